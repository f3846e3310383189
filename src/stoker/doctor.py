"""The data pipeline self-checks, in one call: :func:`check` (``stoker doctor`` on the command line).

The checks are the ones the seeds ran by hand before every training run:

* **length**: the dataset has samples;
* **sample**: one sample's fields with shapes, dtypes and value ranges, flagging images
  that are raw 0-255 pixels, 0-1 values that never went through ``Normalize``,
  channels-last (HWC) layouts where models expect CHW, and NaN / inf values;
* **transform**: the same index fetched twice: a deterministic or a random transform,
  and whether the random one is reproducible under the loader's seed;
* **workers**: whether the dataset pickles for process workers, and how big it is;
* **batches**: a few batches through :class:`stoker.DataLoader`, with their shapes;
* **labels**: the label distribution, flagging heavy imbalance;
* **shuffle**: whether a shuffled loader changes the order from one epoch to the next;
* **stats**: the per-channel mean and std over a sample of the dataset, printed as a
  ``Normalize(...)`` call to paste.

Each check yields :class:`Finding` lines with a status (``ok``, ``warn``, ``fail``,
``skip``); a check that crashes is a failure, not a crash of the doctor.

Example:
    >>> import numpy as np
    >>> from stoker import ArrayDataset
    >>> images = np.random.default_rng(0).random((64, 3, 8, 8), dtype=np.float32)
    >>> report = check(ArrayDataset(images, np.arange(64) % 4), batch_size=16, num_batches=2)
    >>> report.exit_code, [f.check for f in report.warnings]
    (0, ['sample'])
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import math
import pickle
import sys
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoker.datasets import is_iterable_dataset

__all__ = ["DoctorReport", "Finding", "check"]

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
_LABEL_NAMES = ("label", "labels", "target", "targets", "y", "cls", "class")  # cls: webdataset
_IMBALANCE_RATIO = 10.0  # most common / least common class at which labels count as imbalanced
_MIN_LABELS_FOR_BALANCE = 20
_BIG_PICKLE_BYTES = 256 * 2**20
_MAX_CLASSES_SHOWN = 12

Path = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Finding:
    """One line of the report.

    Attributes:
        check: which check: ``length``, ``sample``, ``transform``, ``workers``,
            ``batches``, ``labels``, ``shuffle`` or ``stats``.
        status: ``"ok"``, ``"warn"``, ``"fail"`` or ``"skip"``.
        message: one readable sentence.
        details: further lines (figures, code to paste), shown indented.
        data: the figures, JSON-ready, for ``--json``.

    Example:
        >>> Finding("length", "ok", "1,000 samples").status
        'ok'
    """

    check: str
    status: str
    message: str
    details: tuple[str, ...] = ()
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DoctorReport:
    """What :func:`check` found: the findings, and the normalisation statistics.

    Attributes:
        target: what was checked (a description).
        findings: every finding, in the order the checks ran.
        stats_field: the field the statistics are about (``sample[0]``), or None.
        mean, std: per-channel statistics on the scale ``Normalize`` expects (0-1 for
            pixel data), or None when they could not be computed.

    Example:
        >>> report = DoctorReport("demo", (Finding("length", "ok", "3 samples"),))
        >>> report.ok, report.exit_code, report.render().splitlines()[1]
        (True, 0, '  OK    length: 3 samples')
    """

    target: str
    findings: tuple[Finding, ...]
    stats_field: str | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    @property
    def failures(self) -> list[Finding]:
        return [f for f in self.findings if f.status == FAIL]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.status == WARN]

    @property
    def ok(self) -> bool:
        """True when no check failed (warnings are fine)."""
        return not self.failures

    @property
    def exit_code(self) -> int:
        """0 when no check failed, 1 otherwise (what ``stoker doctor`` exits with)."""
        return 0 if self.ok else 1

    def render(self) -> str:
        """The readable report: one ``OK`` / ``WARN`` / ``FAIL`` / ``SKIP`` line per finding."""
        lines = [f"stoker doctor: {self.target}"]
        for finding in self.findings:
            lines.append(f"  {finding.status.upper():<5} {finding.check}: {finding.message}")
            lines.extend(f"          {detail}" for detail in finding.details)
        counts = Counter(f.status for f in self.findings)
        summary = (
            f"{counts[OK]} ok, {counts[WARN]} {_plural(counts[WARN], 'warning')}, "
            f"{counts[FAIL]} {_plural(counts[FAIL], 'failure')}"
        )
        if counts[SKIP]:
            summary += f", {counts[SKIP]} skipped"
        lines.append(f"result: {'OK' if self.ok else 'FAILED'} ({summary})")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {
            "target": self.target,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "findings": [
                {
                    "check": f.check,
                    "status": f.status,
                    "message": f.message,
                    "details": list(f.details),
                    "data": _jsonable(f.data),
                }
                for f in self.findings
            ],
            "normalize": None
            if self.mean is None
            else {"field": self.stats_field, "mean": list(self.mean), "std": list(self.std or ())},
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def __str__(self) -> str:
        return self.render()


def _plural(n: int, word: str) -> str:
    return word if n == 1 else word + ("es" if word.endswith(("s", "ch")) else "s")


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


# -- samples as fields --------------------------------------------------------------
def _field_name(path: Path) -> str:
    return "sample" + "".join(f"[{k!r}]" if isinstance(k, str) else f"[{k}]" for k in path)


def _leaves(value: Any, path: Path = ()) -> list[tuple[Path, Any]]:
    """Every leaf of a sample (or batch) with its path of keys and indices.

    A list of strings (a collated batch of them) is one leaf.
    """
    if isinstance(value, Mapping):
        return [leaf for k, v in value.items() for leaf in _leaves(v, (*path, k))]
    if (
        isinstance(value, (tuple, list))
        and value
        and not all(isinstance(v, (str, bytes)) for v in value)
    ):
        return [leaf for k, v in enumerate(value) for leaf in _leaves(v, (*path, k))]
    return [(path, value)]


def _get(value: Any, path: Path) -> Any:
    for key in path:
        value = value[key]
    return value


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (bool, int, float, np.generic)) and not isinstance(value, (str, bytes))


def _as_array(value: Any) -> np.ndarray | None:
    """A numpy view of an array-like leaf (numpy, torch, PIL, a number), else None."""
    if isinstance(value, np.ndarray):
        return value
    if _is_scalar(value):
        return np.asarray(value)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.float()
        return tensor.numpy()
    if type(value).__module__.startswith("PIL.") and hasattr(value, "getbands"):
        return np.asarray(value)
    return None


def _is_int_scalar(value: Any) -> bool:
    array = _as_array(value)
    return (
        array is not None
        and array.ndim == 0
        and array.dtype.kind in "iu"
        and not isinstance(value, bool)
    )


def _layout(shape: tuple[int, ...]) -> str | None:
    """``"CHW"``, ``"HWC"`` or ``"HW"`` for an image-shaped array, else None."""
    if len(shape) == 2 and min(shape) >= 8:
        return "HW"
    if len(shape) == 3:
        if shape[0] in (1, 3, 4) and min(shape[1:]) >= 8:
            return "CHW"
        if shape[-1] in (1, 3, 4) and min(shape[:2]) >= 8:
            return "HWC"
    return None


def _is_image(array: np.ndarray) -> bool:
    return _layout(array.shape) is not None and (array.dtype == np.uint8 or array.dtype.kind == "f")


def _describe(value: Any) -> tuple[str, dict[str, Any]]:
    """One line about a leaf, and its figures."""
    array = _as_array(value)
    if array is None:
        kind = type(value).__name__
        if isinstance(value, (str, bytes)):
            return f"{kind} of length {len(value)}", {"type": kind, "length": len(value)}
        if isinstance(value, (list, tuple)):
            items = sorted({type(v).__name__ for v in value})
            return f"{kind} of {len(value)} {'/'.join(items) or 'items'}", {
                "type": kind,
                "length": len(value),
            }
        return kind, {"type": kind}
    data: dict[str, Any] = {
        "type": type(value).__name__,
        "dtype": str(array.dtype),
        "shape": list(array.shape),
    }
    kind = type(value).__name__
    # a scalar reads 'int64 = 3' or 'int = 3'; 'Tensor (int64) = 3' names both
    plain = kind == str(array.dtype) or isinstance(value, (bool, int, float))
    head = (
        f"{array.dtype} {tuple(array.shape)}"
        if array.ndim
        else (kind if plain else f"{kind} ({array.dtype})")
    )
    if array.size == 0 or array.dtype.kind not in "biuf":
        return head + (" (empty)" if array.size == 0 else ""), data
    if array.ndim == 0:
        data["value"] = array.item()
        return f"{head} = {array.item()!r}", data
    as_float = array.astype(np.float64, copy=False)
    finite = np.isfinite(as_float)
    values = as_float[finite] if not finite.all() else as_float
    if values.size:
        data.update(
            min=float(values.min()),
            max=float(values.max()),
            mean=float(values.mean()),
            std=float(values.std()),
        )
        head += f"  min {data['min']:.4g}  max {data['max']:.4g}  mean {data['mean']:.4g}  std {data['std']:.4g}"
    if not finite.all():
        data["non_finite"] = int((~finite).sum())
        head += f"  ({data['non_finite']} NaN/inf)"
    return head, data


def _image_flags(name: str, array: np.ndarray, data: Mapping[str, Any]) -> list[Finding]:
    """The warnings the seeds kept relearning about image tensors."""
    found: list[Finding] = []
    layout = _layout(array.shape)
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
    if layout == "HWC":
        h, w, c = array.shape
        found.append(Finding("sample", WARN, (
            f"{name} has shape {tuple(array.shape)}, channels last (HWC), where models expect "
            f"CHW ({c}, {h}, {w}): transpose with image.transpose(2, 0, 1)"
        ), data={"field": name, "flag": "HWC"}))  # fmt: skip
    return found


def _label_path(sample: Any) -> Path | None:
    """The label field: an int field named label/target/y, or a tuple's last int element."""
    if isinstance(sample, Mapping):
        for key in sample:
            if isinstance(key, str) and key.lower() in _LABEL_NAMES and _is_int_scalar(sample[key]):
                return (key,)
        return None
    if isinstance(sample, (tuple, list)):
        for k in range(len(sample) - 1, -1, -1):
            if _is_int_scalar(sample[k]):
                return (k,)
    return None


