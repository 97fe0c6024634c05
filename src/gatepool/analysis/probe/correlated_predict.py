"""The correlation-aware prediction: the input's statistics walked through a traced model.

    stats = measure_input(images)                    # the data: the only thing measured
    pred = predict_correlated(model, stats)          # the model's weights and those statistics, no batch
    pred["pool1"].var, pred["pool1"].corr(1), pred["block3"].grad_e2

``predict_correlated(model, input_stats)`` traces ``model`` with the probe's :func:`graph.trace` (its
:class:`graph.Untraceable` when torch cannot), the modules with a correlated rule (:mod:`correlated`) as
leaves, everything else traced through (control flow on a size at the input's); it never runs the model
on data and puts no hook on it. :class:`graph.Walk` walks it, the loop the ideal's walk uses too:
forward node by node, each tensor node's :class:`correlated.Field`; backward in reverse from
∂L/∂logits ~ N(0, 1) (the lecture's unit-noise seed), a node used twice getting the sum of its two
(independent) gradients (:func:`correlated.add_grads`). A node without a rule has no prediction, nor
has anything computed from it; ``notes`` says which. Two shapes are carried past a Gaussian: a max pool
whose input is a ReLU's output draws the ReLU's input (``MaxPool.forward(x, pre=...)``), and an add of
a ReLU's output and another tensor marks the sum b + ReLU(y) (``Field.parts``) for the ReLU after it.
A ReLU's output is also that of a module whose steps end in a ReLU (timm's ``BatchNormAct2d``).
A cat of ReLU outputs splits each user's gradient on its own where one of them (a max pool) brings the
gradient at the ReLUs' inputs: each ReLU takes its parts through its gate one by one, as a ReLU with
several users does, not their sum through one independent gate.
A parameter or buffer (a ``get_attr`` node), and whatever is computed from such constants alone
(``gamma.view(-1, 1, 1)``), is evaluated: a product with it is a :class:`correlated.Scale`. The size of
a map (``x.size()``, ``x.shape``) is known (its batch taken as 1), so ShuffleNet's channel shuffle
``x.view(N, g, C/g, H, W).transpose(1, 2).reshape(N, C, H, W)`` is recognised whole, and carried as the
permutation it is (:class:`correlated.ChannelShuffle`).
A module that hands back its input tensor itself (an ``nn.Identity``, a dropout at p = 0) has that
tensor's gradient as its row's, every user's summed (MobileNetV4's ``dw_start`` before a shortcut).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import operator
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
import torch.fx as fx
import torch.nn as nn

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated import regime, registry
from gatepool.analysis.probe.correlated.adaptive import AdaptiveAvgPool2dStep, AvgPool2dStep
from gatepool.analysis.probe.correlated.conv import conv_rule
from gatepool.analysis.probe.correlated.maxpool import maxpool_rule
from gatepool.analysis.probe.correlated.pad import adds_nothing
from gatepool.analysis.probe.correlated.pointwise import gelu_rule
from gatepool.analysis.probe.correlated.registry import register_correlated_rule, rule_for
from gatepool.analysis.probe.correlated.steps import Identity, Steps
from gatepool.analysis.probe.correlated.window_attention import _Cells
from gatepool.analysis.probe.graph import NoPrediction, Walk, trace

__all__ = ["CorrelatedPrediction", "CorrelatedRow", "predict_correlated", "register_correlated_rule"]


def _regime_through(step, x: cr.Field, out: cr.Field):
    """The :class:`regime.Regime` of ``out`` = ``step``'s output of field ``x`` (a conv, a max pool, a norm;
    None for any other step, or where ``x`` has none): the walk's dispatch to :mod:`regime`'s moves, the
    energy levelled to ``out``'s predicted moments."""
    r = _moved(step, x, out)
    return None if r is None else regime.level(r, out.mean, out.var)


