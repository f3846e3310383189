"""The ImageNet training recipe: stoker against NVIDIA DALI's CPU pipeline and torch, side by side.

Run from the repository root in the comparison's own environment (``benchmarks/dali_env.sh``
builds it and runs this script; stoker is imported from ``src/``)::

    benchmarks/dali_env.sh                                    # both image sizes, every loader
    benchmarks/dali_env.sh --sizes small --rounds 7 --json out.json
    benchmarks/dali_env.sh --loaders stoker,dali --batches 6 --no-cost
    PYTHONPATH=src .venv/bin/python benchmarks/bench_vision.py --loaders stoker,torch \\
        --sizes small --rounds 2                              # stoker's own environment, no DALI

A loader whose library is not installed is reported as unavailable, with the reason, and
the run goes on without it.

The recipe, the same for every loader: decode the JPEG, RandomResizedCrop(224,
scale=(0.08, 1), ratio=(3/4, 4/3)), random horizontal flip (p=0.5), ImageNet mean/std
normalisation to float32 CHW, batches of 64 in shuffled order, 2 workers or threads.

Images (written once into ``--data DIR``, by default a folder under the system's temporary
folder, and reused by later runs): photo-like pictures made as ``stoker demo`` makes its own
(smooth colour waves plus sensor-like noise), saved as JPEG at quality 90 in 10 class
folders, and the same files packed with ``stoker pack`` (records ``(jpeg bytes, label)``):

- ``small``: 1,024 images of 500x375 (ImageNet's typical size), ~80 KB each;
- ``large``: 256 photos of 1600x1200, ~800 KB each. An epoch of 15 batches needs 960
  samples, so over this set every loader draws 960 indices per epoch, the 256 files in
  shuffled passes (``RandomSampler(num_samples=960)``; DALI's reader wraps around by itself).

Loaders, each over the same files:

- ``stoker``: ``stoker.vision``'s recipe as its README gives it,
  ``DataLoader(ImageFolder(root, transform=train_transform(224)), batch_size=64,
  shuffle=True, num_workers=2)``, stoker's default ``worker_mode="auto"``;
- ``stoker-thread`` / ``stoker-process``: the same with that ``worker_mode``;
- ``stoker-packed``: ``PackedDataset(packed, transform=DecodeImage(train_transform(224)))``
  in the same loader (default ``worker_mode``);
- ``torch``: ``torch.utils.data.DataLoader(num_workers=2, shuffle=True)`` over a dataset
  written by hand with Pillow and numpy, as a torch user without torchvision writes it
  (Pillow open + RGB, torchvision's RandomResizedCrop parameters, Pillow bilinear resize of
  the crop box, flip, normalisation in numpy, CHW);
- ``dali``: a DALI CPU pipeline (``device_id=None``, ``num_threads=2``, batch 64):
  ``fn.readers.file(random_shuffle=True)`` -> ``fn.decoders.image_random_crop(device="cpu")``
  -> ``fn.resize(224x224)`` -> ``fn.crop_mirror_normalize(mirror=fn.random.coin_flip(),
  mean/std x 255, float, CHW)``, read with ``pipe.run()``.

Method: a round builds every loader afresh, one after the other, in an order rotated by one
loader each round. For each: the first batch is timed from the loader's (or pipeline's)
construction until the batch is in hand (worker or thread start-up, DALI's build and
prefetch included); then the next ``--batches`` (14) batches are timed. Figures are medians
over the rounds (5); a ratio to DALI is taken per round (both measured in the same round)
and reported as the median of those ratios with their range. CPU time of this process (its
threads) and of its child processes is read from ``/proc`` around the timed batches; the CPUs
other processes kept busy meanwhile come from ``/proc/stat``. Every loader's first and last
batch are checked: shape (64, 3, 224, 224), float32, finite, within the range ImageNet
normalisation allows, not constant, labels within the classes.

Per-sample CPU cost (``--no-cost`` skips it): in this process, no workers, one thread, CPU
ms per sample (``time.process_time``, median of 3 passes over 64 images): stoker's file read,
decode (full size, and at the scale the recipe's decode hint asks for when it gives one), each
step of ``train_transform(224)`` on its own, the whole transform, and the whole recipe
(``ImageFolder[i]``, ``PackedDataset[i]``), plus the torch row's Pillow recipe; and DALI's,
from one-thread pipelines (``num_threads=1``, batch 64) that stop after each stage: read,
full decode, random-crop decode, + resize, + crop_mirror_normalize (the whole recipe).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import math
import multiprocessing
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

BATCH = 64
WORKERS = 2
CROP = 224
SCALE = (0.08, 1.0)
RATIO = (3.0 / 4.0, 4.0 / 3.0)
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
# The range ImageNet normalisation maps [0, 1] into, per channel extremes, with some slack.
LOW = min((0.0 - m) / s for m, s in zip(MEAN, STD, strict=True)) - 1e-3
HIGH = max((1.0 - m) / s for m, s in zip(MEAN, STD, strict=True)) + 1e-3
DATA_VERSION = 1  # bump when the images change, so that cached sets are rebuilt
REFERENCE = "dali"
LOADERS = ("stoker", "stoker-thread", "stoker-process", "stoker-packed", "torch", "dali")
STOKER_LOADERS = tuple(n for n in LOADERS if n.startswith("stoker"))


@dataclass(frozen=True, slots=True)
class ImageSet:
    name: str
    images: int
    width: int
    height: int
    classes: int = 10

    @property
    def folder_name(self) -> str:
        return f"v{DATA_VERSION}-{self.images}x{self.width}x{self.height}-c{self.classes}"

    def describe(self) -> str:
        return f"{self.images:,} JPEGs of {self.width}x{self.height}, {self.classes} classes"


SIZES = {
    s.name: s
    for s in (
        ImageSet("small", 1024, 500, 375),
        ImageSet("large", 256, 1600, 1200),
    )
}


@dataclass(frozen=True, slots=True)
class Data:
    """An image set on disk: the class folders and their packed copy."""

    spec: ImageSet
    folder: str  # folder/class_NN/NNNNN.jpg
    packed: str  # the same files, packed by `stoker pack`
    mean_bytes: float


# ----------------------------------------------------------------------------- the images


def photo(rng: np.random.Generator, grid: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """A photo-like picture as `stoker demo` draws its own: colour waves plus noise."""
    yy, xx = grid
    fx, fy, phase = rng.uniform(0.01, 0.08, 3).astype(np.float32)
    waves = np.stack([np.sin(xx * fx + yy * (fy * c) + phase * c) for c in (1, 2, 3)], axis=-1)
    noise = rng.integers(-20, 21, waves.shape, dtype=np.int16)
    return np.clip((waves * 100 + 128).astype(np.int16) + noise, 0, 255).astype(np.uint8)


def ensure_data(root: str, spec: ImageSet) -> Data:
    """The image set in ``root`` (written and packed once, then reused)."""
    home = os.path.join(root, spec.folder_name)
    folder, packed = os.path.join(home, "images"), os.path.join(home, "packed")
    marker = os.path.join(home, "complete.json")
    if not os.path.isfile(marker):
        _progress(f"writing {spec.describe()} into {home} (once) ...")
        start = time.perf_counter()
        os.makedirs(root, exist_ok=True)
        scratch = tempfile.mkdtemp(prefix=f".{spec.folder_name}.build-", dir=root)
        try:
            _write_images(os.path.join(scratch, "images"), spec)
            _pack(os.path.join(scratch, "images"), os.path.join(scratch, "packed"))
            with open(os.path.join(scratch, "complete.json"), "w") as f:
                json.dump(asdict(spec), f)
            if os.path.isdir(home):
                shutil.rmtree(home)  # an incomplete set left by an interrupted run
            os.rename(scratch, home)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        _progress(f"  written and packed in {time.perf_counter() - start:.0f} s")
    sizes = [e.stat().st_size for d in os.scandir(folder) for e in os.scandir(d.path)]
    if len(sizes) != spec.images:
        msg = f"{folder} holds {len(sizes)} files, expected {spec.images}: remove {home}"
        raise RuntimeError(msg)
    return Data(spec, folder, packed, statistics.fmean(sizes))


def _write_images(folder: str, spec: ImageSet) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    grid = np.mgrid[0 : spec.height, 0 : spec.width].astype(np.float32)
    for i in range(spec.images):
        target = os.path.join(folder, f"class_{i % spec.classes:02d}", f"{i:05d}.jpg")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        Image.fromarray(photo(rng, (grid[0], grid[1]))).save(target, format="JPEG", quality=90)


def _pack(folder: str, packed: str) -> None:
    """Packs ``folder`` with ``stoker pack`` (the work tree's stoker, as the loaders use)."""
    command = [sys.executable, "-m", "stoker", "pack", folder, packed]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        msg = f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        raise RuntimeError(msg)


# ----------------------------------------------------------------------------- torch's dataset


def _class_folders(root: str) -> list[tuple[str, int]]:
    """(path, label) of every file, classes and files in sorted order (ImageFolder's)."""
    classes = sorted(d.name for d in os.scandir(root) if d.is_dir())
    return [
        (os.path.join(root, c, name), label)
        for label, c in enumerate(classes)
        for name in sorted(os.listdir(os.path.join(root, c)))
    ]


def random_resized_crop_box(
    width: int, height: int, draw: random.Random | Any = random
) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop parameters: ``(left, top, right, bottom)``."""
    area = width * height
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    for _ in range(10):
        target_area = area * draw.uniform(*SCALE)
        aspect = math.exp(draw.uniform(*log_ratio))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top, left = draw.randint(0, height - h), draw.randint(0, width - w)
            return left, top, left + w, top + h
    in_ratio = width / height
    if in_ratio < RATIO[0]:
        w, h = width, round(width / RATIO[0])
    elif in_ratio > RATIO[1]:
        h, w = height, round(height * RATIO[1])
    else:
        w, h = width, height
    top, left = (height - h) // 2, (width - w) // 2
    return left, top, left + w, top + h


class PillowRecipe:
    """The recipe as a torch user writes it without torchvision: Pillow and numpy.

    Pillow opens and decodes the file (full size), the crop box is drawn as torchvision
    draws it and resized with Pillow's bilinear filter, flipped half the time, then
    normalised and made CHW in numpy. Random draws use Python's ``random``, which torch
    seeds differently in every worker.
    """

    def __init__(self, root: str) -> None:
        self.samples = _class_folders(root)
        self.mean = np.array(MEAN, dtype=np.float32) * 255.0
        self.inv_std = 1.0 / (np.array(STD, dtype=np.float32) * 255.0)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        from PIL import Image

        path, label = self.samples[index]
        with Image.open(path) as image:
            image = image.convert("RGB")
        box = random_resized_crop_box(*image.size)
        image = image.resize((CROP, CROP), Image.Resampling.BILINEAR, box=box)
        if random.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        array = (np.asarray(image, dtype=np.float32) - self.mean) * self.inv_std
        chw = np.ascontiguousarray(array.transpose(2, 0, 1))
        try:
            import torch
        except ImportError:
            return chw, label
        return torch.from_numpy(chw), label


# ----------------------------------------------------------------------------- loaders


class Unavailable(Exception):
    """A loader that cannot run here (its library is not installed)."""


@dataclass
class Built:
    """A loader as a round uses it: its batches, how to stop it, what it reports after."""

    batches: Iterator[tuple[Any, Any]]
    close: Callable[[], None]
    describe: Callable[[], str] = lambda: ""


def build(name: str, data: Data, samples: int, seed: int) -> Built:
    """A fresh loader ``name`` over ``data`` that delivers ``samples`` samples per epoch."""
    try:
        if name.startswith("stoker"):
            return _build_stoker(name, data, samples)
        if name == "torch":
            return _build_torch(data, samples)
        if name == "dali":
            return _build_dali(data, seed)
    except ImportError as error:
        msg = f"{error.name or error} is not installed here"
        raise Unavailable(msg) from error
    raise ValueError(name)


def _build_stoker(name: str, data: Data, samples: int) -> Built:
    import stoker
    from stoker.formats.image_folder import ImageFolder
    from stoker.vision import DecodeImage, train_transform

    dataset: Any
    if name == "stoker-packed":
        from stoker.formats.packed import PackedDataset

        dataset = PackedDataset(data.packed, transform=DecodeImage(train_transform(CROP)))
    else:
        dataset = ImageFolder(data.folder, transform=train_transform(CROP))
    options: dict[str, Any] = {"batch_size": BATCH, "num_workers": WORKERS}
    if len(dataset) >= samples:
        options["shuffle"] = True
    else:  # more samples than files: shuffled passes over the files
        options["sampler"] = stoker.RandomSampler(dataset, num_samples=samples)
    if name in ("stoker-thread", "stoker-process"):
        options["worker_mode"] = name.split("-")[1]
    loader = stoker.DataLoader(dataset, **options)
    iterator = iter(loader)

    def close() -> None:
        del_iterator = getattr(iterator, "close", None)
        if callable(del_iterator):
            del_iterator()
        loader.close()

    def describe() -> str:
        try:
            stats = loader.stats()
        except Exception as error:  # a report only: the figures are taken
            return f"stats() failed: {error!r}"
        mode = getattr(stats, "worker_mode", "") or "?"
        notes = [line.strip() for line in str(stats).splitlines() if "worker_mode" in line]
        return "; ".join([f"ran {mode} workers", *notes])

    return Built(iterator, close, describe)


def _build_torch(data: Data, samples: int) -> Built:
    import torch.utils.data

    dataset = PillowRecipe(data.folder)
    options: dict[str, Any] = {"batch_size": BATCH, "num_workers": WORKERS}
    if len(dataset) >= samples:
        options["shuffle"] = True
    else:
        options["sampler"] = torch.utils.data.RandomSampler(dataset, num_samples=samples)
    loader = torch.utils.data.DataLoader(dataset, **options)
    iterator = iter(loader)

    def close() -> None:
        shutdown = getattr(iterator, "_shutdown_workers", None)  # torch's own, as __del__ does
        if callable(shutdown):
            shutdown()

    return Built(iterator, close)


def dali_recipe_pipeline(
    folder: str, batch_size: int, threads: int, seed: int, stage: str = "recipe"
) -> Any:
    """The DALI CPU pipeline of the recipe; ``stage`` stops it early (for the cost table).

    Stages: ``read`` (the reader alone), ``decode`` (full-size decode), ``crop-decode``
    (``image_random_crop``: only the crop is decoded), ``resize`` (and resized to 224x224),
    ``recipe`` (and ``crop_mirror_normalize``: the whole recipe).
    """
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=None, seed=seed)
    def pipeline() -> Any:
        jpegs, labels = fn.readers.file(file_root=folder, random_shuffle=True, name="Reader")
        if stage == "read":
            return jpegs, labels
        if stage == "decode":
            return fn.decoders.image(jpegs, device="cpu", output_type=types.RGB), labels
        images = fn.decoders.image_random_crop(
            jpegs,
            device="cpu",
            output_type=types.RGB,
            random_area=list(SCALE),
            random_aspect_ratio=list(RATIO),
        )
        if stage == "crop-decode":
            return images, labels
        images = fn.resize(images, resize_x=CROP, resize_y=CROP)
        if stage == "resize":
            return images, labels
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="CHW",
            mean=[m * 255.0 for m in MEAN],
            std=[s * 255.0 for s in STD],
            mirror=fn.random.coin_flip(probability=0.5),
        )
        return images, labels

    pipe = pipeline()
    pipe.build()
    return pipe


def _build_dali(data: Data, seed: int) -> Built:
    import nvidia.dali  # noqa: F401 - a missing DALI is reported before anything is built

    pipe: Any = dali_recipe_pipeline(data.folder, BATCH, WORKERS, seed)

    def batches() -> Iterator[tuple[Any, Any]]:
        while True:
            images, labels = pipe.run()
            # zero-copy views of DALI's buffers (valid until a later run reuses them)
            yield np.asarray(images.as_tensor()), np.asarray(labels.as_tensor())

    def close() -> None:
        nonlocal pipe
        pipe = None  # DALI stops its threads when the pipeline goes away
        gc.collect()

    return Built(batches(), close)


# ----------------------------------------------------------------------------- measuring

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _children(pid: int) -> list[int]:
    """Children, grandchildren, ... of ``pid`` (stoker's own /proc reader)."""
    from stoker._proc import descendants

    return descendants(pid, helpers=True)


def _cpu_s(pids: list[int]) -> float | None:
    """User + kernel CPU seconds of ``pids`` (all their threads); None without /proc."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            if pid == os.getpid():
                return None
            continue  # exited
        total += (int(fields[11]) + int(fields[12])) / _TICKS
    return total


def _machine_busy_s() -> float | None:
    """CPU seconds the whole machine has spent busy since boot."""
    try:
        with open("/proc/stat", "rb") as f:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (
                int(v) for v in f.readline().split()[1:9]
            )
    except (OSError, ValueError):
        return None
    return (user + nice + system + irq + softirq + steal) / _TICKS


def wait_for_idle(limit_s: float, probe_s: float = 0.5, max_cpus: float = 0.3) -> float:
    """Waits up to ``limit_s`` for other processes to leave the CPUs idle; seconds waited."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit_s:
        before = _machine_busy_s()
        if before is None:
            break
        time.sleep(probe_s)
        after = _machine_busy_s()
        if after is not None and (after - before) / probe_s <= max_cpus:
            break
    return time.perf_counter() - start


class BadBatch(AssertionError):
    """A loader delivered a batch that is not what the recipe makes."""


def check_batch(name: str, images: Any, labels: Any, classes: int) -> None:
    """Raises :class:`BadBatch` unless the batch is 64 normalised CHW crops with labels."""
    array = images.numpy() if hasattr(images, "numpy") else np.asarray(images)
    label = labels.numpy() if hasattr(labels, "numpy") else np.asarray(labels)
    label = label.reshape(-1)
    problems = []
    if array.shape != (BATCH, 3, CROP, CROP):
        problems.append(f"shape {array.shape}")
    if array.dtype != np.float32:
        problems.append(f"dtype {array.dtype}")
    if not np.isfinite(array).all():
        problems.append("NaN or infinity")
    elif array.size:
        low, high = float(array.min()), float(array.max())
        if low < LOW or high > HIGH:
            problems.append(f"values in [{low:.3f}, {high:.3f}], outside [{LOW:.3f}, {HIGH:.3f}]")
        if float(array.std()) < 0.05:
            problems.append(f"nearly constant (std {float(array.std()):.4f})")
    if label.shape != (BATCH,) or label.min() < 0 or label.max() >= classes:
        problems.append(f"labels {label[:8]}... (shape {label.shape}), classes 0-{classes - 1}")
    if problems:
        raise BadBatch(f"{name}: " + "; ".join(problems))


@dataclass(slots=True)
class Round:
    rate: float  # timed batches per second
    first_s: float  # construction until the first batch is in hand
    main_cpu_ms: float | None  # this process (its threads), per timed batch
    children_cpu_ms: float | None  # child processes (workers), per timed batch
    other_cpus: float | None  # CPUs other processes kept busy during the timed batches
    note: str = ""


def time_round(name: str, data: Data, batches: int, seed: int) -> Round:
    """One fresh loader: its first batch, then ``batches`` timed batches."""
    gc.collect()
    samples = (1 + batches) * BATCH
    start = time.perf_counter()
    built = build(name, data, samples, seed)
    try:
        images, labels = next(built.batches)
        first_s = time.perf_counter() - start
        check_batch(name, images, labels, data.spec.classes)
        del images, labels
        pids = _children(os.getpid())
        main0, kids0, busy0 = _cpu_s([os.getpid()]), _cpu_s(pids), _machine_busy_s()
        t0 = time.perf_counter()
        for _ in range(batches):
            images, labels = next(built.batches)
        elapsed = time.perf_counter() - t0
        main1, kids1, busy1 = _cpu_s([os.getpid()]), _cpu_s(pids), _machine_busy_s()
        check_batch(name, images, labels, data.spec.classes)
        del images, labels
        note = built.describe()
    finally:
        built.close()
    main_ms = kids_ms = other = None
    if None not in (main0, main1, kids0, kids1):
        main_s, kids_s = main1 - main0, kids1 - kids0  # type: ignore[operator]
        main_ms, kids_ms = main_s / batches * 1e3, kids_s / batches * 1e3
        if busy0 is not None and busy1 is not None:
            other = max(0.0, (busy1 - busy0) - main_s - kids_s) / elapsed
    return Round(batches / elapsed, first_s, main_ms, kids_ms, other, note)


@dataclass
class SizeResult:
    size: str
    description: str
    mean_file_kb: float
    batches: int
    rounds: dict[str, list[Round]] = field(default_factory=dict)
    waited_s: float = 0.0

    def median_rate(self, name: str) -> float:
        return statistics.median(r.rate for r in self.rounds[name])

    def median_first_ms(self, name: str) -> float:
        return statistics.median(r.first_s for r in self.rounds[name]) * 1e3

    def ratios(self, name: str, reference: str, what: str = "rate") -> list[float]:
        """Per-round ratios ``name / reference`` (rates), or ``reference / name`` for times."""
        pairs = zip(self.rounds[name], self.rounds[reference], strict=True)
        if what == "rate":
            return [a.rate / b.rate for a, b in pairs]
        return [a.first_s / b.first_s for a, b in pairs]


def rotated(names: list[str], round_: int) -> list[str]:
    k = round_ % len(names) if names else 0
    return names[k:] + names[:k]


def run_size(
    data: Data,
    names: list[str],
    rounds: int,
    batches: int,
    unavailable: dict[str, str],
    wait_idle_s: float,
) -> SizeResult:
    result = SizeResult(data.spec.name, data.spec.describe(), data.mean_bytes / 1e3, batches)
    for round_ in range(rounds):
        result.waited_s += wait_for_idle(wait_idle_s)
        for name in rotated(names, round_):
            if name in unavailable:
                continue
            try:
                figures = time_round(name, data, batches, seed=1000 * round_ + 7)
            except Unavailable as why:
                unavailable[name] = str(why)
                _progress(f"  {name}: unavailable ({why})")
                continue
            result.rounds.setdefault(name, []).append(figures)
        _progress(
            f"  {data.spec.name} round {round_ + 1}/{rounds}: "
            + "  ".join(
                f"{n} {last.rate:.2f}/s ({last.first_s * 1e3:.0f} ms)"
                for n in names
                if n in result.rounds and len(result.rounds[n]) == round_ + 1
                for last in (result.rounds[n][-1],)
            )
        )
    return result


# ----------------------------------------------------------------------------- CPU per sample


@dataclass(slots=True)
class Cost:
    step: str
    cpu_ms: float  # CPU ms per sample, median of the passes
    wall_ms: float
    note: str = ""


def _per_sample(fn: Callable[[Any], Any], items: list[Any], passes: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per item of ``fn`` over ``items``, median of ``passes`` passes."""
    cpu, wall = [], []
    for _ in range(passes):
        gc.collect()
        c0, w0 = time.process_time(), time.perf_counter()
        for item in items:
            fn(item)
        cpu.append((time.process_time() - c0) / len(items) * 1e3)
        wall.append((time.perf_counter() - w0) / len(items) * 1e3)
    return statistics.median(cpu), statistics.median(wall)


def _step_name(step: Any) -> str:
    text = repr(step)
    return text if len(text) <= 70 else type(step).__name__


def stoker_costs(data: Data, samples: int, passes: int) -> list[Cost]:
    """CPU per sample of stoker's recipe in this process, and of its parts."""
    from stoker.formats.image_folder import ImageFolder
    from stoker.vision import decode_image, train_transform

    transform = train_transform(CROP)
    folder = ImageFolder(data.folder, transform=transform)
    step_k = max(1, len(folder) // samples)
    indices = list(range(0, len(folder), step_k))[:samples]
    paths = [p for p, _ in _class_folders(data.folder)]
    chosen = [paths[i] for i in indices]

    def read(path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    costs = [Cost("read the file", *_per_sample(read, chosen, passes))]
    encoded = [read(p) for p in chosen]
    decoded = [decode_image(b) for b in encoded]
    h, w = decoded[0].shape[:2]
    costs.append(Cost("decode, full size", *_per_sample(decode_image, encoded, passes), f"{w}x{h}"))
    hint = getattr(transform, "decode_size_hint", None)
    if hint is not None:
        shape = decode_image(encoded[0], size_hint=hint).shape
        costs.append(
            Cost(
                f"decode at the recipe's hint ({hint!r})",
                *_per_sample(lambda b: decode_image(b, size_hint=hint), encoded, passes),
                f"{shape[1]}x{shape[0]}",
            )
        )
    for factor in (2, 4, 8):  # what DCT-scaled decoding costs, for reference
        if min(h, w) // factor < CROP:
            break
        shape = decode_image(encoded[0], size_hint=(h // factor, w // factor)).shape
        costs.append(
            Cost(
                f"decode at 1/{factor} scale (DCT-scaled), for reference",
                *_per_sample(
                    lambda b, f=factor: decode_image(b, size_hint=(h // f, w // f)),
                    encoded,
                    passes,
                ),
                f"{shape[1]}x{shape[0]}",
            )
        )
    steps = list(getattr(transform, "transforms", None) or [])
    inputs = decoded
    for step in steps:
        outputs = [step(x) for x in inputs]
        costs.append(
            Cost(f"  step: {_step_name(step)}", *_per_sample(step, inputs, passes), _shape(outputs))
        )
        inputs = outputs
    costs.append(
        Cost(
            "train_transform(224), all steps",
            *_per_sample(transform, decoded, passes),
            "on the decoded image",
        )
    )
    costs.append(
        Cost("whole recipe: ImageFolder[i]", *_per_sample(folder.__getitem__, indices, passes))
    )
    try:
        from stoker.formats.packed import PackedDataset
        from stoker.vision import DecodeImage

        packed = PackedDataset(data.packed, transform=DecodeImage(transform))
        costs.append(
            Cost(
                "whole recipe: PackedDataset[i] + DecodeImage",
                *_per_sample(packed.__getitem__, indices, passes),
            )
        )
    except Exception as error:  # a row only
        costs.append(Cost("whole recipe: PackedDataset[i]", math.nan, math.nan, repr(error)))
    pillow = PillowRecipe(data.folder)
    costs.append(
        Cost(
            "the torch row's Pillow recipe [i], for reference",
            *_per_sample(pillow.__getitem__, indices, passes),
        )
    )
    return costs


def _shape(arrays: list[Any]) -> str:
    first = arrays[0]
    shape = getattr(first, "shape", None)
    if shape is None:
        return type(first).__name__
    same = all(getattr(a, "shape", None) == shape for a in arrays)
    dtype = getattr(first, "dtype", "")
    return f"{'x'.join(map(str, shape))} {dtype}" if same else f"varies, {dtype}"


DALI_STAGES = (
    ("read", "read the files (fn.readers.file)"),
    ("decode", "+ decode, full size (fn.decoders.image)"),
    ("crop-decode", "+ decode the random crop only (decoders.image_random_crop)"),
    ("resize", "  + resize to 224x224 (fn.resize)"),
    ("recipe", "  + crop_mirror_normalize: the whole recipe"),
)


def dali_costs(data: Data, runs: int) -> list[Cost]:
    """CPU per sample of one-thread DALI pipelines (batch 64) that stop after each stage."""
    costs = []
    for stage, label in DALI_STAGES:
        pipe = dali_recipe_pipeline(data.folder, BATCH, 1, seed=3, stage=stage)
        for _ in range(3):  # fill the prefetch queue
            pipe.run()
        cpu, wall = [], []
        for _ in range(runs):
            c0, w0 = time.process_time(), time.perf_counter()
            pipe.run()
            cpu.append((time.process_time() - c0) / BATCH * 1e3)
            wall.append((time.perf_counter() - w0) / BATCH * 1e3)
        del pipe
        gc.collect()
        costs.append(Cost(label, statistics.median(cpu), statistics.median(wall)))
    return costs


# ----------------------------------------------------------------------------- report


def environment() -> dict[str, Any]:
    versions: dict[str, str | None] = {}
    for module, dist in (
        ("numpy", "numpy"),
        ("PIL", "pillow"),
        ("simplejpeg", "simplejpeg"),
        ("torch", "torch"),
        ("nvidia.dali", "nvidia-dali-cuda120"),
        ("stoker", "stoker"),
    ):
        try:
            mod = __import__(module, fromlist=["__name__"])
        except ImportError:
            versions[module] = None
            continue
        versions[module] = getattr(mod, "__version__", None) or _dist_version(dist)
    import stoker

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    commit = subprocess.run(
        ["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", root, "status", "--porcelain", "--", "src"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "start_method": multiprocessing.get_start_method(),
        "git_commit": (commit + ("+dirty src" if dirty else "")) or None,
        "stoker_from": os.path.dirname(os.path.abspath(stoker.__file__)),
        "load_average": f"{os.getloadavg()[0]:.2f}",
        "versions": versions,
    }


def _dist_version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _ratio_cell(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x [{min(values):.2f}-{max(values):.2f}]"


def _median_or_dash(values: list[float | None], fmt: str) -> str:
    present = [v for v in values if v is not None]
    return format(statistics.median(present), fmt) if present else "-"


def _render_size(r: SizeResult, names: list[str]) -> list[str]:
    """One image size's table: every loader's medians and ratios, then the notes."""
    lines: list[str] = []
    shown = [n for n in names if n in r.rounds]
    rounds = max((len(v) for v in r.rounds.values()), default=0)
    lines += [
        f"{r.size}: {r.description} (mean file {r.mean_file_kb:.0f} KB); "
        f"{rounds} rounds, 1 + {r.batches} batches of {BATCH} per loader and round",
        "",
    ]
    header = [
        "loader",
        "batches/s",
        "images/s",
        "first batch ms",
        "CPU ms/batch: this process / workers",
    ]
    with_ref = REFERENCE in r.rounds
    if with_ref:
        header += [f"throughput / {REFERENCE} (per round)", f"first batch / {REFERENCE}"]
    rows = []
    for n in shown:
        rate = r.median_rate(n)
        row = [
            n,
            f"{rate:.2f}",
            f"{rate * BATCH:.0f}",
            f"{r.median_first_ms(n):.0f}",
            _median_or_dash([x.main_cpu_ms for x in r.rounds[n]], ".0f")
            + " / "
            + _median_or_dash([x.children_cpu_ms for x in r.rounds[n]], ".0f"),
        ]
        if with_ref:
            if n == REFERENCE:
                row += ["1.00x", "1.00x"]
            else:
                row += [
                    _ratio_cell(r.ratios(n, REFERENCE)),
                    _ratio_cell(r.ratios(n, REFERENCE, "first")),
                ]
        rows.append(row)
    lines += _table(header, rows)
    others = [x.other_cpus for v in r.rounds.values() for x in v if x.other_cpus is not None]
    if others:
        lines += [
            "",
            f"CPUs kept busy by other processes during the timed batches: median "
            f"{statistics.median(others):.2f}, max {max(others):.2f}",
        ]
    if r.waited_s >= 1.0:
        lines += [f"waited {r.waited_s:.0f} s in all for idle CPUs before the rounds"]
    for n in shown:
        notes = sorted({x.note for x in r.rounds[n] if x.note})
        if notes:
            lines += [f"{n}: " + " | ".join(notes)]
    lines += [""]
    return lines


def _render_costs(costs: dict[str, dict[str, list[Cost]]]) -> list[str]:
    """The per-sample CPU cost tables, one per library."""
    lines: list[str] = []

    for who, per_size in costs.items():
        if not per_size:
            continue
        sizes = list(per_size)
        lines += [
            f"CPU ms per sample, {who}, one process, one thread, no workers (wall ms in brackets)",
            "",
        ]
        steps: list[str] = []
        for size_costs in per_size.values():
            for c in size_costs:
                if c.step not in steps:
                    steps.append(c.step)
        rows = []
        for step in steps:
            row = [step]
            for size in sizes:
                found = next((c for c in per_size[size] if c.step == step), None)
                if found is None or math.isnan(found.cpu_ms):
                    row.append("-" if found is None else found.note)
                else:
                    note = f" ({found.note})" if found.note else ""
                    row.append(f"{found.cpu_ms:.2f} [{found.wall_ms:.2f}]{note}")
            rows.append(row)
        lines += _table(["step", *sizes], rows)
        lines += [""]
    return lines


def render(
    results: dict[str, SizeResult],
    costs: dict[str, dict[str, list[Cost]]],
    names: list[str],
    unavailable: dict[str, str],
    env: dict[str, Any],
    command: str,
) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
    lines = [
        f"command: {command}",
        f"machine: {env['cpus']} CPUs, Python {env['python']}, start method "
        f"{env['start_method']}; {versions}; git {env['git_commit']}; {env['date']}; "
        f"1-min load average {env['load_average']} at start, {env['load_average_end']} at end",
        "",
    ]
    for r in results.values():
        lines += _render_size(r, names)
    lines += _render_costs(costs)
    for name, why in unavailable.items():
        lines.append(f"unavailable: {name}: {why}")
    return "\n".join(lines)


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _default_data_dir() -> str:
    return os.path.join(tempfile.gettempdir(), "stoker-bench-vision")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument(
        "--batches", type=int, default=14, help="timed batches after the first (default 14)"
    )
    parser.add_argument(
        "--sizes", default=",".join(SIZES), help="comma-separated subset of %(default)s"
    )
    parser.add_argument(
        "--loaders", default=",".join(LOADERS), help="comma-separated subset of %(default)s"
    )
    parser.add_argument(
        "--data",
        default=_default_data_dir(),
        metavar="DIR",
        help="where the images are written once and reused (default %(default)s)",
    )
    parser.add_argument(
        "--images",
        type=int,
        metavar="N",
        help="N images per size instead of its own count (a quick check; loaders then draw "
        "shuffled passes over them)",
    )
    parser.add_argument("--no-cost", action="store_true", help="skip the per-sample CPU costs")
    parser.add_argument(
        "--cost-samples", type=int, default=64, help="images per pass of the cost table"
    )
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each round, wait up to SECONDS for other processes to leave the CPUs idle",
    )
    parser.add_argument("--json", metavar="OUT", help="also write every per-round figure to OUT")
    args = parser.parse_args(argv)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    names = [n.strip() for n in args.loaders.split(",") if n.strip()]
    if not sizes or any(s not in SIZES for s in sizes):
        parser.error(f"--sizes takes a subset of {','.join(SIZES)}, got {args.sizes!r}")
    if not names or any(n not in LOADERS for n in names):
        parser.error(f"--loaders takes a subset of {','.join(LOADERS)}, got {args.loaders!r}")
    if args.rounds < 1 or args.batches < 1 or args.cost_samples < 1:
        parser.error("--rounds, --batches and --cost-samples must be positive")
    if args.images is not None and args.images < 10:
        parser.error("--images must be at least 10 (one per class)")

    command = " ".join(["python", os.path.relpath(sys.argv[0]), *sys.argv[1:]])
    env = environment()
    _progress(
        f"{env['cpus']} CPUs; stoker from {env['stoker_from']}; "
        f"{args.rounds} rounds of {', '.join(names)}"
    )
    unavailable: dict[str, str] = {}
    specs = {s: SIZES[s] for s in sizes}
    if args.images is not None:
        specs = {s: dataclasses.replace(spec, images=args.images) for s, spec in specs.items()}
    datas = {s: ensure_data(args.data, spec) for s, spec in specs.items()}
    costs: dict[str, dict[str, list[Cost]]] = {"stoker": {}, "DALI": {}}
    start = time.perf_counter()
    if not args.no_cost:
        for s, data in datas.items():
            _progress(f"{s}: CPU per sample")
            if any(n in STOKER_LOADERS for n in names):
                costs["stoker"][s] = stoker_costs(data, args.cost_samples, passes=3)
            if "dali" in names:
                try:
                    costs["DALI"][s] = dali_costs(data, runs=3 if s == "large" else 5)
                except ImportError as error:
                    unavailable["dali"] = f"{error.name or error} is not installed here"
                except Exception:  # a table only: the loaders still run
                    traceback.print_exc()
    results: dict[str, SizeResult] = {}
    for s, data in datas.items():
        _progress(f"{s}: {data.spec.describe()}")
        results[s] = run_size(data, names, args.rounds, args.batches, unavailable, args.wait_idle)
    _progress(f"done in {time.perf_counter() - start:.0f} s")
    env["load_average_end"] = f"{os.getloadavg()[0]:.2f}"
    print()
    print(render(results, costs, names, unavailable, env, command))
    if args.json:
        payload = {
            "command": command,
            "environment": env,
            "unavailable": unavailable,
            "sizes": {k: asdict(v) for k, v in results.items()},
            "costs": {
                w: {s: [asdict(c) for c in v] for s, v in d.items()} for w, d in costs.items()
            },
        }
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