def _fingerprint(value: Any) -> str:
    digest = hashlib.sha1()
    for path, leaf in _leaves(value):
        digest.update(repr(path).encode())
        array = _as_array(leaf)
        if array is not None:
            digest.update(str(array.dtype).encode() + repr(array.shape).encode())
            digest.update(np.ascontiguousarray(array).tobytes())
        else:
            digest.update(leaf if isinstance(leaf, bytes) else repr(leaf).encode())
    return digest.hexdigest()


def _same(a: Any, b: Any) -> bool:
    return _fingerprint(a) == _fingerprint(b)


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


class _CountingSink(io.RawIOBase):
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


class _ChannelStats:
    """Per-channel count, mean and sum of squared deviations, merged sample by sample
    (Chan et al.'s parallel update, float64), so the pass streams."""

    def __init__(self) -> None:
        self.count = 0.0
        self.mean: np.ndarray | None = None
        self.m2: np.ndarray | None = None

    def add(self, x: np.ndarray) -> None:
        n = float(x.shape[1])
        mean = x.mean(axis=1)
        m2 = ((x - mean[:, None]) ** 2).sum(axis=1)
        if self.mean is None or self.m2 is None:
            self.count, self.mean, self.m2 = n, mean, m2
            return
        total = self.count + n
        delta = mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2 + delta**2 * (self.count * n / total)
        self.count = total

    @property
    def std(self) -> np.ndarray:
        if self.m2 is None:
            raise AssertionError("std asked of empty statistics")
        return np.sqrt(self.m2 / self.count)