def _moved(step, x: cr.Field, out: cr.Field):
    r = x.regime
    if r is None or r.bg.shape != x.shape:
        return None
    if isinstance(step, cr.Conv):
        return regime.conv(r, step.W, step.b, step.stride, step.padding)
    if isinstance(step, cr.MaxPool):
        return regime.max_pool(r, step.k, step.s, step.p, step.ceil_mode)
    if isinstance(step, cr.BatchNorm) and step.norm is not None:
        step = step.norm
    if isinstance(step, cr.GroupNorm):
        gam = torch.ones(x.shape[0], dtype=torch.float64) if step.gamma is None else step.gamma
        scale = (gam / step.sigma2.repeat_interleave(x.shape[0] // step.G).sqrt())[:, None, None]
        return regime.affine(r, scale, out.mean - scale * x.mean)
    if isinstance(step, cr.BatchNorm):
        return regime.affine(r, step.a, out.mean - step.a * x.mean)
    return None


def _weight_back(step, g: cr.Field | None, out: cr.Field | None):
    """``out`` (the gradient at ``step``'s input) with the per-sample weights moved back from ``g``'s
    (``Field.weight``, :mod:`regime`'s gradient side): a conv and a max pool move them, a norm keeps them,
    a ReLU sets its own; any other step drops them."""
    if g is None or out is None or g.weight is None or out.weight is not None:
        return out
    w, hw = None, out.shape[1:]
    if isinstance(step, cr.Conv) and step.Wd is None:
        w = regime.conv_back(g.weight, g.var, step.W, step.stride, step.padding, hw)
    elif isinstance(step, cr.MaxPool):
        w = regime.pool_back(g.weight, g.var, step.k, step.s, step.p, hw)
    elif isinstance(step, (cr.GroupNorm, cr.BatchNorm)) and hw == g.shape[1:]:
        w = g.weight
    return dataclasses.replace(out, weight=w) if w is not None else out


class _Add:
    """x + y: the two independent; ``relu`` the index of the input that is a ReLU's output or a sum with
    one (b + ReLU(s), whose stream the gradient's ``stream_gate`` is for), or None;
    ``gain`` (i, G): the other input a function of input i channel by channel, of linear gain G
    (:mod:`correlated.branch_gain`), whose cross term input i's gradient carries."""

    def __init__(self, relu: int | None, gain: tuple | None = None) -> None:
        self.relu, self.gain = relu, gain

    def backward_to(self, g: cr.Field, i: int) -> cr.Field:
        """Each input gets the output's gradient; the ReLU input also its gradient through that ReLU's
        gate jointly with the next one (``stream_gate``, set by the ReLU after the add). ``yy`` and
        ``dependence`` are about the sum's value, not an input's (g x ≠ g y): dropped."""
        if self.gain is not None and i == self.gain[0]:
            g = cr.grad_cross(g, self.gain[1])
        if i == self.relu:
            return dataclasses.replace(g, pre_relu=None, yy=None, dependence=None)
        return dataclasses.replace(g, stream_gate=None, pre_relu=None, yy=None, dependence=None)


def _branch_gain(args: list, steps: dict, inputs: dict, value: dict) -> tuple | None:
    """(i, G) where the add's other input is a function of input i channel by channel (a chain of steps
    back to it, each of a known linear gain: :func:`correlated.step_gain`; a cat of tokens through the
    one piece that leads back), G (C, P, P) the chain's gain; else None."""
    for i in (0, 1):
        G = _gain_to(args[1 - i], args[i], steps, inputs, value, 32)
        if G is not None:
            return i, G
    return None


def _gain_to(n: fx.Node, s: fx.Node, steps: dict, inputs: dict, value: dict, depth: int):
    """(C, P_n, P_s): the linear gain of node n on node s channel by channel, or None."""
    if n is s:
        P = value[s].mean[0].numel()
        return torch.eye(P, dtype=torch.float64).expand(value[s].shape[0], P, P)
    ins, step = inputs.get(n, []), steps.get(n)
    if depth == 0 or not ins or step is None:
        return None
    if isinstance(step, cr.TokenCat):  # one piece a function of s, the others taken as independent of it
        found = [(k, _gain_to(a, s, steps, inputs, value, depth - 1)) for k, a in enumerate(ins)]
        found = [(k, G) for k, G in found if G is not None]
        if len(found) != 1 or len(ins) != sum(step.fields):
            return None
        k, G = found[0]
        starts = [sum(step.sizes[:j]) for j, f in enumerate(step.fields) if f]
        out = torch.zeros((G.shape[0], sum(step.sizes), G.shape[2]), dtype=torch.float64)
        out[:, starts[k] : starts[k] + G.shape[1]] = G
        return out
    if len(ins) != 1:
        return None
    g = cr.step_gain(step, value[ins[0]], value[n])
    rest = None if g is None else _gain_to(ins[0], s, steps, inputs, value, depth - 1)
    return None if rest is None else g @ rest


class _Difference:
    """a − b where a = A b (a fixed map of b's positions: PoolFormer's ``pool(x) − x``): one map A − I of
    b, not two independent terms. Its gradient goes to b through (A − I)ᵀ; a (whose own step is then
    not walked back) gets the output's gradient as its row's."""

    def __init__(self, step, pooled: int) -> None:
        self.map, self.pooled = step, pooled  # step: (A − I) or (I − A) of b; pooled: a's index of the two

    def forward(self, x: cr.Field) -> cr.Field:
        return self.map.forward(x)

    def backward(self, g: cr.Field) -> list[cr.Field]:
        """The gradients of the two terms, in the call's order."""
        g = dataclasses.replace(g, dependence=None)  # about a − b's value
        return [g, self.map.backward(g)] if self.pooled == 0 else [self.map.backward(g), g]


_ATTENTIONS = (cr.Attention, cr.CellAttention)  # their module's output a tuple (nn.MultiheadAttention's)
# steps whose backward gives each input its own
_PER_INPUT = (cr.Cat, cr.Gate, cr.Product, cr.TokenCat, _Difference, cr.GlobalQueryWindowAttention)


def _relu_input(node: fx.Node, steps: dict, inputs: dict) -> cr.Field | None:
    """The Gaussian input of the ReLU whose output ``node`` is, for a max pool after it (max ReLU = ReLU
    max); of a cat of ReLU outputs (SqueezeNet's Fire, Inception's branches), the cat of their inputs; of
    f(ReLU(y)) with f commuting with the ReLU (:func:`_commutes_with_relu`), f(y). None for anything else."""
    before = _relu_of(steps.get(node))
    if before is not None:
        return before.x
    step = steps.get(node)
    if _commutes_with_relu(step) and len(inputs.get(node, [])) == 1:  # f(ReLU(y)) = ReLU(f(y))
        inner = _relu_input(inputs[node][0], steps, inputs)
        return None if inner is None else copy.copy(step).forward(inner)
    parts = [_relu_of(steps.get(a)) for a in inputs.get(node, [])]
    if isinstance(steps.get(node), cr.Cat) and parts and all(p is not None for p in parts):
        return cr.Cat().forward([p.x for p in parts])
    return None


def _commutes_with_relu(step) -> bool:
    """Is ``step`` an f with f(ReLU(y)) = ReLU(f(y)): a pad of zeros, a scale by a positive constant, a
    shift by zero (timm's ``LearnableAffineBlock`` at init, HGNetV2's stem before its max pool)?"""
    if isinstance(step, cr.Pad):
        return step.value == 0.0
    if isinstance(step, cr.Scale):
        return bool((step.s > 0).all())
    if isinstance(step, cr.Shift):
        return not bool(torch.as_tensor(step.c).any())
    return False


def _relu_of(step) -> cr.ReLU | None:
    """The ReLU whose output a step's is: the step itself, or the last of its steps (timm's
    norm-and-activation, ``BatchNormAct2d``: its ReLU's input is the normed field); else None."""
    if isinstance(step, Steps):
        return step.relu
    return step if isinstance(step, cr.ReLU) else None


def _carries_stream(x: cr.Field, y: cr.Field) -> int | None:
    """The index of the term that is b + ReLU(s) (``Field.parts``) where the other is a normal field of its
    own (no parts, no law, no regime): their sum is (b + other) + ReLU(s), so the stream's law goes on to
    the ReLU after a chain of adds (HRNet's fuse sums four branches, one of them the stream). None else."""
    def plain(f: cr.Field) -> bool:
        return f.parts is None and f.law is None and f.regime is None

    if x.parts is not None and plain(y):
        return 0
    if y.parts is not None and plain(x):
        return 1
    return None


def _relu_step(node: fx.Node, steps: dict, inputs: dict) -> cr.ReLU | None:
    """The ReLU whose output ``node`` is, seen through identities (RegNet's shortcut, an ``nn.Identity``);
    None for anything else."""
    while isinstance(steps.get(node), Identity) and len(inputs.get(node, [])) == 1:
        node = inputs[node][0]
    return _relu_of(steps.get(node))


def _positions_matrix(step, x: cr.Field) -> torch.Tensor | None:
    """The matrix (Ho·Wo, H·W) of a step that is a fixed map of its input's positions, the same at every
    channel (an average or adaptive pool, an interpolation), on the field ``x``; else None."""
    if isinstance(step, AvgPool2dStep):
        windows = cr.AvgPoolWindows(step.k, step.s, step.p, *step.modes)  # the box filter's too
        windows.forward(x)
        return windows.A
    if isinstance(step, AdaptiveAvgPool2dStep) and isinstance(step.conv, cr.AdaptiveAvgPool):
        return step.conv.A
    return step.A if isinstance(step, cr.AdaptiveAvgPool) else None


def _returns_its_input(m: nn.Module) -> bool:
    """Does ``m`` hand back its input tensor itself (``m(x) is x``): an ``nn.Identity``, torch's dropout
    at p = 0 or in eval mode. Its output's gradient is then that tensor's, every user's summed (a hook
    on it sees the shortcut's too), not the gradient through its own users alone."""
    if type(m) is nn.Identity:
        return True
    return type(m) in (nn.Dropout, nn.Dropout2d) and (m.p == 0 or not m.training)


def _tensor_grad(node: fx.Node, gm: fx.GraphModule, grad: dict) -> cr.Field | None:
    """The gradient of ``node``'s tensor: through modules that return their input, the gradient of the
    node whose tensor it is (``node``'s own where that one has none)."""
    own = node
    while (node.op == "call_module" and len(node.args) == 1 and isinstance(node.args[0], fx.Node)
           and _returns_its_input(gm.get_submodule(str(node.target)))):  # fmt: skip
        node = node.args[0]
    g = grad.get(node)
    return g if g is not None else grad.get(own)


def _parts(step) -> list:
    """The steps inside ``step`` that the walk sets up (a BatchNorm's batch, a ReLU's exact lags): a
    composition's, an attention's projections' (LeViT's LinearNorms), down to the innermost."""
    inner = getattr(step, "steps", None)
    if isinstance(step, cr.Attention):
        inner = (step.q, step.k, step.v, step.out)
    if not isinstance(inner, (tuple, list)):
        return [step]
    return [p for s in inner for p in _parts(s)]


def _is_leaf(m: nn.Module) -> bool:
    """A module with a correlated rule is one node of the trace (a plain ``nn.Sequential`` traced through)."""
    return rule_for(m) is not None and type(m) is not nn.Sequential


# what a gradient carries for the pull of the node that made it alone (:class:`correlated.Field`)
_PULL_ONLY = ("yy", "pre_relu", "stream_gate", "dependence", "coupling", "weight")
_ADDS = (operator.add, torch.add, operator.iadd)
_SUBS = (operator.sub, torch.sub, "sub")
_CATS = (torch.cat, torch.concat, torch.concatenate)
_MULS = (operator.mul, torch.mul, operator.imul, "mul", "mul_")
_IN_PLACE = (operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv,
             operator.ifloordiv, operator.ipow, operator.imod, operator.iand, operator.ior, operator.ixor)
_RESHAPES = (torch.reshape, "view", "reshape")
_COPIES = ("contiguous", "clone", torch.clone)
_TRANSPOSES = (torch.transpose, "transpose", "swapaxes", torch.swapaxes)
_DIVS = (operator.truediv, torch.div, torch.true_divide, operator.itruediv, "div", "div_", "true_divide")
_FLAT = (torch.flatten,)
_SPLITS = (torch.chunk, torch.split, torch.tensor_split, "chunk", "split", "tensor_split")
_RELU = (torch.relu, torch.nn.functional.relu)
_F = torch.nn.functional
# activations called as functions (or tensor methods): their pointwise rule by name
_POINTWISE = {
    _F.relu6: "relu6", _F.silu: "silu", _F.hardswish: "hardswish", _F.hardsigmoid: "hardsigmoid",
    torch.sigmoid: "sigmoid", _F.sigmoid: "sigmoid", "sigmoid": "sigmoid",
    torch.tanh: "tanh", _F.tanh: "tanh", "tanh": "tanh",
}
# the calls on a map's regrouped positions whose rules hold there as on the map (each element, each
# position's channels, a sum or product of two tensors of one layout; modules: :func:`_on_regrouped`)
_REGROUPED_OPS = (*_ADDS, *_SUBS, *_MULS, *_DIVS, *_RELU, *_COPIES, "relu", _F.linear, _F.gelu, _F.dropout)


def _node_args(n: fx.Node) -> list[fx.Node]:
    """The nodes among ``n.args`` (lists and tuples included: ``torch.cat([a, b], 1)``), then among
    ``n.kwargs`` (``F.linear(input=x, weight=w)``), in order."""
    found: list[fx.Node] = []
    fx.node.map_arg((n.args, n.kwargs), found.append)
    return found


def _call_args(signature, given: tuple):
    """``signature(*args, **kwargs)`` of a call's (args, kwargs): its arguments by name (torch's)."""
    try:
        return signature(*given[0], **given[1])
    except TypeError as e:
        raise NotImplementedError(f"a call with these arguments: {e}") from None


def _fold(n: fx.Node, const: dict, gm: nn.Module | None = None) -> object:
    """A node computed from constants alone (parameters, buffers, numbers), evaluated; never one that
    would write into them (an in-place op, a module with buffers: the walk leaves the model as it is)."""
    name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
    if name.endswith("_") or n.target in _IN_PLACE:
        raise NotImplementedError(f"{name} would change a parameter or buffer")
    args, kwargs = fx.node.map_arg((n.args, n.kwargs), const.__getitem__)
    if n.op == "call_function":
        return n.target(*args, **kwargs)
    if n.op == "call_method":
        return getattr(args[0], n.target)(*args[1:], **kwargs)
    if n.op == "call_module" and gm is not None:  # EdgeNeXt's projection of its Fourier position code
        m = gm.get_submodule(str(n.target))
        if next(m.buffers(), None) is not None:
            raise NotImplementedError(f"{type(m).__name__} (a module with buffers) of constants")
        return m(*args, **kwargs)
    raise NotImplementedError(f"{n.op} of constants")


def _cat(n: fx.Node, fields: list, layout: tuple = ("C", "H", "W")) -> cr.Cat:
    """``torch.cat(xs, dim)`` along channels (the layout's "C": dim 1 channels first, −1 channels last) of
    fields of one map size, every one of ``xs`` a field (not a parameter such as a class token)."""
    xs = n.args[0] if n.args else None
    if not isinstance(xs, (list, tuple)) or len(xs) != len(fields):
        raise NotImplementedError("cat of tensors that are not all fields (a parameter or a constant)")
    dim = n.kwargs.get("dim", n.args[1] if len(n.args) > 1 else 0)
    full = ("N", *layout)
    if not isinstance(dim, int) or not -len(full) <= dim < len(full) or full[dim] != "C":
        raise NotImplementedError(f"cat along dim {dim} of a {layout} tensor: channels only")
    if len({f.shape[1:] for f in fields}) != 1:
        raise NotImplementedError("cat of maps of different sizes")
    return cr.Cat()


_KEEPS_CHANNELS = (cr.Pointwise, cr.ReLU, cr.Scale, cr.Shift, cr.Dropout, cr.StochasticDepth, Identity,
                   cr.BatchNorm, cr.GroupNorm, cr.LayerNorm)  # fmt: skip


def _keeps_channels(step) -> bool:
    """Is each output channel of ``step`` a function of the same input channel alone (an activation, a
    norm, a depthwise conv)?"""
    if isinstance(step, Steps):
        return all(_keeps_channels(s) for s in step.steps)
    if isinstance(step, cr.Conv):
        return bool(((step.W != 0).flatten(2).any(2).sum(1) <= 1).all())
    return isinstance(step, _KEEPS_CHANNELS)


def _lineage(n: fx.Node, steps: dict, inputs: dict) -> set[fx.Node]:
    """``n`` and the nodes whose channels it is a function of, channel by channel: back through the
    one-input steps that keep each channel its own. Two factors that share one are not independent."""
    seen = {n}
    while len(inputs.get(n, [])) == 1 and _keeps_channels(steps.get(n)):
        n = inputs[n][0]
        seen.add(n)
    return seen


def _conv2d_call(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) -> SimpleNamespace:
    """``F.conv2d``'s arguments as the attributes of an ``nn.Conv2d`` (for its rule)."""
    return SimpleNamespace(weight=weight, bias=bias, stride=stride, padding=padding, dilation=dilation,
                           groups=groups, padding_mode="zeros")


def _factor(v, shape: tuple[int, int, int]) -> torch.Tensor:
    """A number or a constant tensor multiplying a (N, C, H, W) tensor, as a map for its (C, H, W) field;
    a (C,) vector on a (C, 1, 1) field multiplies a flattened (N, C) tensor's features."""
    if isinstance(v, bool) or not isinstance(v, (int, float, torch.Tensor)):
        raise NotImplementedError(f"a product with a {type(v).__name__}")
    t = torch.as_tensor(v).detach()
    if t.ndim == 1 and shape[1:] == (1, 1) and len(t) == shape[0]:
        return t[:, None, None]
    while t.ndim > 3 and t.shape[0] == 1:
        t = t[0]
    try:
        ok = t.ndim <= 3 and torch.broadcast_shapes(t.shape, shape) == torch.Size(shape)
    except RuntimeError:
        ok = False
    if not ok:
        raise NotImplementedError(f"a product with a {tuple(t.shape)} tensor on a {shape} map")
    return t


def _scale(n: fx.Node, x: fx.Node, shape: tuple[int, int, int], const: dict, dims=("C", "H", "W")
           ) -> cr.Scale:
    """x · c, c · x or x / c with c a number or a constant: the factor map's :class:`correlated.Scale`."""
    if len(n.args) != 2 or n.kwargs.get("rounding_mode") is not None or set(n.kwargs) - {"rounding_mode"}:
        raise NotImplementedError(f"{getattr(n.target, '__name__', n.target)} with these arguments")
    a, b = (const.get(v, v) if isinstance(v, fx.Node) and v is not x else v for v in n.args)
    divide = n.target in _DIVS
    if divide and a is not x:
        raise NotImplementedError("a constant divided by a tensor")
    c = _factor(_to_field(b if a is x else a, dims), shape)
    return cr.Scale(1 / c if divide else c)


def _size(n: fx.Node, value: dict, dims: dict) -> torch.Size | int | None:
    """``x.size()``, ``x.size(d)`` or ``x.shape`` of a map (positions besides one), in its layout, its
    batch taken as 1; None for anything else."""
    is_size = n.op == "call_method" and n.target == "size"
    if not (is_size or (n.target is getattr and n.args[1:] == ("shape",))):
        return None
    f = value.get(n.args[0]) if isinstance(n.args[0], fx.Node) else None
    layout = dims.get(n.args[0], _CHW)
    if f is not None and isinstance(layout, cr.Regrouped):  # its index is the tensor at batch 1
        size = torch.Size(layout.where.shape)
    elif f is None or (f.shape[1:] == (1, 1) and layout != ("W", "C")):  # one token (a class token): its size
        return None
    elif layout == _FLATTENED:
        size = torch.Size((1, f.mean.numel()))
    else:
        size = torch.Size((1, *(f.shape[_CHW.index(a)] for a in layout)))
    d = n.kwargs.get("dim", n.args[1] if is_size and len(n.args) > 1 else None)
    if d is None:
        return size
    return size[d] if isinstance(d, int) and -len(size) <= d < len(size) else None


def _shape_args(n: fx.Node, const: dict) -> list | None:
    """The shape a view or reshape asks for, as numbers (None where it is not known)."""
    rest = n.args[1:]
    if len(rest) == 1 and isinstance(rest[0], (list, tuple, torch.Size)):
        rest = rest[0]
    rest = [const.get(v) if isinstance(v, fx.Node) else v for v in rest]
    return rest if all(isinstance(v, int) for v in rest) else None


def _means_positions(n: fx.Node, layout: tuple = ("C", "H", "W")) -> bool:
    """Is ``n`` a mean of a map of this layout over its two position dims (``x.mean([2, 3])``,
    ``torch.mean(x, (-2, -1))``; channels last, MambaOut's ``x.mean((1, 2))``; keepdim or not)?"""
    if n.target not in ("mean", torch.mean) or n.op not in ("call_method", "call_function"):
        return False
    dim = n.kwargs.get("dim", n.args[1] if len(n.args) > 1 else None)
    if not isinstance(dim, (list, tuple)) or not all(isinstance(d, int) for d in dim):
        return False
    full = ("N", *layout)
    if len(full) != 4 or "H" not in full or "W" not in full:
        return False
    return {d % 4 for d in dim} == {full.index("H"), full.index("W")}


def _only_user(n: fx.Node) -> fx.Node | None:
    return next(iter(n.users)) if len(n.users) == 1 else None


def _stacked_mean(n: fx.Node) -> fx.Node | None:
    """The ``torch.mean(·, dim=0)`` that is the only user of ``n`` = ``torch.stack(xs, dim=0)`` (CrossViT's
    mean of its branches' logits, the branches taken as independent, as an add's); else None."""
    if n.target is not torch.stack or not isinstance(n.args[0], (list, tuple)):
        return None
    m = _only_user(n)
    if n.kwargs.get("dim", n.args[1] if len(n.args) > 1 else 0) != 0 or m is None:
        return None
    if m.target not in ("mean", torch.mean) or m.kwargs.get("keepdim") or len(m.args) > 2:
        return None
    return m if m.kwargs.get("dim", m.args[1] if len(m.args) > 1 else None) in (0, (0,), [0]) else None


def _shuffle(n: fx.Node, shape: tuple[int, int, int], const: dict) -> tuple[list[fx.Node], int] | None:
    """Whether ``n`` begins ``x.view(N, g, C/g, H, W).transpose(1, 2)[.contiguous()].reshape(N, C, H, W)``
    (or ``.flatten(1, 2)``): the chain's later nodes and g, else None."""
    if n.target not in _RESHAPES:
        return None
    C, H, W = shape
    want = _shape_args(n, const)
    if want is None or len(want) != 5 or want[0] not in (1, -1) or want[3:] != [H, W] or want[1] < 1:
        return None
    g = want[1]
    if C % g or want[2] not in (C // g, -1):
        return None
    t = _only_user(n)
    if t is None or not (
        (t.target in _TRANSPOSES and sorted(t.args[1:]) == [1, 2] and not t.kwargs)
        or (t.target == "permute" and list(t.args[1:]) in ([0, 2, 1, 3, 4], [[0, 2, 1, 3, 4]]))
    ):
        return None
    chain = [t]
    last = _only_user(t)
    if last is not None and last.target == "contiguous":
        chain.append(last)
        last = _only_user(last)
    if last is None:
        return None
    if last.target in _RESHAPES:
        out = _shape_args(last, const)
        ok = out is not None and len(out) == 4 and out[0] in (1, -1) and out[1] in (C, -1)
        ok = ok and out[2:] == [H, W]
    else:
        ok = last.target in ("flatten", torch.flatten) and list(last.args[1:]) == [1, 2] and not last.kwargs
    return (chain + [last], g) if ok else None


def _merging(n: fx.Node, shape: tuple[int, int, int], const: dict) -> list[fx.Node] | None:
    """Whether ``n`` begins timm's Swin patch merging of a channels-last map,
    ``x.reshape(N, H/2, 2, W/2, 2, C).permute(0, 1, 3, 4, 2, 5).flatten(3)`` (each 2 × 2 block into 4 C
    channels, torchvision's order: :class:`correlated.PatchMerging`): the permute and the flatten, else
    None."""
    C, H, W = shape
    want = _shape_args(n, const) if n.target in _RESHAPES else None
    if want is None or H % 2 or W % 2 or want != [want[0], H // 2, 2, W // 2, 2, C] or want[0] not in (1, -1):
        return None
    t = _only_user(n)
    order = ([0, 1, 3, 4, 2, 5], [[0, 1, 3, 4, 2, 5]])
    if t is None or t.target not in _PERMUTES or list(t.args[1:]) not in order:
        return None
    last = _only_user(t)
    flat = last is not None and last.target in ("flatten", torch.flatten) and not last.kwargs
    return [t, last] if flat and list(last.args[1:]) == [3] else None


_CHW = ("C", "H", "W")
_HWC = ("H", "W", "C")

_WINDOW_OPS = ("view", "reshape", "permute", "transpose", "contiguous", "size", torch.roll, torch.reshape,
               torch.permute, torch.transpose, _F.pad, getattr, operator.getitem, operator.floordiv,
               operator.mul, operator.add, operator.sub, operator.mod)  # fmt: skip


def _window_chain(gm: fx.GraphModule, nodes: list, n: fx.Node, shape: tuple, const: dict) -> dict | None:
    """Whether ``n`` begins a window attention written on a channels-last map (timm's Swin): [a roll] [a pad]
    the partition into (windows, w_h·w_w, C) tokens, a module whose rule is a
    :class:`correlated.WindowAttention`, the reverse, [the crop] [the roll back]. The chain is run on the
    map's position indices (batch 1, the module as the identity): it must give the map back, each
    window's tokens must be where the rule's cells have them (the map padded to whole windows, then
    rolled by the shift, as torchvision's), and its mask (if any) must part the cells (−100 between them,
    0 within). Returns the planned steps: the chain's tensors the identity (the field stays the map), the
    module its rule with the shift; None where ``n`` begins no such chain."""
    C, H, W = shape
    idx = torch.arange(1, C * H * W + 1, dtype=torch.float64).reshape(1, H, W, C)
    env, side, chain, module = {n.args[0]: idx}, {}, [], None

    def known(a):
        if a in env:
            return env[a]
        if a in const:
            return const[a]
        if a in side:
            return side[a]
        if a.op == "get_attr":
            return functools.reduce(getattr, str(a.target).split("."), gm)
        raise KeyError(a)

    prev, end = n.args[0], None
    for m in nodes[nodes.index(n) : nodes.index(n) + 80]:
        ins = [a for a in _node_args(m) if a in env]
        if not ins:  # a size computed beside the chain (Swin's pads after its roll): for the chain's ops
            if m.op in ("call_method", "call_function") and m.target in _WINDOW_OPS:
                try:
                    a, k = fx.node.map_arg((m.args, m.kwargs), known)
                    side[m] = (getattr(a[0], m.target)(*a[1:], **k) if m.op == "call_method"
                               else m.target(*a, **k))  # fmt: skip
                except Exception:  # noqa: BLE001 (not a size after all: the chain's ops go without it)
                    pass
            continue
        allowed = (m.op == "call_module" and module is None) or (
            m.op in ("call_method", "call_function") and m.target in _WINDOW_OPS)  # fmt: skip
        try:
            args, kwargs = fx.node.map_arg((m.args, m.kwargs), known) if allowed else (None, None)
        except KeyError:
            allowed = False
        if allowed and m.op == "call_module":
            sub = gm.get_submodule(str(m.target))
            make = rule_for(sub)
            step = None if make is None else make(sub)
            if not isinstance(step, cr.WindowAttention) or step.window is None:  # MaxViT's: on a partition
                return None
            if not isinstance(args[0], torch.Tensor):
                return None
            module, tokens, mask = m, args[0], kwargs.get("mask", args[1] if len(args) > 1 else None)
            value = args[0]
        elif allowed:
            value = (getattr(args[0], m.target)(*args[1:], **kwargs) if m.op == "call_method"
                     else m.target(*args, **kwargs))  # fmt: skip
        tensors = [a for a in ins if isinstance(env[a], torch.Tensor)]
        if not allowed or (isinstance(value, torch.Tensor) and tensors != [prev]):
            if end is not None:  # past the chain's end
                break
            return None
        env[m] = value
        if isinstance(value, torch.Tensor):
            chain.append(m)
            prev = m
            if module is not None and value.shape == idx.shape and torch.equal(value, idx):
                end = len(chain)  # the map given back (the last time: its crop, a copy, the roll back)
    if end is None:
        return None
    chain = chain[:end]
    if any(u not in env for t in chain[:-1] for u in t.users):  # a tensor of the chain used elsewhere
        return None
    first = int(tokens.flatten()[0]) - 1  # the map position of the first window's first token
    if first < 0 or tokens.ndim != 3:
        return None
    (wh, ww), p = step.window, first // C
    cells = _Cells(H, W, (wh, ww), (p // W, p % W))
    (sh, sw), Hp, Wp = cells.shift, cells.Hp, cells.Wp
    rows, cols = (torch.arange(Hp) + sh) % Hp, (torch.arange(Wp) + sw) % Wp  # the rolled map's

    def windows(t: torch.Tensor) -> torch.Tensor:  # (Hp, Wp, ...) of the rolled map → (windows, w_h·w_w, ...)
        t = t[rows][:, cols]
        t = t.reshape(Hp // wh, wh, Wp // ww, ww, *t.shape[2:]).transpose(1, 2)
        return t.reshape(-1, wh * ww, *t.shape[4:])

    padded = _F.pad(idx[0], (0, 0, 0, Wp - W, 0, Hp - H))
    if tokens.shape != (Hp * Wp // (wh * ww), wh * ww, C) or not torch.equal(tokens, windows(padded)):
        return None
    cell = windows(cells.id)
    same = cell[:, :, None] == cell[:, None, :]
    if mask is None:
        ok = bool(same.all())
    else:
        mask = torch.as_tensor(mask).detach().to(torch.float64)
        ok = mask.shape == same.shape and bool((mask[same] == 0).all()) and bool((mask[~same] <= -30).all())
    if not ok:
        return None
    step.shift, step.returns_windows = (sh, sw), True
    return {t: step if t is module else Identity() for t in chain}


_FLATTENED = ("CHW",)  # a map flattened into one dim after the batch (torch.flatten(x, 1)): C·H·W values
_PERMUTES = (torch.permute, "permute")
# steps that act on each element (or each sample) alike: any layout of the tensor's dims
_ANY_LAYOUT = (cr.Pointwise, cr.ReLU, cr.Dropout, cr.StochasticDepth, Identity)


def _permuted(n: fx.Node, layout: tuple) -> tuple:
    """The layout after a permute or transpose (the batch dim stays first): the field is as it was, its
    axes ("C", "H", "W"; those of size 1 may be left out) named in the tensor's order."""
    full = ("N", *layout)
    if n.target in _PERMUTES:
        perm = list(n.args[1:])
        if len(perm) == 1 and isinstance(perm[0], (list, tuple)):
            perm = list(perm[0])
        perm = perm or list(n.kwargs.get("dims", ()))
    else:
        a, b = n.args[1:3] if len(n.args) >= 3 else (n.kwargs.get("dim0"), n.kwargs.get("dim1"))
        if not isinstance(a, int) or not isinstance(b, int):
            raise NotImplementedError("a transpose of traced dims")
        perm = list(range(len(full)))
        perm[a % len(full)], perm[b % len(full)] = perm[b % len(full)], perm[a % len(full)]
    if not all(isinstance(d, int) for d in perm) or len(perm) != len(full):
        raise NotImplementedError(f"a permute of a {len(full)}-D tensor by {perm}")
    perm = [d % len(full) for d in perm]
    if sorted(perm) != list(range(len(full))) or perm[0] != 0:
        raise NotImplementedError("a permute that moves the batch")
    return tuple(full[d] for d in perm[1:])


def _to_field(v, layout: tuple):
    """A constant broadcast against a tensor of this layout, as a tensor on the field's (C, H, W)."""
    if not isinstance(v, torch.Tensor):
        return v
    if isinstance(layout, cr.Regrouped):  # a number, or a vector along the channels last
        t = v.detach()
        if t.numel() == 1:
            return t.reshape(())
        if layout[-1] != "C" or t.shape[-1] != layout.chw[0] or t.numel() != t.shape[-1]:
            raise NotImplementedError(f"a {tuple(t.shape)} constant on a map's regrouped positions")
        return t.reshape(-1, 1, 1)
    if layout == _CHW:
        return v[0] if v.ndim == 4 and v.shape[0] == 1 else v  # (1, C, H, W): one for the whole batch
    t = v.detach()
    if t.ndim > len(layout) + 1 or (t.ndim == len(layout) + 1 and t.shape[0] != 1):
        raise NotImplementedError(f"a {tuple(t.shape)} constant on a {layout} tensor")
    t = t.reshape((1,) * (len(layout) - t.ndim + 1) + tuple(t.shape))[0]
    axes = [a for a in _CHW if a in layout]
    t = t.permute([layout.index(a) for a in axes])
    return t.reshape([t.shape[axes.index(a)] if a in axes else 1 for a in _CHW])


def _flattens_positions(n: fx.Node, f: cr.Field, const: dict, layout: tuple = _CHW) -> bool:
    """Whether ``n`` is ``x.flatten(2)`` or ``x.reshape(N, C, H·W)`` of a (C, H, W) map, or
    ``x.flatten(1, 2)`` or ``x.reshape(N, H·W, C)`` of a channels-last one: its tokens."""
    C, H, W = f.shape
    last = layout == ("H", "W", "C")
    if n.target in ("flatten", torch.flatten):
        start = n.kwargs.get("start_dim", n.args[1] if len(n.args) > 1 else 0)
        end = n.kwargs.get("end_dim", n.args[2] if len(n.args) > 2 else -1)
        return (start, end) in ((1, 2), (-3, -2)) if last else start in (2, -2) and end in (3, -1)
    want = _shape_args(n, const) if n.target in _RESHAPES else None
    if want is None or len(want) != 3 or want[0] not in (1, -1):
        return False
    tokens, channels = (want[1], want[2]) if last else (want[2], want[1])
    return channels == C and tokens in (H * W, -1)


def _unflattens_tokens(
    n: fx.Node, f: cr.Field, const: dict, layout: tuple = ("C", "W")
) -> tuple[int, int] | None:
    """(H, W) where ``n`` is ``x.reshape(N, C, H, W)`` (or ``view``) of a (C, 1, H·W) sequence whose
    tensor is (N, C, T) (tokens transposed back, PiT's), or ``x.reshape(N, H, W, C)`` of (N, T, C)
    tokens (a channels-last map, PVT v2's), else None."""
    C, one, T = f.shape
    want = _shape_args(n, const) if n.target in _RESHAPES else None
    if want is not None and len(want) == 4 and layout == ("W", "C"):
        want = [want[0], want[3], want[1], want[2]]  # as (N, C, H, W)
    if one != 1 or want is None or len(want) != 4 or want[0] not in (1, -1) or want[1] not in (C, -1):
        return None
    H, W = want[2:]
    if H == -1 and W > 0 and T % W == 0:
        H = T // W
    elif W == -1 and H > 0 and T % H == 0:
        W = T // H
    return (H, W) if H > 0 and W > 0 and H * W == T else None


def _in_layout(m: nn.Module, step, f: cr.Field, layout: tuple):
    """A module's step on a tensor of this layout: a Linear on a map mixes the channels at each
    position (a 1×1 conv), a LayerNorm needs its dim to be the channels, the rest channels first; on
    a map's regrouped positions (:class:`correlated.Regrouped`) an attention within each row's."""
    if isinstance(layout, cr.Regrouped):
        return _on_regrouped(m, step, layout)
    windowless = isinstance(step, cr.WindowAttention) and step.window is None
    if layout == _HWC and windowless and step.token_dims == 2:
        _, H, W = f.shape  # timm's MaxViT on a map of one window: its positions one cell, row by row
        return step.within(torch.zeros(H * W, dtype=torch.long), torch.arange(H * W))
    attention = (cr.Attention, cr.CrossCovarianceAttention)  # on (N, T, C) tokens
    if f.shape[1:] == (1, 1) or isinstance(step, (*_ANY_LAYOUT, *attention)):
        return step
    if isinstance(step, cr.OnMap) or getattr(step, "takes_tokens", False):  # a step of (N, T, C) tokens
        if layout != ("W", "C"):
            raise NotImplementedError(f"{type(m).__name__} of a {layout} tensor: (N, T, C) tokens only")
        return step
    if isinstance(step, cr.Linear):
        return _linear(m.weight, m.bias, f, layout)
    if isinstance(step, cr.LayerNorm) and not step.channels_first:
        if layout[-1] != "C":
            raise NotImplementedError(f"LayerNorm over the {layout[-1]} dim of a map")
        return step
    if layout != _CHW:
        raise NotImplementedError(f"{type(m).__name__} of a {layout} tensor (channels first only)")
    return step


def _on_regrouped(m: nn.Module, step, layout: cr.Regrouped):
    """A module's step on a map's regrouped positions: an attention within each row's positions (a window
    attention of no window of its own: the rows its cells), a step of each element or each position's
    channels (a Linear, a LayerNorm) as it is on the map; a sample's stochastic depth only where the first
    dim is the batch alone (else its rows drop apart)."""
    if isinstance(step, cr.Attention):
        return cr.CellAttention(step, layout.cells())
    if isinstance(step, cr.WindowAttention) and step.window is None:  # MaxViT's, within its partition
        return step.within(*layout.cells_and_tokens(step.token_dims))
    if isinstance(step, cr.StochasticDepth) and step.active and layout.where.shape[0] != 1:
        raise NotImplementedError("stochastic depth of a batch merged with the map's positions")
    if isinstance(step, _ANY_LAYOUT):
        return step
    if layout[-1] == "C" and isinstance(step, cr.Linear):  # over the channels at each position
        return cr.Conv(m.weight[:, :, None, None], m.bias, (1, 1), (0, 0))
    if layout[-1] == "C" and isinstance(step, cr.LayerNorm) and not step.channels_first:
        return step
    raise NotImplementedError(f"{type(m).__name__} of a map's regrouped positions (dims {tuple(layout)})")


# functions a trace keeps whole (fx leaves) that only move a tensor's elements: the walk applies them to
# the index of a regrouped map (timm's MaxViT: its windows' and grid's tokens back into the map)
_REGROUPING_FUNCTIONS = frozenset({"timm.models.maxxvit.window_reverse", "timm.models.maxxvit.grid_reverse",
                                   "timm.models.gcvit.window_reverse"})  # fmt: skip


def _regroups(n: fx.Node) -> bool:
    """Is ``n`` a call of one of :data:`_REGROUPING_FUNCTIONS`?"""
    f = n.target
    name = f"{getattr(f, '__module__', '')}.{getattr(f, '__qualname__', '')}"
    return n.op == "call_function" and name in _REGROUPING_FUNCTIONS


def _regroup(n: fx.Node, index: torch.Tensor, chw: tuple, const: dict) -> tuple:
    """The layout after a reshape, view, transpose or permute ``n`` of a tensor whose elements are
    ``index`` (at batch 1, as the trace's sizes take it) on the field of shape ``chw``
    (:func:`correlated.regrouped`)."""
    args, kwargs = fx.node.map_arg((n.args[1:], n.kwargs), lambda a: const.get(a, a))
    traced: list[fx.Node] = []
    fx.node.map_arg((args, kwargs), traced.append)
    if traced:
        raise NotImplementedError(f"{_name(n)} by traced sizes")
    if n.target == "view":  # where the model's view held, a reshape moves its elements as it did
        index = index.contiguous()
    op = getattr(index, n.target) if isinstance(n.target, str) else functools.partial(n.target, index)
    try:
        return cr.regrouped(op(*args, **kwargs), chw)
    except RuntimeError as e:
        raise NotImplementedError(f"{_name(n)} of a map's positions: {e}") from None


def _linear(weight: torch.Tensor, bias, f: cr.Field, layout: tuple):
    """``F.linear`` (or an ``nn.Linear``) of a tensor of this layout: on features (C, 1, 1) the Linear's
    rule, over the channels at each position a 1×1 conv, over a flattened map (``torch.flatten(x, 1)``)
    every channel and position at once (:class:`correlated.FlatLinear`)."""
    if weight.ndim != 2:
        raise NotImplementedError(f"linear with a {tuple(weight.shape)} weight")
    if f.shape[1:] == (1, 1):
        return cr.Linear(weight, bias)
    if layout == _FLATTENED:
        return cr.FlatLinear(weight, bias)
    if layout[-1] == "W" and f.shape[1] == 1:  # over the tokens (MLP-Mixer's token MLP)
        return cr.TokenLinear(weight, bias)
    if layout[-1] != "C":
        raise NotImplementedError(f"Linear over the {layout[-1]} dim of a map")
    return cr.Conv(weight[:, :, None, None], bias, (1, 1), (0, 0))


def _flattens_map(n: fx.Node, f: cr.Field, const: dict) -> bool:
    """Whether ``n`` flattens a (C, H, W) map whole, its batch kept: ``torch.flatten(x, 1)``,
    ``x.view(x.size(0), -1)``, ``x.reshape(N, C·H·W)`` (an ``nn.Flatten()`` module: :func:`_flat_module`)."""
    if n.target in ("flatten", torch.flatten):
        start = n.kwargs.get("start_dim", n.args[1] if len(n.args) > 1 else 0)
        end = n.kwargs.get("end_dim", n.args[2] if len(n.args) > 2 else -1)
        return start in (1, -3) and end in (3, -1)
    want = _shape_args(n, const) if n.target in _RESHAPES else None
    return want is not None and len(want) == 2 and want[0] in (1, -1) and want[1] in (f.mean.numel(), -1)


def _split_ranges(n: fx.Node, channels: int, layout: tuple, const: dict) -> list[tuple[int, int]]:
    """The channel ranges of a chunk, split or tensor_split along the channels (any other dim: no
    rule), as torch cuts them: the op applied to the channel indices."""
    dim = n.kwargs.get("dim", n.args[2] if len(n.args) > 2 else 0)
    full = ("N", *layout)
    if not isinstance(dim, int) or not -len(full) <= dim < len(full) or full[dim] != "C":
        raise NotImplementedError(f"{_name(n)} along dim {dim}: the channels only")
    index = torch.arange(channels).reshape([channels if a == "C" else 1 for a in full])
    args, kwargs = fx.node.map_arg((n.args[1:], n.kwargs), lambda a: const.get(a, a))
    traced: list[fx.Node] = []
    fx.node.map_arg((args, kwargs), traced.append)
    if traced:
        raise NotImplementedError(f"{_name(n)} by traced sizes")
    op = getattr(torch, n.target) if isinstance(n.target, str) else n.target
    return [(int(p.min()), int(p.max()) + 1) if p.numel() else (0, 0) for p in op(index, *args, **kwargs)]


def _name(n: fx.Node) -> str:
    return n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))


def _index(n: fx.Node, const: dict):
    """The index of ``x[idx]``, a size computed in the trace (PiT's ``x[:, :cls_tokens.shape[1]]``) as its
    number."""
    return fx.node.map_arg(n.args[1], lambda a: const.get(a, a))


def _channel_slice(n: fx.Node, channels: int, layout: tuple, const: dict) -> cr.ChannelSlice | None:
    """``x[:, a:b]`` (``x[:, a:b, :, :]``, ``x[..., a:b]`` of tokens): the slice of the channels that it
    is, else None (another index)."""
    idx = _index(n, const)
    idx = idx if isinstance(idx, tuple) else (idx,)
    if idx and idx[-1] is Ellipsis and layout[-1] != "C":
        idx = idx[:-1]
    full = ("N", *layout)
    if idx and idx[0] is Ellipsis:
        idx = (slice(None),) * (len(full) - len(idx) + 1) + idx[1:]
    c = full.index("C") if "C" in full else None
    if c is None or len(idx) <= c or len(idx) > len(full):
        return None
    whole = all(i == slice(None) for j, i in enumerate(idx) if j != c)
    sl = idx[c]
    if not whole or not isinstance(sl, slice) or sl.step not in (None, 1):
        return None
    if not all(isinstance(v, (int, type(None))) for v in (sl.start, sl.stop)):
        return None
    start, stop, _ = sl.indices(channels)
    return cr.ChannelSlice(start, max(start, stop))


def _token_slice(n: fx.Node, f: cr.Field, layout: tuple, const: dict) -> cr.TokenSlice | None:
    """``x[:, a:b]`` of (N, T, C) tokens (the patches after the class token: Beit's average head; CrossViT's
    ``x[:, 0:1, ...]``; CoaT's ``x[:, 1:, :]``): the tokens a … b − 1 (:class:`correlated.TokenSlice`); None
    for another index."""
    idx = _index(n, const)
    if isinstance(idx, tuple) and len(idx) == 3 and (idx[2] is Ellipsis or idx[2] == slice(None)):
        idx = idx[:2]
    if layout != ("W", "C") or not (isinstance(idx, tuple) and len(idx) == 2 and idx[0] == slice(None)):
        return None
    sl, T = idx[1], f.shape[2]
    if not isinstance(sl, slice) or sl.step not in (None, 1) or not all(
            isinstance(v, (int, type(None))) for v in (sl.start, sl.stop)):  # fmt: skip
        return None
    keep = range(*sl.indices(T))
    if not keep:
        raise NotImplementedError("an empty slice of the tokens")
    return cr.TokenSlice(keep.start, keep.stop)


def _means_tokens(n: fx.Node) -> bool:
    """Is ``n`` a mean of (N, T, C) tokens over the tokens (``x.mean(dim=1)``, keepdim False)?"""
    if n.target not in ("mean", torch.mean) or n.op not in ("call_method", "call_function"):
        return False
    dim = n.kwargs.get("dim", n.args[1] if len(n.args) > 1 else None)
    keep = n.kwargs.get("keepdim", n.args[2] if len(n.args) > 2 else False)
    return dim in (1, -2, (1,), [1]) and keep is False


def _select(n: fx.Node, layout: tuple, const: dict) -> cr.SelectToken:
    """``x[:, i]`` of tokens (a class token)."""
    idx = _index(n, const)
    if layout != ("W", "C") or not (
        isinstance(idx, tuple) and len(idx) == 2 and idx[0] == slice(None) and isinstance(idx[1], int)
    ):
        raise NotImplementedError(f"an index {idx!r} of a {layout} tensor (a token only: x[:, i])")
    return cr.SelectToken(idx[1])


def _pooled(fields: list, key: str) -> float | None:
    """Several calls' moments as one row, as the measurement pools them: by their sizes."""
    if not fields or any(f is None for f in fields):
        return None
    sizes = [f.var.numel() for f in fields]
    if key == "grad_e2":
        return sum(n * float(f.var.mean()) for n, f in zip(sizes, fields)) / sum(sizes)
    ms = [f.moments() for f in fields]
    mean = sum(n * m["mean"] for n, m in zip(sizes, ms)) / sum(sizes)
    e2 = sum(n * m["e2"] for n, m in zip(sizes, ms)) / sum(sizes)
    return {"mean": mean, "e2": e2, "var": max(e2 - mean * mean, 0.0)}[key]


@dataclass
class CorrelatedRow:
    """The prediction at one module's output: its field, and its gradient's field (None: no rule).

    A module called more than once (torchvision's BasicBlock calls its ``relu`` twice) has its first
    call in ``field``/``grad`` (the stencils: the measured stencil is the first call's too) and the
    later ones in ``more``; ``mean``, ``var``, ``e2`` and ``grad_e2`` pool every call by its size.
    """

    name: str
    kind: str
    field: cr.Field | None = None
    grad: cr.Field | None = None
    note: str = ""
    more: list = dataclasses.field(default_factory=list)  # [(field, grad)] of the later calls

    def _all(self, i: int) -> list:
        return [(self.field, self.grad)[i]] + [c[i] for c in self.more]

    @property
    def var(self) -> float | None:
        return _pooled(self._all(0), "var")

    @property
    def mean(self) -> float | None:
        return _pooled(self._all(0), "mean")

    @property
    def e2(self) -> float | None:
        return _pooled(self._all(0), "e2")

    @property
    def grad_e2(self) -> float | None:
        return _pooled(self._all(1), "grad_e2")

    def corr(self, lag: int) -> float | None:
        return None if self.field is None else cr.neighbour_corr(self.field, lag)

    def grad_corr(self, lag: int) -> float | None:
        return None if self.grad is None else cr.neighbour_corr(self.grad, lag)

    def to_dict(self) -> dict:
        def num(v):
            return None if v is None or not math.isfinite(v) else v

        return {
            "name": self.name,
            "kind": self.kind,
            "mean": num(self.mean),
            "var": num(self.var),
            "e2": num(self.e2),
            "corr1": num(self.corr(1)),
            "corr2": num(self.corr(2)),
            "grad_e2": num(self.grad_e2),
            "grad_corr1": num(self.grad_corr(1)),
            "note": self.note,
        }


@dataclass
class CorrelatedPrediction:
    rows: dict[str, CorrelatedRow]
    notes: list[str] = field(default_factory=list)

    def __getitem__(self, name: str) -> CorrelatedRow:
        return self.rows[name]

    def __contains__(self, name) -> bool:
        return name in self.rows

    def to_dict(self) -> dict:
        return {"notes": list(self.notes), "modules": [r.to_dict() for r in self.rows.values()]}


class _Walk(Walk):
    """The correlated walk: each node's :class:`correlated.Field` (``visit``), a tensor's two gradients
    added (``correlated.add_grads``), each step's gradient to its inputs (``pull``)."""

    def __init__(self, gm: fx.GraphModule, exact_lags: int, batch: int | None) -> None:
        nodes = list(gm.graph.nodes)
        out = nodes[-1].args[0]  # the output node's
        super().__init__(gm, nodes[0], out if isinstance(out, fx.Node) else None)
        self.exact_lags, self.batch = exact_lags, batch
        self.const: dict[fx.Node, object] = {}  # parameters, buffers, maps' sizes, what is computed from them
        self.planned: dict[fx.Node, object] = {}  # the later steps of a chain recognised whole (a shuffle)
        self.dims: dict[fx.Node, tuple] = {nodes[0]: _CHW}  # a tensor's dims after the batch (_permuted)
        self.pieces: dict[fx.Node, list] = {}  # a split's channel ranges, for the getitems of its pieces
        self.order = {m: i for i, m in enumerate(nodes)}
        self.holders: dict[int, list[fx.Node]] = {}  # the nodes whose value is one Field (an identity's)
        self.own: dict[fx.Node, object] = {}  # window steps whose module returns its windows (``as_module``)
        self.within: list = []  # steps with rows of modules they call inside (CoaT's shared crpe)

    def visit(self, n: fx.Node) -> cr.Field | None:
        """Node ``n``'s field from its inputs' (:class:`graph.NoPrediction`: why it has none); a constant
        (a parameter, a map's size, what is computed from them alone) goes to ``const`` instead."""
        value, inputs, const, dims = self.value, self.inputs, self.const, self.dims
        if n.op == "get_attr":
            const[n] = functools.reduce(getattr, str(n.target).split("."), self.gm)
            return None
        size = _size(n, value, dims)
        if size is not None:
            const[n] = size
            return None
        found = _node_args(n)
        if found and n.op.startswith("call_") and all(a in const for a in found):
            try:
                const[n] = _fold(n, const, self.gm)
            except Exception as e:  # noqa: BLE001 (any op on constants: no prediction, the reason kept)
                raise NoPrediction(f"{n.name}: {type(e).__name__} on constants") from None
            raise NoPrediction(f"{n.name}: a constant (of parameters alone): no field to predict")
        if n.op == "placeholder":  # an optional input (attn_mask=None): its default
            const[n] = n.args[0] if n.args else None
            return None
        args = inputs[n] = [a for a in found if a not in const]
        if any(value.get(a) is None for a in args):
            raise NoPrediction(f"no input for {n.name}")
        if not args:
            raise NoPrediction(f"{n.name}: no rule")
        layout = dims[n] = dims.get(args[0], _CHW)  # as its first input's unless the step changes it
        try:
            out = self._step(n, args, layout)
            if isinstance(dims[n], cr.Regrouped) and out.shape[0] != dims[n].chw[0]:  # a Linear's width
                dims[n] = dims[n].with_channels(out.shape[0])
            return out
        except NotImplementedError as e:
            raise NoPrediction(f"{n.name}: {e}") from None

    def _step(self, n: fx.Node, args: list[fx.Node], layout: tuple) -> cr.Field:
        """The step of node ``n`` (into ``steps[n]``) and its field; NotImplementedError where no rule has
        one."""
        value, steps, inputs, const, dims = self.value, self.steps, self.inputs, self.const, self.dims
        planned, pieces = self.planned, self.pieces
        if isinstance(layout, cr.Regrouped) and (out := self._regrouped(n, args, layout)) is not None:
            return out
        if n in planned:
            steps[n] = planned.pop(n)
            out = steps[n].forward(value[args[0]])
        elif (chain := _shuffle(n, value[args[0]].shape, const)) is not None:
            *between, last = chain[0]
            planned.update({m: Identity() for m in between})
            planned[last] = cr.ChannelShuffle(chain[1])
            out, steps[n] = value[args[0]], Identity()
        elif (
            layout == ("H", "W", "C")
            and n.target in (torch.roll, _F.pad, "view", "reshape")
            and (chain := _window_chain(self.gm, self.nodes, n, value[args[0]].shape, const)) is not None
        ):
            planned.update(chain)  # a window attention on the map (timm's Swin)
            steps[n] = planned.pop(n)
            out = steps[n].forward(value[args[0]])
        elif layout == ("H", "W", "C") and (merge := _merging(n, value[args[0]].shape, const)) is not None:
            planned.update({merge[0]: Identity(), merge[1]: cr.PatchMerging()})  # timm's Swin
            out, steps[n] = value[args[0]], Identity()
        elif n.target in (_F.channel_shuffle, torch.channel_shuffle):
            groups = n.kwargs.get("groups", n.args[1] if len(n.args) > 1 else None)
            if not isinstance(groups, int):
                raise NotImplementedError("channel shuffle with a traced group count")
            step = cr.ChannelShuffle(groups)
            out = step.forward(value[args[0]])
            steps[n] = step
        elif n.target in _PERMUTES or n.target in _TRANSPOSES:
            dims[n] = _permuted(n, layout)
            out, steps[n] = value[args[0]], Identity()
        elif n.target is operator.getitem and isinstance(steps.get(args[0]), _ATTENTIONS):
            if n.args[1] != 0:
                raise NotImplementedError("the attention weights")
            out, steps[n] = value[args[0]], Identity()
        elif n.target in _SPLITS:  # the pieces are its getitems
            pieces[n] = _split_ranges(n, value[args[0]].shape[0], layout, const)
            out, steps[n] = value[args[0]], Identity()
        elif n.target is operator.getitem and args[0] in pieces:
            if not isinstance(n.args[1], int):
                raise NotImplementedError(f"the pieces of a split taken by {n.args[1]!r}")
            step = cr.ChannelSlice(*pieces[args[0]][n.args[1]])
            out, steps[n] = step.forward(value[args[0]]), step
        elif n.target is operator.getitem and (
            step := _channel_slice(n, value[args[0]].shape[0], layout, const)
        ) is not None:
            out, steps[n] = step.forward(value[args[0]]), step
        elif n.target is operator.getitem and (step := _token_slice(n, value[args[0]], layout, const)):
            out, steps[n] = step.forward(value[args[0]]), step
        elif n.target is operator.getitem:
            step = _select(n, layout, const)
            out, steps[n], dims[n] = step.forward(value[args[0]]), step, ("C",)
        elif n.op == "call_module":
            m = self.gm.get_submodule(str(n.target))
            make = rule_for(m)
            if make is None:
                raise NotImplementedError(f"no correlated rule for {type(m).__name__}")
            step = _in_layout(m, make(m), value[args[0]], layout)
            if (arity := getattr(step, "arity", None)) is not None:  # the call's tensors it reads, in order
                args = inputs[n] = args[:arity]  # (GCViT's local blocks are passed the queries, unread)
            if isinstance(m, nn.Flatten) and value[args[0]].shape[1:] != (1, 1):
                if layout != _CHW or (m.start_dim, m.end_dim) not in ((1, -1), (1, 3), (-3, -1)):
                    raise NotImplementedError("flatten of a map with positions but into (N, C·H·W)")
                dims[n] = _FLATTENED
            if isinstance(step, cr.FlatLinear):
                dims[n] = ("C",)
            for part in _parts(step):  # a timm norm-and-activation's, an attention's projections'
                if isinstance(part, cr.BatchNorm):
                    part.batch = self.batch
                if isinstance(part, cr.ReLU):
                    part.R = self.exact_lags
            if isinstance(step, _ATTENTIONS):  # query, key and value one tensor
                if len(set(args)) != 1 or (isinstance(step, cr.Attention) and layout != ("W", "C")):
                    raise NotImplementedError("attention but batch-first self-attention on tokens")
                inputs[n] = args[:1]
            if hasattr(step, "bind"):  # the call's other arguments, constants (PVT's feat_size)
                given, left = fx.node.map_arg((n.args[1:], n.kwargs), lambda a: const.get(a, a)), []
                fx.node.map_arg(given, left.append)
                if left:
                    raise NotImplementedError(f"{type(m).__name__} called with a tensor beside its input")
                step.bind(*given[0], **given[1])
            pre = _relu_input(args[0], steps, inputs) if isinstance(step, cr.MaxPool) else None
            if pre is not None:  # max ReLU = ReLU max
                out = step.forward(value[args[0]], pre=pre)
            elif getattr(step, "arity", 1) > 1:  # its inputs, as the call passes them (truncated above)
                out = step.forward([value[a] for a in args])
            else:
                out = step.forward(value[args[0]])
            if isinstance(step, cr.Conv) and value[args[0]].law is not None:  # a sparse input's law
                out.law = cr.conv_law(value[args[0]], step, out)
            out.regime = _regime_through(step, value[args[0]], out) if out.regime is None else out.regime
            steps[n] = step
            if hasattr(step, "rows"):
                self.within.append(step)
        elif n.op != "call_module" and (make := registry.function_rule(n.target)) is not None:
            if len(args) != 1:
                raise NotImplementedError(f"a registered rule maps one tensor, not {len(args)}")
            given = fx.node.map_arg((n.args, n.kwargs), lambda a: const.get(a, value.get(a)))
            step = make(*given[0], **given[1])
            out = step.forward(value[args[0]])
            steps[n] = step
        elif n.target in _ADDS and len(args) == 1 and len(n.args) == 2:  # x + a constant
            c = next(const.get(v, v) for v in n.args if v is not args[0])
            if isinstance(c, bool) or not isinstance(c, (int, float, torch.Tensor)):
                raise NotImplementedError(f"a sum with a {type(c).__name__}")
            step = cr.Shift(_to_field(c, layout))
            out, steps[n] = step.forward(value[args[0]]), step
        elif n.target in _SUBS and len(args) == 2 and len(n.args) == 2:  # pool(x) − x
            i = next((i for i in (0, 1) if inputs.get(n.args[i]) == [n.args[1 - i]]), None)
            a, b = (None, None) if i is None else (n.args[i], n.args[1 - i])  # a = A b
            pool = None if a is None else steps.get(a)
            if isinstance(pool, AvgPool2dStep) and pool.s == (1, 1) and len(a.users) == 1:  # a stencil
                diff = pool.stencil(value[b], minus_identity=True)
                step = _Difference(diff if i == 0 else Steps(diff, cr.Scale(-1.0)), i)
            else:
                A = None if a is None else _positions_matrix(pool, value[b])
                if A is None or len(a.users) != 1 or A.shape[0] != A.shape[1]:
                    raise NotImplementedError("a difference of two tensors: x − A x or A x − x, A a "
                                              "fixed map of x's positions (a pool), only")  # fmt: skip
                eye = torch.eye(len(A), dtype=A.dtype)
                step = _Difference(cr.PositionMap(A - eye if i == 0 else eye - A, value[b].shape[1:]), i)
            out, steps[n] = step.forward(value[b]), step
            inputs[a] = []  # its gradient is the output's; x's goes through A − I here
        elif n.target in _SUBS and len(args) == 1 and len(n.args) == 2:  # x − c, c − x
            c = next(const.get(v, v) for v in n.args if v is not args[0])
            if isinstance(c, bool) or not isinstance(c, (int, float, torch.Tensor)):
                raise NotImplementedError(f"a difference with a {type(c).__name__}")
            c = _to_field(c, layout)
            step = cr.Shift(-c) if n.args[0] is args[0] else Steps(cr.Scale(-1.0), cr.Shift(c))
            out, steps[n] = step.forward(value[args[0]]), step
        elif n.target in _ADDS and len(args) == 2 and len(n.args) == 2:
            if dims.get(args[1], _CHW) != layout:
                raise NotImplementedError("a sum of tensors of two layouts")
            out = cr.add(value[args[0]], value[args[1]])
            gain = _branch_gain(args, steps, inputs, value)
            if gain is not None:  # one a function of the other, channel by channel: their cross term
                out = cr.add_cross(out, value[args[gain[0]]], gain[1])
            relus = [_relu_step(a, steps, inputs) for a in args]
            r = next(i for i, s in enumerate(relus) if s) if sum(map(bool, relus)) == 1 else None
            both = regime.add(*(value[a].regime for a in args))
            if r is not None:  # b + ReLU(out): a ReLU after it takes the skewed sum's moments
                stream = relus[r].law
                out = dataclasses.replace(out, parts=(value[args[1 - r]], stream))
            elif (r := _carries_stream(*(value[a] for a in args))) is not None:  # (b + ReLU(y)) + c
                b, stream = value[args[r]].parts
                out = dataclasses.replace(out, parts=(cr.add(b, value[args[1 - r]]), stream))
            elif both is None:  # a field with a law (a pool's, a norm's) and a normal: the sum's law
                out = dataclasses.replace(out, law=cr.sum_law(*(value[a] for a in args)))
            if both is not None:  # the two terms in the same regime: the mixture's law
                both = regime.level(both, out.mean, out.var)
                out = dataclasses.replace(out, law=regime.mixture_law(out.mean, out.var, both), regime=both)
            steps[n] = _Add(r, gain)
        elif (mean := _stacked_mean(n)) is not None:  # the mean of K stacked tensors: their sum over K
            if len(args) != len(n.args[0]) or len({(value[a].shape, dims.get(a, _CHW)) for a in args}) != 1:
                raise NotImplementedError("a stack of tensors of two shapes or with constants")
            out, steps[n] = functools.reduce(cr.add, [value[a] for a in args]), _Add(None)
            planned[mean] = cr.Scale(1.0 / len(args))
        elif n.target in _CATS and layout == ("W", "C"):  # along the tokens, constants too
            dim = n.kwargs.get("dim", n.args[1] if len(n.args) > 1 else 0)
            if dim not in (1, -2):
                raise NotImplementedError(f"cat of tokens along dim {dim}")
            if any(dims.get(a) != layout for a in args):
                raise NotImplementedError("cat of tensors of two layouts")
            step = cr.TokenCat()
            out = step.forward([_to_field(const[v], layout) if v in const else value[v]
                                     for v in n.args[0]])
            steps[n] = step
        elif n.target in _CATS:
            if any(dims.get(a, _CHW) != layout for a in args):
                raise NotImplementedError("cat of tensors of two layouts")
            step = _cat(n, [value[a] for a in args], layout)
            out = step.forward([value[a] for a in args])
            steps[n] = step
        elif (n.target in _MULS and len(args) == 2 and len(n.args) == 2
              and len({value[a].shape for a in args}) == 1 and value[args[0]].shape[1:] != (1, 1)):
            if dims.get(args[1], _CHW) != layout:  # a · b of two maps (StarNet's star)
                raise NotImplementedError("a product of tensors of two layouts")
            if _lineage(args[0], steps, inputs) & _lineage(args[1], steps, inputs):
                raise NotImplementedError("a product of a tensor and a function of its own channels "
                                          "(x · σ(x)): not two independent maps")  # fmt: skip
            step = cr.Product()
            out, steps[n] = step.forward([value[a] for a in args]), step
        elif n.target in _MULS and len(args) == 2 and len(n.args) == 2:  # x · s, s a gate
            if {dims.get(a, _CHW) for a in args} != {_CHW}:
                raise NotImplementedError("a product of tensors that are not channels first")
            step = cr.Gate()
            out, steps[n] = step.forward([value[a] for a in args]), step
        elif (n.target in _MULS or n.target in _DIVS) and len(args) == 1:
            step = _scale(n, args[0], value[args[0]].shape, const, layout)
            out = step.forward(value[args[0]])
            steps[n] = step
        elif layout == _CHW and _flattens_positions(n, value[args[0]], const):  # into tokens
            step = cr.FlattenPositions()
            out, steps[n], dims[n] = step.forward(value[args[0]]), step, ("C", "W")
        elif layout == ("H", "W", "C") and _flattens_positions(n, value[args[0]], const, layout):
            step = cr.FlattenPositions()  # a channels-last map into (N, H·W, C) tokens (PVT v2's)
            out, steps[n], dims[n] = step.forward(value[args[0]]), step, ("W", "C")
        elif layout == ("W", "C") and (hw := _unflattens_tokens(n, value[args[0]], const, layout)):
            step = cr.UnflattenPositions(*hw)  # (N, T, C) tokens into a channels-last map
            out, steps[n], dims[n] = step.forward(value[args[0]]), step, ("H", "W", "C")
        elif layout == ("C", "W") and (hw := _unflattens_tokens(n, value[args[0]], const)) is not None:
            step = cr.UnflattenPositions(*hw)  # tokens back into a map
            out, steps[n], dims[n] = step.forward(value[args[0]]), step, _CHW
        elif (layout in (_CHW, _HWC) and n.target in _RESHAPES and value[args[0]].shape[1:] != (1, 1)
              and not (layout == _CHW and _flattens_map(n, value[args[0]], const))):  # fmt: skip
            index = cr.map_index(value[args[0]].shape)  # (1, C, H, W)
            index = index if layout == _CHW else index.permute(0, 2, 3, 1)
            dims[n] = _regroup(n, index, value[args[0]].shape, const)
            out, steps[n] = value[args[0]], Identity()  # the positions regrouped (MobileViT's, MaxViT's)
        elif n.target in _FLAT or (n.op == "call_method" and n.target in ("flatten", "view")):
            f = value[args[0]]
            if f.shape[1:] == (1, 1):
                out, dims[n] = f, ("C",)
            elif layout == _CHW and _flattens_map(n, f, const):  # a Linear then reads it whole
                out, dims[n] = f, _FLATTENED
            else:
                raise NotImplementedError("flatten of a map with positions but into (N, C·H·W)")
            steps[n] = Identity()
        elif n.target is _F.linear:
            given = fx.node.map_arg((n.args, n.kwargs), lambda a: const.get(a, a))
            w, b = _call_args(lambda input, weight, bias=None: (weight, bias), given)
            if len(args) != 1 or not isinstance(w, torch.Tensor) or isinstance(b, fx.Node):
                raise NotImplementedError("linear of a tensor by a constant weight and bias only")
            step = _linear(w, b, value[args[0]], layout)
            out, steps[n] = step.forward(value[args[0]]), step
            if isinstance(step, cr.FlatLinear):
                dims[n] = ("C",)
        elif n.target in _RELU or (n.op == "call_method" and n.target == "relu"):
            step = cr.ReLU(self.exact_lags)
            out = step.forward(value[args[0]])
            steps[n] = step
        elif n.target is _F.pad:
            given = fx.node.map_arg((n.args, n.kwargs), lambda a: const.get(a, a))
            pads, mode, fill = _call_args(lambda input, pad, mode="constant", value=None:
                                          (pad, mode, value), given)  # fmt: skip
            if adds_nothing(pads, mode):  # 0 on every side (Swin's pad to whole windows, already whole)
                step = Identity()
            elif mode not in ("constant", *cr.PAD_MODES) or layout != _CHW or len(pads) not in (2, 4):
                raise NotImplementedError(f"pad in mode {mode!r} of {len(pads)} sides: a "
                                          "map's (left, right[, top, bottom])")
            elif mode == "constant":
                step = cr.Pad(*pads, *(0, 0)[: 4 - len(pads)], value=fill or 0.0)
            else:  # copies of the map's own values: a fixed map of its positions
                step = cr.ModePad(pads, mode)
            out, steps[n] = step.forward(value[args[0]]), step
        elif n.target in (_F.conv2d, torch.conv2d):  # by a constant weight (a blur pool's filter)
            given = fx.node.map_arg((n.args, n.kwargs), lambda a: const.get(a, a))
            conv = _call_args(_conv2d_call, given)
            if len(args) != 1 or not isinstance(conv.weight, torch.Tensor) or layout != _CHW:
                raise NotImplementedError("conv2d of a channels-first map by a constant weight only")
            step = conv_rule(conv)
            out, steps[n] = step.forward(value[args[0]]), step
        elif n.target is torch.addcmul and len(args) == 1 and args[0] is not n.args[0]:
            given = fx.node.map_arg((n.args, n.kwargs), lambda a: const.get(a, a))
            c, t1, t2, v = _call_args(lambda input, tensor1, tensor2, *, value=1:
                                      (input, tensor1, tensor2, value), given)  # fmt: skip
            factor = t2 if isinstance(t1, fx.Node) else t1  # ResMLP's Affine: β + α · x
            scale = cr.Scale(_factor(_to_field(factor * v, layout), value[args[0]].shape))
            step = Steps(scale, cr.Shift(_to_field(c, layout)))
            out, steps[n] = step.forward(value[args[0]]), step
        elif n.target is _F.interpolate:
            if layout != _CHW:
                raise NotImplementedError(f"interpolate of a {layout} tensor (channels first only)")
            given = fx.node.map_arg((n.args, n.kwargs), lambda a: const.get(a, a))
            step = _call_args(lambda input, *a, **k: cr.Interpolate(*a, **k), given)
            out, steps[n] = step.forward(value[args[0]]), step
        elif n.target is _F.avg_pool2d:
            given = fx.node.map_arg((n.args, n.kwargs), lambda a: const.get(a, a))
            step = AvgPool2dStep(_call_args(lambda input, *a, **k: nn.AvgPool2d(*a, **k), given))
            out, steps[n] = step.forward(value[args[0]]), step
        elif n.target in (_F.max_pool2d, torch.max_pool2d):
            given = fx.node.map_arg((n.args, n.kwargs), lambda a: const.get(a, a))
            pool = _call_args(lambda input, *a, **k: nn.MaxPool2d(*a, **k), given)
            if pool.return_indices:
                raise NotImplementedError("max pool returning its indices")
            step, pre = maxpool_rule(pool), _relu_input(args[0], steps, inputs)  # max ReLU = ReLU max
            out, steps[n] = step.forward(value[args[0]], pre=pre), step
        elif n.target is _F.adaptive_avg_pool2d:
            size = n.kwargs.get("output_size", n.args[1] if len(n.args) > 1 else None)
            step = AdaptiveAvgPool2dStep(nn.AdaptiveAvgPool2d(size))
            out = step.forward(value[args[0]])
            steps[n] = step
        elif layout == ("W", "C") and _means_tokens(n):  # x.mean(1) of (N, T, C) tokens
            step = AdaptiveAvgPool2dStep(nn.AdaptiveAvgPool2d(1))
            out, steps[n], dims[n] = step.forward(value[args[0]]), step, ("C",)
        elif _means_positions(n, layout):  # x.mean([2, 3]), channels last x.mean((1, 2)): the global pool
            step = AdaptiveAvgPool2dStep(nn.AdaptiveAvgPool2d(1))
            out, steps[n] = step.forward(value[args[0]]), step
            if not n.kwargs.get("keepdim", n.args[2] if len(n.args) > 2 else False):
                dims[n] = ("C",)
        elif n.target is _F.dropout:
            p = n.kwargs.get("p", n.args[1] if len(n.args) > 1 else 0.5)
            training = n.kwargs.get("training", n.args[2] if len(n.args) > 2 else True)
            if type(p) not in (int, float) or not isinstance(training, bool):
                raise NotImplementedError("dropout with a traced p or training flag")
            step = cr.Dropout(float(p), training)
            out = step.forward(value[args[0]])
            steps[n] = step
        elif n.target in _COPIES and len(args) == 1:  # the same values (a contiguous copy)
            out, steps[n] = value[args[0]], Identity()
        elif n.target in _POINTWISE or n.target is _F.gelu:
            name = _POINTWISE.get(n.target)
            step = cr.Pointwise(name) if name else gelu_rule(n.kwargs.get("approximate", "none"))
            out = step.forward(value[args[0]])
            steps[n] = step
        else:
            raise NotImplementedError(
                f"no correlated rule for {n.op} {getattr(n.target, '__name__', n.target)}"
            )
        if isinstance(steps.get(n), cr.ReLU):
            steps[n].R = self.exact_lags
        return out

    def _regrouped(self, n: fx.Node, args: list[fx.Node], layout: cr.Regrouped) -> cr.Field | None:
        """A node on a map's regrouped positions: a reshape, view, transpose or permute moves the index
        (the field as it was; back to the map's own layout where the index is the map's); a step of each
        element, of each position's channels, an attention within rows, a sum or a product with another
        tensor of this layout: None (the walk's rule, the layout kept); anything else has no rule."""
        steps, dims = self.steps, self.dims
        if n.target in _RESHAPES or n.target in _PERMUTES or n.target in _TRANSPOSES or _regroups(n):
            if n.target in _PERMUTES or n.target in _TRANSPOSES:
                _permuted(n, layout)  # a transpose of the batch's dim: no rule
            dims[n] = _regroup(n, layout.where, layout.chw, self.const)
            steps[n] = Identity()
            return self.value[args[0]]
        on_elements = n.op == "call_module" or n.target in _REGROUPED_OPS or n.target in _POINTWISE
        if n.target is operator.getitem:
            on_elements = isinstance(steps.get(args[0]), cr.CellAttention)
        if not on_elements:
            raise NotImplementedError(f"{_name(n)} of a map's regrouped positions (dims {tuple(layout)})")
        return None

    def visited(self, n: fx.Node) -> None:
        """What only the forwards of a field's users read (``Field.joint``: a depthwise conv's pairs, 168 lags
        of three (768, 9, 9) maps at ConvMixer's, that the rows, the users' steps and the norm's field would
        hold to the end of the walk) let go once every user of every node whose value the field is has
        been visited."""
        f = self.value.get(n)
        if isinstance(f, cr.Field):
            self.holders.setdefault(id(f), []).append(n)
        at = self.order[n]
        for a in self.inputs.get(n, ()):
            f = self.value.get(a)
            if not isinstance(f, cr.Field) or f.joint is None:
                continue
            if all(self.order[u] <= at for h in self.holders.get(id(f), [a]) for u in h.users):
                f.joint = None

    add = staticmethod(cr.add_grads)

    def pulled(self, n: fx.Node) -> None:
        """Its step let go, and of its gradient what only its own pull reads: the rows keep its mean,
        variance and stencil (a 56 × 56 stage's steps and gradients otherwise hold gigabytes to the end)."""
        if getattr(self.steps.get(n), "returns_windows", False):  # its row reads it (``as_module``)
            self.own[n] = self.steps[n]
        super().pulled(n)
        if self.grad.get(n) is not None:
            self.grad[n] = dataclasses.replace(self.grad[n], **dict.fromkeys(_PULL_ONLY))

    def _cat_of_relus(self, n: fx.Node, step: cr.Cat, g: cr.Field, parts: list) -> list[cr.Field]:
        """A cat of ReLU outputs whose users' gradients are not all independent of the gates (a max pool
        of it brings the gradient at the ReLUs' inputs, ``pre_relu``: its winners are where x > 0): each
        user's gradient split on its own, and each ReLU input given ``pre_relu``, the ReLU's backward of
        those parts (each through the gate on its own, as a ReLU with several users takes them), not of
        their sum, whose gate would be independent of the pool's."""
        per = [step.backward(p) for p in parts]  # each user's gradient, split to the cat's inputs
        out = step.backward(g)
        for i, a in enumerate(self.inputs[n]):
            relu = _relu_of(self.steps.get(a))
            if relu is not None:
                out[i] = dataclasses.replace(out[i], pre_relu=relu.backward([q[i] for q in per]))
        return out

    def pull(self, n: fx.Node, g: cr.Field | None, parts: list) -> list[cr.Field | None]:
        step, k = self.steps.get(n), len(self.inputs[n])
        if g is None or step is None:
            return [None] * k
        if isinstance(step, cr.Cat) and any(p.pre_relu is not None for p in parts):
            return self._cat_of_relus(n, step, g, parts)
        if isinstance(step, _PER_INPUT):  # each input its own
            return step.backward(g)
        if isinstance(step, _Add):
            return [step.backward_to(g, i) for i in range(k)]
        if _relu_of(step) is not None:  # a ReLU (or steps ending in one) takes its users' one by one
            joint = any(p.pre_relu is not None or p.stream_gate is not None for p in parts)
            if any(p.cross is not None for p in parts) and not joint:
                parts = [g]  # a residual add's cross term with its branch's gradient: in their sum alone
            return [step.backward(parts)] * k
        return [_weight_back(step, g, step.backward(g))] * k


def predict_correlated(
    model: nn.Module,
    input_stats: cr.Field,
    *,
    backward: str | None = "unit-noise",
    exact_lags: int = 4,
    batch: int | None = None,
) -> CorrelatedPrediction:
    """Every module's output :class:`correlated.Field` from the input's statistics and the weights.

    Args:
        model: the network (traced by ``torch.fx``; never run on data, no hooks).
        input_stats: what :func:`correlated.measure_input` returns for one input (C, H, W).
        backward: "unit-noise" (∂L/∂logits ~ N(0, 1) independent, the lecture's seed) or None.
        exact_lags: ReLU's bivariate integral where |ρ| > 0.5 for lags |e| ≤ this along each axis,
            Mehler's series everywhere else.
        batch: the number of samples a BatchNorm in training takes its statistics over (the batch's
            size, a number: never the batch); None for infinitely many. With few values per channel
            (batch × H × W) its gradient loses its mean and its x̂ part, and its divisor fluctuates.
    """
    if not isinstance(input_stats, cr.Field):
        raise TypeError(
            f"input_stats must be a correlated.Field (measure_input(batch)), got {type(input_stats).__name__}"
        )
    if backward not in ("unit-noise", None):
        raise ValueError(f"backward must be 'unit-noise' or None, got {backward!r}")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise ValueError(f"batch must be None or an int >= 1, got {batch!r}")
    gm, calls = trace(model, _is_leaf, input_stats.shape)
    walk = _Walk(gm, exact_lags, batch)
    with torch.no_grad():
        out = walk.forward(input_stats)
        if backward is not None and out is not None:
            walk.backward(cr.unit_noise(out.shape[0], tuple(out.shape[1:])))
    value, grad, why, out_node = walk.value, walk.grad, walk.reason, walk.out

    rows: dict[str, CorrelatedRow] = {}
    rows["(input)"] = CorrelatedRow("(input)", "input", input_stats, grad.get(walk.input))
    for name, node in calls:
        if name in rows:  # a module called again: pooled with its first call
            rows[name].more.append((value.get(node), _tensor_grad(node, gm, grad)))
            if value.get(node) is None and not rows[name].note:
                rows[name].note = why.get(node, "no prediction")
            continue
        kind = type(model.get_submodule(name)).__name__
        f, g = value.get(node), _tensor_grad(node, gm, grad)
        step = walk.steps.get(node, walk.own.get(node))
        if hasattr(step, "as_module"):  # the module's own tensor is not the walk's field
            f, g = step.as_module(f, g)
        rows[name] = CorrelatedRow(
            name, kind, f, g, note="" if value.get(node) is not None else why.get(node, "no prediction")
        )
    names = {id(m): k for k, m in model.named_modules()}
    for step in walk.within:  # the modules a step calls inside it, each call pooled as the calls above
        for m, f, g in step.rows():
            name = names.get(id(m))
            if name in rows:
                rows[name].more.append((f, g))
            elif name is not None:
                rows[name] = CorrelatedRow(name, type(m).__name__, f, g)
    rows["(output)"] = CorrelatedRow(
        "(output)", type(model).__name__, value.get(out_node), grad.get(out_node), note=why.get(out_node, "")
    )
    notes = []
    if out_node is not None and value.get(out_node) is None:
        notes.append(f"no prediction at the output: {why.get(out_node, '')}")
    return CorrelatedPrediction(rows, notes)
