"""The checks, one function each, in the order :func:`stoker.doctor.check` runs them.

Every check takes the shared :class:`~stoker.doctor._context.Context`, adds its findings
to it and records what later checks need (the sample check finds the image and label
fields, the stats pass collects the labels the labels check counts). Internal to
:mod:`stoker.doctor`.
"""

from __future__ import annotations

import concurrent.futures
import io
import itertools
import os
import pickle
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from stoker._image_files import read_image_file
from stoker._printable import printable
from stoker.doctor._context import Context, Normalisation
from stoker.doctor._stats import FieldStats, format_values
from stoker.doctor._values import (
    FieldPath,
    as_array,
    describe,
    field_name,
    fingerprint,
    get,
    is_image,
    label_path,
    layout,
    leaves,
    same,
)
from stoker.doctor.report import FAIL, OK, SKIP, WARN, Finding, plural

_IMBALANCE_RATIO = 10.0  # most common / least common class at which labels count as imbalanced
_MIN_LABELS_FOR_BALANCE = 20
_BIG_PICKLE_BYTES = 256 * 2**20
_MAX_CLASSES_SHOWN = 12
_BAD_FILES_SHOWN = 10
_FILES_PER_ROUND = 1024  # files submitted to the reading threads at a time


# -- length ----------------------------------------------------------------------------
def check_length(ctx: Context) -> None:
    """The dataset has samples (a stream may have no length)."""
    try:
        ctx.length = len(ctx.dataset)
    except TypeError:
        if ctx.iterable:
            ctx.add("length", OK, "a stream (iterable dataset) without a length")
            return
        ctx.add(
            "length",
            FAIL,
            f"len() fails on {type(ctx.dataset).__name__}: a map-style dataset needs __len__",
        )
        return
    kind = "a stream of" if ctx.iterable else ""
    if ctx.length == 0:
        ctx.add(
            "length",
            FAIL,
            "the dataset is empty (len() is 0): check the path or the filter",
            length=0,
        )
    else:
        ctx.add("length", OK, f"{kind} {ctx.length:,} samples".strip(), length=ctx.length)


# -- files -----------------------------------------------------------------------------
def check_files(ctx: Context) -> None:
    """Every file of a dataset of image files is a readable image (``stoker pack``'s check).

    Runs for map-style datasets with a ``path(index)`` method (ImageFolder); a sample
    check reads one file and the statistics a few hundred, so a corrupt file among
    thousands would otherwise go unseen until training reaches it.
    """
    path_of = getattr(ctx.dataset, "path", None)
    if ctx.iterable or not callable(path_of) or ctx.length is None:
        return
    mode = ctx.options.files
    if mode == "none":
        ctx.add("files", SKIP, "the files were not checked (files='none')")
        return
    try:
        import PIL  # noqa: F401 (only whether it imports)
    except ImportError:
        from stoker._extras import install_hint

        ctx.add("files", SKIP, f"checking the files needs Pillow: {install_hint('PIL')}")
        return
    paths = [os.fspath(path_of(i)) for i in range(ctx.length)]
    bad = _unreadable_files(paths, mode)
    how = "decoded at reduced scale" if mode == "decode" else "verified by Pillow (headers only)"
    if not bad:
        ctx.add(
            "files", OK, f"all {len(paths):,} files are readable images ({how})", checked=len(paths)
        )
        return
    details = [f"{printable(path)}: {reason}" for path, reason in bad[:_BAD_FILES_SHOWN]]
    if len(bad) > _BAD_FILES_SHOWN:
        details.append(f"... and {len(bad) - _BAD_FILES_SHOWN} more")
    details.append("remove or re-encode them, or pass on_error='skip' to the DataLoader")
    ctx.add("files", FAIL, (
        f"{len(bad)} of {len(paths):,} {plural(len(paths), 'file')} "
        f"{'is' if len(bad) == 1 else 'are'} not a readable image ({how})"
    ), details, checked=len(paths), bad={path: reason for path, reason in bad})  # fmt: skip


