"""Measure the signal forward and the gradient backward at every module of any ``nn.Module``.

    forward   per module output: mean, Var, E[x²], share of exact zeros (optional: per channel,
              per position over batch and channels for (B, C, H, W) maps, a sample for histograms)
    backward  per module output: E[(∂L/∂·)²] and the share of exact-zero gradients, seeded either
              "unit-noise": ∂L/∂out ~ N(0, 1) (the lecture's seed), or
              "loss":       L = cross-entropy(out, target), summed (default) or averaged over the batch
    params    rms W, rms ∂L/∂W, ‖∂L/∂W‖, ‖W‖ and ‖∂L/∂W‖/‖W‖
    beside    ``ideal``: the lecture's rules (:func:`predict`), every position independent;
              ``predicted`` (``correlated=True``): the correlation-aware prediction
              (:func:`correlated_predict.predict_correlated`) from the input's own statistics, with
              each output's measured correlation stencil (``measured_field``) to set it against

Forward hooks read each output as it is made and put a tensor hook on it for its gradient. The model
is left as found: hooks removed, training flags, buffers (BatchNorm running stats), ``.grad`` of every
parameter and the global RNG state restored. A model that fails gives a report with ``error`` set and the
rows measured before the failure.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.analysis.probe.correlated import measure_field, measure_input
from gatepool.analysis.probe.correlated_predict import CorrelatedPrediction, predict_correlated
from gatepool.analysis.probe.graph import Untraceable
from gatepool.analysis.probe.predict import INPUT, OUTPUT, Prediction, predict
from gatepool.analysis.probe.report import ParamRow, ProbeReport, Row, TensorStats
from gatepool.utils.checks import check_int

BACKWARDS = ("loss", "unit-noise")


class _Moments:
    """Running sums of one tensor's elements over calls; ``stats()`` turns them into TensorStats."""

    def __init__(self) -> None:
        self.n = self.zeros = self.nonfinite = 0
        self.s = self.ss = 0.0
        self.vb_sum, self.vb_n = 0.0, 0

    def add(self, t: torch.Tensor) -> None:
        t = t.detach()
        if t.dtype not in (torch.float32, torch.float64):  # half precision, integers: sum in float32
            t = t.float()
        s, ss = float(t.sum()), float((t * t).sum())  # float32 cascade sums: ~1e-7 relative error
        bad = not (math.isfinite(s) and math.isfinite(ss))
        if bad:  # NaN/inf somewhere: count them, drop them
            finite = torch.isfinite(t)
            self.nonfinite += t.numel() - int(finite.sum())
            t = t[finite]  # (n_finite,)
            s, ss = float(t.double().sum()), float(t.double().square().sum())
        self.n += t.numel()
        self.s += s
        self.ss += ss
        self.zeros += int((t == 0).sum())
        if not bad and t.dim() >= 1 and t.shape[0] >= 2:  # variance across the batch, per element
            self.vb_sum += float(t.var(dim=0).mean()) * t[0].numel()
            self.vb_n += t[0].numel()

    def stats(self) -> TensorStats:
        n = self.n
        mean = self.s / n if n else math.nan
        e2 = self.ss / n if n else math.nan
        var = max(e2 - mean * mean, 0.0) if n >= 2 else math.nan
        var_batch = self.vb_sum / self.vb_n if self.vb_n else math.nan
        return TensorStats(n, mean, var, e2, self.zeros / n if n else math.nan, self.nonfinite, var_batch)


