"""``stoker.torch``: a drop-in replacement for ``torch.utils.data.DataLoader``.

This package is the one part of stoker that imports torch. Change one import in a
training script::

    from stoker.torch import DataLoader  # was: from torch.utils.data import DataLoader

and the loop gets torch batches, value for value and type for type the batches torch's
loader yields (see :class:`DataLoader` for the few documented differences), from
stoker's engine: workers write batches into shared memory and every numpy array
becomes a tensor over that memory with ``torch.from_numpy`` (no copy). The loader is a
``torch.utils.data.DataLoader``, so training frameworks that inspect or rebuild torch
loaders (PyTorch Lightning, Hugging Face accelerate) handle it as one and keep it on
stoker's engine.

Randomness follows torch's: with ``generator=None`` the loader's base seed, from which
every epoch's worker seeds and augmentation seeds derive, is drawn from torch's global
generator when the loader is built, so ``torch.manual_seed(0)`` at the top of the
script makes the run reproducible, as it does with torch.

``pin_memory=True`` pins in one background thread; see :class:`DataLoader`.
:class:`Normalize` normalises uint8 image batches on the accelerator (the device-side
half of ``stoker.vision.train_transform(224, normalize=False)``).

Importing this package teaches Hugging Face accelerate (when it is, or later gets,
imported) to rebuild stoker loaders as stoker loaders: see ``stoker.torch._accelerate``.

Without torch, importing this package raises an ImportError (a
:class:`~stoker._extras.MissingExtraError`) that names the extra: ``pip install
'stoker[torch]'``.
"""

from stoker._extras import require

require("torch", "stoker.torch")

from stoker.torch import _accelerate
from stoker.torch._loader import DataLoader
from stoker.torch._normalize import Normalize
from stoker.torch._samplers import BatchSampler, RandomSampler, SequentialSampler

__all__ = ["BatchSampler", "DataLoader", "Normalize", "RandomSampler", "SequentialSampler"]

# Hugging Face accelerate rebuilds loaders as torch's; teach it to rebuild ours as ours,
# now or when it is imported (see stoker.torch._accelerate).
_accelerate.install_when_imported()
