"""torch's own sample inputs for F.scaled_dot_product_attention (its OpInfo database) through ours: values
and gradients (q, k, v and a float mask that requires grad) equal torch's, float32 and float64, on both of
our paths. One test case per sample and path. Needs ``expecttest`` (dev extra).

The samples broadcast batch dims across q, k and v (q (4, 3, 8) with k, v (4, 4, 6, 8)), use is_causal
with fewer queries than keys, and a float mask (3, 6) on 4-d inputs. Those with ``dropout_p > 0`` draw
random gates: our fast path calls torch's kernel, so under the same seed it must draw torch's gates; our
explicit path draws its own, and is skipped there.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("expecttest")  # torch.testing._internal imports it

from gatepool.layers.attention import scaled_dot_product_attention  # noqa: E402

DTYPES = (torch.float32, torch.float64)
# Absolute tolerance per unit of a tensor's largest entry. The samples' entries reach ±9, so scores reach
# ~±50 and float32 rounds at ~1e-5 of the largest output: torch's own float32 kernels are up to 1.3e-5 of
# it off their float64 values on these samples (our explicit path up to 1.0e-5). float64: tight.
TOL = {torch.float32: (1e-5, 3e-5), torch.float64: (1e-12, 1e-12)}  # rtol, atol per unit of the largest


def _samples():
    from torch.testing._internal.common_methods_invocations import op_db

    (op,) = [o for o in op_db if o.name == "nn.functional.scaled_dot_product_attention"]
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return {dt: list(op.sample_inputs("cpu", dt, requires_grad=True)) for dt in DTYPES}


SAMPLES = _samples()


def _id(dtype, i, s):
    shape = "x".join
    parts = [str(dtype).removeprefix("torch."), f"s{i:02d}", f"q{shape(map(str, s.input.shape))}"]
    parts += [f"k{shape(map(str, s.args[0].shape))}"]
    if s.kwargs.get("is_causal"):
        parts.append("causal")
    if s.kwargs.get("attn_mask") is not None:
        parts.append(f"mask{shape(map(str, s.kwargs['attn_mask'].shape))}")
    if s.kwargs.get("dropout_p", 0.0) > 0:
        parts.append(f"p{s.kwargs['dropout_p']}")
    return "-".join(parts)


CASES = [pytest.param(dt, s, id=_id(dt, i, s)) for dt in DTYPES for i, s in enumerate(SAMPLES[dt])]


def _run(fn, sample, grad_out=None):
    """fn's output and the gradients of every input that requires grad, for one upstream gradient."""
    q = sample.input.detach().requires_grad_()
    k, v = (t.detach().requires_grad_() for t in sample.args)
    kwargs = dict(sample.kwargs)
    inputs = [q, k, v]
    if isinstance(kwargs.get("attn_mask"), torch.Tensor):
        mask = kwargs["attn_mask"]
        kwargs["attn_mask"] = mask.detach().requires_grad_(mask.requires_grad)
        if mask.requires_grad:
            inputs.append(kwargs["attn_mask"])
    torch.manual_seed(0)  # the dropout draws
    out = fn(q, k, v, **kwargs)
    if grad_out is None:
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    return (out.detach(), *torch.autograd.grad(out, inputs, grad_out)), grad_out


@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize("dtype, sample", CASES)
def test_torch_sample_inputs(dtype, sample, return_weights):
    if return_weights and sample.kwargs.get("dropout_p", 0.0) > 0:
        pytest.skip("dropout_p > 0: the explicit path draws its own gates, not torch's")

    def ours(q, k, v, **kw):
        res = scaled_dot_product_attention(q, k, v, **kw, return_weights=return_weights)
        return res[0] if return_weights else res

    want, grad_out = _run(F.scaled_dot_product_attention, sample)
    got, _ = _run(ours, sample, grad_out)
    assert len(got) == len(want) == 4 + (sample.kwargs.get("attn_mask") is not None)
    for name, a, b in zip(("out", "grad q", "grad k", "grad v", "grad attn_mask"), got, want):
        assert a.dtype == b.dtype == dtype and a.shape == b.shape, name
        rtol, atol = TOL[dtype]
        atol *= max(b.abs().max().item(), 1.0)
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m, name=name: f"{name}: {m}")


def test_samples_cover_broadcasting_causal_and_a_mask():
    """torch's sample set (25 per dtype on torch 2.13, 12 with dropout) still holds what we test against."""
    for dtype in DTYPES:
        samples = SAMPLES[dtype]
        shapes = {(tuple(s.input.shape), tuple(s.args[0].shape)) for s in samples}
        assert ((4, 3, 8), (4, 4, 6, 8)) in shapes  # batch dims that broadcast across q, k and v
        assert any(s.kwargs.get("is_causal") and s.input.shape[-2] != s.args[0].shape[-2] for s in samples)
        assert any(s.kwargs.get("attn_mask") is not None for s in samples)
        assert sum(s.kwargs.get("dropout_p", 0.0) == 0 for s in samples) >= 13
