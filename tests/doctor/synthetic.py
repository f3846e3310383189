"""Synthetic datasets for the doctor's tests, and lookups into the report they get."""

from __future__ import annotations

import numpy as np

from stoker import Dataset, sample_rng
from stoker.doctor import DoctorReport, Finding

__all__ = [
    "SMALL",
    "Images",
    "finding",
    "flags",
    "seeded_noise",
    "standardised",
    "unit_images",
    "unseeded_noise",
]


class Images(Dataset):
    """``(image, label)`` pairs from a fixed array, with an optional transform."""

    def __init__(
        self, images: np.ndarray, labels: np.ndarray | None = None, transform=None
    ) -> None:
        self.images = images
        self.labels = np.arange(len(images)) % 4 if labels is None else labels
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i):
        image = self.images[i]
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[i])


def unit_images(n: int = 64, shape=(3, 16, 16)) -> np.ndarray:
    return np.random.default_rng(0).random((n, *shape)).astype(np.float32)


def standardised(n: int = 64, shape=(3, 16, 16)) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((n, *shape)).astype(np.float32)


def seeded_noise(image: np.ndarray) -> np.ndarray:
    return image + sample_rng().normal(0, 0.1, image.shape).astype(np.float32)


def unseeded_noise(image: np.ndarray) -> np.ndarray:
    return image + np.random.default_rng().normal(0, 0.1, image.shape).astype(np.float32)


def flags(report: DoctorReport) -> set[str]:
    return {f.data["flag"] for f in report.findings if "flag" in f.data}


def finding(report: DoctorReport, check_name: str, status: str | None = None) -> Finding:
    found = [
        f
        for f in report.findings
        if f.check == check_name and (status is None or f.status == status)
    ]
    assert found, f"no {check_name}/{status} finding in:\n{report.render()}"
    return found[0]


SMALL = {"batch_size": 8, "num_batches": 2, "stats_samples": 64}