def _unreadable_files(paths: list[str], mode: str) -> list[tuple[str, str]]:
    """``(path, reason)`` for every file that is not a readable image, in order."""

    def problem(path: str) -> str | None:
        return read_image_file(path, mode)[1]

    bad = []
    workers = min(32, (os.cpu_count() or 1) + 4)
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="stoker-doctor") as pool:
        for start in range(0, len(paths), _FILES_PER_ROUND):
            chunk = paths[start : start + _FILES_PER_ROUND]
            bad.extend(
                (path, reason)
                for path, reason in zip(chunk, pool.map(problem, chunk), strict=True)
                if reason is not None
            )
    return bad


# -- sample ----------------------------------------------------------------------------
def check_sample(ctx: Context) -> None:
    """One sample's fields, flagging raw pixels, missing normalisation, HWC and NaN."""
    index = ctx.options.index
    if not ctx.iterable and ctx.length is not None and not 0 <= index < ctx.length:
        ctx.add(
            "sample",
            FAIL,
            f"index {index} is outside the dataset (length {ctx.length}); pass a smaller index",
        )
        return
    where = "the first sample" if ctx.iterable else f"sample {index}"
    try:
        ctx.sample = _fetch(ctx)
    except Exception as exc:
        ctx.add_raised("sample", f"fetching {where}", exc)
        ctx.sample = None
        return
    fields = leaves(ctx.sample)
    details, figures, flags = [], {}, []
    for path, leaf in fields:
        name = field_name(path)
        line, data = describe(leaf)
        details.append(f"{name:<20} {line}")
        figures[name] = data
        array = as_array(leaf)
        if array is not None:
            flags.extend(_field_flags(name, array, data, raw=ctx.options.raw_images))
    ctx.image_path = _statistics_field(fields)
    ctx.label_path = label_path(ctx.sample)
    kind = type(ctx.sample).__name__
    count = f"{len(fields)} {plural(len(fields), 'field')}"
    ctx.add("sample", OK, f"{where} is a {kind} of {count}", details, fields=figures)
    ctx.findings.extend(flags)
    if ctx.image_path is not None and not any(f.status != OK for f in flags):
        name = field_name(ctx.image_path)
        data = figures[name]
        if abs(data.get("mean", 9)) < 0.5 and 0.5 < data.get("std", 0) < 2:
            ctx.add(
                "sample",
                OK,
                f"{name} looks standardised (mean {data['mean']:.3f}, std {data['std']:.3f})",
            )


def _fetch(ctx: Context) -> Any:
    """The sample at ``options.index``, or a stream's first sample."""
    if not ctx.iterable:
        return ctx.dataset[ctx.options.index]
    iterator = iter(ctx.dataset)
    try:
        return next(iterator)
    except StopIteration:
        msg = "the stream is empty: iterating the dataset yields nothing"
        raise ValueError(msg) from None
    finally:
        close = getattr(iterator, "close", None)
        if callable(close):
            close()


def _statistics_field(fields: list[tuple[FieldPath, Any]]) -> FieldPath | None:
    """The field the statistics are about: the first image, else the first float array."""
    for path, leaf in fields:
        array = as_array(leaf)
        if array is not None and is_image(array):
            return path
    for path, leaf in fields:
        array = as_array(leaf)
        if array is not None and array.ndim >= 1 and array.dtype.kind == "f":
            return path
    return None


def _field_flags(
    name: str, array: np.ndarray, data: Mapping[str, Any], *, raw: bool
) -> list[Finding]:
    """NaN or inf values in a field, then what is wrong with it as an image.

    ``raw``: the images are decoded by stoker for the check, not the user's pipeline's:
    a note replaces the warnings about dtype, range and layout.
    """
    found = []
    if data.get("non_finite"):
        found.append(
            Finding(
                "sample",
                FAIL,
                f"{name} holds {data['non_finite']} NaN or inf values",
                data={"field": name},
            )
        )
    if is_image(array) and raw:
        found.append(Finding("sample", OK, (
            f"{name} holds the decoded pixels ({array.dtype}, {layout(array.shape)}); the dtype, "
            "range and layout your model is fed come from your own transform: pass module:attr "
            "to check them"
        ), data={"field": name, "flag": "decoded"}))  # fmt: skip
    elif is_image(array):
        found.extend(_image_flags(name, array, data))
    return found