class _Sums:
    """Running sums of named tensors of a fixed shape (per channel, per position), with their count."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.count: dict[str, int] = {}
        self.skipped = False

    def add(self, key: str, total: torch.Tensor, count: int) -> None:
        total = total.detach().double().cpu()
        if key not in self.sums:
            self.sums[key], self.count[key] = total, count
        elif self.sums[key].shape == total.shape:
            self.sums[key] += total
            self.count[key] += count
        else:  # a later call with another shape: keep the first
            self.skipped = True

    def mean(self, key: str) -> torch.Tensor | None:
        return self.sums[key] / self.count[key] if key in self.sums else None


class _Probe:
    """Everything measured about one tensor slot (a module output, an element of a tuple, an input)."""

    def __init__(
        self, name: str, kind: str, *, per_channel: bool, maps: bool, fields: bool, samples: int, seed: int
    ) -> None:
        self.row = Row(name=name, kind=kind)
        self.fields = fields
        self.fwd, self.bwd = _Moments(), _Moments()
        self.chan, self.map = (_Sums() if per_channel else None), (_Sums() if maps else None)
        self.n_samples, self.seed = samples, seed
        self.handles: list = []

    def forward(self, t: torch.Tensor) -> None:
        self.row.calls += 1
        self.row.shape = self.row.shape or tuple(t.shape)
        self.fwd.add(t)
        x = t.detach()
        if self.chan is not None and x.dim() >= 2:
            dims = [d for d in range(x.dim()) if d != 1]
            n = x.numel() // x.shape[1]
            self.chan.add("sum", x.sum(dims), n)
            self.chan.add("sq", (x * x).sum(dims), n)
            self.chan.add("zero", (x == 0).sum(dims).double(), n)
        if self.map is not None and x.dim() == 4:
            n = x.shape[0] * x.shape[1]
            self.map.add("sum", x.sum((0, 1)), n)
            self.map.add("sq", (x * x).sum((0, 1)), n)
        if self.fields and self.row.measured_field is None and x.dim() in (2, 4):  # the first call's
            self.row.measured_field = measure_field(x)
        if self.row.samples is None:
            self.row.samples = self._sample(x)
        if t.requires_grad:
            self.handles.append(t.register_hook(self.backward))

    def _sample(self, x: torch.Tensor) -> torch.Tensor | None:
        """A random subset of the values (the same positions for tensors of the same size)."""
        if not self.n_samples or not x.numel():
            return None
        idx = _sample_index(x.numel(), min(self.n_samples, x.numel()), self.seed)
        return x.reshape(-1)[idx.to(x.device)].float().cpu()

    def backward(self, g: torch.Tensor) -> None:
        self.bwd.add(g)
        g = g.detach()
        if self.row.grad_samples is None:
            self.row.grad_samples = self._sample(g)
        if self.chan is not None and g.dim() >= 2:
            dims = [d for d in range(g.dim()) if d != 1]
            self.chan.add("grad_sq", (g * g).sum(dims), g.numel() // g.shape[1])
        if self.map is not None and g.dim() == 4:
            self.map.add("grad_sq", (g * g).sum((0, 1)), g.shape[0] * g.shape[1])

    def finish(self, prediction: Prediction | None) -> Row:
        r = self.row
        if self.fwd.n or self.fwd.nonfinite:
            r.forward = self.fwd.stats()
        if self.bwd.n or self.bwd.nonfinite:
            r.backward = self.bwd.stats()
        if prediction is not None and r.name in prediction:
            r.ideal = prediction[r.name]
        r.per_channel = _moments_of(self.chan, zero=True) if self.chan and self.chan.sums else None
        r.maps = _moments_of(self.map, zero=False) if self.map and self.map.sums else None
        if (self.chan and self.chan.skipped) or (self.map and self.map.skipped):
            r.notes.append("called with several shapes: per-channel values and maps are from the first")
        if r.forward is not None and r.forward.numel < 2:
            r.notes.append("variance undefined: fewer than 2 values")
        return r


@functools.lru_cache(maxsize=64)
def _sample_index(numel: int, k: int, seed: int) -> torch.Tensor:
    return torch.randint(numel, (k,), generator=torch.Generator().manual_seed(seed))


def _moments_of(sums: _Sums, *, zero: bool) -> dict[str, torch.Tensor]:
    mean, e2 = sums.mean("sum"), sums.mean("sq")
    out = {"mean": mean, "var": (e2 - mean * mean).clamp_min(0), "e2": e2}
    if zero:
        out["zero_share"] = sums.mean("zero")
    if "grad_sq" in sums.sums:
        out["grad_e2"] = sums.mean("grad_sq")
    return out


def _tensors(out) -> list[tuple[str, torch.Tensor]]:
    """("", t) for a tensor; ("[i]", t) / ("[key]", t) for the tensors of a tuple, list or dict."""
    if isinstance(out, torch.Tensor):
        return [("", out)]
    if isinstance(out, (tuple, list)):
        return [(f"[{i}]", t) for i, t in enumerate(out) if isinstance(t, torch.Tensor)]
    if isinstance(out, dict):
        return [(f"[{k}]", t) for k, t in out.items() if isinstance(t, torch.Tensor)]
    return []


def _geometry(m: nn.Module) -> dict:
    """Conv/pool geometry a padding map needs."""
    keys = ("kernel_size", "stride", "padding", "dilation")
    if isinstance(m, nn.modules.conv._ConvNd) or (hasattr(m, "kernel_size") and hasattr(m, "padding")):
        geo = {k: getattr(m, k) for k in keys if hasattr(m, k) and not isinstance(getattr(m, k), str)}
        geo["zero_padding"] = getattr(m, "padding_mode", "zeros") == "zeros" and "padding" in geo
        return geo
    return {}


def measure(
    model: nn.Module,
    inputs: torch.Tensor | Sequence[torch.Tensor],
    target: torch.Tensor | None = None,
    *,
    backward: str | None = "auto",
    modules: Sequence[str] | None = None,
    module_inputs: bool = False,
    per_channel: bool = False,
    maps: bool = False,
    samples: int = 4096,
    loss_reduction: str = "sum",
    seed: int = 0,
    prediction: Prediction | bool = True,
    border: str = "middle",
    correlated: bool = False,
    measured_fields: bool = True,
) -> ProbeReport:
    """Run ``model(inputs)`` once forward and once backward and measure every module on the way.

    Args:
        model: any ``nn.Module``; left exactly as found.
        inputs: a tensor, or a sequence of tensors passed as ``model(*inputs)``.
        target: class indices (B,) for ``backward="loss"``.
        backward: "loss" (cross-entropy against ``target``), "unit-noise" (∂L/∂out ~ N(0, 1) from a
            generator seeded with ``seed``), None (forward only), or "auto": "loss" when a target is
            given, else "unit-noise".
        modules: qualified names (as in ``model.named_modules()``) to measure; all of them by default.
            ``(input)`` and ``(output)`` are always measured.
        module_inputs: also measure each selected module's first input, as ``name:in``.
        per_channel: per-channel mean, Var, E[x²], zero share and E[g²] (dim 1 is the channel).
        maps: per-position mean, Var, E[x²] and E[g²] over batch and channels, for (B, C, H, W) tensors.
        samples: how many values to keep per tensor for histograms (0: none).
        loss_reduction: "sum" (the lecture's) or "mean" over the batch, for ``backward="loss"``.
        prediction: a :func:`predict` result to set beside the measurement; True computes one for
            the input's measured mean and Var with the same backward seed; False: none.
        border: the ``border`` of that prediction: "middle" (the lecture's rules, away from the
            padding) or "average" (zero padding counted over the whole map, the figure a measurement
            over the whole map should match; use it for small maps, a ResNet's 2×2 and 4×4 stages).
        correlated: also the correlation-aware prediction, each row's ``predicted`` (a
            :class:`correlated_predict.CorrelatedRow`: the ``predicted`` column of the table), from the
            input's statistics (:func:`correlated.measure_input`) and the weights, never the batch
            beyond them; and each (B, C, H, W) or (B, F) output's measured :class:`correlated.Field`
            (``measured_field``, the first call's). Its backward follows the unit-noise seed (with
            ``backward="loss"`` it is forward only, and a warning says so); a model the walk cannot
            trace gets a warning, a module without a rule a ``note`` on its row (``predicted.note``).
        measured_fields: with ``correlated``, keep each output's measured field (the stencil figures read
            it); False: the ``predicted`` column alone (a zoo's check at 224 × 224: the fields, a
            (C, 2H − 1, 2W − 1) stencil a row, hold gigabytes).
    """
    args, backward = _checked_arguments(model, inputs, target, backward, loss_reduction)
    check_int(samples, "samples", 0)
    for name, flag in (("correlated", correlated), ("measured_fields", measured_fields)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    if correlated and (len(args) != 1 or args[0].dim() not in (2, 4)):
        shapes = [tuple(a.shape) for a in args]
        raise ValueError(f"correlated=True needs one input of shape (B, C, H, W) or (B, F), got {shapes}")
    selected = _selected_modules(model, modules)
    if prediction is True:
        prediction = _prediction_for(model, args[0], backward, loss_reduction, border)
    elif prediction is False:
        prediction = None
    report = ProbeReport(
        rows={},
        params=[],
        backward=backward,
        prediction=prediction,
        loss_reduction=loss_reduction if backward == "loss" else None,
    )
    x_stats = measure_input(args[0]) if correlated else None  # before the run: a model may write its input
    fields = correlated and measured_fields
    recorder = _Recorder(per_channel=per_channel, maps=maps, fields=fields, samples=samples, seed=seed)
    with _left_as_found(model), recorder.hooked(model, selected, module_inputs), _forked_rng(args):
        call_args, leaves = recorder.inputs(args, backward)
        _run(model, call_args, target, backward, loss_reduction, seed, report)
        recorder.input_gradients(leaves)
        report.params = _param_rows(model, [n for n, _ in selected] if modules is not None else None)
    report.rows = recorder.rows(prediction)
    if correlated:  # predicted after the run, whose activations and gradients are let go: peaks do not add
        predicted = _correlated_for(model, x_stats, len(args[0]), backward, report.warnings)
        for r in report.rows.values():
            if predicted is not None and r.name in predicted:
                r.predicted = predicted[r.name]
    _warn(report, args[0])
    return report


def _correlated_for(
    model: nn.Module, x_stats, batch: int, backward: str | None, warnings: list[str]
) -> CorrelatedPrediction | None:
    """The correlated prediction from the input's statistics ``x_stats`` (:func:`measure_input`, taken
    before the model ran) and the batch size; None, with a warning, where the walk cannot trace the model."""
    try:
        pred = predict_correlated(
            model, x_stats, backward="unit-noise" if backward == "unit-noise" else None, batch=batch
        )
    except (Untraceable, NotImplementedError, RuntimeError, ValueError) as e:
        warnings.append(f"no correlated prediction: {type(e).__name__}: {e}")
        return None
    warnings += pred.notes
    if backward == "loss":
        warnings.append("the correlated prediction's backward follows the unit-noise seed only: none here")
    return pred


def _checked_arguments(
    model: nn.Module,
    inputs: torch.Tensor | Sequence[torch.Tensor],
    target: torch.Tensor | None,
    backward: str | None,
    loss_reduction: str,
) -> tuple[tuple[torch.Tensor, ...], str | None]:
    """The inputs as a tuple and the backward seed ("auto" resolved), checked before any computation."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    args = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    if not args or not all(isinstance(a, torch.Tensor) for a in args):
        raise TypeError("inputs must be a tensor or a non-empty sequence of tensors")
    if backward == "auto":
        backward = "loss" if target is not None else "unit-noise"
    if backward is not None and backward not in BACKWARDS:
        raise ValueError(f"backward must be 'loss', 'unit-noise', 'auto' or None, got {backward!r}")
    if loss_reduction not in ("sum", "mean"):
        raise ValueError(f"loss_reduction must be 'sum' or 'mean', got {loss_reduction!r}")
    if backward == "loss":
        if target is None:
            raise ValueError("backward='loss' needs target= (class indices, shape (B,))")
        if target.dim() != 1 or target.shape[0] != args[0].shape[0]:
            raise ValueError(
                f"target must have shape ({args[0].shape[0]},) to match the batch, got {tuple(target.shape)}"
            )
    return args, backward


