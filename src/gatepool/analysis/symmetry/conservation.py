"""The conservation check: does the flow of a (learned) vector field keep a quantity, such as a
Hamiltonian neural net's energy?

Integrate ``dx/dt = F(x)`` from ``x₀`` with a fixed step and record ``Q(x_t) − Q(x₀)`` along the
trajectory. A fixed step has an error of its own: RK4's is O(dt⁴) per unit time, so the drift of a
conserved Q shrinks 16× or more when the step halves (32× on a linear oscillator), while a field that
does not conserve Q drifts by the same amount at any step. The report gives the drift at ``dt`` and at
``dt/2``: a drift that does not shrink is the model's. Leapfrog (kick–drift–kick, for a state
``x = (q, p)`` split in halves along the last axis) is symplectic when the field comes from a separable
H(q, p) = T(p) + V(q); its energy error then stays bounded instead of growing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .check import _cast, _cast_input, _name

METHODS = ("rk4", "leapfrog", "euler")


def _step(field: Callable, x: torch.Tensor, dt: float, method: str) -> torch.Tensor:
    if method == "rk4":
        k1 = field(x)
        k2 = field(x + dt / 2 * k1)
        k3 = field(x + dt / 2 * k2)
        k4 = field(x + dt * k3)
        return x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    if method == "euler":
        return x + dt * field(x)
    q, p = x.chunk(2, dim=-1)  # leapfrog: kick (p), drift (q), kick (p)
    p = p + dt / 2 * field(torch.cat([q, p], -1)).chunk(2, dim=-1)[1]
    q = q + dt * field(torch.cat([q, p], -1)).chunk(2, dim=-1)[0]
    p = p + dt / 2 * field(torch.cat([q, p], -1)).chunk(2, dim=-1)[1]
    return torch.cat([q, p], -1)


def integrate(
    field: Callable[[torch.Tensor], torch.Tensor],
    x0: torch.Tensor,
    dt: float,
    steps: int,
    method: str = "rk4",
) -> torch.Tensor:
    """The trajectory (steps + 1, *x0.shape) of ``dx/dt = field(x)`` from ``x0`` with a fixed step ``dt``
    (``method``: "rk4", "leapfrog" or "euler"). Each step is detached: a field that needs gradients (an
    HNN's ∇H) enables them itself."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not (isinstance(steps, int) and steps >= 1):
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if not dt > 0:
        raise ValueError(f"dt must be > 0, got {dt!r}")
    if method == "leapfrog" and x0.shape[-1] % 2:
        raise ValueError(f"leapfrog splits the last axis into (q, p): it must be even, got {x0.shape[-1]}")
    xs = [x0.detach()]
    for _ in range(steps):
        xs.append(_step(field, xs[-1], dt, method).detach())
    return torch.stack(xs)


@dataclass(frozen=True)
class DriftRow:
    """One dtype: the largest |Q(x_t) − Q(x₀)| along the trajectory at dt and at dt/2, and relative to
    max(|Q(x₀)|)."""

    dtype: str
    max_drift: float
    rel_drift: float
    max_drift_half_step: float

    @property
    def shrink(self) -> float:
        """drift(dt) / drift(dt/2): 16 or more for RK4 when the drift is the integrator's, about 1 when it
        is the field's."""
        return self.max_drift / self.max_drift_half_step if self.max_drift_half_step > 0 else float("inf")


@dataclass(frozen=True)
class ConservationReport:
    name: str
    method: str
    dt: float
    steps: int
    rows: tuple[DriftRow, ...]
    rtol: float

    @property
    def ok(self) -> bool:
        """Every dtype's relative drift within ``rtol``."""
        return all(r.rel_drift <= self.rtol for r in self.rows)

    def max_rel(self, dtype: str | torch.dtype | None = None) -> float:
        dtype = str(dtype).removeprefix("torch.") if dtype is not None else None
        return max(r.rel_drift for r in self.rows if dtype is None or r.dtype == dtype)

    def __str__(self) -> str:
        span = f"{self.method}, dt {self.dt}, {self.steps} steps (t = {self.dt * self.steps:g})"
        lines = [f"{self.name}: {span}: {'pass' if self.ok else 'FAIL'} (rtol {self.rtol:.0e})"]
        for r in self.rows:
            lines.append(f"  {r.dtype:8} max drift {r.max_drift:9.2e}  rel {r.rel_drift:9.2e}  "
                         f"at dt/2 {r.max_drift_half_step:9.2e}  (shrinks {r.shrink:.1f}×)")
        return "\n".join(lines)

    def assert_ok(self) -> None:
        if not self.ok:
            raise AssertionError(f"not conserved:\n{self}")


def conservation_check(
    field: Callable[[torch.Tensor], torch.Tensor],
    quantity: Callable[[torch.Tensor], torch.Tensor],
    x0: torch.Tensor,
    *,
    dt: float,
    steps: int,
    method: str = "rk4",
    dtypes: Sequence[torch.dtype] | None = (torch.float32, torch.float64),
    rtol: float = 1e-4,
    name: str | None = None,
) -> ConservationReport:
    """Integrate ``field`` from ``x0`` (a batch of states) at ``dt`` and ``dt/2`` over the same time, and
    report the drift of ``quantity`` (state → one value per state) in every dtype. Modules are copied
    and cast, as in :func:`check_symmetry`. Passes when ``max |Q(x_t) − Q(x₀)| / max |Q(x₀)| <= rtol``."""
    if not callable(field) or not callable(quantity):
        raise TypeError("field and quantity must be callable")
    rows = []
    for dtype in (None,) if dtypes is None else tuple(dtypes):
        F, Q, x = _cast(field, dtype), _cast(quantity, dtype), _cast_input(x0, dtype)
        drifts = []
        for h, n in ((dt, steps), (dt / 2, 2 * steps)):
            traj = integrate(F, x, h, n, method)
            with torch.no_grad():
                q = torch.stack([Q(s).double() for s in traj])  # (n + 1, ...)
            drifts.append(((q - q[0]).abs().max().item(), q[0].abs().max().item()))
        (d, q0), (d_half, _) = drifts
        dname = str(dtype or x0.dtype).removeprefix("torch.")
        rows.append(DriftRow(dname, d, d / q0 if q0 > 0 else d, d_half))
    return ConservationReport(name or _name(field), method, dt, steps, tuple(rows), rtol)
