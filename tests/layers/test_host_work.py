"""What one call of a gate costs the host: no sync with the device, and a budget of dispatcher calls.

A ``TorchDispatchMode`` sees every aten call that reaches the dispatcher; one that reads a tensor's
value back to Python (``aten._local_scalar_dense``: ``.item()``, ``bool(t)``, ``if t.any():``) waits for the
device, so a CUDA graph cannot capture the call and ``torch.compile`` breaks its graph there. The tests run
one forward and backward of every gate in the gate table, windowed (tiling, overlapping and dilated
windows, one of which reads no input), global and adaptive, in 1-D to 3-D, on the fused and the
pure-PyTorch paths. On a GPU (``gpu``) ``torch.cuda.set_sync_debug_mode("error")`` does the same there.

Every dispatcher call costs the host a few microseconds whatever the tensor's size; on a small input (and on
a GPU at any size) they, not the arithmetic, are the cost of a call. ``BUDGET`` is how many one forward and
backward of each 2-D gate makes (the library's own ops counted with the aten calls inside them); a change
that adds one fails here: lower the budget when a change removes some. Under a dispatch mode the fused
gates take the ``gatepool::softmax_pool`` op (``fused_pool.eager`` steps aside), so this counts the op's
path: the one ``torch.compile`` and CUDA take. The eager CPU path (the C++ operator
``gatepool::softmax_pool_eager``, what a plain call takes) has a budget of its own, ``EAGER_BUDGET``:
dispatcher calls (the operator's own inside it) and autograd nodes, counted by torch's profiler, which sees
both without changing the path.
"""

from __future__ import annotations

import pytest
import torch
from torch._library.custom_ops import OPDEFS
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from gatepool.layers import c_kernels, fused_pool, gate_table
from gatepool.layers.adaptive_pool import AdaptiveGatedPool1d, AdaptiveGatedPool2d, AdaptiveGatedPool3d
from gatepool.layers.gated_pool import GatedPool1d, GatedPool2d, GatedPool3d
from gatepool.layers.global_pool import GlobalGatedPool1d, GlobalGatedPool2d, GlobalGatedPool3d
from gatepool.layers.soft_pool import soft_pool
from gatepool.layers.windows import pool_geometry, window_mask

aten = torch.ops.aten
GATED = {1: GatedPool1d, 2: GatedPool2d, 3: GatedPool3d}
GLOBAL = {1: GlobalGatedPool1d, 2: GlobalGatedPool2d, 3: GlobalGatedPool3d}
ADAPTIVE = {1: AdaptiveGatedPool1d, 2: AdaptiveGatedPool2d, 3: AdaptiveGatedPool3d}
SIZE = {1: (6,), 2: (6, 5), 3: (4, 5, 4)}
C = 3
WINDOWS = {  # (kernel, stride, padding, dilation, ceil_mode)
    "tiled": (2, None, 0, 1, False),
    "overlap": (3, 2, 1, 1, True),
    "dilated": (2, 1, 1, 2, False),
}
SYNCS = (aten._local_scalar_dense.default, aten.item.default, aten.is_nonzero.default, aten.equal.default)


