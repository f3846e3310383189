"""A small real training loop: losses are bit-identical with num_workers=0 and 2."""

from __future__ import annotations

import numpy as np
import pytest

from stoker import DataLoader

torch = pytest.importorskip("torch", reason="trains a tiny torch model")


class NoisyRegression:
    """y = x @ w + noise, with a random flip-and-jitter augmentation per sample."""

    def __init__(self, n: int = 96) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.normal(size=(n, 8)).astype(np.float32)
        self.y = (self.x @ rng.normal(size=8)).astype(np.float32)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        x = self.x[i].copy()
        if np.random.rand() < 0.5:
            x = x[::-1].copy()
        x += torch.randn(8).numpy() * 0.1  # torch's global RNG, as torchvision transforms use it
        return x, self.y[i]


def train(num_workers: int, worker_mode: str = "process") -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 1)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(
        NoisyRegression(),
        batch_size=8,
        shuffle=True,
        generator=42,
        num_workers=num_workers,
        worker_mode=worker_mode,
        persistent_workers=num_workers > 0,
    )
    losses = []
    for _epoch in range(3):
        for x, y in loader:
            x, y = torch.from_numpy(x), torch.from_numpy(y)
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    loader.close()
    return losses


def test_losses_are_bit_identical_with_and_without_workers() -> None:
    reference = train(0)
    assert len(reference) == 36
    assert np.mean(reference[-12:]) < np.mean(
        reference[:12]
    )  # it trains: the last epoch beats the first
    assert train(2) == reference
    assert train(2, worker_mode="thread") == reference