def _selected_modules(model: nn.Module, modules: Sequence[str] | None) -> list[tuple[str, nn.Module]]:
    """The submodules to measure, with their qualified names: ``modules`` (each checked), or all."""
    named = dict(model.named_modules())
    if modules is None:
        return [(n, m) for n, m in named.items() if n]
    names = list(modules)
    unknown = [n for n in names if n not in named or n == ""]
    if unknown:
        valid = [n for n in named if n]
        few = ", ".join(valid[:8]) + (f", ... ({len(valid)} in all)" if len(valid) > 8 else "")
        raise ValueError(
            f"modules: no module named {unknown[0]!r} in {type(model).__name__}; "
            f"valid names include: {few or '(the model has no submodules)'}"
        )
    return [(n, named[n]) for n in names]


def _prediction_for(
    model: nn.Module, x: torch.Tensor, backward: str | None, loss_reduction: str, border: str
) -> Prediction:
    """The ideal prediction for an input with ``x``'s measured mean and Var (0 and 1 for one value)."""
    x0 = x.detach().double()
    stats = (float(x0.mean()), float(x0.var(unbiased=False))) if x0.numel() > 1 else (0.0, 1.0)
    return predict(
        model,
        tuple(x0.shape),
        input_stats=stats,
        backward=backward,
        loss_reduction=loss_reduction,
        border=border,
    )


