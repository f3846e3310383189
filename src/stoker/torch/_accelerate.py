"""Hugging Face accelerate rebuilds stoker loaders as stoker loaders.

``Accelerator.prepare(loader)`` and ``skip_first_batches(loader, n)`` read a loader's
torch arguments and build a new ``torch.utils.data.DataLoader`` from them (inside
accelerate's ``DataLoaderShard``), whatever class the loader was. Left alone, a stoker
loader would then run on torch's engine, without stoker's speed, determinism, resume and
error handling (its batches would still be right: see :mod:`stoker.torch._rebuilds`).

So when accelerate is imported, :func:`install` replaces the name ``DataLoader`` in
``accelerate.data_loader`` (the one module that constructs loaders) by a function that
builds a :class:`stoker.torch.DataLoader` when the arguments come from one (its
``collate_fn`` is a :class:`~stoker.torch._rebuilds.TorchCollate`) and torch's loader
otherwise. Batches skipped by ``skip_first_batches`` are skipped the stoker way: not
loaded, and every later sample keeps the random seeds of its place in the epoch, so a
resumed run draws the same augmentations as an uninterrupted one.

Nothing else in accelerate is changed; accelerate's own ``isinstance`` checks still see
torch's class (a stoker.torch loader is a subclass of it).
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

from stoker.torch._rebuilds import TorchCollate

__all__ = ["install", "install_when_imported", "uninstall"]

_MODULE = "accelerate.data_loader"
_MARK = "_stoker_builds_loaders"


def install() -> bool:
    """Teaches an imported accelerate to rebuild stoker loaders as stoker loaders.

    Idempotent; a no-op when accelerate is not imported (returns whether it is now
    installed).
    """
    module = sys.modules.get(_MODULE)
    if module is None or not hasattr(module, "DataLoader"):
        return False
    if getattr(module, _MARK, False):
        return True
    torch_loader = module.DataLoader

    def build_loader(dataset: Any, *args: Any, **kwargs: Any) -> Any:
        collate = kwargs.get("collate_fn")
        if args or not isinstance(collate, TorchCollate):
            return torch_loader(dataset, *args, **kwargs)
        from stoker.torch._loader import DataLoader

        skip = 0
        batch_sampler = kwargs.get("batch_sampler")
        skipping = getattr(module, "SkipBatchSampler", None)
        if skipping is not None and type(batch_sampler) is skipping:
            skip = batch_sampler.skip_batches
            kwargs["batch_sampler"] = batch_sampler.batch_sampler
        loader = DataLoader(dataset, **kwargs)
        if skip:
            loader._skip_batches_every_epoch(skip)
        return loader

    build_loader.__doc__ = (
        "Builds a stoker.torch.DataLoader from a stoker loader's arguments, "
        "torch's loader otherwise."
    )
    build_loader.__wrapped__ = torch_loader  # type: ignore[attr-defined]
    module.DataLoader = build_loader
    setattr(module, _MARK, True)
    return True


def uninstall() -> None:
    """Puts accelerate's own ``DataLoader`` name back."""
    module = sys.modules.get(_MODULE)
    if module is not None and getattr(module, _MARK, False):
        module.DataLoader = module.DataLoader.__wrapped__
        setattr(module, _MARK, False)


class _InstallAfterImport(importlib.abc.MetaPathFinder):
    """Runs :func:`install` right after ``accelerate.data_loader`` is first imported."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            install()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install_when_imported() -> None:
    """:func:`install` now if accelerate is loaded, else as soon as it is (idempotent)."""
    if install() or any(isinstance(f, _InstallAfterImport) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _InstallAfterImport())
