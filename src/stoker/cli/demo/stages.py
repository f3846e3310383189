"""The four stages, each loaded by stoker and by torch.utils.data, and how a run is timed.

A training step is simulated by :class:`Step`; :func:`time_run` times the steps after
the warm-up and how much of them was spent waiting for data.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker.cli.demo.cache import DemoData
from stoker.cli.demo.config import DemoConfig
from stoker.cli.demo.datasets import MixUpCollate, NaiveJpegDataset, decode_packed
from stoker.tuning.background_load import BackgroundLoad

__all__ = [
    "Stage",
    "Step",
    "Timing",
    "accelerator",
    "build_stages",
    "close_loader",
    "make_loader",
    "quiet_pinning",
    "time_run",
]


@dataclass(frozen=True, slots=True)
class Timing:
    step_s: float  # mean wall time per timed step
    wait_share: float  # share of it spent waiting for the next batch
    other_cpus: float | None  # CPUs other processes kept busy meanwhile (BackgroundLoad)
    own_cpus: float | None = None  # CPUs the loader (trainer and workers) kept busy


class Step:
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


def time_run(
    loader: Any, config: DemoConfig, step: Step, pinned: bool, tick: Callable[[], None]
) -> Timing:
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
    return Timing(elapsed / config.batches, waited / elapsed, load.cpus, load.own_cpus)


@dataclass(frozen=True, slots=True)
class Stage:
    number: int
    title: str
    dataset: Any
    options: dict[str, Any]  # DataLoader arguments beyond dataset, batch_size and shuffle
    mixup: bool = False

    @property
    def pinned(self) -> bool:
        return bool(self.options.get("pin_memory"))


def build_stages(data: DemoData, config: DemoConfig) -> list[Stage]:
    from stoker.formats.packed import PackedDataset

    naive = NaiveJpegDataset(data.paths, data.labels, config.size)
    packed = PackedDataset(data.packed, transform=decode_packed(config.size, normalise=True))
    packed_uint8 = PackedDataset(data.packed, transform=decode_packed(config.size, normalise=False))
    workers = {"num_workers": config.workers, "pin_memory": True, "persistent_workers": True}
    return [
        Stage(1, "naive: Pillow, file per sample, main process", naive, {}),
        Stage(2, f"+ {config.workers} workers, pin_memory, persistent", naive, workers),
        Stage(3, "+ packed shards via mmap, stoker.vision decode", packed, workers),
        Stage(
            4,
            "+ prefetch_factor=4, MixUp collate_fn",
            packed_uint8,
            {**workers, "prefetch_factor": 4},
            True,
        ),
    ]


def make_loader(library: str, stage: Stage, config: DemoConfig) -> Any:
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


def close_loader(loader: Any) -> None:
    close = getattr(loader, "close", None)
    if callable(close):
        close()
    # torch's persistent workers stop when the loader's iterator is collected
    gc.collect()


def accelerator() -> tuple[Any, str]:
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


@contextlib.contextmanager
def quiet_pinning() -> Iterator[None]:
    """Silences the 'no accelerator, pin_memory does nothing' warnings: the demo says it once."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pin", category=UserWarning)
        yield
