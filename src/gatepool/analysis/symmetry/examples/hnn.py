"""Hamiltonian neural network (Greydanus et al. 2019): learn a scalar H(q, p) and move along
``dq/dt = ∂H/∂p, dp/dt = −∂H/∂q``. Along that flow ``dH/dt = ∂H/∂q·∂H/∂p − ∂H/∂p·∂H/∂q = 0``: whatever
its weights, the learned field conserves the learned H. Baseline: an MLP that outputs the vector field
directly, which conserves nothing by construction.

Both are fitted briefly to a harmonic oscillator (H = (q² + p²)/2, field (p, −q)), and each is checked on
the energy it stands for (``conservation_check``, RK4): the HNN on its own H, conserved to the integrator's
error (the drift shrinks 16× or more at dt/2) over t = 20; the baseline on the true energy, which it drifts
away from over t = 100 by the same amount at dt/2 (its fit is not conservative). The HNN's true energy is
off by its fit error only, and stays there: the third report.
"""

from __future__ import annotations

import torch
from torch import nn

from gatepool.analysis.symmetry import ConservationReport, conservation_check
from gatepool.utils.threads import num_threads


def mlp(d_out: int, width: int = 32) -> nn.Sequential:
    return nn.Sequential(nn.Linear(2, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
                         nn.Linear(width, d_out))


class HNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.H = mlp(1)

    def energy(self, x: torch.Tensor) -> torch.Tensor:  # (B, 2) = (q, p)
        return self.H(x)[..., 0]  # (B,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # the field (B, 2)
        with torch.enable_grad():
            x = x if x.requires_grad else x.detach().requires_grad_(True)
            (dH,) = torch.autograd.grad(self.energy(x).sum(), x, create_graph=self.training)
        return torch.stack([dH[..., 1], -dH[..., 0]], -1)  # (∂H/∂p, −∂H/∂q)


class TrueEnergy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * (x**2).sum(-1)


def fit(model: nn.Module, steps: int = 200, seed: int = 0) -> nn.Module:
    """Regress the field on the oscillator's, (q, p) uniform in [−2, 2]²."""
    g = torch.Generator().manual_seed(seed)
    x = 4 * torch.rand(256, 2, generator=g) - 2
    target = torch.stack([x[:, 1], -x[:, 0]], -1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        ((model(x.requires_grad_(True)) - target) ** 2).mean().backward()
        opt.step()
    return model.eval()


def reports(seed: int = 0) -> tuple[list[ConservationReport], list[ConservationReport]]:
    """The network's reports (they pass) and the baseline's (they fail)."""
    with num_threads(1):  # tiny models: one thread is fastest, and a busy machine does not stall it
        torch.manual_seed(seed)
        hnn, plain = fit(HNN(), seed=seed), fit(mlp(2), seed=seed)
        x0 = torch.tensor([[1.0, 0.0], [0.0, 1.5], [1.5, 0.5]])
        long = dict(dt=0.25, steps=400, dtypes=(torch.float64,), rtol=5e-2)  # t = 100: 16 turns
        return ([conservation_check(hnn, hnn.H, x0, dt=0.1, steps=200, rtol=1e-5, name="HNN, its own H"),
                 conservation_check(hnn, TrueEnergy(), x0, **long, name="HNN, the true energy")],
                [conservation_check(plain, TrueEnergy(), x0, **long, name="MLP field, the true energy")])


if __name__ == "__main__":
    for report in sum(reports(), []):
        print(report)
