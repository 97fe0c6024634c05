"""The one path chooser of the softmax gates: the path each case takes, why, and that the pools take it."""

from __future__ import annotations

import sys

import pytest
import torch

from gatepool.layers import GatedPool2d, fused_pool, soft_pool2d, softmax_paths
from gatepool.layers.softmax_paths import PATHS, input_dtype, pool_in, softmax_path

X = torch.randn(2, 3, 8, 8)

EAGER_NODE = "torch::autograd::CppNode<gatepool::SoftmaxPoolEager>"  # the eager C++ operator's node



def test_the_kernel_where_it_runs_and_the_plain_path_for_weights():
    if fused_pool.available():
        path = softmax_path(X)
        assert path.name == "c" and path.fused and "C kernel" in path.reason
    path = softmax_path(X, return_weights=True)
    assert path.name == "plain" and "return_weights" in path.reason


def test_without_a_kernel_tiled_or_plain_and_why(monkeypatch):
    monkeypatch.setattr(fused_pool, "usable", lambda x: False)
    tiled = softmax_path(X, tiles=True)
    assert tiled.name == "tiled" and not tiled.fused
    scored = softmax_path(X, tiles=True, scored=True)
    assert scored.name == "plain" and "attention" in scored.reason
    overlap = softmax_path(X)
    assert overlap.name == "plain" and "do not tile" in overlap.reason
    half = softmax_path(X.half(), tiles=True)
    assert half.name == "tiled" and "not built" in half.reason
    ints = softmax_path(X.to(torch.int16), tiles=True)
    assert "int16" in ints.reason and "C kernel: float16, bfloat16, float32, float64" in ints.reason


def test_other_windows_and_every_name_listed():
    assert softmax_path(X, windows="adaptive").name == "gather"
    tiling = softmax_path(X, windows="adaptive", tiles=True)  # a windowed pool's windows: on the CPU, C
    assert tiling.name == ("c" if fused_pool.usable(X) else "tiled")
    assert softmax_path(X, windows="global").name != "one-window"  # on the CPU the windowed paths
    names = {softmax_path(X, **kw).name for kw in ({}, {"return_weights": True}, {"windows": "adaptive"})}
    assert names <= set(PATHS)


@pytest.mark.parametrize("gate", ["soft", "attention"])
def test_the_pools_take_the_chosen_path(gate, monkeypatch):
    """Each call asks the chooser once, and takes the path it names."""
    pool = GatedPool2d(2, gate=gate, channels=3)
    x = X.clone().requires_grad_()
    seen = []
    chooser = softmax_paths.softmax_path

    def spy(*args, **kwargs):
        seen.append(chooser(*args, **kwargs))
        return seen[-1]

    for module in ("soft_pool", "gated_pool"):  # (gatepool.layers.soft_pool is also the function's name)
        monkeypatch.setattr(sys.modules[f"gatepool.layers.{module}"], "softmax_path", spy)
    out = pool(x)
    assert len(seen) == 1 and seen[0].name in PATHS
    nodes = [out.grad_fn.name()] + [f.name() for f, _ in out.grad_fn.next_functions if f]
    # the op's autograd node, or the eager operator's (fused_pool.eager: the C++ operator, not the op)
    fused = any("gatepool_softmax_pool" in n or n == EAGER_NODE for n in nodes)
    assert fused == seen[0].fused  # attention's projection: in the eager operator, or a node above the op's
    out = soft_pool2d(x, 2)
    assert seen[-1].name in ("c", "tiled") and out.shape == (2, 3, 4, 4)


@pytest.mark.parametrize("gate", ["soft", "soft-learned", "attention"])
@pytest.mark.parametrize("kernel", [True, False])
def test_tiling_adaptive_windows_take_the_path_the_chooser_names(gate, kernel, monkeypatch):
    """Adaptive windows that tile the input (8 → 4) run a windowed pool's path, the one the chooser names
    (the C kernel; without it tiled, or plain for attention), never the gather, and give its values."""
    from gatepool.layers import AdaptiveGatedPool2d, adaptive_pool

    if not kernel:
        monkeypatch.setattr(fused_pool, "usable", lambda x: False)
    elif not fused_pool.available():
        pytest.skip("the C kernel is not built here")
    torch.manual_seed(0)
    adaptive = AdaptiveGatedPool2d(4, gate=gate, channels=3)
    windowed = GatedPool2d(2, gate=gate, channels=3)
    windowed.load_state_dict(adaptive.state_dict())
    chosen = softmax_path(X, scored=gate == "attention", windows="adaptive", tiles=True)
    assert chosen.name == ("c" if kernel else "plain" if gate == "attention" else "tiled")

    def no_gather(*args):
        raise AssertionError("the tiling windows were gathered")

    monkeypatch.setattr(adaptive_pool, "_gather", no_gather)
    for x in (X, X.bfloat16()):
        out = adaptive(x)
        assert out.dtype == x.dtype
        torch.testing.assert_close(out, windowed(x))


def test_pool_in_keeps_batch_dtype_and_memory_format(monkeypatch):
    x = torch.randn(3, 8, 8, dtype=torch.bfloat16)  # unbatched
    assert input_dtype(x) == (torch.bfloat16 if fused_pool.usable(x) else torch.float32)  # the C kernel's
    assert input_dtype(x, return_weights=True) == torch.float32  # the plain path's
    monkeypatch.setattr(fused_pool, "usable", lambda x: False)  # the pure-PyTorch paths: float32 inside
    out = pool_in(x, False, lambda t: (t.dtype == torch.float32 and t.dim() == 4) * t[..., ::2, ::2])
    assert out.shape == (3, 4, 4) and out.dtype == torch.bfloat16 and out.abs().sum() > 0
    cl = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    out = pool_in(cl, True, lambda t: t[..., ::2, ::2].contiguous())
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()


@pytest.mark.parametrize("gate", ["soft", "soft-learned", "attention"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_output_dtype_under_autocast_is_max_pools(gate, dtype):
    """Under ``torch.autocast`` a gate gives the dtype ``F.max_pool2d`` gives there (the input's)."""
    x = torch.randn(2, 3, 8, 8, dtype=dtype, requires_grad=True)
    pool = GatedPool2d(3, 2, 1, gate=gate, channels=3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = pool(x)
        want = torch.nn.functional.max_pool2d(x, 3, 2, 1)
    assert out.dtype == want.dtype == dtype
    out.float().sum().backward()
    assert x.grad.dtype == dtype and torch.isfinite(x.grad).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("gate", ["soft", "soft-learned", "attention"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_goes_into_triton_as_it_is(gate, dtype):
    """On CUDA a float16/bfloat16 input reaches the kernels in its dtype: no full-size float32 copy."""
    from torch.utils._python_dispatch import TorchDispatchMode

    x = torch.randn(4, 8, 16, 16, device="cuda", dtype=dtype, requires_grad=True)
    pool = GatedPool2d(3, 2, 1, gate=gate, channels=8).cuda()
    copies = []

    class Copies(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            full_size = isinstance(out, torch.Tensor) and out.numel() >= x.numel()
            if func is torch.ops.aten._to_copy.default and full_size and out.dtype == torch.float32:
                copies.append(tuple(out.shape))
            return out

    assert softmax_path(x.detach()).name == "triton" and input_dtype(x) == dtype
    with Copies():
        pool(x).sum().backward()
    assert copies == [] and x.grad.dtype == dtype
