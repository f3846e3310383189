"""``stoker demo``: the classic staged data-loading speed-up, on a synthetic image dataset.

A well-known tuning walkthrough takes an image-classification input pipeline through four
steps and reports the step time after each (0.58 s -> 0.35 s -> 0.26 s -> 0.21 s). This command does
the same on
this machine, with ``torch.utils.data`` beside stoker as the reference:

1. **naive**: a Dataset that opens each JPEG with Pillow, resizes and normalises it in
   the main process (``num_workers=0``);
2. **+ workers**: ``num_workers=2``, ``pin_memory=True``, ``persistent_workers=True``;
3. **+ packed shards**: the same images packed into shards read through ``mmap``
   (:class:`stoker.formats.packed.PackedDataset`) and decoded by :mod:`stoker.vision`
   (libjpeg-turbo through simplejpeg, at reduced scale where the target is smaller);
4. **+ deeper prefetch and a batch-level collate**: ``prefetch_factor=4``; samples stay
   uint8 and a MixUp ``collate_fn`` normalises and mixes the whole batch at once.

A training step is simulated by sleeping a fixed time per batch (the trainer waiting for
the accelerator), so that loading matters only where it is slower than the step, as in a
real run. The images are built once in a cache folder (``$STOKER_CACHE`` or
``~/.cache/stoker``, under ``demo/``) and reused.

The package: ``config.py`` (the sizes), ``datasets.py`` (what the stages load),
``cache.py`` (building the images once), ``stages.py`` (the stages and their timing),
``report.py`` (the lines, table and plot) and ``command.py`` (the arguments and the run).
"""

from __future__ import annotations

from stoker.cli.demo.command import add_parser, run
from stoker.cli.demo.config import DemoConfig
from stoker.cli.demo.datasets import MixUpCollate, NaiveJpegDataset

__all__ = ["DemoConfig", "MixUpCollate", "NaiveJpegDataset", "add_parser", "run"]