def _image_flags(name: str, array: np.ndarray, data: Mapping[str, Any]) -> list[Finding]:
    """The mistakes with image tensors that cost training runs most often."""
    found: list[Finding] = []
    lo, hi, mean, std = data.get("min"), data.get("max"), data.get("mean"), data.get("std")
    if array.dtype == np.uint8:
        found.append(Finding("sample", WARN, (
            f"{name} is raw uint8 pixels (0-255): convert to float, scale by 1/255 and Normalize "
            "(ignore this if you normalise on the accelerator)"
        ), data={"field": name, "flag": "uint8"}))  # fmt: skip
    elif lo is not None and lo >= 0 and 2.0 < hi <= 255.0:
        found.append(Finding("sample", WARN, (
            f"{name} is float with values in [{lo:.4g}, {hi:.4g}]: pixel values that were never "
            "scaled; divide by 255, then Normalize with the mean and std below"
        ), data={"field": name, "flag": "0-255"}))  # fmt: skip
    elif lo is not None and lo >= 0 and hi <= 1.0:
        found.append(Finding("sample", WARN, (
            f"{name} is in [0, 1] with mean {mean:.3f} and std {std:.3f}: scaled but not "
            "standardised (ToTensor without Normalize); Normalize with the mean and std below"
        ), data={"field": name, "flag": "0-1"}))  # fmt: skip
    if layout(array.shape) == "HWC":
        h, w, c = array.shape
        found.append(Finding("sample", WARN, (
            f"{name} has shape {tuple(array.shape)}, channels last (HWC), where models expect "
            f"CHW ({c}, {h}, {w}): transpose with image.transpose(2, 0, 1)"
        ), data={"field": name, "flag": "HWC"}))  # fmt: skip
    return found


# -- transform -------------------------------------------------------------------------
def check_transform(ctx: Context) -> None:
    """The same index fetched twice: a deterministic or a random transform, and whether
    the random one is reproducible under the loader's seed."""
    index = ctx.options.index
    if ctx.iterable:
        ctx.add("transform", SKIP, "an iterable dataset has no index to fetch twice")
        return
    if same(ctx.sample, ctx.dataset[index]):
        ctx.add(
            "transform",
            OK,
            f"deterministic transform: sample {index} is identical when fetched twice",
            random=False,
        )
        return
    ctx.add(
        "transform",
        OK,
        f"random transform: sample {index} differs between two fetches",
        random=True,
    )
    first, second = (_first_through_loader(ctx) for _ in range(2))
    if same(first, second):
        ctx.add(
            "transform",
            OK,
            "the random transform is reproducible: the same loader seed gives the same sample",
            reproducible=True,
        )
    else:
        ctx.add("transform", WARN, (
            "the random transform is not reproducible: two loaders with the same seed gave "
            "different samples, so it draws from a generator stoker does not seed (its own "
            "np.random.default_rng() or RandomState); draw from stoker.sample_rng() instead"
        ), reproducible=False)  # fmt: skip


def _first_through_loader(ctx: Context) -> Any:
    index, seed = ctx.options.index, ctx.options.seed
    return next(iter(ctx.loader(ctx.dataset, batch_size=None, sampler=[index], generator=seed)))


