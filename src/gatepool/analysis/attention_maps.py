"""Attention's cost and its maps: how many gates, and where one query's gate goes.

Cost: a layer holds one gate per (query, key) pair per head, ``t²`` of them for t tokens, so

    gates = t² · heads · layers,        bytes = gates · bytes_per_value

(12×12 = 144 tokens: 2.1·10⁴ gates; every pixel of a 224×224 image, 50,176 tokens: 2.5·10⁹ gates,
about 10 GB at 4 bytes; 16×16 patches, 196 tokens, cut that by about 65,000).

Map: one row of the gate matrix G (the query token's weights over all 144 tokens of the 12×12 grid),
drawn over the digit's token strengths ``‖x_j‖`` (the L2 norm of each stem token), with the share of
the gate held by the top-k tokens beside the even split ``k / t``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from gatepool.utils.checks import check_int
from gatepool.utils.plotting import pyplot, save_png

__all__ = ["attention_cost", "plot_attention_cost", "plot_attention_map", "token_strengths", "top_k_share"]


def attention_cost(tokens: int, heads: int = 1, layers: int = 1, bytes_per_value: int = 4) -> dict:
    """Gates ``t² · heads · layers`` and the bytes to hold them; returns a dict with both and the inputs."""
    args = dict(tokens=tokens, heads=heads, layers=layers, bytes_per_value=bytes_per_value)
    for name, value in args.items():
        check_int(value, name)
    gates = tokens * tokens * heads * layers
    return dict(tokens=tokens, heads=heads, layers=layers, bytes_per_value=bytes_per_value,
                gates=gates, bytes=gates * bytes_per_value)  # fmt: skip


def token_strengths(tokens: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
    """``‖x_j‖₂`` of each token: (B, T, C) → (B, T), or (B, H, W) when ``grid = (H, W)`` is given."""
    if tokens.ndim != 3:
        raise ValueError(f"tokens must be (B, T, C), got {tuple(tokens.shape)}")
    s = tokens.detach().norm(dim=-1)  # (B, T)
    if grid is not None:
        if grid[0] * grid[1] != s.shape[1]:
            raise ValueError(f"grid {grid} does not hold {s.shape[1]} tokens")
        s = s.reshape(s.shape[0], *grid)
    return s


def top_k_share(gate_row: torch.Tensor, k: int = 3) -> dict:
    """Share of a gate row held by its k largest entries, the even split ``k / t``, and those tokens."""
    row = gate_row.detach().reshape(-1).double()
    if not 0 < k <= row.numel():
        raise ValueError(f"k must be in 1..{row.numel()}, got {k}")
    top = row.topk(k)
    total = row.sum().item()
    return dict(share=top.values.sum().item() / total if total > 0 else 0.0, even_split=k / row.numel(),
                tokens=top.indices.tolist(), gates=top.values.tolist())  # fmt: skip


def plot_attention_map(
    gate_row: torch.Tensor,
    strengths: torch.Tensor,
    query: tuple[int, int],
    path: str | os.PathLike,
    *,
    k: int = 3,
    title: str | None = None,
    image: torch.Tensor | None = None,
) -> dict:
    """Draw one query's gate row over the token strengths and save it as a PNG at ``path``.

    Args:
        gate_row: (T,) or (H, W): the query's gates over the grid's tokens (row-major).
        strengths: (H, W) token strengths (see :func:`token_strengths`) drawn in grey underneath.
        query: (row, col) of the query token; marked with a star.
        k: the top-k tokens are circled and their share reported.
        image: optionally the input digit (h, w), shown in a first panel.

    Returns :func:`top_k_share`'s dict plus ``query`` and the top tokens as (row, col).
    """
    plt = pyplot()

    if strengths.ndim != 2:
        raise ValueError(f"strengths must be (H, W), got {tuple(strengths.shape)}")
    h, w = strengths.shape
    gates = gate_row.detach().reshape(-1).float().cpu()
    if gates.numel() != h * w:
        raise ValueError(f"gate_row has {gates.numel()} entries but strengths is {h}×{w}")
    r, c = query
    if not (0 <= r < h and 0 <= c < w):
        raise ValueError(f"query {query} is outside the {h}×{w} grid")
    info = top_k_share(gates, k)
    top_rc = [divmod(int(j), w) for j in info["tokens"]]
    gates = gates.reshape(h, w).numpy()

    panels = 2 if image is None else 3
    fig, axes = plt.subplots(1, panels, figsize=(3.4 * panels, 3.6))
    if image is not None:
        axes[0].imshow(image.detach().cpu().reshape(image.shape[-2:]).numpy(), cmap="gray_r")
        axes[0].set_title("input")
        axes[0].axis("off")
    ax_s, ax_g = axes[-2], axes[-1]
    ax_s.imshow(strengths.detach().cpu().numpy(), cmap="gray_r")
    ax_s.set_title("token strengths ‖x_j‖")
    ax_g.imshow(strengths.detach().cpu().numpy(), cmap="gray_r", alpha=0.5)
    alpha = 0.9 * gates / max(float(gates.max()), 1e-12)  # small gates fade out, the digit shows through
    im = ax_g.imshow(gates, cmap="Reds", alpha=alpha, vmin=0.0)
    fig.colorbar(im, ax=ax_g, fraction=0.046, pad=0.04)
    for ax in (ax_s, ax_g):
        ax.plot(c, r, marker="*", color="tab:blue", markersize=14, markeredgecolor="white")
        ax.set_xticks([])
        ax.set_yticks([])
    for tr, tc in top_rc:
        ax_g.add_patch(plt.Circle((tc, tr), 0.45, fill=False, color="tab:green", linewidth=2))
    ax_g.set_title(
        f"gate of query ({r}, {c}): top {k} hold {info['share']:.2f}\n(even split {info['even_split']:.3f})"
    )
    if title:
        fig.suptitle(title)
    save_png(fig, path, dpi=120)
    return {**info, "query": (r, c), "top_rc": top_rc}


def plot_attention_cost(
    entries: Sequence[tuple[str, int]], path: str | os.PathLike, *, bytes_per_value: int = 4
) -> list[dict]:
    """Log-scale bar chart of the gates per head per layer, ``t²``, for labelled token counts.

    ``entries``: (label, tokens) pairs, e.g. ``[("12×12 grid", 144), ("224² pixels", 50176)]``.
    Returns the :func:`attention_cost` dict of each entry (with its label).
    """
    plt = pyplot()

    rows = [{"label": label, **attention_cost(t, bytes_per_value=bytes_per_value)} for label, t in entries]
    if not rows:
        raise ValueError("entries must hold at least one (label, tokens) pair")
    fig, ax = plt.subplots(figsize=(1.6 * len(rows) + 2, 3.6))
    bars = ax.bar([r["label"] for r in rows], [r["gates"] for r in rows], color="tab:red")
    ax.set_yscale("log")
    ax.set_ylabel("gates per head per layer (t²)")
    for bar, r in zip(bars, rows):
        label = f"{r['gates']:.1e}\n{_human_bytes(r['bytes'])}"
        x = bar.get_x() + bar.get_width() / 2
        ax.annotate(label, (x, r["gates"]), ha="center", va="bottom", fontsize=8)
    ax.set_ylim(bottom=1, top=max(r["gates"] for r in rows) * 50)
    ax.tick_params(axis="x", labelsize=8)
    save_png(fig, path, dpi=120)
    return rows


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} TB"
