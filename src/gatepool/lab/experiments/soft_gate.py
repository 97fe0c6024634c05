"""Experiments 8–11: the gate itself. Max pooling is ``V · hardmax(V)``; soften it to ``V · softmax(V/τ)``.

    out = Σ_j g_j v_j,   g = softmax(v/τ)
    ∂out/∂v_j = g_j (1 + (v_j − out)/τ)        (hard max: 1 for the winner, 0 elsewhere)

The measurements run through ``gatepool.layers`` (the layers a model uses) and autograd; the theory beside
them is the closed form above, computed here in float64 numpy, independently of the layers.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from gatepool.lab.claims import Claim, Context, experiment
from gatepool.utils.checks import check_number
from gatepool.utils.plotting import pyplot

# The lecture's window: the strongest 2 × 2 window of Tuesday's top-edge map of the 7 (row 1, column 6).
# It prints the window to two decimals (3.44, 4.11, 8.44, 9.11) and e^v to four or more significant digits
# (31, 61, 4,647, 9,054; Σ 13,794), so its arithmetic ran on the unrounded window: we take v = ln e^v
# (3.434, 4.111, 8.444, 9.111), on which every gate, output and gradient it prints rounds correctly; from
# the two-decimal display, ∂out/∂v₃ comes out 0.1985 instead of the printed .200. The printed e^v are
# rounded too: ln 31 = 3.434 would print as 3.43, and any v₁ in [3.435, 3.445) gives both 3.44 and 31;
# v₁ and v₂ hold gates of .002 and .004, so that choice moves no printed digit. (The map itself is not
# rebuilt: the lecture does not give the filter's weights.)
LECTURE_EXP = [31.0, 61.0, 4647.0, 9054.0]
LECTURE_EXP_SUM = 13794.0
DISPLAYED_WINDOW = [3.44, 4.11, 8.44, 9.11]
WINDOW = [round(math.log(e), 6) for e in LECTURE_EXP]
TEMPERATURES = [0.01, 0.5, 1.0, 2.0, 100.0]
LECTURE_OUT = {0.01: 9.11, 0.5: 8.97, 1.0: 8.85, 2.0: 8.45, 100.0: 6.34}
LECTURE_DIAL_GATES = {0.5: [None, None, 0.21, 0.79], 2.0: [0.03, 0.04, 0.39, 0.54]}
WINDOW_REF = "lecture, the soft gate on the 7's strongest top-edge window (e^v = 31, 61, 4,647, 9,054)"
DIAL_REF = "lecture, the temperature dial on the same window"
GRADIENT_REF = "lecture, the soft gate's backward on the same window"


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


def _window(ctx: Context) -> torch.Tensor:
    return torch.tensor(ctx["window"], dtype=torch.float32).view(1, 1, -1)  # (N=1, C=1, L=n)


def _gated(v: torch.Tensor, gate: str, tau: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pool the whole window once through our layer: (out, gates, ∂out/∂v)."""
    from gatepool.layers import GatedPool1d

    v = v.clone().requires_grad_(True)
    pool = GatedPool1d(v.shape[-1], gate=gate, temperature=tau, return_weights=True)
    out, gates = pool(v)
    (grad,) = torch.autograd.grad(out.sum(), v)
    return out.detach().reshape(()), gates.detach().reshape(-1), grad.reshape(-1)


# ----------------------------------------------------------------------------- 8. soft-gate


