"""Small helpers the experiment files share: the lecture's digits, and pyplot (from gatepool.utils)."""

from __future__ import annotations

import torch

from gatepool.utils.plotting import pyplot

__all__ = ["mnist_batch", "pyplot"]


def mnist_batch(n: int = 512, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` MNIST digits, normalized: ((n, 1, 28, 28) float32, (n,) int64)."""
    from gatepool.data import load_dataset

    if n < 1:
        raise ValueError(f"batch must be ≥ 1, got {n}")
    ds = load_dataset("mnist", split)
    if n > len(ds):
        raise ValueError(f"batch={n} is more than the {len(ds)} {split} digits")
    return ds.normalized()[:n], ds.labels[:n]
