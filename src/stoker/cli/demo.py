"""``stoker demo``: the seeds' staged speed-up, reproduced on a synthetic image dataset.

The third seed tunes an image-classification input pipeline in four steps and reports the
step time after each (0.58 s -> 0.35 s -> 0.26 s -> 0.21 s). This command does the same on
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
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from stoker.tuning.sweep import BackgroundLoad

__all__ = ["DemoConfig", "MixUpCollate", "NaiveJpegDataset", "add_parser", "run"]

_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
_BUSY_CPUS = 0.3  # other processes above this many CPUs during a run make it suspect
_DATASET_VERSION = 1  # bump when the synthetic images change, so old caches are rebuilt


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """The demo's sizes.

    Example:
        >>> DemoConfig.full().batch_size, DemoConfig.quick().images
        (32, 96)
    """

    images: int  # JPEG files in the dataset (one epoch covers warm-up + timed batches)
    width: int  # source image size
    height: int
    size: int  # the square the pipeline resizes to
    classes: int
    batch_size: int
    warmup: int  # batches per run not timed (worker start-up, pipeline fill)
    batches: int  # timed batches per run
    step_ms: float  # simulated accelerator time per training step
    workers: int

    @classmethod
    def full(cls) -> DemoConfig:
        return cls(images=1024, width=500, height=375, size=160, classes=10, batch_size=32,
                   warmup=2, batches=30, step_ms=20.0, workers=2)  # fmt: skip

    @classmethod
    def quick(cls) -> DemoConfig:
        return cls(images=96, width=128, height=96, size=48, classes=4, batch_size=16,
                   warmup=1, batches=5, step_ms=5.0, workers=2)  # fmt: skip

    def describe(self) -> str:
        return (
            f"{self.images} JPEGs of {self.width}x{self.height} -> {self.size}x{self.size}, "
            f"batch {self.batch_size}"
        )

    @property
    def name(self) -> str:
        return f"v{_DATASET_VERSION}-{self.images}x{self.width}x{self.height}-c{self.classes}"


# --------------------------------------------------------------------------- the datasets


class NaiveJpegDataset:
    """The seed's baseline: open the file, decode with Pillow, resize, normalise, CHW.

    Example:
        >>> ds = NaiveJpegDataset(["a.jpg"], [0], size=32)
        >>> len(ds)
        1
    """

    def __init__(self, paths: list[str], labels: list[int], size: int) -> None:
        self.paths = paths
        self.labels = labels
        self.size = size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        from PIL import Image

        with Image.open(self.paths[index]) as image:
            image = image.convert("RGB").resize((self.size, self.size), Image.BILINEAR)
        pixels = np.asarray(image, dtype=np.float32) * np.float32(1 / 255)
        chw = ((pixels - _MEAN) / _STD).transpose(2, 0, 1)
        return np.ascontiguousarray(chw), self.labels[index]


class _DecodePacked:
    """A packed ``(jpeg bytes, label)`` record decoded by stoker.vision and resized.

    ``normalise=False`` keeps the image uint8 (CHW) for a batch-level collate to normalise.
    """

    def __init__(self, size: int, normalise: bool) -> None:
        from stoker.vision import IMAGENET_MEAN, IMAGENET_STD, Compose, Normalize, Resize, ToCHW

        steps: list[Callable[[Any], Any]] = [Resize((size, size))]
        if normalise:
            steps.append(Normalize(IMAGENET_MEAN, IMAGENET_STD))
        steps.append(ToCHW())
        self.transform = Compose(steps)
        self.size = size

    def __call__(self, record: tuple[memoryview, int]) -> tuple[np.ndarray, int]:
        from stoker.vision import decode_image

        data, label = record
        return self.transform(decode_image(data, size_hint=(self.size, self.size))), int(label)


class MixUpCollate:
    """A batch-level collate: stack uint8 CHW images, normalise to float32 and MixUp, at once.

    MixUp (Zhang et al., 2018) blends each image with another of the batch,
    ``lam * x + (1 - lam) * x[perm]``, and the one-hot labels the same way, with ``lam``
    drawn from Beta(alpha, alpha). It needs the whole batch, so it belongs in the collate
    function, which runs in the workers. Normalisation is linear, so it is folded into
    the mixing: two multiply-adds over the uint8 batch. Randomness comes from
    ``numpy.random``, which stoker seeds per batch.

    Args:
        classes: the number of classes (labels become soft one-hot rows).
        alpha: the Beta distribution's parameter.
        as_torch: return torch tensors (for ``torch.utils.data``, whose workers move
            tensors through shared memory); stoker takes numpy arrays.

    Example:
        >>> collate = MixUpCollate(classes=3)
        >>> black = np.zeros((3, 4, 4), np.uint8)
        >>> images, targets = collate([(black, 0), (black, 2)])
        >>> images.shape, images.dtype, targets.shape, targets.sum(axis=1).round(3).tolist()
        ((2, 3, 4, 4), dtype('float32'), (2, 3), [1.0, 1.0])
    """

    def __init__(self, classes: int, alpha: float = 0.2, as_torch: bool = False) -> None:
        self.classes = classes
        self.alpha = alpha
        self.as_torch = as_torch
        self._scale = (1 / (255 * _STD)).reshape(1, 3, 1, 1)
        self._shift = (_MEAN / _STD).reshape(1, 3, 1, 1)

    def __call__(self, samples: list[tuple[np.ndarray, int]]) -> tuple[Any, Any]:
        pixels = np.stack([image for image, _ in samples])  # uint8 (N, 3, H, W)
        labels = np.fromiter((label for _, label in samples), dtype=np.int64, count=len(samples))
        n = len(samples)
        lam = np.float32(np.random.beta(self.alpha, self.alpha))
        perm = np.random.permutation(n)
        # lam * norm(x) + (1 - lam) * norm(x[perm]), with norm(x) = x * scale - shift
        images = np.multiply(pixels, self._scale * lam, dtype=np.float32)
        images += np.multiply(pixels[perm], self._scale * (1 - lam), dtype=np.float32)
        images -= self._shift
        targets = np.zeros((n, self.classes), dtype=np.float32)
        targets[np.arange(n), labels] = lam
        targets[np.arange(n), labels[perm]] += 1 - lam
        if self.as_torch:
            import torch

            return torch.from_numpy(images), torch.from_numpy(targets)
        return images, targets


# --------------------------------------------------------------------------- the cache


def _cache_root(explicit: str | None) -> str:
    if explicit:
        return explicit
    base = os.environ.get("STOKER_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "stoker"
    )
    return os.path.join(base, "demo")


def _photo(rng: np.random.Generator, grid: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """A photo-like picture: smooth colour waves plus sensor-like noise (~80 KB at 500x375)."""
    yy, xx = grid
    fx, fy, phase = rng.uniform(0.01, 0.08, 3).astype(np.float32)
    waves = np.stack([np.sin(xx * fx + yy * (fy * c) + phase * c) for c in (1, 2, 3)], axis=-1)
    noise = rng.integers(-20, 21, waves.shape, dtype=np.int16)
    return np.clip((waves * 100 + 128).astype(np.int16) + noise, 0, 255).astype(np.uint8)


@dataclass(frozen=True, slots=True)
class _DemoData:
    folder: str  # images/<class>/<n>.jpg
    packed: str  # the same images as packed shards
    paths: list[str]
    labels: list[int]
    built_s: float  # 0 when reused from the cache


def _build(root: str, config: DemoConfig, say: Callable[[str], None]) -> _DemoData:
    """The demo images (and their packed copy) in ``root``; built once, then reused."""
    from PIL import Image

    from stoker.formats.packed import PackedWriter

    home = os.path.join(root, config.name)
    folder, packed = os.path.join(home, "images"), os.path.join(home, "packed")
    classes = [f"class_{c:02d}" for c in range(config.classes)]
    paths = [
        os.path.join(folder, classes[i % config.classes], f"{i:05d}.jpg")
        for i in range(config.images)
    ]
    labels = [i % config.classes for i in range(config.images)]
    if os.path.isfile(os.path.join(packed, "manifest.json")) and all(
        os.path.isfile(p) for p in paths
    ):
        return _DemoData(folder, packed, paths, labels, 0.0)
    start = time.perf_counter()
    say(
        f"building {config.images} synthetic {config.width}x{config.height} JPEGs "
        f"in {home} (once) ..."
    )
    os.makedirs(root, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=f".{config.name}-", dir=root)
    try:
        rng = np.random.default_rng(0)
        grid = np.mgrid[0 : config.height, 0 : config.width].astype(np.float32)
        with PackedWriter(os.path.join(scratch, "packed"), classes=classes) as writer:
            for path, label in zip(paths, labels, strict=True):
                relative = os.path.relpath(path, folder)
                target = os.path.join(scratch, "images", relative)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                buffer = io.BytesIO()
                Image.fromarray(_photo(rng, (grid[0], grid[1]))).save(
                    buffer, format="JPEG", quality=90
                )
                with open(target, "wb") as f:
                    f.write(buffer.getvalue())
                writer.add((buffer.getvalue(), label), key=relative)
        shutil.rmtree(home, ignore_errors=True)
        os.replace(scratch, home)  # atomic: a half-built cache is never taken for a whole one
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return _DemoData(folder, packed, paths, labels, time.perf_counter() - start)


# --------------------------------------------------------------------------- running a stage


@dataclass(frozen=True, slots=True)
class _Timing:
    step_s: float  # mean wall time per timed step
    wait_share: float  # share of it spent waiting for the next batch
    other_cpus: float | None  # CPUs other processes kept busy meanwhile (BackgroundLoad)


class _Step:
    """The simulated training step: hand the batch to the accelerator, then wait for it.

    With an accelerator the images are copied to it (``non_blocking`` when pinned, so the
    copy overlaps the step) and the step ends by synchronising, as reading the loss does;
    the rest of the step is a sleep, the time a model would take on the accelerator.
    """

    def __init__(self, step_s: float, device: Any) -> None:
        self.step_s = step_s
        self.device = device

    def __call__(self, batch: Any, pinned: bool) -> None:
        start = time.perf_counter()
        if self.device is not None:
            import torch

            images = batch[0]
            if isinstance(images, np.ndarray):
                images = torch.from_numpy(images)
            images.to(self.device, non_blocking=pinned)
        left = self.step_s - (time.perf_counter() - start)
        if left > 0:
            time.sleep(left)
        if self.device is not None:
            torch.cuda.synchronize(self.device)


def _time_run(
    loader: Any, config: DemoConfig, step: _Step, pinned: bool, tick: Callable[[], None]
) -> _Timing:
    iterator = iter(loader)
    for _ in range(config.warmup):
        batch = next(iterator)
        step(batch, pinned)
        del batch
        tick()
    waited = 0.0
    with BackgroundLoad() as load:
        start = time.perf_counter()
        for _ in range(config.batches):
            before = time.perf_counter()
            batch = next(iterator)
            waited += time.perf_counter() - before
            step(batch, pinned)
            del batch
            tick()
        elapsed = time.perf_counter() - start
    del iterator
    return _Timing(elapsed / config.batches, waited / elapsed, load.cpus)


@dataclass(frozen=True, slots=True)
class _Stage:
    number: int
    title: str
    dataset: Any
    options: dict[str, Any]  # DataLoader arguments beyond dataset, batch_size and shuffle
    mixup: bool = False

    @property
    def pinned(self) -> bool:
        return bool(self.options.get("pin_memory"))


def _stages(data: _DemoData, config: DemoConfig) -> list[_Stage]:
    from stoker.formats.packed import PackedDataset

    naive = NaiveJpegDataset(data.paths, data.labels, config.size)
    packed = PackedDataset(data.packed, transform=_DecodePacked(config.size, normalise=True))
    packed_uint8 = PackedDataset(data.packed, transform=_DecodePacked(config.size, normalise=False))
    workers = {"num_workers": config.workers, "pin_memory": True, "persistent_workers": True}
    return [
        _Stage(1, "naive: Pillow, file per sample, main process", naive, {}),
        _Stage(2, f"+ {config.workers} workers, pin_memory, persistent", naive, workers),
        _Stage(3, "+ packed shards via mmap, stoker.vision decode", packed, workers),
        _Stage(
            4,
            "+ prefetch_factor=4, MixUp collate_fn",
            packed_uint8,
            {**workers, "prefetch_factor": 4},
            True,
        ),
    ]


def _loader(library: str, stage: _Stage, config: DemoConfig) -> Any:
    options = dict(stage.options)
    if stage.mixup:
        options["collate_fn"] = MixUpCollate(config.classes, as_torch=library == "torch")
    if library == "torch":
        import torch
        import torch.utils.data

        generator = torch.Generator().manual_seed(0)
        return torch.utils.data.DataLoader(
            stage.dataset,
            batch_size=config.batch_size,
            shuffle=True,
            generator=generator,
            **options,
        )
    if "torch" in sys.modules:
        from stoker.torch import DataLoader
    else:
        from stoker import DataLoader

        options.pop("pin_memory", None)  # pinning needs torch
    return DataLoader(
        stage.dataset, batch_size=config.batch_size, shuffle=True, generator=0, **options
    )


def _close(loader: Any) -> None:
    close = getattr(loader, "close", None)
    if callable(close):
        close()
    # torch's persistent workers stop when the loader's iterator is collected
    gc.collect()


def _accelerator() -> tuple[Any, str]:
    """The accelerator to copy batches to, and a sentence about pinning."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None, (
            "pin_memory: this run does not use torch, so batches are numpy arrays and "
            "nothing is pinned."
        )
    if torch.cuda.is_available():
        device = torch.device("cuda")
        return (
            device,
            f"pin_memory: batches are pinned and copied to {torch.cuda.get_device_name(0)} "
            "with non_blocking=True.",
        )
    return None, (
        "pin_memory: there is no accelerator here, so pinning does nothing "
        "(torch and stoker both skip it); stage 2's gain is the workers'."
    )


