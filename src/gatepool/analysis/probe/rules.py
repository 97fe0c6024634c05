"""The probe's rules, by module type: what the lecture's rules say a module does to the moments.

    register_rule(ModuleType, rule)     the rule for ModuleType and its subclasses (a later call replaces it)
    rule_for(module)                    the rule of the nearest registered type in ``type(module).__mro__``

A rule is ``rule(module, site) -> Leaf | Chain | Residual``; ``site.shapes`` is (input shape, output
shape) from the shape pass (None when unknown) and ``site.border`` the border mode of ``predict``:

    Leaf(forward, backward)   the module as one step: forward(x) -> Moments, backward(g, x) -> GradMoments
                              (x: the input's Moments, None when unknown; g: E[(∂L/∂out)²] at the output)
    Chain(names)              the named children one after the other (``nn.Sequential``)
    Residual(names)           ``x + branch(x)``, the branch the named children one after the other

A rule raises :class:`NoRule` (its message becomes the note) where it has no answer: no prediction,
never a guess. Registered here: Conv1d/2d/3d and Linear (their actual E[w²] and fan-in/out), ReLU,
GELU / SiLU / Tanh / Sigmoid / ReLU6 / Hardsigmoid / Hardswish (Gaussian integrals,
``theory.activation_moments``), max
and average pools (torch's and ``GatedPool1d/2d/3d`` with gate "max" / "avg"), AdaptiveAvgPool,
GroupNorm / LayerNorm / BatchNorm / InstanceNorm, Dropout, Flatten, Unflatten, Identity and
``nn.Sequential``. A model file registers the rules of its own blocks (``ResidualCNN``'s block does).

``border="middle"`` (the lecture's rules) predicts a conv for positions whose kernel sees no padding;
``border="average"`` multiplies by the mean of :func:`theory.padding_variance_map`, the figure a
measurement over the whole map should match.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from gatepool.analysis.probe import theory
from gatepool.analysis.probe.registry import Registry
from gatepool.layers import GatedPoolNd

__all__ = [
    "Chain",
    "GradMoments",
    "Leaf",
    "Moments",
    "NoRule",
    "Residual",
    "Rule",
    "Site",
    "activation_leaf",
    "need",
    "register_rule",
    "rule_for",
]


# ---------------------------------------------------------------------------------------------------
# What a rule sees and says
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Moments:
    """Forward: mean and variance of each element, and two optional refinements a rule may set.

    ``within``: the variance inside one channel, over batch and positions, where each channel has a
    mean of its own (a conv or linear layer of an input with mean µ: channel c has mean µ·Σ_k w_ck, so
    ``within = fan_in · E[w²] · Var(x)`` while ``var`` pools ``fan_in · E[w²] · E[x²]``); BatchNorm and
    InstanceNorm divide by it. ``pre_relu``: the input's moments when this is ReLU of a normal, so
    that a max pool after it takes ``ReLU(max of n normals)`` instead of the max of n normals.
    ``parts``: the two independent terms of a sum (a residual add), so that a ReLU of
    ``normal + ReLU(normal)`` takes :func:`theory.relu_of_sum` instead of a normal's moments.
    ``inv_within``: ``mean_c 1/Var_c`` from a conv or linear layer's actual rows (Σ_k w_ck² and its border
    pattern per channel): BatchNorm's backward multiplies by it, ≥ 1/within (Jensen), 3-14% in a ResNet.
    """

    mean: float
    var: float
    within: float | None = None
    pre_relu: Moments | None = None
    parts: tuple[Moments, Moments] | None = None  # the two independent terms of a sum, when known
    inv_within: float | None = None  # the mean over channels of 1 / (each channel's own variance)

    @property
    def e2(self) -> float:
        """E[x²] = Var + mean²."""
        return self.var + self.mean**2


@dataclass(frozen=True)
class GradMoments:
    """Backward: E[g²] of each element's gradient, and the share of exact zeros (None: no rule for it).

    ``winners``: set by a max pool of n taps over ReLU outputs: the gradient sits on each window's winner,
    positive unless the whole window is, so the ReLU before it passes ``1 − Φ(−µ/σ)ⁿ`` of E[g²], not
    ``Φ(µ/σ)`` (g is not independent of x there).
    """

    e2: float
    zero: float | None
    winners: int | None = None


class NoRule(Exception):
    """Raised by a rule that has no answer; the message is the note shown for the module."""


@dataclass(frozen=True)
class Site:
    """Where a module sits: (input shape, output shape) from the shape pass or None, and the border mode."""

    shapes: tuple[tuple[int, ...], tuple[int, ...]] | None
    border: str = "middle"


@dataclass(frozen=True)
class Leaf:
    """The module as one step: ``forward(x) -> Moments``, ``backward(g, x) -> GradMoments``."""

    forward: Callable[[Moments | None], Moments]
    backward: Callable[[GradMoments, Moments | None], GradMoments]


@dataclass(frozen=True)
class Chain:
    """The named children, one after the other."""

    children: tuple[str, ...]


@dataclass(frozen=True)
class Residual:
    """``x + branch(x)``, the branch the named children one after the other: variances add (the branch
    ends in zero-mean weights), and so do E[g²]."""

    branch: tuple[str, ...]


Rule = Callable[[Any, Site], Leaf | Chain | Residual]

_RULES = Registry("module_type", modules=True, functions=False)


def register_rule(module_type: type[nn.Module], rule: Rule | None = None):
    """Use ``rule(module, site)`` for ``module_type`` and its subclasses; returns ``rule``.

    Without ``rule`` it is a decorator: ``@register_rule(MyBlock)`` above ``def my_rule(m, site)``.
    """
    return _RULES.register(module_type, rule)


def rule_for(module: nn.Module) -> Rule | None:
    """The rule registered for the nearest type in ``type(module).__mro__``, or None."""
    return _RULES.lookup(type(module))


def need(value, what: str):
    """``value``, or :class:`NoRule` ("needs <what>") when it is None."""
    if value is None:
        raise NoRule(f"needs {what}")
    return value


# ---------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------


def _mean_sq(t: torch.Tensor | None) -> float:
    return 0.0 if t is None else float(t.detach().double().pow(2).mean())


def _mean(t: torch.Tensor | None) -> float:
    return 0.0 if t is None else float(t.detach().double().mean())


def _all_zero(zero: float | None, n: int) -> float | None:
    """Share of inputs whose n outgoing gradients are all exact zeros: ``zero ** n``.

    Below 1e-12 it is 0.0: the chance of an exact zero is then nil (a ResidualCNN's input would
    otherwise show 1e-100), and a measured share is a count over far fewer than 1e12 elements.
    """
    if zero is None:
        return None
    share = zero**n
    return share if share >= 1e-12 else 0.0


def _within(x: Moments) -> float:
    """The variance inside a channel: ``x.within`` where a rule set it, else ``x.var``."""
    return x.var if x.within is None else x.within


def _inv_mean(per_channel: torch.Tensor) -> float | None:
    """mean_c 1/v_c, None where a channel has no variance."""
    return float((1.0 / per_channel).mean()) if bool((per_channel > 0).all()) else None


def _tuple(v, n: int) -> tuple[int, ...]:
    return (v,) * n if isinstance(v, int) else tuple(v)


def _spatial_ratio(shapes, n_spatial: int, stride: tuple[int, ...]) -> float:
    """numel_out / numel_in per channel; without shapes, the interior value 1/∏stride."""
    if shapes is None:
        return 1.0 / math.prod(stride)
    (si, so) = shapes
    return math.prod(so[-n_spatial:]) / math.prod(si[-n_spatial:])


# ---------------------------------------------------------------------------------------------------
# Rules for torch's modules and the gated pools
# ---------------------------------------------------------------------------------------------------


def _conv_rule(m: nn.Conv1d | nn.Conv2d | nn.Conv3d, site: Site) -> Leaf:
    shapes = site.shapes
    d = m.weight.dim() - 2
    k = math.prod(m.kernel_size)
    w2, b2, bm = _mean_sq(m.weight), _mean_sq(m.bias), _mean(m.bias)
    fan_in = m.in_channels // m.groups * k
    fan_out_mid = m.out_channels // m.groups * k / math.prod(m.stride)
    fwd_share, bwd_fan_out, spread = 1.0, fan_out_mid, 0.0
    if site.border == "average" and m.padding_mode == "zeros":  # the mean share of taps on real inputs
        fwd_share = bwd_fan_out = None
        if shapes is not None:
            fwd_share, sq_share = 1.0, 1.0
            geometry = zip(shapes[0][-d:], m.kernel_size, _conv_padding(m, d), m.stride, m.dilation)
            for L, kk, p, s, dil in geometry:
                cover = theory.tap_coverage(L, kk, p, s, dil)  # (kk,) share of outputs where tap j is real
                fwd_share *= float(cover.mean())
                sq_share *= float(cover.pow(2).mean())
            spread = fwd_share - sq_share  # mean over taps of ā(1 − ā): border outputs miss some taps
            # real taps summed over the outputs, per input: how many outputs an input reaches
            bwd_fan_out = m.out_channels // m.groups * k * fwd_share * _spatial_ratio(shapes, d, m.stride)

    ones = None  # (C_out, n_pos): Σ of the real taps' weights at each output, the actual weights
    if site.border == "average" and shapes is not None:
        with torch.no_grad():
            w = m.weight.detach().double()
            one = torch.ones((1, m.in_channels, *shapes[0][-d:]), dtype=w.dtype, device=w.device)
            ones = m._conv_forward(one, w, None)[0].flatten(1).cpu()  # (C_out, n_pos)
    elif site.border == "middle":
        ones = m.weight.detach().double().flatten(1).sum(1, keepdim=True).cpu()  # (C_out, 1)
    bias = (
        torch.zeros(m.out_channels, dtype=torch.float64) if m.bias is None else m.bias.detach().double().cpu()
    )
    row2 = m.weight.detach().double().flatten(1).pow(2).sum(1).cpu()  # (C_out,) Σ_k w_ck² = fan_in · E_c[w²]

    def forward(x):
        x = need(x, "the input's moments")
        share = need(fwd_share, "the input shape (border='average')")
        if ones is None:  # another padding mode at the border: the expectation over the weights
            e2 = theory.linear_forward(fan_in, w2, x.e2 * share, b2)
            within = theory.linear_forward(fan_in, w2, _within(x) * share + (x.e2 - _within(x)) * spread)
            return Moments(bm, e2 - bm * bm, within=within)
        # the common input mean µ through the actual weights: a mean µ·Σ_{real taps} w + b per channel
        # and position; the rest of the input (Var(x), independent elements) through E[w²]
        pattern = x.mean * ones + bias[:, None]  # (C_out, n_pos)
        mean = float(pattern.mean())
        e2 = theory.linear_forward(fan_in, w2, x.var * share) + float(pattern.pow(2).mean())
        # inside each channel: its own Σ_k w_ck² times the input's variance, plus its border pattern
        per_channel = row2 * _within(x) * share + pattern.var(dim=1, unbiased=False)  # (C_out,)
        return Moments(
            mean,
            max(e2 - mean * mean, 0.0),
            within=float(per_channel.mean()),
            inv_within=_inv_mean(per_channel),
        )

    def backward(g, x):
        zero = _all_zero(g.zero, m.out_channels // m.groups * k)
        return GradMoments(theory.linear_backward(need(bwd_fan_out, "shapes"), w2, g.e2), zero)

    return Leaf(forward, backward)


def _conv_padding(m, d: int) -> tuple[int, ...]:
    if isinstance(m.padding, str):  # "same" / "valid"
        if m.padding == "valid":
            return (0,) * d
        return tuple(dil * (k - 1) // 2 for k, dil in zip(m.kernel_size, m.dilation))
    return _tuple(m.padding, d)


def _linear_rule(m: nn.Linear, site: Site) -> Leaf:
    w2 = _mean_sq(m.weight)

    rows = m.weight.detach().double().sum(1).cpu()  # (out,) Σ_j w_ij: the input mean's path
    row2 = m.weight.detach().double().pow(2).sum(1).cpu()  # (out,) Σ_j w_ij²
    bias = torch.zeros_like(rows) if m.bias is None else m.bias.detach().double().cpu()

    def forward(x):
        x = need(x, "the input's moments")
        unit_mean = x.mean * rows + bias  # (out,) each unit's mean, from the actual weights
        mean = float(unit_mean.mean())
        e2 = theory.linear_forward(m.in_features, w2, x.var) + float(unit_mean.pow(2).mean())
        per_unit = row2 * _within(x)  # (out,) each unit's variance over the batch
        return Moments(
            mean, max(e2 - mean * mean, 0.0), within=float(per_unit.mean()), inv_within=_inv_mean(per_unit)
        )

    def backward(g, x):
        zero = _all_zero(g.zero, m.out_features)
        return GradMoments(theory.linear_backward(m.out_features, w2, g.e2), zero)

    return Leaf(forward, backward)


def _relu_of(x: Moments) -> tuple[float, float, float, float]:
    """(mean, Var, E[p²], P(p > 0)) of ReLU(x): x normal, or a normal plus a ReLU of a normal."""
    if x.parts is not None:
        a, b = x.parts
        if b.pre_relu is not None and a.pre_relu is None and a.parts is None:
            a, b = b, a
        if a.pre_relu is not None and b.pre_relu is None and b.parts is None:  # b + ReLU(c)
            return theory.relu_of_sum(b.mean, b.var, a.pre_relu.mean, a.pre_relu.var)
    return theory.relu_moments(x.mean, x.var)


def _relu_rule(m: nn.ReLU, site: Site) -> Leaf:
    def forward(x):
        x = need(x, "the input's moments")
        mean, var, _, _ = _relu_of(x)
        # the share of the variance inside a channel is kept (a linearization: the ReLU keeps the ranks)
        within = None if x.within is None or x.var <= 0 else var * x.within / x.var
        return Moments(mean, var, within=within, pre_relu=Moments(x.mean, x.var))

    def backward(g, x):
        x = need(x, "the input's moments")
        pos = _relu_of(x)[3]
        if g.winners is not None:  # g only on max-pool winners: positive unless a whole window is not
            return GradMoments(g.e2 * (1.0 - (1.0 - pos) ** g.winners), g.zero)
        zero = None if g.zero is None else 1.0 - (1.0 - g.zero) * pos
        return GradMoments(theory.relu_backward(g.e2, x.mean, x.var), zero)

    return Leaf(forward, backward)


def activation_leaf(name: str) -> Leaf:
    """An elementwise ``f`` of :data:`theory.ACTIVATIONS` on a normal input, by quadrature.

    forward ``E[f(x)]``, ``Var f(x)``; backward ``E[(∂L/∂x)²] = E[f'(x)²] · E[g²]`` (exact zeros kept).
    """

    def forward(x):
        x = need(x, "the input's moments")
        mean, var, _ = theory.activation_moments(name, x.mean, x.var)
        return Moments(mean, var)

    def backward(g, x):
        x = need(x, "the input's moments")
        return GradMoments(theory.activation_moments(name, x.mean, x.var)[2] * g.e2, g.zero)

    return Leaf(forward, backward)


def _gelu_rule(m: nn.GELU, site: Site) -> Leaf:
    return activation_leaf("gelu_tanh" if m.approximate == "tanh" else "gelu")


def _activation_rule(name: str) -> Rule:
    return lambda m, site: activation_leaf(name)


def _window_rule(gate: str, kernel, stride, padding, d: int, shapes, border: str = "middle") -> Leaf:
    """Max or average over windows of ``kernel`` inputs.

    A max after a ReLU (``x.pre_relu``) is ``ReLU(max of n normals)``. With ``border="average"`` and
    the shapes known, a padded max pool mixes its windows by the number of real taps each one holds
    (padding is −inf: it never wins), as a padded conv counts its real taps.
    """
    kernel = _tuple(kernel, d)
    stride = kernel if stride is None or stride == () else _tuple(stride, d)
    padding = _tuple(padding, d)
    n = math.prod(kernel)
    ratio = _spatial_ratio(shapes, d, stride)  # outputs per input
    tiled = stride == kernel and not any(padding)  # each input in at most one window
    counts = {n: 1.0}  # {real taps in a window: share of the windows}
    if gate == "max" and border == "average" and shapes is not None and any(padding):
        taps = None
        for L, kk, p, s in zip(shapes[0][-d:], kernel, padding, stride):
            t = theory.taps_per_output(L, kk, p, s, 1)  # (n_out,)
            taps = t if taps is None else torch.outer(taps, t).flatten()
        values, freq = torch.unique(taps, return_counts=True)
        counts = {int(v): float(c) / taps.numel() for v, c in zip(values, freq)}

    def max_of(k: int, x: Moments) -> tuple[float, float]:
        if x.pre_relu is not None:
            return theory.max_of_rectified_normals(k, x.pre_relu.mean, x.pre_relu.var)
        return theory.max_pool_forward(k, x.mean, x.var)

    def forward(x):
        x = need(x, "the input's moments")
        if gate == "max":
            parts = [(share, *max_of(k, x)) for k, share in counts.items()]  # (share, mean, var)
            mean = sum(s * m for s, m, _ in parts)
            e2 = sum(s * (v + m * m) for s, m, v in parts)
            return Moments(mean, max(e2 - mean * mean, 0.0))
        return Moments(x.mean, theory.avg_pool_forward(n, x.var))

    def backward(g, x):
        covered = ratio * n  # share of inputs inside some window (1 when the windows tile the map)
        if gate == "max":  # each window's winner gets g: E[g²]·(windows per input)
            e2 = g.e2 * ratio
            zero = 1.0 - (1.0 - g.zero) * ratio if tiled and g.zero is not None else None
            if x is not None and x.pre_relu is not None:
                return GradMoments(e2, zero, winners=n)
        else:  # every input of a window gets g/n, from each window it is in
            e2 = g.e2 * ratio / n
            zero = 1.0 - (1.0 - g.zero) * covered if tiled and g.zero is not None else None
        return GradMoments(e2, zero)

    return Leaf(forward, backward)


def _max_pool_rule(d: int) -> Rule:
    def rule(m, site: Site) -> Leaf:
        if _tuple(m.dilation, d) != (1,) * d:
            raise NoRule("dilated max pool: no rule")
        return _window_rule("max", m.kernel_size, m.stride, m.padding, d, site.shapes, site.border)

    return rule


def _avg_pool_rule(d: int) -> Rule:
    return lambda m, site: _window_rule("avg", m.kernel_size, m.stride, m.padding, d, site.shapes)


def _gated_pool_rule(m: GatedPoolNd, site: Site) -> Leaf:
    """GatedPool1d, 2d and 3d: the max and avg gates follow the rules in any dimension."""
    if m.gate not in ("max", "avg"):
        raise NoRule(f"measured only: gate {m.gate!r} has no closed form")
    if _tuple(getattr(m, "dilation", 1), m.dim) != (1,) * m.dim:
        raise NoRule("dilated pool: no rule")
    return _window_rule(m.gate, m.kernel_size, m.stride, m.padding, m.dim, site.shapes, site.border)


def _adaptive_avg_rule(d: int) -> Rule:
    def rule(m, site: Site) -> Leaf:
        if site.shapes is None:
            raise NoRule("needs the input shape")
        si, so = site.shapes[0][-d:], site.shapes[1][-d:]
        if any(i % o for i, o in zip(si, so)):
            raise NoRule(f"input {tuple(si)} not a multiple of output {tuple(so)}: uneven windows")
        kernel = tuple(i // o for i, o in zip(si, so))
        return _window_rule("avg", kernel, kernel, 0, d, site.shapes)

    return rule


def _norm_leaf(m: nn.Module, batch_stats: bool, per_channel: bool = False) -> Leaf:
    """Batch statistics (GroupNorm, LayerNorm, BatchNorm in training): output γ·x̂ + β, x̂ ~ (0, 1)."""
    weight = getattr(m, "weight", None)
    bias = getattr(m, "bias", None)
    g2, b2, bm = (_mean_sq(weight) if weight is not None else 1.0), _mean_sq(bias), _mean(bias)
    eps = float(getattr(m, "eps", 0.0))
    if not batch_stats:  # BatchNorm in eval: a fixed per-channel affine a·x + b
        a = 1.0 / (m.running_var.double() + eps).sqrt()  # (C,)
        b = -m.running_mean.double() * a
        if m.affine:
            a, b = a * m.weight.detach().double(), b * m.weight.detach().double() + m.bias.detach().double()

        def forward_eval(x):
            x = need(x, "the input's moments")
            mean = float((a * x.mean + b).mean())
            e2 = float((a * a * x.e2 + 2 * a * b * x.mean + b * b).mean())
            return Moments(mean, e2 - mean * mean)

        def backward_eval(g, x):
            return GradMoments(float((a * a).mean()) * g.e2, g.zero)

        return Leaf(forward_eval, backward_eval)

    def forward(x):
        var = None if x is None else (_within(x) if per_channel else x.var)
        share = 1.0 if var is None else var / (var + eps)  # Var(x̂); 1 unless Var(x) ~ eps
        return Moments(bm, g2 * share + b2 - bm * bm)

    def backward(g, x):
        x = need(x, "the input's variance")
        var = _within(x) if per_channel else x.var  # BatchNorm divides by each channel's own variance
        if per_channel and x.inv_within is not None:  # mean_c 1/Var_c, from the actual weights
            var = 1.0 / x.inv_within
        return GradMoments(theory.norm_backward(g.e2, var, weight2=g2, eps=eps), 0.0)

    return Leaf(forward, backward)


def _group_layer_norm_rule(m: nn.GroupNorm | nn.LayerNorm, site: Site) -> Leaf:
    return _norm_leaf(m, batch_stats=True)


def _running_norm_rule(m: nn.Module, site: Site) -> Leaf:
    """BatchNorm and InstanceNorm: batch statistics in training (or without running ones), else affine."""
    return _norm_leaf(m, batch_stats=m.training or m.running_var is None, per_channel=True)


def _dropout_rule(m: nn.Dropout, site: Site) -> Leaf:
    keep = 1.0 - m.p

    def forward(x):
        x = need(x, "the input's moments")
        return Moments(x.mean, x.e2 / keep - x.mean**2) if m.training else x

    def backward(g, x):
        if not m.training:
            return g
        zero = None if g.zero is None else 1.0 - (1.0 - g.zero) * keep
        return GradMoments(g.e2 / keep, zero)

    return Leaf(forward, backward)


def _identity_rule(m: nn.Module, site: Site) -> Leaf:
    return Leaf(lambda x: x, lambda g, x: g)


def _sequential_rule(m: nn.Sequential, site: Site) -> Chain:
    if type(m).forward is not nn.Sequential.forward:
        raise NoRule(f"no rule for {type(m).__name__} (a container with its own forward)")
    return Chain(tuple(name for name, _ in m.named_children()))


def _register_all(rules: Sequence[tuple[type[nn.Module], Rule]]) -> None:
    for module_type, rule in rules:
        register_rule(module_type, rule)


_register_all([
    (nn.Conv1d, _conv_rule), (nn.Conv2d, _conv_rule), (nn.Conv3d, _conv_rule),
    (nn.Linear, _linear_rule),
    (nn.ReLU, _relu_rule), (nn.GELU, _gelu_rule), (nn.SiLU, _activation_rule("silu")),
    (nn.Tanh, _activation_rule("tanh")), (nn.Sigmoid, _activation_rule("sigmoid")),
    (nn.ReLU6, _activation_rule("relu6")), (nn.Hardsigmoid, _activation_rule("hardsigmoid")),
    (nn.Hardswish, _activation_rule("hardswish")),
    (nn.MaxPool1d, _max_pool_rule(1)), (nn.MaxPool2d, _max_pool_rule(2)), (nn.MaxPool3d, _max_pool_rule(3)),
    (nn.AvgPool1d, _avg_pool_rule(1)), (nn.AvgPool2d, _avg_pool_rule(2)), (nn.AvgPool3d, _avg_pool_rule(3)),
    (nn.AdaptiveAvgPool1d, _adaptive_avg_rule(1)), (nn.AdaptiveAvgPool2d, _adaptive_avg_rule(2)),
    (nn.AdaptiveAvgPool3d, _adaptive_avg_rule(3)),
    (GatedPoolNd, _gated_pool_rule),
    (nn.GroupNorm, _group_layer_norm_rule), (nn.LayerNorm, _group_layer_norm_rule),
    (nn.modules.batchnorm._BatchNorm, _running_norm_rule),
    (nn.modules.instancenorm._InstanceNorm, _running_norm_rule),
    (nn.Dropout, _dropout_rule),
    (nn.Identity, _identity_rule), (nn.Flatten, _identity_rule), (nn.Unflatten, _identity_rule),
    (nn.Sequential, _sequential_rule),
])  # fmt: skip
