"""The data pipeline self-checks in one call: :func:`check` (``stoker doctor`` in a shell).

The checks are the ones careful users run by hand before every training run. They run in
this order, each a function in ``_checks.py``:

1. **length**: the dataset has samples;
   **files**: for a dataset of image files (a ``path(index)`` method, like ``ImageFolder``),
   every file is a readable image, checked as ``stoker pack`` checks it (``files=``); one
   that is not is a failure;
2. **sample**: one sample's fields with shapes, dtypes and value ranges, flagging images
   that are raw 0-255 pixels, 0-1 values that never went through ``Normalize``,
   channels-last (HWC) layouts where models expect CHW, and NaN / inf values;
3. **transform**: the same index fetched twice: a deterministic or a random transform,
   and whether the random one is reproducible under the loader's seed;
4. **workers**: whether the dataset pickles for process workers, and how big it is;
5. **batches**: a few batches through :class:`stoker.DataLoader`, with their shapes;
6. **shuffle**: whether a shuffled loader changes the order from one epoch to the next
   (a second epoch of the batches check's loader);
7. **stats**: the per-channel mean and std over a sample of the dataset, with a
   ``Normalize(...)`` call to paste while the data is not normalised yet: raw pixels or
   values in 0-1, none below 0. Values below 0 mean a mean was subtracted already (and
   mean ~0 with std ~1 is standardised data): then the figures come without the advice;
8. **labels**: the label distribution, flagging heavy imbalance (it counts the labels
   the stats pass read).

``raw_images=True`` says the samples are images stoker decoded for the check (``stoker
doctor FOLDER``): the dtype, range and layout warnings, which are about what a model is
fed by the caller's own transform, are then left out.

When the length or sample check fails, the others are skipped. Each check yields
:class:`Finding` lines with a status (``ok``, ``warn``, ``fail``, ``skip``); a check that
crashes is a failure, not a crash of the doctor. The :class:`DoctorReport` shows them
grouped by check in reading order (labels beside the batches, stats last).

The package: ``report.py`` (findings and the report), ``_checks.py`` (the checks),
``_context.py`` (what they share), ``_values.py`` (samples as fields), ``_stats.py``
(streamed per-channel mean and std) and ``_run.py`` (:func:`check`).

Example:
    >>> import numpy as np
    >>> from stoker import ArrayDataset
    >>> images = np.random.default_rng(0).random((64, 3, 8, 8), dtype=np.float32)
    >>> report = check(ArrayDataset(images, np.arange(64) % 4), batch_size=16, num_batches=2)
    >>> report.exit_code, [f.check for f in report.warnings]
    (0, ['sample'])
"""

from __future__ import annotations

from stoker.doctor._run import check

# The statuses a Finding carries ("ok", "warn", "fail", "skip"), for callers comparing them.
from stoker.doctor.report import FAIL as FAIL
from stoker.doctor.report import OK as OK
from stoker.doctor.report import SKIP as SKIP
from stoker.doctor.report import WARN as WARN
from stoker.doctor.report import DoctorReport, Finding

__all__ = ["DoctorReport", "Finding", "check"]