def _soft_gate_claims(setup: dict) -> list[Claim]:
    n = len(setup["window"])
    on_window = setup["window"] == WINDOW
    lecture_gates = [0.002, 0.004, 0.337, 0.656]
    claims = [
        Claim(
            f"exp-{j + 1}",
            f"the printed window's v_{j + 1} = {DISPLAYED_WINDOW[j]} "
            f"gives the printed e^v = {LECTURE_EXP[j]:,.0f}",
            LECTURE_EXP[j],
            0.5 + LECTURE_EXP[j] * math.expm1(0.005),
            "both are rounded: half a unit of e^v plus e^v · (e^0.005 − 1) for the window's two decimals",
            source="arithmetic",
            ref=WINDOW_REF + " (math.exp of the lecture's printed v: its own arithmetic, no code of ours)",
        )
        for j in range(4)
    ]
    claims += [
        Claim(
            "exp-sum",
            "arithmetic: Σ e^v over the window (v = ln of the printed e^v) is the printed 13,794",
            LECTURE_EXP_SUM,
            0.5 + 4 * 0.5,
            "half a unit of the printed sum plus half a unit of each of the four printed e^v "
            "it is built from",
            depends=("window",),
            source="arithmetic",
            ref=WINDOW_REF + " (the window is defined from the printed e^v, so the sum re-adds them)",
        ),
        Claim(
            "max-out",
            "max pool = V · hardmax(V) picks the largest value",
            9.11,
            printed(2),
            TWO_DECIMALS,
            depends=("window",),
            source="arithmetic",
            ref=WINDOW_REF + " (the window's largest printed value, by the max's definition: any correct max "
            "pool meets it, as hard-1…4)",
        ),
        Claim(
            "soft-out",
            "SoftPool (τ = 1) = V · softmax(V)",
            8.85,
            printed(2),
            TWO_DECIMALS,
            depends=("window",),
            source="lecture",
            ref=WINDOW_REF,
        ),
    ]
    claims += [
        Claim(
            f"soft-gate-{j + 1}",
            f"SoftPool gate on v_{j + 1}",
            lecture_gates[j] if on_window and n == 4 else None,
            printed(3, 1.0),
            THREE_DECIMALS,
            depends=("window",),
            source="lecture",
            ref=WINDOW_REF,
        )
        for j in range(n)
    ]
    return claims


@experiment(
    "soft-gate",
    title="max pool is V·hardmax(V); SoftPool is V·softmax(V)",
    order=8,
    setup={"window": WINDOW},
    claims=_soft_gate_claims,
)
def soft_gate(ctx: Context) -> None:
    v = _window(ctx)
    for j, shown in enumerate(DISPLAYED_WINDOW):
        ctx.check(
            f"exp-{j + 1}", math.exp(shown), note=f"ln {LECTURE_EXP[j]:,.0f} = {math.log(LECTURE_EXP[j]):.4f}"
        )
    ctx.check("exp-sum", float(torch.exp(v.double()).sum()), theory=float(np.exp(ctx["window"]).sum()))
    g_th, out_th, _ = softmax_theory(np.array(ctx["window"], dtype=np.float64), 1.0)
    out_max, gates_max, _ = _gated(v, "max")
    out_soft, gates_soft, _ = _gated(v, "soft", 1.0)
    ctx.check("max-out", out_max, theory=max(ctx["window"]))
    ctx.check("soft-out", out_soft, theory=out_th)
    for j, (g, t) in enumerate(zip(gates_soft.tolist(), g_th)):
        ctx.check(f"soft-gate-{j + 1}", g, theory=float(t))
    ctx.data.update(hard_gates=gates_max, soft_gates=gates_soft)
    ctx.note(
        f"window v = ln e^v = {[round(x, 3) for x in ctx['window']]}; hardmax gates "
        f"{[round(float(g), 4) for g in gates_max]}, softmax gates {[round(float(g), 4) for g in gates_soft]}"
    )
    ctx.figure(_gate_panel(), "gate-family.png")


def _gate_panel():
    """ReLU → SiLU beside hardmax → softmax: the same step made soft, as a gate times its input."""
    plt = pyplot()
    y = np.linspace(-4, 4, 401)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax1.plot(y, np.maximum(y, 0), label="ReLU = H(y) · y")
    ax1.plot(y, y / (1 + np.exp(-y)), label="SiLU = σ(y) · y")
    ax1.plot(y, (y > 0).astype(float), ls=":", color="C0", label="gate H(y)")
    ax1.plot(y, 1 / (1 + np.exp(-y)), ls=":", color="C1", label="gate σ(y)")
    ax1.set(xlabel="y", title="an activation is a gate times its input")
    ax1.legend(fontsize=8)
    window = np.array(WINDOW)
    x = np.arange(len(window))
    hard = (window == window.max()).astype(float)
    soft = softmax_theory(window, 1.0)[0]
    ax2.bar(x - 0.2, hard, width=0.4, label="hardmax(V): max pool")
    ax2.bar(x + 0.2, soft, width=0.4, label="softmax(V): SoftPool")
    ax2.set(xticks=x, xticklabels=[f"v={v:.2f}" for v in window], ylabel="gate", title="a pool is a gate too")
    ax2.legend(fontsize=8)
    return fig


# ----------------------------------------------------------------------------- 9. temperature-dial