# -- workers ---------------------------------------------------------------------------
def check_workers(ctx: Context) -> None:
    """Whether the dataset pickles for process workers, and how big it is."""
    sink = _CountingSink()
    buffers: list[int] = []
    try:
        pickle.Pickler(
            sink, protocol=5, buffer_callback=lambda b: buffers.append(memoryview(b).nbytes)
        ).dump(ctx.dataset)
    except Exception as exc:
        ctx.add("workers", WARN, (
            f"the dataset cannot be pickled ({type(exc).__name__}: {exc}): process workers "
            "started with spawn or forkserver need it; use fork (the Linux default) or "
            "worker_mode='thread'"
        ), picklable=False)  # fmt: skip
        return
    size = sink.size + sum(buffers)
    if size > _BIG_PICKLE_BYTES:
        ctx.add("workers", WARN, (
            f"the dataset pickles to {_human_bytes(size)}: every process worker started with "
            "spawn or forkserver gets its own copy; keep big data on disk or memory-mapped"
        ), picklable=True, pickled_bytes=size)  # fmt: skip
    else:
        ctx.add(
            "workers",
            OK,
            f"pickles for process workers ({_human_bytes(size)})",
            picklable=True,
            pickled_bytes=size,
        )


class _CountingSink(io.RawIOBase):
    """A file that only counts the bytes written to it."""

    def __init__(self) -> None:
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        self.size += n
        return n


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# -- batches (and shuffle, over the same loader) ---------------------------------------
def check_batches(ctx: Context) -> None:
    """A few batches through :class:`stoker.DataLoader`, with their shapes; then the
    shuffle check on a second epoch of the same loader."""
    batch_size = ctx.options.batch_size
    recorder = None if ctx.iterable else _Recorder(ctx.dataset)
    if recorder is None:
        loader = ctx.loader(ctx.dataset, batch_size=batch_size)
    else:
        loader = ctx.loader(
            recorder, batch_size=batch_size, shuffle=True, generator=ctx.options.seed
        )
    try:
        batches = ctx.take(loader)
    except Exception as exc:
        ctx.add_raised("batches", f"loading batches of {batch_size}", exc)
        return
    if not batches:
        ctx.add("batches", FAIL, "the loader yielded no batch", batches=0)
        return
    shapes = {}
    for path, leaf in leaves(batches[0]):
        array = as_array(leaf)
        shapes[field_name(path)] = (
            f"{array.dtype} {tuple(array.shape)}" if array is not None else describe(leaf)[0]
        )
    details = [
        f"{name.replace('sample', 'batch', 1):<20} {shape}" for name, shape in shapes.items()
    ]
    how = "DataLoader(shuffle=True)" if recorder is not None else "DataLoader"
    ctx.add(
        "batches",
        OK,
        f"{len(batches)} {plural(len(batches), 'batch')} of {batch_size} through {how}",
        details,
        shapes=shapes,
    )
    if ctx.label_path is not None:
        for batch in batches:
            ctx.batch_labels.extend(
                int(v) for v in np.asarray(as_array(get(batch, ctx.label_path))).ravel()
            )
    check_shuffle(ctx, loader, recorder, batches)


class _Recorder:
    """Wraps a map-style dataset and records the indices the loader asks for."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.indices: list[int] = []

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Any) -> Any:
        self.indices.append(int(index))
        return self.dataset[index]

    def __getitems__(self, indices: Sequence[int]) -> Any:
        self.indices.extend(int(i) for i in indices)
        getitems = getattr(self.dataset, "__getitems__", None)
        return getitems(list(indices)) if callable(getitems) else [self.dataset[i] for i in indices]


# -- shuffle ---------------------------------------------------------------------------
def check_shuffle(ctx: Context, loader: Any, recorder: _Recorder | None, first: list[Any]) -> None:
    """Whether a shuffled loader changes the order from one epoch to the next.

    Run by the batches check with its loader, the indices it recorded (None for a
    stream) and the first epoch's batches.
    """
    if recorder is None:
        _check_stream_order(ctx, loader, first)
        return
    epoch0 = list(recorder.indices)
    recorder.indices.clear()
    ctx.take(loader)
    epoch1 = list(recorder.indices)
    details = [f"epoch 0 starts {_head(epoch0)}", f"epoch 1 starts {_head(epoch1)}"]
    if (
        len(epoch0) > 1
        and epoch0 == sorted(epoch0)
        and epoch0 == list(range(epoch0[0], epoch0[0] + len(epoch0)))
    ):
        ctx.add(
            "shuffle",
            FAIL,
            "shuffle=True read the samples in order: the sampler does not shuffle",
            details,
            changes=False,
        )
    elif len(epoch0) > 1 and epoch0 == epoch1:
        ctx.add(
            "shuffle",
            FAIL,
            "a shuffled loader repeats the same order every epoch (is set_epoch called?)",
            details,
            changes=False,
        )
    else:
        ctx.add(
            "shuffle",
            OK,
            "a shuffled loader changes the order from one epoch to the next",
            details,
            changes=True,
        )


def _check_stream_order(ctx: Context, loader: Any, first: list[Any]) -> None:
    """A stream has no indices to record: compare two epochs' first batches instead."""
    second = ctx.take(loader)
    if [fingerprint(b) for b in first] == [fingerprint(b) for b in second]:
        ctx.add("shuffle", WARN, (
            "the stream yields the same batches in the same order every epoch: shuffle per epoch "
            "(set_epoch with shuffle_files / shuffle_shards, or shuffle_buffer=N / "
            "stoker.ShuffleBuffer)"
        ), changes=False)  # fmt: skip
    else:
        ctx.add(
            "shuffle",
            OK,
            "the stream's first batches change from one epoch to the next",
            changes=True,
        )