_MAX_FEATURES = 64  # a 1-D field up to this long gets a mean and std per element


def _stats_layout(array: np.ndarray) -> str | None:
    """How statistics split ``array``: per channel of an image, per feature, or overall."""
    if _is_image(array):
        return _layout(array.shape)
    if array.ndim == 1 and len(array) <= _MAX_FEATURES:
        return "features"
    return None


def _channels(array: np.ndarray, layout: str | None) -> np.ndarray:
    """``array`` as ``(channels, values)`` float64 rows."""
    x = array.astype(np.float64, copy=False)
    if layout == "features":
        return x.reshape(-1, 1)
    if layout == "CHW":
        return x.reshape(x.shape[0], -1)
    if layout == "HWC":
        return x.reshape(-1, x.shape[-1]).T
    return x.reshape(1, -1)


def _format(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:.4f}" for v in values) + "]"


# -- the checks ------------------------------------------------------------------------
class _Doctor:
    def __init__(
        self,
        dataset: Any,
        *,
        batch_size: int,
        num_batches: int,
        stats_samples: int,
        num_workers: int,
        index: int,
        seed: int,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_batches = num_batches
        self.stats_samples = stats_samples
        self.num_workers = num_workers
        self.index = index
        self.seed = seed
        self.iterable = is_iterable_dataset(dataset)
        self.findings: list[Finding] = []
        self.length: int | None = None
        self.sample: Any = None
        self.label_path: Path | None = None
        self.image_path: Path | None = None
        self.labels: list[int] = []
        self.batch_labels: list[int] = []
        self.stats: tuple[str, tuple[float, ...], tuple[float, ...]] | None = None

    def add(
        self, check: str, status: str, message: str, details: Sequence[str] = (), **data: Any
    ) -> None:
        self.findings.append(Finding(check, status, message, tuple(details), data))

    def run(self, check: str, method: Any) -> None:
        try:
            method()
        except Exception as exc:
            self.add(
                check,
                FAIL,
                f"the check raised {type(exc).__name__}: {exc}",
                error=type(exc).__name__,
            )

    def loader(self, dataset: Any, **kwargs: Any) -> Any:
        from stoker.loader import DataLoader

        if self.num_workers:
            kwargs.update(num_workers=self.num_workers, worker_mode="thread")
        kwargs.setdefault("generator", self.seed)  # never draw a seed from the caller's global RNG
        return DataLoader(dataset, **kwargs)

    # length ------------------------------------------------------------------------
    def check_length(self) -> None:
        try:
            self.length = len(self.dataset)
        except TypeError:
            if self.iterable:
                self.add("length", OK, "a stream (iterable dataset) without a length")
                return
            self.add(
                "length",
                FAIL,
                f"len() fails on {type(self.dataset).__name__}: a map-style dataset needs __len__",
            )
            return
        kind = "a stream of" if self.iterable else ""
        if self.length == 0:
            self.add(
                "length",
                FAIL,
                "the dataset is empty (len() is 0): check the path or the filter",
                length=0,
            )
        else:
            self.add("length", OK, f"{kind} {self.length:,} samples".strip(), length=self.length)

    # one sample ------------------------------------------------------------------------
    def fetch(self) -> Any:
        if not self.iterable:
            return self.dataset[self.index]
        iterator = iter(self.dataset)
        try:
            return next(iterator)
        except StopIteration:
            msg = "the stream is empty: iterating the dataset yields nothing"
            raise ValueError(msg) from None
        finally:
            close = getattr(iterator, "close", None)
            if callable(close):
                close()

    def check_sample(self) -> None:
        if not self.iterable and self.length is not None and not 0 <= self.index < self.length:
            self.add(
                "sample",
                FAIL,
                f"index {self.index} is outside the dataset (length {self.length}); pass a smaller index",
            )
            return
        try:
            self.sample = self.fetch()
        except Exception as exc:
            where = "the first sample" if self.iterable else f"sample {self.index}"
            self.add(
                "sample",
                FAIL,
                f"fetching {where} raised {type(exc).__name__}: {exc}",
                error=type(exc).__name__,
            )
            self.sample = None
            return
        leaves = _leaves(self.sample)
        details, fields, flags = [], {}, []
        for path, leaf in leaves:
            name = _field_name(path)
            line, data = _describe(leaf)
            details.append(f"{name:<20} {line}")
            fields[name] = data
            array = _as_array(leaf)
            if array is None:
                continue
            if data.get("non_finite"):
                flags.append(
                    Finding(
                        "sample",
                        FAIL,
                        f"{name} holds {data['non_finite']} NaN or inf values",
                        data={"field": name},
                    )
                )
            if _is_image(array):
                self.image_path = self.image_path if self.image_path is not None else path
                flags.extend(_image_flags(name, array, data))
        self.label_path = _label_path(self.sample)
        if self.image_path is None:  # no image: the statistics are about the first float array
            self.image_path = next(
                (
                    p
                    for p, leaf in leaves
                    if (a := _as_array(leaf)) is not None and a.ndim >= 1 and a.dtype.kind == "f"
                ),
                None,
            )
        where = "the first sample" if self.iterable else f"sample {self.index}"
        kind = type(self.sample).__name__
        count = f"{len(leaves)} {_plural(len(leaves), 'field')}"
        self.add("sample", OK, f"{where} is a {kind} of {count}", details, fields=fields)
        self.findings.extend(flags)
        if self.image_path is not None and not any(
            f.check == "sample" and f.status != OK for f in flags
        ):
            data = fields[_field_name(self.image_path)]
            if abs(data.get("mean", 9)) < 0.5 and 0.5 < data.get("std", 0) < 2:
                self.add(
                    "sample",
                    OK,
                    f"{_field_name(self.image_path)} looks standardised (mean {data['mean']:.3f}, std {data['std']:.3f})",
                )

    # the same index twice ------------------------------------------------------------
    def check_transform(self) -> None:
        if self.iterable:
            self.add("transform", SKIP, "an iterable dataset has no index to fetch twice")
            return
        if not _same(self.sample, self.dataset[self.index]):
            self.add(
                "transform",
                OK,
                f"random transform: sample {self.index} differs between two fetches",
                random=True,
            )
            first, second = (self.first_through_loader() for _ in range(2))
            if _same(first, second):
                self.add(
                    "transform",
                    OK,
                    "the random transform is reproducible: the same loader seed gives the same sample",
                    reproducible=True,
                )
            else:
                self.add("transform", WARN, (
                    "the random transform is not reproducible: two loaders with the same seed gave different "
                    "samples, so it draws from a generator stoker does not seed (its own "
                    "np.random.default_rng() or RandomState); draw from stoker.sample_rng() instead"
                ), reproducible=False)  # fmt: skip
        else:
            self.add(
                "transform",
                OK,
                f"deterministic transform: sample {self.index} is identical when fetched twice",
                random=False,
            )

    def first_through_loader(self) -> Any:
        return next(
            iter(
                self.loader(
                    self.dataset, batch_size=None, sampler=[self.index], generator=self.seed
                )
            )
        )

    # pickling for process workers -----------------------------------------------------
    def check_workers(self) -> None:
        sink = _CountingSink()
        buffers: list[int] = []
        try:
            pickle.Pickler(
                sink, protocol=5, buffer_callback=lambda b: buffers.append(memoryview(b).nbytes)
            ).dump(self.dataset)
        except Exception as exc:
            self.add("workers", WARN, (
                f"the dataset cannot be pickled ({type(exc).__name__}: {exc}): process workers started with "
                "spawn or forkserver need it; use fork (the Linux default) or worker_mode='thread'"
            ), picklable=False)  # fmt: skip
            return
        size = sink.size + sum(buffers)
        if size > _BIG_PICKLE_BYTES:
            self.add("workers", WARN, (
                f"the dataset pickles to {_human_bytes(size)}: every process worker started with spawn or "
                "forkserver gets its own copy; keep big data on disk or memory-mapped"
            ), picklable=True, pickled_bytes=size)  # fmt: skip
        else:
            self.add(
                "workers",
                OK,
                f"pickles for process workers ({_human_bytes(size)})",
                picklable=True,
                pickled_bytes=size,
            )

    # batches, labels, shuffle ------------------------------------------------------------
    def take(self, loader: Any) -> list[Any]:
        iterator = iter(loader)
        try:
            return list(itertools.islice(iterator, self.num_batches))
        finally:
            close = getattr(iterator, "close", None)
            if callable(close):
                close()

    def check_batches(self) -> None:
        recorder = None if self.iterable else _Recorder(self.dataset)
        if recorder is None:
            loader = self.loader(self.dataset, batch_size=self.batch_size)
        else:
            loader = self.loader(
                recorder, batch_size=self.batch_size, shuffle=True, generator=self.seed
            )
        try:
            batches = self.take(loader)
        except Exception as exc:
            self.add(
                "batches",
                FAIL,
                f"loading batches of {self.batch_size} raised {type(exc).__name__}: {exc}",
                error=type(exc).__name__,
            )
            return
        if not batches:
            self.add("batches", FAIL, "the loader yielded no batch", batches=0)
            return
        shapes = {}
        for path, leaf in _leaves(batches[0]):
            array = _as_array(leaf)
            shapes[_field_name(path)] = (
                f"{array.dtype} {tuple(array.shape)}" if array is not None else _describe(leaf)[0]
            )
        details = [
            f"{name.replace('sample', 'batch', 1):<20} {shape}" for name, shape in shapes.items()
        ]
        how = "DataLoader(shuffle=True)" if recorder is not None else "DataLoader"
        self.add(
            "batches",
            OK,
            f"{len(batches)} {_plural(len(batches), 'batch')} of {self.batch_size} through {how}",
            details,
            shapes=shapes,
        )
        if self.label_path is not None:
            for batch in batches:
                self.batch_labels.extend(
                    int(v) for v in np.asarray(_as_array(_get(batch, self.label_path))).ravel()
                )
        self.check_shuffle(loader, recorder, batches)

    def check_shuffle(self, loader: Any, recorder: _Recorder | None, first: list[Any]) -> None:
        if recorder is None:
            second = self.take(loader)
            if [_fingerprint(b) for b in first] == [_fingerprint(b) for b in second]:
                self.add("shuffle", WARN, (
                    "the stream yields the same batches in the same order every epoch: shuffle per epoch "
                    "(set_epoch with shuffle_files / shuffle_shards, or a shuffle buffer)"
                ), changes=False)  # fmt: skip
            else:
                self.add(
                    "shuffle",
                    OK,
                    "the stream's first batches change from one epoch to the next",
                    changes=True,
                )
            return
        epoch0 = list(recorder.indices)
        recorder.indices.clear()
        self.take(loader)
        epoch1 = list(recorder.indices)
        head = lambda order: ", ".join(map(str, order[:6])) + (", ..." if len(order) > 6 else "")  # noqa: E731
        details = [f"epoch 0 starts {head(epoch0)}", f"epoch 1 starts {head(epoch1)}"]
        if (
            len(epoch0) > 1
            and epoch0 == sorted(epoch0)
            and epoch0 == list(range(epoch0[0], epoch0[0] + len(epoch0)))
        ):
            self.add(
                "shuffle",
                FAIL,
                "shuffle=True read the samples in order: the sampler does not shuffle",
                details,
                changes=False,
            )
        elif len(epoch0) > 1 and epoch0 == epoch1:
            self.add(
                "shuffle",
                FAIL,
                "a shuffled loader repeats the same order every epoch (is set_epoch called?)",
                details,
                changes=False,
            )
        else:
            self.add(
                "shuffle",
                OK,
                "a shuffled loader changes the order from one epoch to the next",
                details,
                changes=True,
            )

    def check_labels(self) -> None:
        if self.label_path is None:
            self.add(
                "labels",
                SKIP,
                "no label field (an int named label/labels/target/y, or a tuple's last int)",
            )
            return
        name = _field_name(self.label_path)
        targets = getattr(self.dataset, "targets", None)
        source = "the dataset's targets"
        pool: Sequence[int] | np.ndarray
        try:
            pool = (
                np.asarray(targets).ravel()
                if targets is not None and len(targets) == self.length
                else []
            )
        except TypeError:
            pool = []
        if len(pool) == 0 or np.asarray(pool).dtype.kind not in "iu":
            pool, source = (
                (self.labels, "the first samples" if self.iterable else "a random sample")
                if self.labels
                else (self.batch_labels, "the first batches")
            )
        counts = Counter(int(v) for v in pool)
        if not counts:
            self.add("labels", SKIP, f"no labels seen in {name}")
            return
        shown = sorted(counts.items())
        text = ", ".join(f"{k}: {v}" for k, v in shown[:_MAX_CLASSES_SHOWN])
        if len(shown) > _MAX_CLASSES_SHOWN:
            text += f", ... ({len(shown) - _MAX_CLASSES_SHOWN} more)"
        n, k = sum(counts.values()), len(counts)
        batch_counts = Counter(self.batch_labels)
        details = [f"counts over {source} ({n}): {text}"]
        if batch_counts:
            details.append(
                f"in the first batches: {len(batch_counts)} classes in {sum(batch_counts.values())} samples"
            )
        data = {"field": name, "counts": dict(shown), "source": source}
        (top, top_n), (rare, rare_n) = (
            counts.most_common(1)[0],
            min(counts.items(), key=lambda kv: (kv[1], kv[0])),
        )
        if n >= _MIN_LABELS_FOR_BALANCE and k == 1:
            self.add(
                "labels",
                WARN,
                f"{name} holds a single class ({top}) in {n} samples: check the labels",
                details,
                **data,
            )
        elif n >= _MIN_LABELS_FOR_BALANCE and top_n / rare_n >= _IMBALANCE_RATIO:
            self.add("labels", WARN, (
                f"{name} is imbalanced: class {top} has {top_n / n:.0%} of {n} samples, {top_n / rare_n:.0f}x "
                f"class {rare}; consider WeightedRandomSampler or a weighted loss"
            ), details, **data)  # fmt: skip
        else:
            self.add(
                "labels",
                OK,
                f"{name}: {k} {_plural(k, 'class')}, most common {top} ({top_n / n:.0%})",
                details,
                **data,
            )

    # offline mean and std ------------------------------------------------------------
    def check_stats(self) -> None:
        """One pass over ``stats_samples`` random samples: the statistics, and labels."""
        if self.image_path is None:
            self.add("stats", SKIP, "no image or float array field to compute a mean and std over")
            if self.label_path is None:
                return
        name = _field_name(self.image_path) if self.image_path is not None else ""
        if self.iterable:
            source: Any = self.loader(self.dataset, batch_size=None)
            items: Iterator[Any] = itertools.islice(iter(source), self.stats_samples)
        else:
            if self.length is None:
                raise AssertionError("a map-style dataset reached the stats check without a length")
            count = min(self.stats_samples, self.length)
            picks = np.sort(
                np.random.default_rng(self.seed).choice(self.length, size=count, replace=False)
            ).tolist()
            items = iter(self.loader(self.dataset, batch_size=None, sampler=picks))
        stats, seen, skipped, layout, pixels = _ChannelStats(), 0, 0, None, True
        for sample in items:
            if self.label_path is not None:
                label = _as_array(_get(sample, self.label_path))
                if label is not None and label.ndim == 0:
                    self.labels.append(int(label))
            if self.image_path is None:
                continue
            array = _as_array(_get(sample, self.image_path))
            if array is None or array.size == 0:
                skipped += 1
                continue
            this = _stats_layout(array)
            x = _channels(array, this)
            if stats.mean is not None and x.shape[0] != stats.mean.shape[0]:
                skipped += 1
                continue
            layout = layout or this
            pixels = (
                pixels
                and this in ("CHW", "HWC", "HW")
                and (
                    array.dtype == np.uint8
                    or (array.min() >= 0 and array.max() <= 255 and array.max() > 2)
                )
            )
            stats.add(x)
            seen += 1
        if self.image_path is None:
            return
        if not seen or stats.mean is None:
            self.add("stats", FAIL, f"no sample had a usable {name} to compute statistics over")
            return
        raw_mean, raw_std = stats.mean, stats.std
        scale = 255.0 if pixels else 1.0
        mean, std = (
            tuple(float(v) for v in raw_mean / scale),
            tuple(float(v) for v in raw_std / scale),
        )
        if layout == "features":
            channels = f"{len(mean)} {_plural(len(mean), 'feature')}"
        else:
            channels = f"{len(mean)} {_plural(len(mean), 'channel')}" + (
                f", {layout}" if layout else ""
            )
        message = f"mean and std of {name} over {seen} samples ({channels})"
        details = [f"mean = {_format(mean)}", f"std  = {_format(std)}"]
        if scale != 1.0:
            details.insert(
                0, "on the 0-1 scale (pixels / 255), as Normalize after ToTensor expects:"
            )
            details.append(f"raw 0-255 scale: mean = {_format(raw_mean)}, std = {_format(raw_std)}")
        details.append(f"paste: Normalize(mean={_format(mean)}, std={_format(std)})")
        if skipped:
            details.append(
                f"({skipped} samples left out: no such field or a different channel count)"
            )
        if all(abs(m) < 0.1 for m in mean) and all(abs(s - 1) < 0.1 for s in std):
            message += "; already standardised (mean ~0, std ~1)"
        self.add(
            "stats",
            OK,
            message,
            details,
            field=name,
            samples=seen,
            mean=list(mean),
            std=list(std),
            scale=scale,
        )
        self.stats = (name, mean, std)


def _positive(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        kind = "a positive integer" if minimum == 1 else "a non-negative integer"
        msg = f"{name} must be {kind}, got {value!r}"
        raise ValueError(msg)
    return int(value)


def check(
    dataset: Any,
    *,
    batch_size: int = 32,
    num_batches: int = 3,
    stats_samples: int = 200,
    num_workers: int = 0,
    index: int = 0,
    seed: int = 0,
    target: str | None = None,
) -> DoctorReport:
    """Runs the self-checks over ``dataset`` and returns what they found.

    Args:
        dataset: a map-style dataset (``__getitem__`` and ``__len__``) or an
            iterable dataset (index-based checks are then skipped).
        batch_size: the batch size of the loader the batch checks use.
        num_batches: how many batches to load per epoch (two epochs are loaded).
        stats_samples: how many samples (drawn at random without replacement) the
            mean and std are computed over.
        num_workers: loader workers (thread workers) for the batches and statistics.
        index: the sample to inspect and fetch twice.
        seed: seeds the shuffled loader and the choice of samples for the statistics.
        target: how the report names the dataset (default: its ``repr``).

    Returns:
        A :class:`DoctorReport`; ``print(report)`` shows it, ``report.exit_code`` is 0
        when no check failed.

    Example:
        >>> report = check([(float(i), i % 2) for i in range(40)], batch_size=8, num_batches=2)
        >>> report.ok, next(f.message for f in report.findings if f.check == "labels")
        (True, 'sample[1]: 2 classes, most common 0 (50%)')
    """
    doctor = _Doctor(
        dataset,
        batch_size=_positive("batch_size", batch_size),
        num_batches=_positive("num_batches", num_batches),
        stats_samples=_positive("stats_samples", stats_samples),
        num_workers=_positive("num_workers", num_workers, minimum=0),
        index=_positive("index", index, minimum=0),
        seed=_positive("seed", seed, minimum=0),
    )
    if target is None:
        text = repr(dataset)
        if text.startswith("<") and " object at 0x" in text:  # the default repr says little
            try:
                size = f"len={len(dataset)}"
            except Exception:  # no length, or a broken one: the length check reports it
                size = ""
            text = f"{type(dataset).__name__}({size})"
        target = text if len(text) <= 120 else text[:117] + "..."
    doctor.run("length", doctor.check_length)
    usable = not any(f.status == FAIL for f in doctor.findings)
    if usable:
        doctor.run("sample", doctor.check_sample)
        usable = doctor.sample is not None
    if usable:
        doctor.run("transform", doctor.check_transform)
        doctor.run("workers", doctor.check_workers)
        doctor.run("batches", doctor.check_batches)
        doctor.run("stats", doctor.check_stats)
        doctor.run("labels", doctor.check_labels)
    else:
        doctor.add(
            "checks", SKIP, "the remaining checks need a sample; fix the failure above first"
        )
    stats = doctor.stats
    findings = _ordered(doctor.findings)
    return DoctorReport(
        target,
        findings,
        stats_field=stats[0] if stats else None,
        mean=stats[1] if stats else None,
        std=stats[2] if stats else None,
    )


_ORDER = (
    "length",
    "sample",
    "transform",
    "workers",
    "batches",
    "labels",
    "shuffle",
    "stats",
    "checks",
)


def _ordered(findings: list[Finding]) -> tuple[Finding, ...]:
    """Findings grouped by check in reading order (labels are computed after the stats pass)."""
    rank = {name: i for i, name in enumerate(_ORDER)}
    return tuple(sorted(findings, key=lambda f: rank.get(f.check, len(rank))))
