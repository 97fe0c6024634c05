"""The lecture's window of four scores and the soft gate's closed form: what soft-gate,
temperature-dial and soft-gradient share.

Max pooling is ``V · hardmax(V)``; soften it to ``V · softmax(V/τ)``:

    out = Σ_j g_j v_j,   g = softmax(v/τ)
    ∂out/∂v_j = g_j (1 + (v_j − out)/τ)        (hard max: 1 for the winner, 0 elsewhere)

The measurements run through ``gatepool.layers`` (the layers a model uses) and autograd (``pool_once``); the
theory beside them is the closed form above (``softmax_theory``), computed in float64 numpy,
independently of the layers. ``printed`` is the tolerance of a value the lecture prints.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from gatepool.lab.claims import Context

# The lecture's window: the strongest 2 × 2 window of Tuesday's top-edge map of the 7 (row 1, column 6).
# It prints the window to two decimals (3.44, 4.11, 8.44, 9.11) and e^v to four or more significant digits
# (31, 61, 4,647, 9,054; Σ 13,794), so its arithmetic ran on the unrounded window: we take v = ln e^v
# (3.434, 4.111, 8.444, 9.111), on which every gate, output and gradient it prints rounds correctly; from
# the two-decimal display, ∂out/∂v₃ comes out 0.1985 instead of the printed .200. The printed e^v are
# rounded too: ln 31 = 3.434 would print as 3.43, and any v₁ in [3.435, 3.445) gives both 3.44 and 31;
# v₁ and v₂ hold gates of .002 and .004, so that choice moves no printed digit. (The map itself is not
# rebuilt: the lecture does not give the filter's weights.)
LECTURE_EXP = [31.0, 61.0, 4647.0, 9054.0]
WINDOW = [round(math.log(e), 6) for e in LECTURE_EXP]


def printed(decimals: int, scale: float = 10.0) -> float:
    """Half a unit in the last printed decimal, plus float32 rounding of a value up to ``scale``."""
    return 0.5 * 10.0**-decimals + 8 * float(np.finfo(np.float32).eps) * scale


TWO_DECIMALS = "half a unit in the lecture's second decimal (±0.005), plus float32 rounding"
THREE_DECIMALS = "half a unit in the lecture's third decimal (±0.0005), plus float32 rounding"


def softmax_theory(v: np.ndarray, tau: float) -> tuple[np.ndarray, float, np.ndarray]:
    """Closed form in float64: gates, output and ∂out/∂v for a window ``v`` at temperature ``tau``."""
    z = (v - v.max()) / tau
    g = np.exp(z) / np.exp(z).sum()
    out = float(g @ v)
    return g, out, g * (1 + (v - out) / tau)


def window_of(ctx: Context) -> torch.Tensor:
    """The setup's window of scores, as one sample of one channel."""
    return torch.tensor(ctx["window"], dtype=torch.float32).view(1, 1, -1)  # (N=1, C=1, L=n)


def pool_once(v: torch.Tensor, gate: str, tau: float = 1.0
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """Pool the whole window once through our layer: (out, gates, ∂out/∂v)."""
    from gatepool.layers import GatedPool1d

    v = v.clone().requires_grad_(True)
    pool = GatedPool1d(v.shape[-1], gate=gate, temperature=tau, return_weights=True)
    out, gates = pool(v)
    (grad,) = torch.autograd.grad(out.sum(), v)
    return out.detach().reshape(()), gates.detach().reshape(-1), grad.reshape(-1)