def _head(order: list[int]) -> str:
    return ", ".join(map(str, order[:6])) + (", ..." if len(order) > 6 else "")


# -- stats -----------------------------------------------------------------------------
def check_stats(ctx: Context) -> None:
    """One pass over ``stats_samples`` random samples: the per-channel mean and std of the
    image (or float) field, and the labels the labels check counts."""
    if ctx.image_path is None:
        ctx.add("stats", SKIP, "no image or float array field to compute a mean and std over")
        if ctx.label_path is None:
            return
    stats = FieldStats()
    for sample in _stats_samples(ctx):
        if ctx.label_path is not None:
            label = as_array(get(sample, ctx.label_path))
            if label is not None and label.ndim == 0:
                ctx.labels.append(int(label))
        if ctx.image_path is not None:
            stats.add(as_array(get(sample, ctx.image_path)))
    if ctx.image_path is not None:
        _add_stats(ctx, field_name(ctx.image_path), stats)


def _stats_samples(ctx: Context) -> Iterator[Any]:
    """A stream's first ``stats_samples`` samples, or as many drawn at random, in order."""
    if ctx.iterable:
        source = ctx.loader(ctx.dataset, batch_size=None)
        return itertools.islice(iter(source), ctx.options.stats_samples)
    if ctx.length is None:
        raise AssertionError("a map-style dataset reached the stats check without a length")
    count = min(ctx.options.stats_samples, ctx.length)
    picks = np.sort(
        np.random.default_rng(ctx.options.seed).choice(ctx.length, size=count, replace=False)
    ).tolist()
    return iter(ctx.loader(ctx.dataset, batch_size=None, sampler=picks))


def _add_stats(ctx: Context, name: str, stats: FieldStats) -> None:
    """The stats finding: the figures, on the scale Normalize expects, and a line to paste."""
    if not stats.seen or stats.channels.mean is None:
        ctx.add("stats", FAIL, f"no sample had a usable {name} to compute statistics over")
        return
    raw_mean, raw_std = stats.channels.mean, stats.channels.std
    scale = stats.scale
    mean = tuple(float(v) for v in raw_mean / scale)
    std = tuple(float(v) for v in raw_std / scale)
    if stats.layout == "features":
        channels = f"{len(mean)} {plural(len(mean), 'feature')}"
    else:
        channels = f"{len(mean)} {plural(len(mean), 'channel')}" + (
            f", {stats.layout}" if stats.layout else ""
        )
    message = f"mean and std of {name} over {stats.seen} samples ({channels})"
    details = [f"mean = {format_values(mean)}", f"std  = {format_values(std)}"]
    if scale != 1.0:
        details.insert(0, "on the 0-1 scale (pixels / 255), as Normalize after ToTensor expects:")
        details.append(
            f"raw 0-255 scale: mean = {format_values(raw_mean)}, std = {format_values(raw_std)}"
        )
    standardised = all(abs(m) < 0.1 for m in mean) and all(abs(s - 1) < 0.1 for s in std)
    advise = stats.low >= 0 and not standardised
    if advise:
        details.append(f"paste: Normalize(mean={format_values(mean)}, std={format_values(std)})")
    if stats.skipped:
        details.append(
            f"({stats.skipped} samples left out: no such field or a different channel count)"
        )
    if standardised:
        message += "; already standardised (mean ~0, std ~1): no Normalize to add"
    elif not advise:
        message += (
            f"; already normalised (values go down to {stats.low:.4g}, so a mean was "
            "subtracted): no Normalize to add"
        )
    ctx.add(
        "stats",
        OK,
        message,
        details,
        field=name,
        samples=stats.seen,
        mean=list(mean),
        std=list(std),
        scale=scale,
        normalize_advised=advise,
    )
    ctx.normalisation = Normalisation(name, mean, std)


