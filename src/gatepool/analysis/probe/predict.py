"""The ideal after every module: the lecture's rules walked through a model, forward then backward.

    forward   (mean, Var) of the input, default N(0, 1) per element, pushed through each module
    backward  E[(∂L/∂·)²] seeded at the output (1 for "unit-noise"), pulled back through each module

``predict(model, input_shape)`` knows the parts the lecture reasons about (see :mod:`theory`):
Conv1d/2d/3d and Linear (their actual E[w²] and fan-in/out), ReLU, max and average pools (torch's and
``GatedPool1d/2d/3d`` with gate "max" / "avg"), AdaptiveAvgPool, GroupNorm / LayerNorm / BatchNorm /
InstanceNorm, Dropout, Flatten, Identity, ``nn.Sequential`` (so ``ResidualCNN``) and ``PreActBlock``
(stream + branch). Anything else gets *no prediction* (``None``) with a note saying why, never a guess,
and so does everything that depends on it — except a norm's output, which is known whatever its input
(mean β, E[x²] = γ² + β²). Soft gates are "measured only": no closed form is claimed for them.

``border="middle"`` (the lecture's rules) predicts a conv for positions whose kernel sees no padding;
``border="average"`` multiplies by the mean of :func:`theory.padding_variance_map`, the figure a
measurement over the whole map should match.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn

from gatepool.analysis.probe import theory

INPUT, OUTPUT = "(input)", "(output)"


@dataclass
class Ideal:
    """The predicted figures after one module (``None``: no prediction; ``note`` says why)."""

    name: str
    kind: str
    shape: tuple[int, ...] | None = None
    mean: float | None = None
    var: float | None = None
    grad_e2: float | None = None  # E[(∂L/∂out)²] per element
    grad_zero_share: float | None = None  # share of exact-zero gradients at the output
    note: str = ""

    @property
    def e2(self) -> float | None:
        """E[x²] = Var + mean²."""
        return None if self.var is None or self.mean is None else self.var + self.mean**2

    def to_dict(self) -> dict:
        return {**asdict(self), "shape": list(self.shape) if self.shape else None, "e2": self.e2}


@dataclass
class Prediction:
    """Ideal figures by module name, in forward order, plus ``(input)`` and ``(output)``."""

    rows: dict[str, Ideal]
    input_stats: tuple[float, float]
    backward: str | float | None
    border: str
    error: str | None = None  # the shape pass failed: figures that needed a shape are missing
    notes: list[str] = field(default_factory=list)

    def __getitem__(self, name: str) -> Ideal:
        if name not in self.rows:
            raise KeyError(f"no module {name!r} in the prediction; names: {_few(self.rows)}")
        return self.rows[name]

    def __contains__(self, name: object) -> bool:
        return name in self.rows

    def __iter__(self):
        return iter(self.rows.values())

    def to_dict(self) -> dict:
        return {
            "input_stats": list(self.input_stats),
            "backward": self.backward,
            "border": self.border,
            "error": self.error,
            "notes": list(self.notes),
            "modules": [r.to_dict() for r in self.rows.values()],
        }

    def table(self) -> str:
        head = (f"{'module':<22} {'type':<16} {'mean':>8} {'Var':>9} {'E[x²]':>9} {'E[g²]':>10} {'g=0':>6}"
                "  note")
        lines = [head, "-" * len(head)]
        for r in self.rows.values():
            lines.append(
                f"{r.name:<22.22} {r.kind:<16.16} {_f(r.mean, 8)} {_f(r.var, 9)} {_f(r.e2, 9)} "
                f"{_f(r.grad_e2, 10)} {_f(r.grad_zero_share, 6, '.2f')}  {r.note}"
            )
        if self.error:
            lines.append(f"shape pass failed: {self.error}")
        return "\n".join(lines)


def _f(v: float | None, width: int, fmt: str = ".4g") -> str:
    return f"{'—':>{width}}" if v is None else f"{v:>{width}{fmt}}"


def _few(names, n: int = 8) -> str:
    names = list(names)
    return ", ".join(names[:n]) + (f", ... ({len(names)} in all)" if len(names) > n else "")


# ---------------------------------------------------------------------------------------------------
# Moments that travel: forward (mean, Var), backward (E[g²], share of zeros)
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Fwd:
    mean: float
    var: float

    @property
    def e2(self) -> float:
        return self.var + self.mean**2


@dataclass(frozen=True)
class _Bwd:
    e2: float
    zero: float | None  # None: no rule for the zero share


class _Unknown(Exception):
    """A leaf the rules do not cover; its message is the note."""


# ---------------------------------------------------------------------------------------------------
# The nodes: a leaf (one rule), a sequence, a residual
# ---------------------------------------------------------------------------------------------------


class _Node:
    def __init__(self, name: str, rec: Ideal) -> None:
        self.name, self.rec = name, rec

    def forward(self, x: _Fwd | None) -> _Fwd | None:
        raise NotImplementedError

    def backward(self, g: _Bwd | None) -> _Bwd | None:
        raise NotImplementedError

    def _set_fwd(self, y: _Fwd | None) -> _Fwd | None:
        if y is not None and math.isfinite(y.mean) and math.isfinite(y.var):
            self.rec.mean, self.rec.var = y.mean, y.var
            return y
        return None

    def _set_bwd(self, g: _Bwd | None) -> None:
        if g is not None and math.isfinite(g.e2):
            self.rec.grad_e2, self.rec.grad_zero_share = g.e2, g.zero


class _Seq(_Node):
    def __init__(self, name, rec, children: list[_Node]) -> None:
        super().__init__(name, rec)
        self.children = children

    def forward(self, x):
        for c in self.children:
            x = c.forward(x)
        return self._set_fwd(x)

    def backward(self, g):
        self._set_bwd(g)
        for c in reversed(self.children):
            g = c.backward(g)
        return g


class _Residual(_Node):
    """``x + branch(x)``: variances add (the branch ends in zero-mean weights), and so do E[g²]."""

    def __init__(self, name, rec, branch: _Seq) -> None:
        super().__init__(name, rec)
        self.branch = branch

    def forward(self, x):
        f = self.branch.forward(x)
        if x is None or f is None:
            return self._set_fwd(None)
        return self._set_fwd(_Fwd(x.mean + f.mean, theory.residual_add(x.var, f.var)))

    def backward(self, g):
        self._set_bwd(g)
        gb = self.branch.backward(g)
        if g is None or gb is None:
            return None
        zero = None if g.zero is None or gb.zero is None else g.zero * gb.zero
        return _Bwd(g.e2 + gb.e2, zero)


class _Leaf(_Node):
    """One module with a forward rule ``fwd(x) -> y`` and a backward rule ``bwd(g, x) -> g_in``."""

    def __init__(self, name, rec, fwd, bwd) -> None:
        super().__init__(name, rec)
        self.fwd, self.bwd, self.x = fwd, bwd, None

    def forward(self, x):
        self.x = x
        try:
            y = self.fwd(x)
        except _Unknown as e:
            self.rec.note = self.rec.note or str(e)
            y = None
        return self._set_fwd(y)

    def backward(self, g):
        self._set_bwd(g)
        if g is None:
            return None
        try:
            return self.bwd(g, self.x)
        except _Unknown as e:
            self.rec.note = self.rec.note or str(e)
            return None


class _Opaque(_Node):
    """A module the rules do not cover: no prediction for it or for what depends on it."""

    def forward(self, x):
        return self._set_fwd(None)

    def backward(self, g):
        self._set_bwd(g)
        return None


# ---------------------------------------------------------------------------------------------------
# Leaf rules
# ---------------------------------------------------------------------------------------------------


def _need(v, what: str):
    if v is None:
        raise _Unknown(f"needs {what}")
    return v


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


def _tuple(v, n: int) -> tuple[int, ...]:
    return (v,) * n if isinstance(v, int) else tuple(v)


def _spatial_ratio(shapes, n_spatial: int, stride: tuple[int, ...]) -> float:
    """numel_out / numel_in per channel; without shapes, the interior value 1/∏stride."""
    if shapes is None:
        return 1.0 / math.prod(stride)
    (si, so) = shapes
    return math.prod(so[-n_spatial:]) / math.prod(si[-n_spatial:])


def _conv_rules(m: nn.Conv1d | nn.Conv2d | nn.Conv3d, shapes, border: str):
    d = m.weight.dim() - 2
    k = math.prod(m.kernel_size)
    w2, b2, bm = _mean_sq(m.weight), _mean_sq(m.bias), _mean(m.bias)
    fan_in = m.in_channels // m.groups * k
    fan_out_mid = m.out_channels // m.groups * k / math.prod(m.stride)
    fwd_share, bwd_fan_out = 1.0, fan_out_mid
    if border == "average" and m.padding_mode == "zeros":  # the mean share of taps on real inputs
        fwd_share = bwd_fan_out = None
        if shapes is not None:
            fwd_share = 1.0
            geometry = zip(shapes[0][-d:], m.kernel_size, _conv_padding(m, d), m.stride, m.dilation)
            for L, kk, p, s, dil in geometry:
                fwd_share *= float(theory.taps_per_output(L, kk, p, s, dil).mean()) / kk
            # real taps summed over the outputs, per input: how many outputs an input reaches
            bwd_fan_out = m.out_channels // m.groups * k * fwd_share * _spatial_ratio(shapes, d, m.stride)

    def fwd(x):
        x = _need(x, "the input's moments")
        share = _need(fwd_share, "the input shape (border='average')")
        e2 = theory.linear_forward(fan_in, w2, x.e2 * share, b2)
        return _Fwd(bm, e2 - bm * bm)

    def bwd(g, x):
        zero = _all_zero(g.zero, m.out_channels // m.groups * k)
        return _Bwd(theory.linear_backward(_need(bwd_fan_out, "shapes"), w2, g.e2), zero)

    return fwd, bwd


def _conv_padding(m, d: int) -> tuple[int, ...]:
    if isinstance(m.padding, str):  # "same" / "valid"
        if m.padding == "valid":
            return (0,) * d
        return tuple(dil * (k - 1) // 2 for k, dil in zip(m.kernel_size, m.dilation))
    return _tuple(m.padding, d)


def _linear_rules(m: nn.Linear):
    w2, b2, bm = _mean_sq(m.weight), _mean_sq(m.bias), _mean(m.bias)

    def fwd(x):
        x = _need(x, "the input's moments")
        e2 = theory.linear_forward(m.in_features, w2, x.e2, b2)
        return _Fwd(bm, e2 - bm * bm)

    def bwd(g, x):
        zero = _all_zero(g.zero, m.out_features)
        return _Bwd(theory.linear_backward(m.out_features, w2, g.e2), zero)

    return fwd, bwd


def _relu_rules():
    def fwd(x):
        x = _need(x, "the input's moments")
        mean, var, _, _ = theory.relu_moments(x.mean, x.var)
        return _Fwd(mean, var)

    def bwd(g, x):
        x = _need(x, "the input's moments")
        pos = theory.relu_moments(x.mean, x.var)[3]
        zero = None if g.zero is None else 1.0 - (1.0 - g.zero) * pos
        return _Bwd(theory.relu_backward(g.e2, x.mean, x.var), zero)

    return fwd, bwd


def _pool_rules(gate: str, kernel, stride, padding, d: int, shapes):
    kernel = _tuple(kernel, d)
    stride = kernel if stride is None or stride == () else _tuple(stride, d)
    padding = _tuple(padding, d)
    n = math.prod(kernel)
    ratio = _spatial_ratio(shapes, d, stride)  # outputs per input
    tiled = stride == kernel and not any(padding)  # each input in at most one window

    def fwd(x):
        x = _need(x, "the input's moments")
        if gate == "max":
            return _Fwd(*theory.max_pool_forward(n, x.mean, x.var))
        return _Fwd(x.mean, theory.avg_pool_forward(n, x.var))

    def bwd(g, x):
        covered = ratio * n  # share of inputs inside some window (1 when the windows tile the map)
        if gate == "max":  # each window's winner gets g: E[g²]·(windows per input)
            e2 = g.e2 * ratio
            zero = 1.0 - (1.0 - g.zero) * ratio if tiled and g.zero is not None else None
        else:  # every input of a window gets g/n, from each window it is in
            e2 = g.e2 * ratio / n
            zero = 1.0 - (1.0 - g.zero) * covered if tiled and g.zero is not None else None
        return _Bwd(e2, zero)

    return fwd, bwd


def _adaptive_avg_rules(m: nn.Module, d: int, shapes):
    if shapes is None:
        raise _Unknown("needs the input shape")
    si, so = shapes[0][-d:], shapes[1][-d:]
    if any(i % o for i, o in zip(si, so)):
        raise _Unknown(f"input {tuple(si)} not a multiple of output {tuple(so)}: uneven windows")
    kernel = tuple(i // o for i, o in zip(si, so))
    return _pool_rules("avg", kernel, kernel, 0, d, shapes)


def _norm_rules(m: nn.Module, batch_stats: bool):
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

        def fwd_eval(x):
            x = _need(x, "the input's moments")
            mean = float((a * x.mean + b).mean())
            e2 = float((a * a * x.e2 + 2 * a * b * x.mean + b * b).mean())
            return _Fwd(mean, e2 - mean * mean)

        def bwd_eval(g, x):
            return _Bwd(float((a * a).mean()) * g.e2, g.zero)

        return fwd_eval, bwd_eval

    def fwd(x):
        share = 1.0 if x is None else x.var / (x.var + eps)  # Var(x̂); 1 unless Var(x) ~ eps
        return _Fwd(bm, g2 * share + b2 - bm * bm)

    def bwd(g, x):
        x = _need(x, "the input's variance")
        return _Bwd(theory.norm_backward(g.e2, x.var, weight2=g2, eps=eps), 0.0)

    return fwd, bwd


def _dropout_rules(m: nn.Dropout):
    keep = 1.0 - m.p

    def fwd(x):
        x = _need(x, "the input's moments")
        return _Fwd(x.mean, x.e2 / keep - x.mean**2) if m.training else x

    def bwd(g, x):
        if not m.training:
            return g
        zero = None if g.zero is None else 1.0 - (1.0 - g.zero) * keep
        return _Bwd(g.e2 / keep, zero)

    return fwd, bwd


def _identity_rules():
    return (lambda x: x), (lambda g, x: g)


_MAX = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)
_AVG = (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)
_ADAPTIVE_AVG = (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d)
_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_DIMS = {nn.MaxPool1d: 1, nn.AvgPool1d: 1, nn.AdaptiveAvgPool1d: 1, nn.MaxPool3d: 3, nn.AvgPool3d: 3,
         nn.AdaptiveAvgPool3d: 3}


def _leaf_rules(m: nn.Module, shapes, border: str):
    """(fwd, bwd) for a module the rules cover; raises _Unknown with the reason otherwise."""
    d = _DIMS.get(type(m), 2)
    if isinstance(m, _CONV):
        return _conv_rules(m, shapes, border)
    if isinstance(m, nn.Linear):
        return _linear_rules(m)
    if isinstance(m, nn.ReLU):
        return _relu_rules()
    if isinstance(m, _MAX):
        if _tuple(m.dilation, d) != (1,) * d:
            raise _Unknown("dilated max pool: no rule")
        return _pool_rules("max", m.kernel_size, m.stride, m.padding, d, shapes)
    if isinstance(m, _AVG):
        return _pool_rules("avg", m.kernel_size, m.stride, m.padding, d, shapes)
    if _is_gated_pool(m):
        if m.gate not in ("max", "avg"):
            raise _Unknown(f"measured only: gate {m.gate!r} has no closed form")
        return _pool_rules(m.gate, m.kernel_size, m.stride, m.padding, m.dim, shapes)
    if isinstance(m, _ADAPTIVE_AVG):
        return _adaptive_avg_rules(m, d, shapes)
    if isinstance(m, (nn.GroupNorm, nn.LayerNorm)):
        return _norm_rules(m, batch_stats=True)
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        return _norm_rules(m, batch_stats=m.training or m.running_var is None)
    if isinstance(m, nn.modules.instancenorm._InstanceNorm):
        return _norm_rules(m, batch_stats=m.training or m.running_var is None)
    if isinstance(m, nn.Dropout):
        return _dropout_rules(m)
    if isinstance(m, (nn.Identity, nn.Flatten, nn.Unflatten)):
        return _identity_rules()
    raise _Unknown(f"no rule for {type(m).__name__}")


def _is_gated_pool(m: nn.Module) -> bool:
    from gatepool.layers import GatedPoolNd  # GatedPool1d, 2d and 3d: the rules hold in any dimension

    return isinstance(m, GatedPoolNd)


def _is_preact_block(m: nn.Module) -> bool:
    from gatepool.models.residual_cnn import PreActBlock

    return isinstance(m, PreActBlock)


# ---------------------------------------------------------------------------------------------------
# Building the tree and walking it
# ---------------------------------------------------------------------------------------------------


def _build(m: nn.Module, name: str, rows: dict[str, Ideal], shapes: dict, border: str) -> _Node:
    shape = shapes.get(name, (None, None))
    rec = Ideal(name=name, kind=type(m).__name__, shape=_shape_out(shape))
    rows[name] = rec

    def child(sub: str) -> str:
        return sub if name == OUTPUT else f"{name}.{sub}"

    if isinstance(m, nn.Sequential) and type(m).forward is nn.Sequential.forward:
        kids = [_build(c, child(n), rows, shapes, border) for n, c in m.named_children()]
        return _Seq(name, rec, kids)
    if _is_preact_block(m):
        parts = ["gn1", "relu1", "conv1", "gn2", "relu2", "conv2"]
        kids = [_build(getattr(m, p), child(p), rows, shapes, border) for p in parts]
        branch = _Seq(f"{name}:branch", Ideal(f"{name}:branch", "branch"), kids)
        return _Residual(name, rec, branch)
    for sub, c in m.named_modules():  # the insides of a leaf or of a container we cannot read
        if sub:
            rows[child(sub)] = Ideal(child(sub), type(c).__name__, _shape_out(shapes.get(child(sub))),
                                     note=f"inside {type(m).__name__}: no prediction")
    if next(m.children(), None) is not None and not _is_gated_pool(m):
        rec.note = f"no rule for {type(m).__name__} (a container with its own forward)"
        return _Opaque(name, rec)
    io = shapes.get(name)
    try:
        fwd, bwd = _leaf_rules(m, io if io and None not in io else None, border)
    except _Unknown as e:
        rec.note = str(e)
        return _Opaque(name, rec)
    return _Leaf(name, rec, fwd, bwd)


def _shape_out(io) -> tuple[int, ...] | None:
    return None if not io or io[1] is None else tuple(io[1])


def _trace_shapes(model: nn.Module, input_shape: tuple[int, ...]) -> tuple[dict, str | None]:
    """{name: (input shape, output shape)} from one forward pass on zeros (batch 1, eval mode)."""
    names = {id(m): (n if n else OUTPUT) for n, m in reversed(list(model.named_modules()))}
    shapes: dict[str, tuple] = {}
    batch = input_shape[0]

    def full(s):
        return (batch, *s[1:]) if len(s) and s[0] == 1 else tuple(s)

    def hook(m, args, out):
        x = next((a for a in args if isinstance(a, torch.Tensor)), None)
        y = out if isinstance(out, torch.Tensor) else None
        shapes[names[id(m)]] = (None if x is None else full(x.shape), None if y is None else full(y.shape))

    param = next(model.parameters(), None)
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    device = param.device if param is not None else torch.device("cpu")
    modes = {m: m.training for m in model.modules()}
    handles = [m.register_forward_hook(hook) for m in model.modules()]
    error = None
    try:
        model.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            model(torch.zeros((1, *input_shape[1:]), dtype=dtype, device=device))
    except Exception as e:  # the prediction goes on with the shapes seen so far
        error = f"{type(e).__name__}: {e}"
    finally:
        for h in handles:
            h.remove()
        for m, t in modes.items():
            m.training = t
    return shapes, error


def predict(
    model: nn.Module,
    input_shape: tuple[int, ...] | torch.Size,
    *,
    input_stats: tuple[float, float] = (0.0, 1.0),
    backward: str | float | None = "unit-noise",
    loss_reduction: str = "sum",
    border: str = "middle",
) -> Prediction:
    """The ideal (mean, Var) after every module and E[(∂L/∂out)²] at every module's output.

    Args:
        model: the network, left as it is (one forward pass on zeros reads the shapes).
        input_shape: (B, ...) of the input, e.g. (512, 1, 28, 28).
        input_stats: (mean, Var) of each input element; N(0, 1) by default.
        backward: "unit-noise" (E[g²] = 1 at the output, as the lecture seeds it), "loss" (summed or
            mean cross-entropy at logits ≈ 0: ``theory.cross_entropy_grad``), a number (that E[g²]),
            or None (forward only).
        loss_reduction: "sum" or "mean", for ``backward="loss"``.
        border: "middle" (the rules as stated, a conv position away from the padding) or "average"
            (the mean over the map of ``padding_variance_map``).
    """
    input_shape = tuple(int(s) for s in input_shape)
    if len(input_shape) < 1 or min(input_shape) < 1:
        raise ValueError(f"input_shape must be (B, ...) with positive sizes, got {input_shape}")
    if border not in ("middle", "average"):
        raise ValueError(f"border must be 'middle' or 'average', got {border!r}")
    if not (backward is None or backward in ("unit-noise", "loss") or isinstance(backward, (int, float))):
        raise ValueError(f"backward must be 'unit-noise', 'loss', a number or None, got {backward!r}")
    if loss_reduction not in ("sum", "mean"):
        raise ValueError(f"loss_reduction must be 'sum' or 'mean', got {loss_reduction!r}")
    mean, var = (float(v) for v in input_stats)
    if not var >= 0:
        raise ValueError(f"input_stats must be (mean, var) with var >= 0, got {input_stats}")

    shapes, error = _trace_shapes(model, input_shape)
    rows: dict[str, Ideal] = {INPUT: Ideal(INPUT, "input", input_shape, mean, var)}
    root = _build(model, OUTPUT, rows, shapes, border)
    out = rows.pop(OUTPUT)  # the root's record goes last, as "(output)"
    rows[OUTPUT] = out
    root.forward(_Fwd(mean, var))

    notes = []
    if backward is not None:
        seed = None
        if backward == "unit-noise":
            seed = _Bwd(1.0, 0.0)
        elif backward == "loss":
            if out.shape is None or len(out.shape) != 2:
                notes.append(f"backward='loss' needs (B, C) logits at the output, got shape {out.shape}")
            else:
                seed = _Bwd(theory.cross_entropy_grad(out.shape[1], input_shape[0], loss_reduction), 0.0)
                notes.append(f"cross-entropy ({loss_reduction}) seeded at logits ≈ 0: E[g²] = (1 − 1/C)/C")
        else:
            seed = _Bwd(float(backward), 0.0)
        g = root.backward(seed)
        if g is not None:
            rows[INPUT].grad_e2, rows[INPUT].grad_zero_share = g.e2, g.zero
    if error:
        notes.append(f"the shape pass failed ({error}); rules that need a shape give no prediction")
    return Prediction(rows, (mean, var), backward, border, error, notes)
