"""Data-parallel training: one training over N processes started by ``torchrun``.

    torchrun --nproc-per-node N -m gatepool train --epochs 6 --batch-size 128 --out runs/ddp

``torchrun`` sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` (and where the ranks meet); with
``WORLD_SIZE`` > 1, :func:`gatepool.train.train` joins the process group (gloo on the CPU, NCCL on CUDA,
rank r on ``cuda:LOCAL_RANK``) and trains its model wrapped in DistributedDataParallel. One global
batch of B examples, drawn exactly as a single process draws it (every rank holds the whole data set in
memory and the same epoch order from the seed), is split over the N ranks:

    x_r, y_r = tensor_split(x, N)[r], tensor_split(y, N)[r]      # n_r rows each, Σ n_r = B, |n_r − B/N| < 1
    L_r      = loss_fn(f, x_r, y_r) · (n_r · N / B)               # scaled so that DDP's mean over ranks
    ∇θ       = (1/N) Σ_r ∇L_r = ∇ (1/B) Σ_b loss_b                #   is the global batch's mean gradient

so the update is the single process's on the same global batch, up to float32 reduction order, for a
model without stochastic layers: every rank reseeds the same RNG, so dropout would draw the same masks on
every rank (not one process's masks over the whole batch); the package's models have dropout 0 by
default. The
epoch's train loss and accuracy are summed over the ranks (the global ones); every rank evaluates the
whole test set with the same weights (the same numbers everywhere, no gather). Rank 0 alone prints and
writes checkpoints and results (atomically, as always); at the start rank 0 reads (and, if damaged,
repairs) the run folder first, then the other ranks read the same checkpoint, so all resume from one
epoch after a kill of every rank. Normalization layers see their own rank's rows (as in plain DDP): the
package's models use GroupNorm and LayerNorm, which are per example, so this changes nothing for them;
a model with BatchNorm would see batch statistics of B/N rows.

Nothing here runs without ``WORLD_SIZE`` > 1: :func:`from_env` is then rank 0 of 1 and every helper is
a no-op.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn


@dataclass(frozen=True)
class Ranks:
    """This process's place: ``rank`` of ``world`` processes, ``local_rank`` on its machine."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Rank 0: the one that prints and writes."""
        return self.rank == 0

    @property
    def parallel(self) -> bool:
        return self.world > 1


def from_env() -> Ranks:
    """``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` as torchrun sets them; rank 0 of 1 without them."""
    try:
        ranks = Ranks(*(int(os.environ.get(k, d)) for k, d in (("RANK", 0), ("WORLD_SIZE", 1),
                                                                ("LOCAL_RANK", 0))))  # fmt: skip
    except ValueError:
        raise ValueError("RANK, WORLD_SIZE and LOCAL_RANK must be integers (as torchrun sets them), got "
                         f"{[os.environ.get(k) for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK')]}") from None
    if ranks.world < 1 or not 0 <= ranks.rank < ranks.world:
        raise ValueError(f"RANK must be in [0, WORLD_SIZE), got RANK={ranks.rank} WORLD_SIZE={ranks.world}")
    return ranks


def rank_device(device: torch.device, ranks: Ranks) -> torch.device:
    """Under DDP on CUDA, rank r's GPU: ``cuda:LOCAL_RANK``; otherwise ``device`` as it is."""
    if ranks.parallel and device.type == "cuda":
        device = torch.device("cuda", ranks.local_rank)
        torch.cuda.set_device(device)
    return device


@contextlib.contextmanager
def process_group(device: torch.device, ranks: Ranks) -> Iterator[Ranks]:
    """Join the process group for the block when ``ranks.parallel`` (gloo on the CPU, NCCL on CUDA) and
    leave it after (only if this block joined it); a no-op for one process."""
    if not ranks.parallel or dist.is_initialized():
        yield ranks
        return
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"data-parallel training runs on cpu (gloo) or cuda (nccl), not on {device}")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        yield ranks
        dist.barrier()  # every rank is done (rank 0 has written the results) before any leaves
    finally:
        dist.destroy_process_group()


def wrap(model: nn.Module, device: torch.device, ranks: Ranks) -> nn.Module:
    """``model`` in DistributedDataParallel when ``ranks.parallel`` (its parameters broadcast from rank 0)."""
    if not ranks.parallel:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def check_batches(n: int, batch_size: int, ranks: Ranks) -> None:
    """Every global batch of one pass over ``n`` examples must give each rank at least one row."""
    if not ranks.parallel:
        return
    last = n % batch_size or batch_size
    if min(batch_size, last) < ranks.world:
        raise ValueError(f"batch_size {batch_size} over {n} training examples leaves a batch of "
                         f"{min(batch_size, last)} rows for {ranks.world} processes; choose batch_size "
                         f"and train_size so that every batch has at least {ranks.world} rows")  # fmt: skip


def shard(x: torch.Tensor, y: torch.Tensor, ranks: Ranks) -> tuple[torch.Tensor, torch.Tensor, float]:
    """This rank's rows of the global batch (x (B, ...), y (B, ...)) and its loss scale n_r·N/B."""
    if not ranks.parallel:
        return x, y, 1.0
    if len(y) < ranks.world:
        raise ValueError(f"a batch of {len(y)} rows cannot be split over {ranks.world} processes")
    xr, yr = x.tensor_split(ranks.world)[ranks.rank], y.tensor_split(ranks.world)[ranks.rank]
    return xr, yr, yr.numel() * ranks.world / y.numel()


def all_sum(values: list[float | int], device: torch.device, ranks: Ranks) -> list[float]:
    """The sums over the ranks of ``values``, all-reduced as one float64 tensor on ``device`` (no fallback:
    a device without float64 raises)."""
    if not ranks.parallel:
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


@contextlib.contextmanager
def main_first(ranks: Ranks) -> Iterator[None]:
    """Rank 0 runs the block first (e.g. reads, and repairs, the run folder); the others after it."""
    if ranks.parallel and not ranks.main:
        dist.barrier()
    try:
        yield
    finally:
        if ranks.parallel and ranks.main:
            dist.barrier()