# --------------------------------------------------------------------------- output


class _Progress:
    def __init__(self, total: int) -> None:
        try:
            from tqdm import tqdm
        except ImportError:
            self._bar = None
        else:
            self._bar = tqdm(total=total, unit="batch", file=sys.stderr, dynamic_ncols=True)

    def describe(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_description(text)

    def tick(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def say(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text, file=sys.stdout)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _result_line(stage: _Stage, library: str, timing: _Timing, baseline: _Timing | None) -> str:
    speedup = (baseline or timing).step_s / timing.step_s
    line = (
        f"  stage {stage.number} {library:<6} {timing.step_s * 1e3:7.1f} ms/step  {speedup:5.2f}x  "
        f"(waiting for data {timing.wait_share:.0%} of the step)"
    )
    if timing.other_cpus is not None and timing.other_cpus > _BUSY_CPUS:
        line += f" [other processes busy: {timing.other_cpus:.1f} CPUs]"
    return line


def _table(
    stages: list[_Stage], results: dict[tuple[int, str], _Timing], libraries: list[str]
) -> str:
    header = f"{'stage':<52}"
    for library in libraries:
        header += f"  {library + ' ms/step':>15} {'speed-up':>8} {'wait':>5}"
    if len(libraries) == 2:
        header += f"  {'stoker vs torch':>15}"
    lines = [header]
    for stage in stages:
        line = f"{stage.number}. {stage.title:<49}"
        for library in libraries:
            timing, base = results[(stage.number, library)], results[(1, library)]
            speedup = base.step_s / timing.step_s
            line += f"  {timing.step_s * 1e3:15.1f} {speedup:7.2f}x {timing.wait_share:5.0%}"
        if len(libraries) == 2:
            ratio = (
                results[(stage.number, "torch")].step_s / results[(stage.number, "stoker")].step_s
            )
            line += f"  {ratio:14.2f}x"
        lines.append(line)
    return "\n".join(lines)


def _plot(
    path: str,
    stages: list[_Stage],
    results: dict[tuple[int, str], _Timing],
    libraries: list[str],
    config: DemoConfig,
) -> bool:
    from stoker.cli.bench import _pyplot

    plt = _pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / len(libraries)
    for k, library in enumerate(libraries):
        xs = [s.number + (k - (len(libraries) - 1) / 2) * width for s in stages]
        ms = [results[(s.number, library)].step_s * 1e3 for s in stages]
        bars = ax.bar(xs, ms, width, label="stoker" if library == "stoker" else "torch.utils.data")
        base = ms[0]
        for bar, value in zip(bars, ms, strict=True):
            where = (bar.get_x() + bar.get_width() / 2, value)
            text = f"{value:.0f} ms\n{base / value:.2f}x"
            ax.annotate(text, where, ha="center", va="bottom", fontsize=8)
    compute = f"simulated step compute ({config.step_ms:g} ms)"
    ax.axhline(config.step_ms, color="grey", linestyle="--", linewidth=1, label=compute)
    ax.set_xticks(
        [s.number for s in stages],
        [f"{s.number}. {s.title}" for s in stages],
        fontsize=8,
        rotation=12,
    )
    ax.set_ylabel("ms per training step")
    ax.set_title(
        f"stoker demo: {config.describe()}, {os.cpu_count()} CPUs",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    ax.margins(y=0.15)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


# --------------------------------------------------------------------------- the command


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "demo",
        help="reproduce the seeds' staged data-loading speed-up, beside torch.utils.data",
        description="Build a synthetic JPEG dataset in a cache folder (once), then time a "
        "simulated training loop in four stages: naive single-process loading; workers with "
        "pinned memory and persistent workers; packed shards read through mmap; a deeper "
        "prefetch with a batch-level MixUp collate. Each stage runs with stoker and with "
        "torch.utils.data (when installed) on the same dataset object.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny images and few batches (a few seconds)"
    )
    parser.add_argument(
        "--cache",
        default=None,
        help="cache folder (default $STOKER_CACHE/demo or ~/.cache/stoker/demo)",
    )
    parser.add_argument(
        "--plot",
        default=None,
        help="where to save the PNG plot (default: demo.png in the cache folder)",
    )
    parser.add_argument(
        "--step-ms",
        type=float,
        default=None,
        help="simulated accelerator time per training step (default 20; 5 with --quick): "
        "loading gains show only while loading is slower than the step",
    )
    parser.add_argument(
        "--no-torch", action="store_true", help="run stoker only, without the torch reference"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    config = DemoConfig.quick() if args.quick else DemoConfig.full()
    if args.step_ms is not None:
        if not args.step_ms >= 0:
            print(f"stoker demo: --step-ms must be 0 or more, got {args.step_ms}", file=sys.stderr)
            return 2
        config = replace(config, step_ms=args.step_ms)
    libraries = ["stoker"]
    if not args.no_torch:
        try:
            import torch
            import torch.utils.data  # noqa: F401
        except ImportError:
            print(
                "torch is not installed: running stoker alone "
                "(pip install 'stoker[demo]' for the reference)."
            )
        else:
            libraries.append("torch")
    root = _cache_root(args.cache)
    try:
        data = _build(root, config, lambda text: print(text, flush=True))
    except ImportError as exc:
        print(
            f"stoker demo needs Pillow to write its images: pip install 'stoker[demo]' ({exc})",
            file=sys.stderr,
        )
        return 2
    device, pin_note = _accelerator()
    step = _Step(config.step_ms / 1e3, device)
    stages = _stages(data, config)
    print(
        f"stoker demo: {config.describe()}, {config.batches} timed steps per run after "
        f"{config.warmup} warm-up, a simulated {config.step_ms:g} ms of accelerator work per "
        f"step; {os.cpu_count()} CPUs"
    )
    if data.built_s:
        print(
            f"  (built the dataset in {data.built_s:.1f} s; "
            f"later runs reuse {os.path.dirname(data.folder)})"
        )

    progress = _Progress(len(stages) * len(libraries) * (config.warmup + config.batches))
    results: dict[tuple[int, str], _Timing] = {}
    try:
        for stage in stages:
            for library in libraries:
                progress.describe(f"stage {stage.number} {library}")
                with _quiet_pinning():
                    loader = _loader(library, stage, config)
                    try:
                        timing = _time_run(loader, config, step, stage.pinned, progress.tick)
                    finally:
                        _close(loader)
                        del loader
                results[(stage.number, library)] = timing
                progress.say(_result_line(stage, library, timing, results.get((1, library))))
    finally:
        progress.close()

    print()
    print(_table(stages, results, libraries))
    print(
        "speed-up: against stage 1 of the same library. "
        "wait: share of the step spent waiting for the batch."
    )
    print(pin_note)
    busy = [
        t.other_cpus
        for t in results.values()
        if t.other_cpus is not None and t.other_cpus > _BUSY_CPUS
    ]
    if busy:
        print(
            f"note: other processes kept up to {max(busy):.1f} CPUs busy during {len(busy)} of the "
            f"{len(results)} runs; those figures are disturbed. Rerun on a quiet machine."
        )
    plot = args.plot or os.path.join(root, "demo.png")
    if _plot(plot, stages, results, libraries, config):
        print(f"plot: {os.path.abspath(plot)}")
    else:
        print("plot: skipped, it needs matplotlib: pip install 'stoker[cli]'")
    print(f"done in {time.perf_counter() - started:.1f} s")
    return 0


@contextlib.contextmanager
def _quiet_pinning() -> Iterator[None]:
    """Silences the 'no accelerator, pin_memory does nothing' warnings: the demo says it once."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pin", category=UserWarning)
        yield
