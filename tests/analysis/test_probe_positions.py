"""The depthwise conv through the positions' covariance matrix (:mod:`correlated.positions`) against
the pairs of taps' road it replaces on small maps: the same variance maps and lag sums, forward and back,
to rounding, over kernels, strides, paddings, channel multipliers and non-square maps."""

import pytest
import torch
import torch.nn.functional as F

from gatepool.analysis.probe.correlated import positions
from gatepool.analysis.probe.correlated.adaptive import avg_windows
from gatepool.analysis.probe.correlated.conv import Conv
from gatepool.analysis.probe.correlated.measure import measure_field
from gatepool.analysis.probe.correlated.stencil import pool_stencil


def _field(C: int, H: int, W: int, seed: int):
    """A field with a varying variance map and correlation at every lag: smoothed, scaled noise."""
    g = torch.Generator().manual_seed(seed)
    z = F.avg_pool2d(torch.randn(256, C, H + 2, W + 2, generator=g, dtype=torch.float64), 3, 1)
    return measure_field(z * (0.5 + torch.rand(1, C, H, W, generator=g, dtype=torch.float64)))


CASES = [  # (C, groups, multiplier, kernel, stride, padding, (H, W))
    (4, 4, 1, (3, 3), (1, 1), (1, 1), (6, 6)),
    (4, 4, 1, (7, 7), (1, 1), (3, 3), (9, 9)),
    (3, 3, 2, (5, 5), (2, 2), (2, 2), (7, 8)),
    (2, 2, 1, (3, 5), (2, 1), (0, 2), (6, 5)),
    (5, 5, 1, (4, 4), (4, 4), (0, 0), (8, 8)),  # a box pool's shape
]


@pytest.mark.parametrize("C,groups,mult,kernel,stride,padding,hw", CASES)
def test_the_positions_road_is_the_pairs_road(C, groups, mult, kernel, stride, padding, hw):
    x = _field(C, *hw, seed=C + kernel[0])
    w = torch.randn(C * mult, 1, *kernel, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    conv = Conv(w, None, stride, padding, groups=groups)
    conv.x = x
    Ho = (hw[0] + 2 * padding[0] - kernel[0]) // stride[0] + 1
    Wo = (hw[1] + 2 * padding[1] - kernel[1]) // stride[1] + 1
    var, T = positions.conv_forward(conv._matrix(hw, (Ho, Wo)), conv.src, x, (Ho, Wo))
    var_p, T_p = conv._pairs_forward(x, (Ho, Wo))
    torch.testing.assert_close(var, var_p, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(T, T_p, rtol=1e-9, atol=1e-12)

    g = _field(C * mult, Ho, Wo, seed=7)
    var, T = positions.conv_backward(conv._matrix(hw, (Ho, Wo)), conv.src, C, g, hw)
    var_p, T_p = conv._pairs_backward(g)
    torch.testing.assert_close(var, var_p, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(T, T_p, rtol=1e-9, atol=1e-12)


def test_the_road_taken_where_it_is_cheaper():
    assert positions.cheaper(768, 49, (9, 9), (9, 9))  # ConvMixer-768/32 at 64 × 64
    assert not positions.cheaper(32, 9, (32, 32), (32, 32))  # EfficientNet's first 3 × 3
    assert not positions.cheaper(10**6, 49, (9, 9), (9, 9))  # past its memory


def test_a_stencil_takes_its_position_dependent_taps_on_either_road():
    """PoolFormer's ``pool(x) − x`` (a 3 × 3 average without the padding counted, less the centre): the
    stencil's own weights at each output position, not the unit kernel it is built on."""
    A = avg_windows(7, 3, 1, 1, False, False)
    st = pool_stencil(3, A, A, (3, 3), (1, 1), minus_identity=True)
    x = _field(3, 7, 7, seed=3)
    st.x = x
    var, T = positions.conv_forward(st._matrix((7, 7), (7, 7)), st.src, x, (7, 7))
    var_p, T_p = st._pairs_forward(x, (7, 7))
    torch.testing.assert_close(var, var_p, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(T, T_p, rtol=1e-9, atol=1e-12)