def _dial_claims(setup: dict) -> list[Claim]:
    on_window = setup["window"] == WINDOW
    claims = [
        Claim(
            f"out-tau{t:g}",
            f"V · softmax(V/τ) at τ = {t:g}",
            LECTURE_OUT.get(t) if on_window else None,
            printed(2),
            TWO_DECIMALS,
            depends=("window",),
            source="lecture",
            ref=DIAL_REF,
        )
        for t in setup["temperatures"]
    ]
    claims += [
        Claim(
            f"gate{j + 1}-tau{t:g}",
            f"the gate on v_{j + 1} at τ = {t:g}",
            gates[j] if on_window else None,
            printed(2, 1.0),
            TWO_DECIMALS,
            depends=("window",),
            source="lecture",
            ref=DIAL_REF,
        )
        for t, gates in LECTURE_DIAL_GATES.items()
        if t in setup["temperatures"]
        for j in range(min(len(gates), len(setup["window"])))
        if gates[j] is not None
    ]
    claims.append(
        Claim(
            "mean-limit",
            "τ → ∞ gives the mean (τ = 1e4 measured)",
            6.28 if on_window else None,
            printed(2),
            TWO_DECIMALS,
            depends=("window",),
            source="lecture",
            ref=DIAL_REF,
        )
    )
    claims.append(
        Claim(
            "max-limit",
            "τ → 0 gives the max (τ = 1e-4 measured)",
            9.11 if on_window else None,
            printed(2),
            TWO_DECIMALS,
            depends=("window",),
            source="lecture",
            ref=DIAL_REF,
        )
    )
    return claims


@experiment(
    "temperature-dial",
    title="τ dials the gate from max (τ→0) through SoftPool (τ=1) to mean (τ→∞)",
    order=9,
    setup={"window": WINDOW, "temperatures": TEMPERATURES},
    claims=_dial_claims,
)
def temperature_dial(ctx: Context) -> None:
    plt = pyplot()
    window = np.array(ctx["window"], dtype=np.float64)
    v = _window(ctx)
    for t in ctx["temperatures"]:
        check_number(t, "--set temperatures (each τ)", 0, low_open=True)
        out, gates, _ = _gated(v, "soft", float(t))
        g_th, out_th, _ = softmax_theory(window, float(t))
        ctx.check(f"out-tau{t:g}", out, theory=out_th)
        for j, shown in enumerate(LECTURE_DIAL_GATES.get(t, ())):
            if shown is not None and j < len(window):
                ctx.check(f"gate{j + 1}-tau{t:g}", gates[j], theory=float(g_th[j]))
    ctx.check("mean-limit", _gated(v, "soft", 1e4)[0], theory=float(window.mean()))
    ctx.check("max-limit", _gated(v, "soft", 1e-4)[0], theory=float(window.max()))

    taus = np.logspace(-2, 2, 81)
    curves = np.stack([_gated(v, "soft", float(t))[1].numpy() for t in taus])  # (T, n)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for j in range(curves.shape[1]):
        ax1.plot(taus, curves[:, j], label=f"g{j + 1} (v={window[j]:g})")
    ax1.axhline(1 / len(window), color="grey", ls=":", lw=1, label="even split")
    ax1.set(xscale="log", xlabel="temperature τ", ylabel="gate", title="gates of softmax(V/τ)")
    ax1.legend(fontsize=8)
    outs = curves @ window
    ax2.plot(taus, outs, color="k")
    ax2.axhline(window.max(), color="C3", ls="--", lw=1, label="max")
    ax2.axhline(window.mean(), color="C0", ls="--", lw=1, label="mean")
    ax2.scatter(
        ctx["temperatures"],
        [softmax_theory(window, t)[1] for t in ctx["temperatures"]],
        zorder=3,
        label="claimed τ",
    )
    ax2.set(xscale="log", xlabel="temperature τ", ylabel="out = V·softmax(V/τ)", title="the output")
    ax2.legend(fontsize=8)
    ctx.figure(fig, "temperature-dial.png")


# ----------------------------------------------------------------------------- 10. soft-gradient


def _gradient_claims(setup: dict) -> list[Claim]:
    on_window = setup["window"] == WINDOW
    n = len(setup["window"])
    hard = [0.0, 0.0, 0.0, 1.0]
    soft = [-0.010, -0.017, 0.200, 0.827]
    claims = [
        Claim(
            f"hard-{j + 1}",
            f"max pool: ∂out/∂v_{j + 1}",
            hard[j] if on_window else None,
            1e-6,
            "exact: the winner passes the gradient, the rest get exact zeros",
            depends=("window",),
            source="arithmetic",
            ref=GRADIENT_REF + " (0/1 by the max's definition: any correct max pool meets it)",
        )
        for j in range(n)
    ]
    claims += [
        Claim(
            f"soft-{j + 1}",
            f"SoftPool: ∂out/∂v_{j + 1} = g_j(1 + (v_j − out))",
            soft[j] if on_window else None,
            printed(3, 1.0),
            THREE_DECIMALS,
            depends=("window",),
            source="lecture",
            ref=GRADIENT_REF,
        )
        for j in range(n)
    ]
    return claims


