"""Predicted vs measured correlation stencils, per module (PNG).

plot_stencils(report, path)   one column per module with a map output: the correlation pooled over
                              channels, Σ_c T_c(e) / Σ_c Σ_p √(v_p v_{p+e}), at lags |e| ≤ 4,
                              measured (top) and predicted (bottom, ``predict_correlated``)
"""

from __future__ import annotations

from pathlib import Path

import torch

from gatepool.analysis.probe.correlated import Field, xcorr
from gatepool.analysis.probe.report import ProbeReport
from gatepool.utils.plotting import pyplot, save_png

__all__ = ["pooled_stencil", "plot_stencils"]


def pooled_stencil(f: Field, radius: int = 4) -> torch.Tensor:
    """(2r+1, 2r+1) correlation pooled over channels at lags |e| ≤ r (NaN beyond the map)."""
    C, H, W = f.shape
    s = f.var.clamp_min(0).sqrt()
    G = xcorr(s, s)
    T = (f.corr * G).sum(0)
    rho = T / G.sum(0).clamp_min(1e-300)
    out = torch.full((2 * radius + 1, 2 * radius + 1), float("nan"), dtype=torch.float64)
    rh, rw = min(radius, H - 1), min(radius, W - 1)
    out[radius - rh : radius + rh + 1, radius - rw : radius + rw + 1] = rho[
        H - 1 - rh : H + rh, W - 1 - rw : W + rw
    ]
    return out


def plot_stencils(report: ProbeReport, path: str | Path, max_modules: int = 16, radius: int = 4) -> Path:
    rows = [
        r
        for r in report.rows.values()
        if r.predicted is not None
        and r.predicted.field is not None
        and r.measured_field is not None
        and r.measured_field.shape[1] > 1
    ][:max_modules]
    plt = pyplot()
    fig, axes = plt.subplots(2, max(len(rows), 1), figsize=(1.6 * max(len(rows), 1) + 1, 3.6), squeeze=False)
    for j, r in enumerate(rows):
        for i, (label, f) in enumerate((("measured", r.measured_field), ("predicted", r.predicted.field))):
            ax = axes[i, j]
            im = ax.imshow(pooled_stencil(f, radius).numpy(), vmin=-1, vmax=1, cmap="RdBu_r")
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(r.name, fontsize=6)
            if j == 0:
                ax.set_ylabel(label, fontsize=7)
    fig.colorbar(im if rows else None, ax=axes.ravel().tolist(), shrink=0.6) if rows else None
    fig.suptitle(f"correlation at lags |e| ≤ {radius}, pooled over channels", fontsize=8)
    return save_png(fig, path)