class _Recorder:
    """The probes of one measurement, by name in the order their tensors appear, and the hooks that
    feed them: each selected module's output (and first input, with ``module_inputs``), the model's
    output, and the model's inputs."""

    def __init__(self, *, per_channel: bool, maps: bool, fields: bool, samples: int, seed: int) -> None:
        self.opts = dict(per_channel=per_channel, maps=maps, fields=fields, samples=samples)
        self.seed = seed  # one seed for every probe: equal tensors, equal samples
        self.probes: dict[str, _Probe] = {}

    def probe(self, name: str, kind: str) -> _Probe:
        if name not in self.probes:
            self.probes[name] = _Probe(name, kind, seed=self.seed, **self.opts)
        return self.probes[name]

    @contextlib.contextmanager
    def hooked(
        self, model: nn.Module, selected: list[tuple[str, nn.Module]], module_inputs: bool
    ) -> Iterator[None]:
        """Hooks on the selected modules and the model's output while inside; none left after."""
        handles = []
        try:
            for n, m in selected:
                if module_inputs:
                    handles.append(m.register_forward_pre_hook(self._input_hook(n)))
                handles.append(m.register_forward_hook(self._output_hook(n)))
            handles.append(model.register_forward_hook(self._output_hook(OUTPUT)))
            yield
        finally:
            for h in handles:
                h.remove()
            for pr in self.probes.values():  # the tensor hooks for the gradients
                for h in pr.handles:
                    h.remove()

    def _output_hook(self, name: str):
        def hook(m, a, out):
            for suffix, t in _tensors(out):
                p = self.probe(name + suffix, type(m).__name__)
                p.row.meta = p.row.meta or _geometry(m)
                if a and isinstance(a[0], torch.Tensor):
                    p.row.meta.setdefault("input_shape", tuple(a[0].shape))
                p.forward(t)

        return hook

    def _input_hook(self, name: str):
        def hook(m, a):
            for _, t in _tensors(a[:1]):
                self.probe(f"{name}:in", type(m).__name__).forward(t)

        return hook

    def inputs(
        self, args: tuple[torch.Tensor, ...], backward: str | None
    ) -> tuple[list[torch.Tensor], list[tuple[_Probe, torch.Tensor]]]:
        """The model's inputs measured; the arguments to call it with, and the leaves whose gradient is
        the input's (floating-point inputs, when there is a backward pass)."""
        leaves = []
        call_args = []
        for i, a in enumerate(args):
            name = INPUT if len(args) == 1 else f"{INPUT}[{i}]"
            pr = self.probe(name, "input")
            if backward is not None and a.is_floating_point():
                leaf = a.detach().requires_grad_(True)
                leaves.append((pr, leaf))
                a = leaf * 1  # not a leaf: in-place ops of the model stay legal
            pr.forward(a.detach())
            call_args.append(a)
        return call_args, leaves

    @staticmethod
    def input_gradients(leaves: list[tuple[_Probe, torch.Tensor]]) -> None:
        for pr, leaf in leaves:
            if leaf.grad is not None:
                pr.backward(leaf.grad)

    def rows(self, prediction: Prediction | None) -> dict[str, Row]:
        return {n: pr.finish(prediction) for n, pr in self.probes.items()}


