"""The data of a training: tensors in memory (:class:`TrainData`), moved to the device once, and the
epoch's batches, a function of (seed, epoch) only.

The data are tensors and a batch is one ``index_select`` (no DataLoader, no per-image Python). The whole
data set goes to the device once, at the start, when it takes at most half the free device memory
(MNIST: 188 MB); otherwise it stays in CPU memory and each batch is copied with ``non_blocking=True``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import torch
import torch.nn as nn

from gatepool.train.config import TrainConfig

Batch = tuple[torch.Tensor, torch.Tensor]  # (inputs, targets)


class TrainData(NamedTuple):
    """In-memory tensors: images (N, C, H, W) float32, already normalized; labels (N,) int64."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


def load_data(config: TrainConfig, data: TrainData | None = None) -> TrainData:
    """The normalized train and test tensors of ``config.data`` (or ``data``), cut to the subsets."""
    if data is None:
        from gatepool.data import dataset_names, load

        if config.data not in dataset_names():
            known = sorted(dataset_names())
            raise ValueError(f"data must be one of {known} (or pass train(data=...)), got {config.data!r}")
        train_ds = load(config.data, "train", data_dir=config.data_dir)
        test_ds = load(config.data, "test", data_dir=config.data_dir)
        data = TrainData(train_ds.images, train_ds.labels, test_ds.images, test_ds.labels)  # uint8 (N, H, W)
        normalize = lambda images: _normalize(images, train_ds.mean, train_ds.std)  # noqa: E731
    else:
        data = TrainData(*data)  # a plain 4-tuple works too
        normalize = lambda x: x.float()  # noqa: E731
    if len(data.train_x) != len(data.train_y) or len(data.test_x) != len(data.test_y):
        raise ValueError("data: images and labels must have the same length")
    train_idx = _subset(len(data.train_y), config.train_size, config.subset_seed, "train_size")
    test_idx = _subset(len(data.test_y), config.test_size, config.subset_seed, "test_size")
    return TrainData(
        normalize(_pick(data.train_x, train_idx)).contiguous(),
        _pick(data.train_y, train_idx).long().contiguous(),
        normalize(_pick(data.test_x, test_idx)).contiguous(),
        _pick(data.test_y, test_idx).long().contiguous(),
    )


def _normalize(images: torch.Tensor, mean: float, std: float) -> torch.Tensor:
    """uint8 (N, H, W) -> float32 (N, 1, H, W): (x/255 − mean)/std, the training set's mean and std."""
    x = images.unsqueeze(1).to(torch.float32).div_(255.0)
    return x.sub_(mean).div_(std)


def _pick(t: torch.Tensor, idx: torch.Tensor | None) -> torch.Tensor:
    return t if idx is None else t.index_select(0, idx)


def _subset(n: int, size: int | None, seed: int, name: str) -> torch.Tensor | None:
    if size is None or size == n:
        return None
    if size > n:
        raise ValueError(f"{name} must be <= {n} (the split's size), got {size}")
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:size]


def data_to_device(data: TrainData, device: torch.device) -> TrainData:
    """``data`` moved to ``device`` once, when it fits (at most half the free memory of a GPU); else as it
    is, and each batch is copied on its way (``train_epoch``, ``evaluate``)."""
    if all(t.device == device for t in data):
        return data
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if sum(t.numel() * t.element_size() for t in data) > free // 2:
            return data
    return TrainData(*(t.to(device) for t in data))



def model_device(model: nn.Module) -> torch.device:
    """Where ``model``'s first parameter (or buffer) lives; the CPU for a model without either."""
    for t in (*model.parameters(), *model.buffers()):
        return t.device
    return torch.device("cpu")



def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit seed for epoch ``epoch`` that depends on (seed, epoch) only."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1, np.uint64)[0] >> np.uint64(1))


def data_batches(data: TrainData, batch_size: int, generator: torch.Generator) -> Iterator[Batch]:
    """Every training example once, in the order ``randperm(N, generator)``: ((B, ...), (B,)) per batch."""
    x, y = data.train_x, data.train_y
    perm = torch.randperm(len(y), generator=generator).to(x.device)  # drawn on the CPU: one order anywhere
    for i in range(0, len(y), batch_size):
        idx = perm[i : i + batch_size]  # (B,)
        yield x.index_select(0, idx), y.index_select(0, idx)


def epoch_steps(config: TrainConfig, data: TrainData | None, drawn: bool) -> int:
    """Batches per epoch: ``config.steps_per_epoch``, or (for the data set's batches) one pass over it."""
    if drawn:
        if config.steps_per_epoch is None:
            raise ValueError("steps_per_epoch must be set (an integer >= 1) when train(batches=...) draws "
                             "the batches: it fixes the schedule's length")  # fmt: skip
        return config.steps_per_epoch
    full = math.ceil(len(data.train_y) / config.batch_size)
    if config.steps_per_epoch is not None and config.steps_per_epoch > full:
        raise ValueError(f"steps_per_epoch must be <= {full} (one pass over {len(data.train_y)} training "
                         f"examples in batches of {config.batch_size}), got {config.steps_per_epoch}")
    return full if config.steps_per_epoch is None else config.steps_per_epoch
