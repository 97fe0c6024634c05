"""What the experiments share: here the helpers any experiment may use; in this package's modules what
one family of experiments shares (its setup, its trainings, its measurements).

    relative_error(a, b) = max |a − b| / max(1e-12, max |b|)      in float64

is how an equality of tensors is judged (against float32 rounding). ``GATES`` is the library's gate list
(``gatepool.layers.GATES``, in its order): the pools an experiment compares when it compares every gate.
"""

from __future__ import annotations

import torch

from gatepool.layers import GATES


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| / max(1e-12, max |b|), in float64: ``a`` against the reference ``b``."""
    a, b = a.detach().double(), b.detach().double()
    return (a - b).abs().max().item() / max(1e-12, b.abs().max().item())


__all__ = ["GATES", "relative_error"]