# -- labels ----------------------------------------------------------------------------
def check_labels(ctx: Context) -> None:
    """The label distribution, flagging a single class or heavy imbalance.

    Counts the dataset's ``targets`` where it has them, else the labels the stats pass
    read, else those of the batches check.
    """
    if ctx.label_path is None:
        ctx.add(
            "labels",
            SKIP,
            "no label field (an int named label/labels/target/y, or a tuple's last int)",
        )
        return
    name = field_name(ctx.label_path)
    pool, source = _label_pool(ctx)
    counts = Counter(int(v) for v in pool)
    if not counts:
        ctx.add("labels", SKIP, f"no labels seen in {name}")
        return
    shown = sorted(counts.items())
    text = ", ".join(f"{k}: {v}" for k, v in shown[:_MAX_CLASSES_SHOWN])
    if len(shown) > _MAX_CLASSES_SHOWN:
        text += f", ... ({len(shown) - _MAX_CLASSES_SHOWN} more)"
    n, k = sum(counts.values()), len(counts)
    batch_counts = Counter(ctx.batch_labels)
    details = [f"counts over {source} ({n}): {text}"]
    if batch_counts:
        details.append(
            f"in the first batches: {len(batch_counts)} classes in {sum(batch_counts.values())} "
            "samples"
        )
    data = {"field": name, "counts": dict(shown), "source": source}
    (top, top_n), (rare, rare_n) = (
        counts.most_common(1)[0],
        min(counts.items(), key=lambda kv: (kv[1], kv[0])),
    )
    if n >= _MIN_LABELS_FOR_BALANCE and k == 1:
        ctx.add(
            "labels",
            WARN,
            f"{name} holds a single class ({top}) in {n} samples: check the labels",
            details,
            **data,
        )
    elif n >= _MIN_LABELS_FOR_BALANCE and top_n / rare_n >= _IMBALANCE_RATIO:
        ctx.add("labels", WARN, (
            f"{name} is imbalanced: class {top} has {top_n / n:.0%} of {n} samples, "
            f"{top_n / rare_n:.0f}x class {rare}; consider WeightedRandomSampler or a weighted "
            "loss"
        ), details, **data)  # fmt: skip
    else:
        ctx.add(
            "labels",
            OK,
            f"{name}: {k} {plural(k, 'class')}, most common {top} ({top_n / n:.0%})",
            details,
            **data,
        )


def _label_pool(ctx: Context) -> tuple[Sequence[int] | np.ndarray, str]:
    """The labels to count, and where they come from."""
    targets = getattr(ctx.dataset, "targets", None)
    pool: Sequence[int] | np.ndarray
    try:
        pool = (
            np.asarray(targets).ravel()
            if targets is not None and len(targets) == ctx.length
            else []
        )
    except TypeError:
        pool = []
    if len(pool) and np.asarray(pool).dtype.kind in "iu":
        return pool, "the dataset's targets"
    if ctx.labels:
        return ctx.labels, "the first samples" if ctx.iterable else "a random sample"
    return ctx.batch_labels, "the first batches"