class NoHostSync(TorchDispatchMode):
    """Fails on every aten call that reads a value back to the host."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in SYNCS:
            raise AssertionError(f"a host sync: {func}")
        return func(*args, **(kwargs or {}))


# fmt: off
BUDGET = {  # dispatcher calls of one forward + backward of each 2-D pool, (2, 3, 6, 5), on either path
    "fused": {
        "max": dict(tiled=3, overlap=3, dilated=3, glob=3, adaptive=3),
        "avg": dict(tiled=3, overlap=3, dilated=29, glob=4, adaptive=3),
        "soft": dict(tiled=23, overlap=23, dilated=23, glob=26, adaptive=58),
        "soft-learned": dict(tiled=31, overlap=31, dilated=31, glob=34, adaptive=86),
        "attention": dict(tiled=32, overlap=32, dilated=32, glob=35, adaptive=85),
        "conv": dict(tiled=6, overlap=6, dilated=6),
    },
    "python": {  # the tiled path where windows tile, else the plain one
        "max": dict(tiled=3, overlap=3, dilated=3, glob=3, adaptive=3),
        "avg": dict(tiled=3, overlap=3, dilated=29, glob=4, adaptive=3),
        "soft": dict(tiled=38, overlap=67, dilated=77, glob=67, adaptive=58),
        "soft-learned": dict(tiled=56, overlap=95, dilated=105, glob=85, adaptive=86),
        "attention": dict(tiled=55, overlap=76, dilated=86, glob=52, adaptive=85),
        "conv": dict(tiled=6, overlap=6, dilated=6),
    },
}
EAGER_BUDGET = {  # (dispatcher calls, autograd nodes) of one forward + backward of a windowed 2-D pool,
    # (2, 3, 6, 5), on the eager C++ operator at one thread; nodes: the operator's, an AccumulateGrad per leaf
    "soft": (10, 2),  # the operator, its layout copies and buffers; the gradient's accumulation into x.grad
    "soft-learned": (14, 3),  # + exp(log τ) inside the operator, ∂L/∂log τ's buffers, its accumulation
    "attention": (16, 4),  # + ∂L/∂w and ∂L/∂V (its projection, inside the operator), their accumulation
}
# fmt: on


class CountCalls(TorchDispatchMode):
    """Counts the dispatcher calls by op; the library's ops (``gatepool::``) with the calls inside them."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[str(func)] = self.calls.get(str(func), 0) + 1
        if func.namespace == "gatepool":  # run the op's Python body under this mode, so its calls count
            with self:
                return OPDEFS[func._schema.name]._init_fn(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


def make_pool(kind: str, d: int, gate: str):
    """The pool ``kind`` ("global", "adaptive", or a key of WINDOWS) of ``gate`` in ``d`` dimensions."""
    channels = C if gate_table.row(gate).weights else None
    if kind == "global":
        return GLOBAL[d](gate, channels=channels)
    if kind == "adaptive":
        return ADAPTIVE[d](3, gate=gate, channels=channels)
    k, s, p, dl, ceil = WINDOWS[kind]
    return GATED[d](k, s, p, dl, False, ceil, gate=gate, channels=channels)


def every_pool() -> list[tuple[str, int, str]]:
    """``(kind, d, gate)``: each gate of the table in each pool that has it, 1-D to 3-D."""
    cases = []
    for d in (1, 2, 3):
        for gate in gate_table.names():
            row = gate_table.row(gate)
            kinds = [*WINDOWS, *["global"] * row.global_form, *["adaptive"] * row.adaptive_form]
            cases += [(kind, d, gate) for kind in kinds]
    return cases


POOLS = {f"{gate}-{d}d-{kind}": (kind, d, gate) for kind, d, gate in every_pool()}


def forward_backward(pool, x: torch.Tensor) -> None:
    out = pool(x)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(torch.ones_like(out))


@pytest.mark.usefixtures("pool_path")
@pytest.mark.parametrize("name", POOLS)
def test_no_host_sync_in_any_gate(name):
    kind, d, gate = POOLS[name]
    torch.manual_seed(0)
    pool = make_pool(kind, d, gate)
    x = torch.randn(2, C, *SIZE[d], requires_grad=True)
    with NoHostSync():
        forward_backward(pool, x)
    assert x.grad is not None


@pytest.mark.usefixtures("pool_path")
@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("window", WINDOWS)
def test_no_host_sync_in_soft_pool_with_a_tensor_temperature(d, window):
    k, s, p, dl, ceil = WINDOWS[window]
    x = torch.randn(2, C, *SIZE[d], requires_grad=True)
    tau = torch.full((C,), 0.7, requires_grad=True)
    with NoHostSync():
        soft_pool(x, d, k, s, p, dl, ceil, temperature=tau).sum().backward()
    assert x.grad is not None and tau.grad is not None


def test_the_sync_check_fails_on_a_sync():
    """The mode itself: the checks it must catch do fail under it."""
    t = torch.ones(3)
    for read in (lambda: bool((t > 0).all()), lambda: t.sum().item(), lambda: (t > 0).any() and 1):
        with pytest.raises(AssertionError, match="a host sync"), NoHostSync():
            read()


@pytest.mark.parametrize("n", range(1, 8))
@pytest.mark.parametrize("k, dl", [(2, 1), (2, 2), (3, 2), (2, 3), (3, 3)])
def test_has_empty_windows_agrees_with_the_window_mask(n, k, dl):
    """``PoolGeometry.has_empty_windows`` (decided on the host) against the mask of every window."""
    for p in range(k // 2 + 1):
        for s in (1, 2, 3):
            for ceil in (False, True):
                try:
                    geo = pool_geometry(torch.zeros(1, 1, n, 2), 2, (k, 2), (s, 1), (p, 0), (dl, 1), ceil)
                except ValueError:
                    continue  # a window larger than the padded input
                mask = window_mask(geo)
                want = mask is not None and bool((~mask.any(-1)).any())
                assert geo.has_empty_windows == want, (n, k, s, p, dl, ceil)


@pytest.mark.parametrize("name", [n for n in POOLS if "-2d-" in n])
def test_dispatcher_calls_within_the_budget(name, pool_path):
    kind, d, gate = POOLS[name]
    torch.manual_seed(0)
    pool = make_pool(kind, d, gate)
    x = torch.randn(2, C, *SIZE[d], requires_grad=True)
    grad = torch.ones(pool(x).shape)
    forward_backward(pool, x)  # the first call builds and loads what it needs
    with CountCalls() as count:
        out = pool(x)
        out.backward(grad)
    budget = BUDGET[pool_path.name][gate]["glob" if kind == "global" else kind]
    total = sum(count.calls.values())
    assert total <= budget, f"{total} calls, {budget} budgeted: {count.calls}"


@pytest.mark.skipif(not fused_pool.available() or not c_kernels.eager_op(), reason="no eager C++ operator")
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("gate", EAGER_BUDGET)
def test_eager_calls_and_nodes_within_the_budget(gate, window):
    torch.manual_seed(0)
    pool = make_pool(window, 2, gate)
    x = torch.randn(2, C, *SIZE[2], requires_grad=True)
    grad = torch.ones(pool(x).shape)
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # (at more, ∂L/∂τ and ∂L/∂w sum per-thread rows: one call more each)
    try:
        forward_backward(pool, x)  # the first call builds and loads what it needs
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            pool(x).backward(grad)
    finally:
        torch.set_num_threads(before)
    names = [e.name for e in prof.events()]
    calls = [n for n in names if n.startswith(("aten::", "gatepool::"))]
    nodes = [n.split(": ")[-1] for n in names if n.startswith("autograd::engine::evaluate_function")]
    assert "gatepool::softmax_pool_eager" in calls  # the eager path, not the op
    most_calls, most_nodes = EAGER_BUDGET[gate]
    assert len(calls) <= most_calls, f"{len(calls)} calls, {most_calls} budgeted: {calls}"
    assert len(nodes) <= most_nodes, f"{len(nodes)} nodes, {most_nodes} budgeted: {nodes}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", POOLS)
def test_no_sync_on_cuda(name):
    kind, d, gate = POOLS[name]
    torch.manual_seed(0)
    pool = make_pool(kind, d, gate).cuda()
    x = torch.randn(2, C, *SIZE[d], device="cuda", requires_grad=True)
    forward_backward(pool, x)  # the first call compiles and loads the kernels: not the one checked
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        forward_backward(pool, x)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@pytest.mark.parametrize("gate", ["soft", "soft-learned", "attention"])
def test_the_window_geometry_is_worked_out_once_a_call(gate, monkeypatch):
    """A call that cannot take the eager route (under a dispatch mode: the op's path) works out its
    windows once, and a call on the cached route not at all."""
    import gatepool.layers.gated_pool as gp

    calls = []
    monkeypatch.setattr(gp, "pool_geometry", lambda *a, **k: calls.append(1) or pool_geometry(*a, **k))
    pool = GatedPool2d(2, gate=gate, channels=3)
    x = torch.randn(2, 3, 6, 6)

    class Quiet(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Quiet():
        pool(x)
    assert len(calls) == 1
    pool(x)  # the route worked out: once
    calls.clear()
    pool(x)
    assert calls == []
