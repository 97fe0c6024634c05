"""What one call of a gate costs the host: no sync with the device, forward or backward.

A ``TorchDispatchMode`` sees every aten call that reaches the dispatcher; one that reads a tensor's
value back to Python (``aten._local_scalar_dense``: ``.item()``, ``bool(t)``, ``if t.any():``) waits for the
device, so a CUDA graph cannot capture the call and ``torch.compile`` breaks its graph there. The tests run
one forward and backward of every gate in the gate table, windowed (tiling, overlapping and dilated
windows, one of which reads no input), global and adaptive, in 1-D to 3-D, on the fused and the
pure-PyTorch paths. On a GPU (``gpu``) ``torch.cuda.set_sync_debug_mode("error")`` does the same there.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gatepool.layers import gate_table
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
