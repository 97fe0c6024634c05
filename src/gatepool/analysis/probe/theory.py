"""The lecture's propagation rules: what each part does to E[x²] forward and to E[(∂L/∂x)²] backward.

Every rule assumes independent, zero-mean weights and inputs whose elements are independent; it is the
"ideal" a measurement is set beside, not a fit.

    linear / conv   forward   Var(y)      = fan_in  · E[w²] · E[x²]          fan_in  = C_in  · k
                    backward  E[(∂L/∂x)²] = fan_out · E[w²] · E[(∂L/∂y)²]    fan_out = C_out · k
    ReLU, x ~ N(µ, σ²), α = µ/σ   (x = a + ReLU(c), two normals: averaged over c, ``relu_of_sum``)
                    forward   E[p]  = µ Φ(α) + σ φ(α),   E[p²] = (µ² + σ²) Φ(α) + µ σ φ(α)
                              (N(0, 1): mean 1/√(2π), E[p²] = ½, variance ½ − 1/(2π))
                    backward  E[(∂L/∂x)²] = Φ(α) · E[g²]   (halves it for µ = 0)
    GELU, SiLU, tanh, sigmoid, ReLU6, hard sigmoid / swish: f of x ~ N(µ, σ²), by quadrature
                    forward   E[f(x)], E[f(x)²];   backward  E[(∂L/∂x)²] = E[f'(x)²] · E[g²]
    max of ReLUs    max_j ReLU(x_j) = ReLU(max_j x_j): the largest of n N(µ, σ²), then rectified
    padding         each output sees only the taps that land on real inputs: Var factor = N / k
    avg pool of n   forward   Var = σ²/n;  backward  E[(∂L/∂x)²] = E[g²]/n²  (each input gets g/n)
    max pool of n   forward   the largest of n N(0, 1), density n φ(x) Φ(x)^(n−1) (n = 4: mean 1.03, Var 0.49)
                    backward  only the winner gets g: E[(∂L/∂x)²] = E[g²]/n, a share (n−1)/n exact zeros
    norm            GroupNorm / LayerNorm reset to mean 0, variance 1;  backward E[g²] / Var(x)
    residual        x + f(x): Var = Var(x) + Var(f(x)),  E[g_x²] = E[g²] + E[g_f²]
    cross-entropy   at logits ≈ 0 over C classes, summed over the batch: E[g²] = (1 − 1/C)/C per logit
"""

from __future__ import annotations

import math
from functools import cache

import torch

from gatepool.utils.checks import check_int

_SQRT_2PI = math.sqrt(2.0 * math.pi)


def normal_pdf(x: float) -> float:
    """φ(x), the standard normal density."""
    return math.exp(-0.5 * x * x) / _SQRT_2PI


