"""The tolerances of the flashcards and the definitions, and the relative error they are judged by.

Equalities are checked as the largest difference relative to the output's largest magnitude, against
float32 rounding (rtol 1e-5, as ``gatepool.analysis.symmetry.default_tolerance``); the contrasts ("breaks",
"depends") must exceed 100× that rounding tolerance, a bar of ours (the flashcards give no number).
"""

from __future__ import annotations

import torch

RTOL = 1e-5  # float32 rounding, relative to the output's scale
ROUNDING = "float32 rounding: rtol 1e-5 of the output's largest magnitude (as symmetry.default_tolerance)"
FAR = 100 * RTOL
FAR_WHY = "a difference 100× the float32 rounding tolerance cannot be rounding"


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| / max(1e-12, max |b|), in float64."""
    a, b = a.detach().double(), b.detach().double()
    return (a - b).abs().max().item() / max(1e-12, b.abs().max().item())
