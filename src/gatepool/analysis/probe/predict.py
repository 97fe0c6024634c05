"""The ideal after every module: the lecture's rules walked through a model, forward then backward.

    forward   (mean, Var) of the input, default N(0, 1) per element, pushed through each module
    backward  E[(∂L/∂·)²] seeded at the output (1 for "unit-noise"), pulled back through each module

``predict(model, input_shape)`` asks :mod:`rules` for each module's rule, by module type (see there
for the modules covered and for ``register_rule``): a leaf is one step, a chain or a residual walks the
children the rule names. A module without a rule but with children (torchvision's ResNet, a user's
block) is traced by ``torch.fx`` and walked node by node (:mod:`graph`, the function rules of
:mod:`functions`); each module called in the graph gets the figures of its output node, a module called
twice the two calls pooled by their sizes. Where torch.fx cannot trace it, the note says why and the
module stays one module without a rule. A module without a rule gets *no prediction* (``None``) with a
note saying why, never a guess, and so does everything that depends on it — except a norm's output,
which is known whatever its input (mean β, E[x²] = γ² + β²). Soft gates are "measured only": no closed
form is claimed for them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn

from gatepool.analysis.probe import theory
from gatepool.analysis.probe.graph import GraphWalk, Untraceable
from gatepool.analysis.probe.rules import (
    Chain,
    GradMoments,
    Leaf,
    Moments,
    NoRule,
    Residual,
    Site,
    rule_for,
)

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
        head = (
            f"{'module':<22} {'type':<16} {'mean':>8} {'Var':>9} {'E[x²]':>9} {'E[g²]':>10} {'g=0':>6}  note"
        )
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
# The nodes: a leaf (one rule), a sequence, a residual
# ---------------------------------------------------------------------------------------------------


class _Node:
    def __init__(self, name: str, rec: Ideal) -> None:
        self.name, self.rec = name, rec

    def forward(self, x: Moments | None) -> Moments | None:
        raise NotImplementedError

    def backward(self, g: GradMoments | None) -> GradMoments | None:
        raise NotImplementedError

    def _set_fwd(self, y: Moments | None) -> Moments | None:
        if y is not None and math.isfinite(y.mean) and math.isfinite(y.var):
            self.rec.mean, self.rec.var = y.mean, y.var
            return y
        return None

    def _set_bwd(self, g: GradMoments | None) -> None:
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
        return self._set_fwd(Moments(x.mean + f.mean, theory.residual_add(x.var, f.var)))

    def backward(self, g):
        self._set_bwd(g)
        gb = self.branch.backward(g)
        if g is None or gb is None:
            return None
        zero = None if g.zero is None or gb.zero is None else g.zero * gb.zero
        return GradMoments(g.e2 + gb.e2, zero)


class _Leaf(_Node):
    """One module with a forward rule ``fwd(x) -> y`` and a backward rule ``bwd(g, x) -> g_in``."""

    def __init__(self, name, rec, fwd, bwd) -> None:
        super().__init__(name, rec)
        self.fwd, self.bwd, self.x = fwd, bwd, None

    def forward(self, x):
        self.x = x
        try:
            y = self.fwd(x)
        except NoRule as e:
            self.rec.note = self.rec.note or str(e)
            y = None
        return self._set_fwd(y)

    def backward(self, g):
        self._set_bwd(g)
        if g is None:
            return None
        try:
            return self.bwd(g, self.x)
        except NoRule as e:
            self.rec.note = self.rec.note or str(e)
            return None


class _Opaque(_Node):
    """A module the rules do not cover: no prediction for it or for what depends on it."""

    def forward(self, x):
        return self._set_fwd(None)

    def backward(self, g):
        self._set_bwd(g)
        return None


class _Graph(_Node):
    """A module without a rule, traced by torch.fx: the rules node by node (:class:`graph.GraphWalk`)."""

    def __init__(self, name, rec, m: nn.Module, rows: dict[str, Ideal], shapes: dict, border: str) -> None:
        super().__init__(name, rec)
        self.m, self.rows = m, rows
        self.prefix = "" if name == OUTPUT else f"{name}."
        self.records: list[dict[str, Ideal]] = []  # the rows of each module call with a rule, in order

        def make_step(sub: str, module: nn.Module, io) -> _Node:
            full, local, scratch = self.prefix + sub, dict(shapes), {}
            if io is not None:
                local[full] = io  # this call's shapes (a module called twice may see two)
            self.records.append(scratch)
            return _build(module, full, scratch, local, border)

        io = shapes.get(name)
        self.walk = GraphWalk(m, io[0] if io and io[0] is not None else None, border, make_step)

    def forward(self, x):
        y = self.walk.forward(x)
        self._fill()
        reason = self.walk.reason.get(self.walk.out, "no prediction")
        self.rec.note = "" if y is not None else f"no rule for {self.rec.kind}; traced by torch.fx: {reason}"
        return self._set_fwd(y)

    def backward(self, g):
        self._set_bwd(g)
        gi = self.walk.backward(g)
        self._fill()
        return gi

    def _fill(self) -> None:
        """Each module's row: its calls' figures pooled by their sizes."""
        walk, calls = self.walk, {}
        leaves = [n for n in walk.nodes if n.op == "call_module"]
        for scratch, n in zip(self.records, leaves):
            w = _numel(walk._shape(n))
            for key, r in scratch.items():
                calls.setdefault(key, []).append((r, w))
        for sub, node in walk.calls:  # modules traced through: their output node
            full = self.prefix + sub
            if node.op == "call_module" and node.target == sub:  # a module with a rule: built above
                continue
            v, g = walk.value.get(node), walk.grad.get(node)
            r = Ideal(
                full,
                type(self.m.get_submodule(sub)).__name__,
                walk._shape(node),
                None if v is None else v.mean,
                None if v is None else v.var,
                None if g is None else g.e2,
                None if g is None else g.zero,
                note="" if v is not None else walk.reason.get(node, "no prediction"),
            )
            calls.setdefault(full, []).append((r, _numel(walk._shape(node))))
        for key, recs in calls.items():
            self.rows[key] = _pool(key, recs)
        for sub, c in self.m.named_modules():
            if sub and self.prefix + sub not in self.rows:
                self.rows[self.prefix + sub] = Ideal(
                    self.prefix + sub, type(c).__name__, note="not called in the traced forward"
                )


def _numel(shape) -> float:
    return float(math.prod(shape)) if shape else 1.0


def _pool(name: str, recs: list[tuple[Ideal, float]]) -> Ideal:
    """Several calls of one module as one row, as the measurement pools them: means and E[x²] by size."""
    if len(recs) == 1:
        return recs[0][0]
    first = recs[0][0]
    total = sum(w for _, w in recs)

    def avg(values):
        if any(v is None for v in values):
            return None
        return sum(w * v for (_, w), v in zip(recs, values)) / total

    mean = avg([r.mean for r, _ in recs])
    e2 = avg([r.e2 for r, _ in recs])
    var = None if mean is None or e2 is None else max(e2 - mean * mean, 0.0)
    note = next((r.note for r, _ in recs if r.note), "")
    return Ideal(
        name,
        first.kind,
        first.shape,
        mean,
        var,
        avg([r.grad_e2 for r, _ in recs]),
        avg([r.grad_zero_share for r, _ in recs]),
        note=note,
    )


# ---------------------------------------------------------------------------------------------------
# Building the tree and walking it
# ---------------------------------------------------------------------------------------------------


def _build(m: nn.Module, name: str, rows: dict[str, Ideal], shapes: dict, border: str) -> _Node:
    shape = shapes.get(name, (None, None))
    rec = Ideal(name=name, kind=type(m).__name__, shape=_shape_out(shape))
    rows[name] = rec

    def child(sub: str) -> str:
        return sub if name == OUTPUT else f"{name}.{sub}"

    def chain(label: str, record: Ideal, names) -> _Seq:
        kids = [_build(m.get_submodule(n), child(n), rows, shapes, border) for n in names]
        return _Seq(label, record, kids)

    io = shapes.get(name)
    rule, spec = rule_for(m), None
    if rule is None:
        rec.note = f"no rule for {type(m).__name__}"
        if next(m.children(), None) is not None:
            try:
                return _Graph(name, rec, m, rows, shapes, border)
            except Untraceable as e:
                rec.note += f" (a container with its own forward; torch.fx cannot trace it: {e})"
    else:
        try:
            spec = rule(m, Site(io if io and None not in io else None, border))
        except NoRule as e:
            rec.note = str(e)
    if isinstance(spec, Chain):
        return chain(name, rec, spec.children)
    if isinstance(spec, Residual):
        return _Residual(name, rec, chain(f"{name}:branch", Ideal(f"{name}:branch", "branch"), spec.branch))
    if spec is not None and not isinstance(spec, Leaf):
        raise TypeError(
            f"the probe rule for {type(m).__name__} returned {type(spec).__name__}; "
            "a rule returns a Leaf, a Chain or a Residual"
        )
    for sub, c in m.named_modules():  # the insides of a leaf or of a module without a rule
        if sub:
            rows[child(sub)] = Ideal(
                child(sub),
                type(c).__name__,
                _shape_out(shapes.get(child(sub))),
                note=f"inside {type(m).__name__}: no prediction",
            )
    if spec is None:
        return _Opaque(name, rec)
    return _Leaf(name, rec, spec.forward, spec.backward)


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
    root.forward(Moments(mean, var))

    notes = []
    if backward is not None:
        seed = None
        if backward == "unit-noise":
            seed = GradMoments(1.0, 0.0)
        elif backward == "loss":
            if out.shape is None or len(out.shape) != 2:
                notes.append(f"backward='loss' needs (B, C) logits at the output, got shape {out.shape}")
            else:
                e2 = theory.cross_entropy_grad(out.shape[1], input_shape[0], loss_reduction)
                seed = GradMoments(e2, 0.0)
                notes.append(f"cross-entropy ({loss_reduction}) seeded at logits ≈ 0: E[g²] = (1 − 1/C)/C")
        else:
            seed = GradMoments(float(backward), 0.0)
        g = root.backward(seed)
        if g is not None:
            rows[INPUT].grad_e2, rows[INPUT].grad_zero_share = g.e2, g.zero
    if error:
        notes.append(f"the shape pass failed ({error}); rules that need a shape give no prediction")
    return Prediction(rows, (mean, var), backward, border, error, notes)