def normal_cdf(x: float) -> float:
    """Φ(x), the standard normal distribution function."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


# ---------------------------------------------------------------------------------------------------
# Linear and convolution
# ---------------------------------------------------------------------------------------------------


def linear_forward(fan_in: float, w2: float, x2: float, b2: float = 0.0) -> float:
    """E[y²] of ``y = w·x + b``: ``fan_in · E[w²] · E[x²] + E[b²]`` (Var(y) when the bias is 0)."""
    return fan_in * w2 * x2 + b2


def linear_backward(fan_out: float, w2: float, g2: float) -> float:
    """E[(∂L/∂x)²] = ``fan_out · E[w²] · E[(∂L/∂y)²]``."""
    return fan_out * w2 * g2


# ---------------------------------------------------------------------------------------------------
# ReLU of a normal input
# ---------------------------------------------------------------------------------------------------


def relu_moments(mean: float = 0.0, var: float = 1.0) -> tuple[float, float, float, float]:
    """(mean, variance, E[p²], P(p > 0)) of ``p = ReLU(x)``, ``x ~ N(mean, var)`` (the rectified normal).

    ``relu_moments()`` is (1/√(2π), ½ − 1/(2π), ½, ½).
    """
    if var < 0:
        raise ValueError(f"var must be >= 0, got {var}")
    if var == 0:  # a constant: ReLU(mean)
        p = max(mean, 0.0)
        return p, 0.0, p * p, float(mean > 0)
    sd = math.sqrt(var)
    a = mean / sd
    cdf, pdf = normal_cdf(a), normal_pdf(a)
    m = mean * cdf + sd * pdf
    e2 = (mean * mean + var) * cdf + mean * sd * pdf
    return m, max(e2 - m * m, 0.0), e2, cdf


@cache
def relu_of_sum(mean: float, var: float, c_mean: float, c_var: float) -> tuple[float, float, float, float]:
    """(mean, variance, E[p²], P(p > 0)) of ``p = ReLU(a + ReLU(c))``, a ~ N(mean, var), c ~ N(c_mean, c_var).

    The ReLU after a residual add whose stream is itself a ReLU output (a ResNet's second block): the sum
    is skewed, not normal. Given c the inner value is N(mean + ReLU(c), var), so each moment is
    :func:`relu_moments` averaged over c: its mass Φ(−c_mean/σ_c) at ReLU(c) = 0 and a quadrature over c > 0.
    """
    if c_var <= 0 or var <= 0:
        return relu_moments(mean + max(c_mean, 0.0), var + (0.0 if c_var <= 0 else c_var))
    from scipy import integrate

    sc = math.sqrt(c_var)
    z0 = -c_mean / sc  # c > 0 where z > z0
    at_zero = normal_cdf(z0)

    def moments(z: float) -> tuple[float, float, float, float]:
        return relu_moments(mean + c_mean + sc * z, var)

    out = []
    for i in (0, 2, 3):  # E[p], E[p²], P(p > 0)

        def h(z: float, i: int = i) -> float:
            return moments(z)[i] * normal_pdf(z)

        inner = integrate.quad(h, z0, max(z0, 0.0) + 12.0, limit=200)[0]
        out.append(at_zero * relu_moments(mean, var)[i] + inner)
    m, e2, pos = out
    return m, max(e2 - m * m, 0.0), e2, pos


def relu_backward(g2: float, mean: float = 0.0, var: float = 1.0) -> float:
    """E[(∂L/∂x)²] = ``P(x > 0) · E[g²]``: the gate H(x) lets through the gradient of the positive inputs."""
    return relu_moments(mean, var)[3] * g2


# ---------------------------------------------------------------------------------------------------
# Smooth activations of a normal input, by quadrature
# ---------------------------------------------------------------------------------------------------


def _gelu(x: float) -> float:
    return x * normal_cdf(x)


def _gelu_d(x: float) -> float:
    return normal_cdf(x) + x * normal_pdf(x)


def _gelu_tanh(x: float) -> float:
    return 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _gelu_tanh_d(x: float) -> float:
    u = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)
    t = math.tanh(u)
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * math.sqrt(2.0 / math.pi) * (1.0 + 3 * 0.044715 * x * x)


def _sigmoid(x: float) -> float:
    return 0.5 * (1.0 + math.tanh(0.5 * x))  # no overflow for large |x|


def _silu(x: float) -> float:
    return x * _sigmoid(x)


def _silu_d(x: float) -> float:
    s = _sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


def _hardsigmoid(x: float) -> float:
    return min(max(x / 6.0 + 0.5, 0.0), 1.0)


ACTIVATIONS = {  # name: (f, f')
    "gelu": (_gelu, _gelu_d),
    "gelu_tanh": (_gelu_tanh, _gelu_tanh_d),
    "silu": (_silu, _silu_d),
    "tanh": (math.tanh, lambda x: 1.0 - math.tanh(x) ** 2),
    "sigmoid": (_sigmoid, lambda x: _sigmoid(x) * (1.0 - _sigmoid(x))),
    "relu6": (lambda x: min(max(x, 0.0), 6.0), lambda x: float(0.0 < x < 6.0)),
    "hardsigmoid": (_hardsigmoid, lambda x: float(-3.0 < x < 3.0) / 6.0),
    "hardswish": (lambda x: x * _hardsigmoid(x), lambda x: _hardsigmoid(x) + x * float(-3.0 < x < 3.0) / 6.0),
}


@cache
def activation_moments(name: str, mean: float = 0.0, var: float = 1.0) -> tuple[float, float, float]:
    """(mean, variance, E[f'(x)²]) of ``f(x)``, ``x ~ N(mean, var)``, f one of :data:`ACTIVATIONS`.

    ``E[h(x)] = ∫ h(µ + σz) φ(z) dz`` by ``scipy.integrate.quad``; E[f'²] is the backward factor
    (``E[(∂L/∂x)²] = E[f'(x)²] · E[g²]``, g independent of x). ``activation_moments("tanh")`` is
    (0, 0.3943, 0.4644).
    """
    if name not in ACTIVATIONS:
        raise ValueError(f"name must be one of {sorted(ACTIVATIONS)}, got {name!r}")
    if var < 0:
        raise ValueError(f"var must be >= 0, got {var}")
    f, d = ACTIVATIONS[name]
    if var == 0:
        return f(mean), 0.0, d(mean) ** 2
    from scipy import integrate  # lazy, as in max_of_normals

    sd = math.sqrt(var)

    def e(h) -> float:
        kinks = [(k - mean) / sd for k in (-3.0, 0.0, 3.0, 6.0) if -12.0 < (k - mean) / sd < 12.0]
        return integrate.quad(
            lambda z: h(mean + sd * z) * normal_pdf(z), -12.0, 12.0, limit=200, points=kinks or None
        )[0]

    m = e(f)
    e2 = e(lambda x: f(x) ** 2)
    return m, max(e2 - m * m, 0.0), e(lambda x: d(x) ** 2)


# ---------------------------------------------------------------------------------------------------
# Padding: the share of the kernel that sees real inputs
# ---------------------------------------------------------------------------------------------------


def _pair(v, name: str) -> tuple[int, int]:
    t = (v, v) if isinstance(v, int) else tuple(v)
    if len(t) != 2 or not all(isinstance(i, int) for i in t):
        raise TypeError(f"{name} must be an int or a pair of ints, got {v!r}")
    return t  # type: ignore[return-value]


def taps_per_output(length: int, k: int, p: int, s: int, d: int) -> torch.Tensor:
    """(n_out,) float64: for each output along one axis, how many of the k taps land inside [0, length).

    The axis has ``length`` inputs, a kernel of ``k`` taps with padding ``p``, stride ``s`` and dilation
    ``d`` (as torch's conv). Divided by k it is the share of an output's variance that zero padding
    leaves; ``taps_per_output(5, 3, 1, 1, 1)`` is [2, 3, 3, 3, 2].
    """
    n_out = (length + 2 * p - d * (k - 1) - 1) // s + 1
    pos = torch.arange(n_out)[:, None] * s - p + torch.arange(k)[None, :] * d  # (n_out, k) input index
    return ((pos >= 0) & (pos < length)).sum(1).double()  # (n_out,)


def tap_coverage(length: int, k: int, p: int, s: int, d: int) -> torch.Tensor:
    """(k,) float64: for each of the k taps along one axis, the share of the outputs where it is real.

    Its mean is ``taps_per_output(...).mean() / k``; ``tap_coverage(5, 3, 1, 1, 1)`` is [0.8, 1, 0.8].
    """
    n_out = (length + 2 * p - d * (k - 1) - 1) // s + 1
    pos = torch.arange(n_out)[:, None] * s - p + torch.arange(k)[None, :] * d  # (n_out, k) input index
    return ((pos >= 0) & (pos < length)).double().mean(0)  # (k,)


def padding_variance_map(
    height: int,
    width: int,
    kernel_size: int | tuple[int, int],
    padding: int | tuple[int, int],
    stride: int | tuple[int, int] = 1,
    dilation: int | tuple[int, int] = 1,
) -> torch.Tensor:
    """(H_out, W_out) share of kernel taps that land on real inputs, i.e. Var(y) relative to the middle.

    Zero padding adds nothing to ``y = Σ w·x``, so an output that sees N of the k = k_h·k_w taps has
    N/k of the middle variance: for 3×3 with padding 1, a corner 4/9, an edge 6/9, the middle 1.
    The map is separable: (taps along H) ⊗ (taps along W) / k.
    """
    (kh, kw), (ph, pw) = _pair(kernel_size, "kernel_size"), _pair(padding, "padding")
    (sh, sw), (dh, dw) = _pair(stride, "stride"), _pair(dilation, "dilation")
    check_int(height, "height")
    check_int(width, "width")
    for name, pair, low in (
        ("kernel_size", (kh, kw), 1),
        ("stride", (sh, sw), 1),
        ("dilation", (dh, dw), 1),
        ("padding", (ph, pw), 0),
    ):
        for v in pair:
            check_int(v, name, low)
    if height + 2 * ph < dh * (kh - 1) + 1 or width + 2 * pw < dw * (kw - 1) + 1:
        raise ValueError(
            f"kernel_size={kernel_size} (dilation {dilation}) does not fit a {height}×{width} map "
            f"padded by {padding}"
        )
    rows = taps_per_output(height, kh, ph, sh, dh)  # (H_out,)
    cols = taps_per_output(width, kw, pw, sw, dw)  # (W_out,)
    return torch.outer(rows, cols) / (kh * kw)  # (H_out, W_out)


# ---------------------------------------------------------------------------------------------------
# Pools
# ---------------------------------------------------------------------------------------------------


def avg_pool_forward(n: int, var: float = 1.0) -> float:
    """Var of the mean of n independent values of variance ``var``: ``var / n`` (the mean is kept)."""
    return var / n


def avg_pool_backward(n: int, g2: float = 1.0) -> float:
    """Each of the n inputs receives g/n: ``E[(∂L/∂x)²] = E[g²] / n²``."""
    return g2 / (n * n)


@cache
def max_of_normals(n: int) -> tuple[float, float]:
    """(mean, variance) of the largest of n i.i.d. N(0, 1), integrating its density n φ(x) Φ(x)^(n−1).

    ``max_of_normals(4)`` = (1.0294, 0.4917): the lecture's 2×2 max pool, mean 1.03, variance 0.49.
    """
    check_int(n, "n")
    from scipy import integrate, special  # lazy: scipy is needed by this one integral only

    def density(x: float) -> float:
        return n * normal_pdf(x) * special.ndtr(x) ** (n - 1)

    mean = integrate.quad(lambda x: x * density(x), -math.inf, math.inf)[0]
    e2 = integrate.quad(lambda x: x * x * density(x), -math.inf, math.inf)[0]
    return mean, e2 - mean * mean


def max_pool_forward(n: int, mean: float = 0.0, var: float = 1.0) -> tuple[float, float]:
    """(mean, variance) of the largest of n i.i.d. N(mean, var): ``mean + σ·m_n``, ``var · v_n``."""
    m, v = max_of_normals(n)
    return mean + math.sqrt(var) * m, var * v


@cache
def max_of_rectified_normals(n: int, mean: float = 0.0, var: float = 1.0) -> tuple[float, float]:
    """(mean, variance) of ``max_j ReLU(x_j) = ReLU(max_j x_j)``, n i.i.d. ``x_j ~ N(mean, var)``.

    A max pool after a ReLU: the largest of n normals, density ``n φ(z) Φ(z)^(n−1)``, rectified.
    ``max_of_rectified_normals(1)`` is the ReLU of N(0, 1): (1/√(2π), ½ − 1/(2π)).
    """
    check_int(n, "n")
    if var <= 0:
        p = max(mean, 0.0)
        return p, 0.0
    from scipy import integrate, special

    sd = math.sqrt(var)
    z0 = -mean / sd  # max > 0 where z > z0

    def density(z: float) -> float:
        return n * normal_pdf(z) * special.ndtr(z) ** (n - 1)

    hi = max(z0, 0.0) + 12.0
    m = integrate.quad(lambda z: (mean + sd * z) * density(z), z0, hi, limit=200)[0]
    e2 = integrate.quad(lambda z: (mean + sd * z) ** 2 * density(z), z0, hi, limit=200)[0]
    return m, max(e2 - m * m, 0.0)


def max_pool_backward(n: int, g2: float = 1.0, zero_share: float = 0.0) -> tuple[float, float]:
    """(E[(∂L/∂x)²], share of exact zeros) per input: only the winner of each window gets g.

    ``E[g²] / n`` and ``1 − (1 − zero_share) / n`` — (n−1)/n exact zeros when g itself has none.
    """
    return g2 / n, 1.0 - (1.0 - zero_share) / n


# ---------------------------------------------------------------------------------------------------
# Norms, residuals, the loss
# ---------------------------------------------------------------------------------------------------


def norm_backward(g2: float, var: float, *, weight2: float = 1.0, eps: float = 0.0) -> float:
    """E[(∂L/∂x)²] through ``γ·(x − µ)/√(Var(x) + eps)``: ``γ² · E[g²] / (Var(x) + eps)``.

    The projection that removes the mean and the x̂ direction (2 of the m values normalized together)
    is dropped: a factor 1 − 2/m, close to 1 for the lecture's groups of 4·14·14.
    """
    return weight2 * g2 / (var + eps)


def residual_add(stream_var: float, branch_var: float) -> float:
    """Var(x + f(x)) = Var(x) + Var(f(x)): the branch ends in zero-mean random weights, uncorrelated."""
    return stream_var + branch_var


def cross_entropy_grad(num_classes: int, batch: int = 1, reduction: str = "sum") -> float:
    """E[(∂L/∂z)²] per logit at initialization (logits ≈ 0, softmax uniform): ``(1 − 1/C)/C``.

    ∂L/∂z = softmax(z) − onehot(y), so per sample Σ_j g_j² = Σ p_j² − 2 p_y + 1 = 1 − 1/C at p = 1/C.
    ``reduction="mean"`` divides the gradient by the batch size, so E[g²] by batch².
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    g2 = (1.0 - 1.0 / num_classes) / num_classes
    return g2 if reduction == "sum" else g2 / (batch * batch)
