"""Torch's intra-op thread count, set for a block and restored after.

    with num_threads(1):        # tiny models: 1 thread is fastest, and a busy machine does not stall it
        train(...)
    # torch.get_num_threads() is back to what it was, even after an exception

The bits of a CPU computation depend on the thread count (a sum split over threads is added in another
order), so a run that must be reproducible states its count and runs inside this block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from gatepool.utils.checks import check_int

__all__ = ["check_threads", "num_threads"]


def check_threads(n: int | None, name: str = "threads") -> int | None:
    """``n`` if it is None or an int ≥ 1, else a ValueError naming ``name``."""
    return check_int(n, name, optional=True)


@contextmanager
def num_threads(n: int | None) -> Iterator[int]:
    """Run the block with ``n`` torch threads (None: leave torch's setting); yield the count in use."""
    check_threads(n)
    old = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        if n is not None:
            torch.set_num_threads(old)
