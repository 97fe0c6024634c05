"""torch's own sample inputs for F.max_pool*d / F.avg_pool*d (its OpInfo database) through the max and avg
gates: values, input gradients and indices equal torch's bit for bit. Needs ``expecttest`` (dev extra)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("expecttest")  # torch.testing._internal imports it

from gatepool.layers import GatedPool1d, GatedPool2d, GatedPool3d  # noqa: E402

GATED = {1: GatedPool1d, 2: GatedPool2d, 3: GatedPool3d}
PARAMS = {  # the functional's arguments after the input, in order, with their defaults
    "max": ("kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"),
    "avg": ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override"),
}
DEFAULTS = {"stride": None, "padding": 0, "dilation": 1, "ceil_mode": False, "return_indices": False,
            "count_include_pad": True, "divisor_override": None}


def _bind(kind, args, kwargs):
    bound = dict(DEFAULTS, **dict(zip(PARAMS[kind], args)), **kwargs)
    if bound["stride"] in ((), []):  # torch reads an empty stride as "= kernel_size"
        bound["stride"] = None
    return {k: (tuple(v) if isinstance(v, list) else v) for k, v in bound.items()}


def _run(fn, x, grad_out=None):
    t = x.clone().requires_grad_()
    res = fn(t)
    res = res if isinstance(res, tuple) else (res,)
    grad_out = torch.randn_like(res[0]) if grad_out is None else grad_out
    (g,) = torch.autograd.grad(res[0], t, grad_out)
    return res, g, grad_out


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("d", [1, 2, 3])
def test_torch_sample_inputs(kind, d):
    from torch.testing._internal.common_methods_invocations import op_db

    (op,) = [o for o in op_db if o.name == f"nn.functional.{kind}_pool{d}d"]
    ran = 0
    samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=True))
    for sample in samples[:: 3 if kind == "max" else 1]:  # max: 864 to 1440 samples, every third
        a = _bind(kind, sample.args, sample.kwargs)
        if a["divisor_override"] is not None:  # not a gate argument
            continue
        x = sample.input.detach()
        window = (a["kernel_size"], a["stride"], a["padding"])
        if kind == "max":
            pool = GATED[d](*window, a["dilation"], a["return_indices"], a["ceil_mode"], gate="max")
        else:
            cip = a["count_include_pad"]
            pool = GATED[d](*window, 1, False, a["ceil_mode"], gate="avg", count_include_pad=cip)
        want, g_want, grad_out = _run(lambda t, s=sample: op.op(t, *s.args, **s.kwargs), x)
        got, g, _ = _run(pool, x, grad_out)
        assert len(got) == len(want), a
        for w, o in zip((*want, g_want), (*got, g)):  # values, indices, input gradients
            assert torch.equal(w, o), (tuple(x.shape), a)
        ran += 1
    assert ran > 0