@experiment(
    "soft-gradient",
    title="the soft gate passes a gradient to every input",
    order=10,
    setup={"window": WINDOW},
    claims=_gradient_claims,
)
def soft_gradient(ctx: Context) -> None:
    v = _window(ctx)
    window = np.array(ctx["window"], dtype=np.float64)
    _, _, grad_hard = _gated(v, "max")
    out_soft, _, grad_soft = _gated(v, "soft", 1.0)
    hard_th = (window == window.max()).astype(float)
    soft_th = softmax_theory(window, 1.0)[2]
    for j in range(len(window)):
        ctx.check(f"hard-{j + 1}", grad_hard[j], theory=float(hard_th[j]))
        ctx.check(
            f"soft-{j + 1}",
            grad_soft[j],
            theory=float(soft_th[j]),
            note=f"closed form g_j(1 + (v_j − out)) = {soft_th[j]:.4f}",
        )
    ctx.note(f"Σ ∂out/∂v = {grad_soft.sum().item():.4f} for the soft gate (shift-equivariance makes it 1)")

    plt = pyplot()
    x = np.arange(len(window))
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.bar(x - 0.2, grad_hard.numpy(), width=0.4, label="max pool (hard)")
    ax.bar(x + 0.2, grad_soft.numpy(), width=0.4, label="SoftPool (soft)")
    ax.axhline(0, color="k", lw=0.8)
    labels = [f"v={w:.2f}" + ("\n< out − 1" if w < float(out_soft) - 1 else "") for w in window]
    ax.set(xticks=x, xticklabels=labels, ylabel="∂out/∂v",  # g_j(1 + v_j − out) < 0 below out − τ
           title="τ = 1: inputs more than τ below the output are pushed down")
    ax.legend(fontsize=8)
    ctx.figure(fig, "soft-gradient.png")


# ----------------------------------------------------------------------------- 11. gradient-share

POOLS = ["max", "avg", "soft", "soft-learned", "attention", "conv"]


def _share_claims(setup: dict) -> list[Claim]:
    return [
        Claim(
            f"{p}",
            f"share of {p}-pool inputs that receive a non-zero gradient at initialization",
            0.25 if p == "max" else 1.0,
            0.01,
            "the share is exact up to ties and gradients that are exactly zero upstream (rare events)",
            source="arithmetic" if p in ("max", "avg", "soft") else "ours",
            ref="lecture, the gradient share: max pool reaches ¼ of its inputs, average and soft pooling all "
            "(by the gates' definitions: one winner in four, or every input a positive weight)"
            if p in ("max", "avg", "soft")
            else "the lecture's 'a soft gate reaches every input', applied to our other gates",
        )
        for p in setup["pools"]
    ]


@experiment(
    "gradient-share",
    title="max pool passes gradient to ¼ of its inputs, soft gates to all",
    order=11,
    setup={"pools": POOLS, "batch": 512, "seed": 0},
    quick={"batch": 64},
    claims=_share_claims,
)
def gradient_share(ctx: Context) -> None:
    from gatepool.data import load_dataset
    from gatepool.models import ResidualCNN

    ds = load_dataset("mnist", "train")
    x = ds.normalized()[: ctx["batch"]]  # (B, 1, 28, 28)
    y = ds.labels[: ctx["batch"]]
    for name in ctx["pools"]:
        torch.manual_seed(ctx["seed"])
        model = ResidualCNN(pool=name)
        inputs: list[torch.Tensor] = []

        def keep_input(_module, args, _inputs=inputs):
            args[0].retain_grad()
            _inputs.append(args[0])

        handles = [
            model.pool1.register_forward_pre_hook(keep_input),
            model.pool2.register_forward_pre_hook(keep_input),
        ]
        try:
            loss = torch.nn.functional.cross_entropy(model(x), y, reduction="sum")
            loss.backward()
        finally:
            for h in handles:
                h.remove()
        nonzero = sum(int((t.grad != 0).sum()) for t in inputs)
        total = sum(t.numel() for t in inputs)
        per_pool = [round(float((t.grad != 0).float().mean()), 4) for t in inputs]
        ctx.check(name, nonzero / total, note=f"pool1 {per_pool[0]}, pool2 {per_pool[1]}")