@contextlib.contextmanager
def _left_as_found(model: nn.Module) -> Iterator[None]:
    """Inside: every parameter's ``.grad`` None. After: training flags, buffers and ``.grad`` as found."""
    modes = {m: m.training for m in model.modules()}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    grads = {p: p.grad for p in model.parameters()}
    try:
        for p in grads:
            p.grad = None
        yield
    finally:
        for m, t in modes.items():
            m.training = t
        with torch.no_grad():
            for n, b in model.named_buffers():
                if n in buffers:
                    b.copy_(buffers[n])
        for p, g in grads.items():
            p.grad = g


def _forked_rng(args: tuple[torch.Tensor, ...]) -> contextlib.AbstractContextManager:
    """The global RNG state (CPU and the inputs' CUDA devices) restored on exit."""
    devices = sorted({a.device.index or 0 for a in args if a.device.type == "cuda"})
    return torch.random.fork_rng(devices=devices)


def _run(model, call_args, target, backward, reduction, seed, report: ProbeReport) -> None:
    """Forward and backward; a failure is written into the report, not raised."""
    stage = "forward"
    try:
        with torch.set_grad_enabled(backward is not None):
            out = model(*call_args)
        if backward is None:
            return
        stage = "backward"
        tensors = [t for _, t in _tensors(out) if t.is_floating_point()]
        if not tensors:
            raise TypeError(f"the model returned {type(out).__name__}, not a floating-point tensor")
        y = tensors[0]
        if not y.requires_grad:
            raise RuntimeError("the output does not require grad (no parameters and no float input?)")
        if backward == "loss":
            if y.dim() != 2 or y.shape[0] != target.shape[0]:
                raise ValueError(f"backward='loss' needs (B, C) logits, got output shape {tuple(y.shape)}")
            loss = F.cross_entropy(y, target.to(y.device), reduction=reduction)
            report.loss = float(loss.detach())
            loss.backward()
        else:
            g = torch.Generator().manual_seed(seed)
            y.backward(torch.randn(y.shape, generator=g, dtype=torch.float32).to(y))
    except Exception as e:  # the rows measured so far are kept; the report says what failed
        report.error = f"{stage} failed: {type(e).__name__}: {e}"


def _param_rows(model: nn.Module, selected: list[str] | None) -> list[ParamRow]:
    rows = []
    for name, p in model.named_parameters():
        owner = name.rsplit(".", 1)[0] if "." in name else ""
        if selected is not None and not any(owner == s or owner.startswith(s + ".") for s in selected):
            continue
        w = p.detach().double()
        row = ParamRow(name, tuple(p.shape), float(w.pow(2).mean().sqrt()), float(w.norm()))
        if p.grad is not None:
            g = p.grad.detach().double()
            row.grad_rms, row.grad_norm = float(g.pow(2).mean().sqrt()), float(g.norm())
        rows.append(row)
    return rows


def _warn(report: ProbeReport, x: torch.Tensor) -> None:
    for r in report.rows.values():
        for what, s in (("values", r.forward), ("gradients", r.backward)):
            if s is not None and s.nonfinite:
                report.warnings.append(
                    f"{r.name}: {s.nonfinite} NaN/inf {what} of {s.numel + s.nonfinite} "
                    "(moments over the finite ones)"
                )
    if x.dim() >= 1 and x.shape[0] < 2:
        report.warnings.append("batch of 1: the variance across the batch (var_batch) is undefined (NaN)")
