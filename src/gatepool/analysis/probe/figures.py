"""The probe's figures (matplotlib, Agg, PNG): ideal vs measured per layer, histograms, padding maps.

<prefix>_layers.png          bars per tensor: ideal vs measured Var forward, E[g²] backward (log scale)
<prefix>_histograms.png      the values of each tensor; the spike at 0 after a ReLU shows
<prefix>_grad_histograms.png the gradients that have exact zeros: below a ReLU, 75% below a 2×2 max pool
<prefix>_padding_<name>.png  per-position Var(y) / middle beside the share of taps on real inputs
<prefix>_stencils.png        predicted vs measured correlation stencils per module
                             (``correlated_figures``)
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from gatepool.analysis.probe.report import ProbeReport, Row
from gatepool.analysis.probe.theory import padding_variance_map
from gatepool.utils.plotting import pyplot, save_png


def plot_layers(report: ProbeReport, path: str | Path) -> Path:
    """Two bar panels, one pair of bars per tensor: ideal vs measured, forward Var and backward E[g²]."""
    plt = pyplot()
    rows = [r for r in report.rows.values() if r.forward is not None]
    names = [r.name for r in rows]
    panels = [("forward Var", [r.ideal and r.ideal.var for r in rows], [r.forward.var for r in rows])]
    if any(r.backward is not None for r in rows):
        panels.append(
            (
                "backward E[(∂L/∂·)²]",
                [r.ideal and r.ideal.grad_e2 for r in rows],
                [r.backward.e2 if r.backward else None for r in rows],
            )
        )
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(max(6.0, 0.38 * len(rows) + 2), 3.4 * len(panels)), squeeze=False
    )
    x = range(len(rows))
    for ax, (title, ideal, measured) in zip(axes[:, 0], panels):
        ax.bar([i - 0.2 for i in x], [_pos(v) for v in ideal], width=0.4, label="ideal (rules)", color="#9ab")
        ax.bar([i + 0.2 for i in x], [_pos(v) for v in measured], width=0.4, label="measured", color="#d62")
        for i, v in zip(x, ideal):
            if v is None:
                ax.annotate(
                    "—",
                    (i - 0.2, 0),
                    xycoords=("data", "axes fraction"),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    color="#678",
                )
        ax.set_yscale("log")
        ax.set_title(title + ("  (— : no prediction)" if any(v is None for v in ideal) else ""))
        ax.set_xticks(list(x))
        ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_png(fig, path)


def _pos(v: float | None) -> float:
    return v if v is not None and math.isfinite(v) and v > 0 else math.nan


def plot_histograms(
    report: ProbeReport,
    path: str | Path,
    names: list[str] | None = None,
    which: str = "forward",
    max_panels: int = 30,
) -> Path:
    """A histogram per tensor of its sampled values (``which="backward"``: of its gradient), titled
    with the share of exact zeros: the spike at 0 after a ReLU, in the gradient below a max pool."""
    if which not in ("forward", "backward"):
        raise ValueError(f"which must be 'forward' or 'backward', got {which!r}")
    plt = pyplot()
    pick = (lambda r: r.samples) if which == "forward" else (lambda r: r.grad_samples)
    rows: list[Row] = []
    for r in report.rows.values():
        s = pick(r)
        if s is None or not s.numel() or (names is not None and r.name not in names):
            continue
        if any(pick(q).shape == s.shape and torch.equal(pick(q), s) for q in rows):
            continue  # the same tensor again (a container's output is its last child's; Flatten)
        rows.append(r)
    rows = rows[:max_panels]
    cols = min(5, max(1, len(rows)))
    nrows = max(1, math.ceil(len(rows) / cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(2.6 * cols, 2.1 * nrows), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    for ax, r in zip(axes.flat, rows):
        ax.set_visible(True)
        s = pick(r)
        stats = r.forward if which == "forward" else r.backward
        zeros = stats.zero_share if stats else math.nan
        ax.hist(
            s[torch.isfinite(s)].numpy(),
            bins=60,
            histtype="stepfilled",
            color="#d62" if zeros > 0.05 else "#47a",
        )
        ax.set_title(f"{r.name}\n{'zeros' if which == 'forward' else 'g = 0'}: {zeros:.0%}", fontsize=8)
        ax.tick_params(labelsize=6)
        ax.set_yticks([])  # counts say little; the shape and the spike at 0 do
    fig.subplots_adjust(hspace=0.7, wspace=0.3)  # tight_layout costs seconds on 30 panels
    return save_png(fig, path, dpi=80)


def padding_maps(row: Row) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(theory, measured) per-position Var relative to the middle for a conv row with maps, else None."""
    meta = row.meta
    if row.maps is None or row.kind != "Conv2d" or len(meta.get("input_shape", ())) != 4:
        return None  # zero padding is a conv's; a max pool pads with −∞
    if not meta.get("zero_padding") or not any(meta["padding"]):
        return None
    h, w = meta["input_shape"][-2:]
    theory = padding_variance_map(
        h, w, meta["kernel_size"], meta["padding"], meta["stride"], meta["dilation"]
    )
    var = row.maps["var"]
    if theory.shape != var.shape:
        return None
    inner = theory == theory.max()
    return theory, var / var[inner].mean()


def plot_padding(
    theory: torch.Tensor,
    measured: torch.Tensor | None,
    path: str | Path,
    title: str = "",
    annotate: bool = True,
) -> Path:
    """Heat-maps: the share of taps on real inputs, and the measured Var(y) / middle beside it.

    ``annotate`` writes each cell's value (maps up to 16×16).
    """
    plt = pyplot()
    panels = [("ideal: share of taps on real inputs", theory)]
    if measured is not None:
        panels.append(("measured Var(y) / middle", measured))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    for ax, (name, m) in zip(axes[0], panels):
        im = ax.imshow(m.numpy(), vmin=0, vmax=max(1.0, float(m.max())), cmap="viridis")
        h, w = m.shape
        if annotate and h * w <= 256:
            for i in range(h):
                for j in range(w):
                    ax.text(j, i, f"{float(m[i, j]):.2f}", ha="center", va="center", fontsize=5, color="w")
        ax.set_title(name, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.subplots_adjust(wspace=0.3)
    return save_png(fig, path)


def save_figures(
    report: ProbeReport, directory: str | Path, prefix: str = "probe", max_padding_maps: int = 2
) -> list[Path]:
    """Every figure the report supports, written into ``directory``."""
    directory = Path(directory)
    paths = []
    if any(r.forward is not None for r in report.rows.values()):
        paths.append(plot_layers(report, directory / f"{prefix}_layers.png"))
    if any(r.samples is not None for r in report.rows.values()):
        paths.append(plot_histograms(report, directory / f"{prefix}_histograms.png"))
    sparse = [
        r.name
        for r in report.rows.values()  # gradients with exact zeros: below ReLUs and max pools
        if r.grad_samples is not None and r.backward is not None and r.backward.zero_share > 0.01
    ]
    if sparse:
        paths.append(plot_histograms(report, directory / f"{prefix}_grad_histograms.png", sparse, "backward"))
    n = 0
    for r in report.rows.values():
        maps = padding_maps(r)
        if maps is None or n >= max_padding_maps:
            continue
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in r.name)
        paths.append(
            plot_padding(*maps, directory / f"{prefix}_padding_{safe}.png", title=r.name, annotate=False)
        )
        n += 1
    if any(r.predicted is not None and r.measured_field is not None for r in report.rows.values()):
        from gatepool.analysis.probe.correlated_figures import plot_stencils

        paths.append(plot_stencils(report, directory / f"{prefix}_stencils.png"))
    return paths
