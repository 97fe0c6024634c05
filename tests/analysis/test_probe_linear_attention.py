"""ReLU linear attention (EfficientViT-B0's LiteMLA) and one head of EfficientViT-M's cascaded softmax
attention against Monte Carlo on Gaussian fields of known correlation: the rules' draws of the state
against draws of the fields themselves through timm's formulas."""

import torch

from gatepool.analysis.probe.correlated.cascaded_attention import SoftmaxAttention
from gatepool.analysis.probe.correlated.field import _DT, Field
from gatepool.analysis.probe.correlated.linear_attention import LinearAttention
from gatepool.analysis.probe.correlated.positions import covariance

H = W = 4
T = H * W
# channels of each of q, k, v per group: EfficientViT-B0's 16. At 8 the queries' gradient has a heavy tail
# (a query with two positive channels: ∂o/∂q ~ 1/|q|, its second moment log-divergent as ε → 0), which
# neither 8192 nor 20000 draws estimate stably (the rule's chunked and whole draws 10% apart); at 16 such
# queries are 0.2% of them and the estimate is stable (0.5%)
D = 16
GROUPS = 2
N = 20000  # Monte Carlo draws


def _lags(ell: float) -> torch.Tensor:
    """(2H − 1, 2W − 1) a Gaussian correlation of length ``ell``."""
    a, b = torch.meshgrid(torch.arange(-(H - 1), H), torch.arange(-(W - 1), W), indexing="ij")
    return torch.exp(-(a**2 + b**2).to(_DT) / (2 * ell**2))


def _field(C: int, mean: float, ell: float, seed: int) -> Field:
    """C channels, each its own variance map (0.5–1.5) and mean map about ``mean``, one correlation."""
    g = torch.Generator().manual_seed(seed)
    var = 0.5 + torch.rand((C, H, W), generator=g, dtype=_DT)
    m = mean + 0.3 * torch.randn((C, H, W), generator=g, dtype=_DT)
    return Field(m, var, _lags(ell).expand(C, -1, -1).clone())


def _sample(f: Field, n: int, seed: int) -> torch.Tensor:
    """(n, C, T) draws of f by its Cholesky factor (the test's own draws, not the rule's)."""
    K = covariance(f) + 1e-10 * torch.eye(T, dtype=_DT)
    z = torch.randn((n, f.shape[0], T), generator=torch.Generator().manual_seed(seed), dtype=_DT)
    return f.mean.reshape(1, f.shape[0], T) + torch.einsum("ctu,ncu->nct", torch.linalg.cholesky(K), z)


def _timm_attn(q, k, v, eps=1e-5):  # timm's LiteMLA._attn, as written there
    v = torch.nn.functional.pad(v, (0, 1), mode="constant", value=1.0)
    kv = k.transpose(-1, -2) @ v
    out = q @ kv
    return out[..., :-1] / (out[..., -1:] + eps)


def _cascaded_head(q, k, v, bias):  # timm's CascadedGroupAttention, one head, as written there (B, d, T)
    q = q * D**-0.5
    attn = q.transpose(-2, -1) @ k
    attn = attn + bias
    attn = attn.softmax(dim=-1)
    return v @ attn.transpose(-2, -1)


def _linear(parts):
    return _timm_attn(parts[:, :, 0].relu(), parts[:, :, 1].relu(), parts[:, :, 2]).transpose(-1, -2)


def _bias():
    return 0.5 * torch.randn((T, T), generator=torch.Generator().manual_seed(4), dtype=_DT)


def _softmax(parts):
    return _cascaded_head(*(parts[:, :, i].transpose(-1, -2) for i in range(3)), _bias())


def _monte_carlo(x: Field, g: Field, attend=_linear):
    """Draws of x (GROUPS·3D channels) through the attention, and of g at its output: per position
    (channels pooled) the output's mean and variance and each part's gradient E[g²], with their
    standard errors."""
    X = _sample(x, N, 1).requires_grad_(True)
    G = _sample(g, N, 2)
    o = attend(X.reshape(N, GROUPS, 3, D, T).transpose(-1, -2))  # (n, groups, qkv, T, d) in
    o = o.reshape(N, GROUPS * D, T)
    (gx,) = torch.autograd.grad((o * G).sum(), X)
    o, gx = o.detach(), gx.reshape(N, GROUPS, 3, D, T)
    mean = o.mean(0)
    dev2 = (o - mean) ** 2  # (n, C, T)
    var, var_se = dev2.mean((0, 1)), dev2.mean(1).std(0) / N**0.5
    e2 = (gx**2).mean((1, 3))  # (n, 3, T): q, k, v pooled
    d = (o - mean).reshape(N, -1, H, W)
    lag = (d[..., 1:] * d[..., :-1]).mean((1, 2, 3))  # (n,): horizontal neighbours' products, pooled
    return mean, var, var_se, e2.mean(0), e2.std(0) / N**0.5, lag.mean(), lag.std() / N**0.5


def _setup():
    x = _field(GROUPS * 3 * D, 0.2, 1.0, 0)
    gvar = 0.5 + torch.rand((GROUPS * D, H, W), generator=torch.Generator().manual_seed(3), dtype=_DT)
    g = Field(torch.zeros_like(gvar), gvar, _lags(0.7).expand(GROUPS * D, -1, -1).clone())
    return x, g


def _against_monte_carlo(rule, attend):
    x, g = _setup()
    mean, var, var_se, e2, e2_se, lag, lag_se = _monte_carlo(x, g, attend)
    out = rule.forward(x)
    gx = rule.backward(g)
    # the rule's own draws (8192) add their error to the Monte Carlo's: both within 5 combined errors + 2%
    k = (1 + N / rule.n) ** 0.5
    pv = out.var.reshape(GROUPS * D, T).mean(0)
    assert ((pv - var).abs() <= 5 * k * var_se + 0.02 * var).all(), pv / var
    assert (out.mean.reshape(GROUPS * D, T) - mean).abs().max() < 0.05 * var.sqrt().min()
    K = covariance(out).reshape(-1, H, W, H, W)
    plag = torch.stack([K[:, i, j, i, j + 1] for i in range(H) for j in range(W - 1)]).mean()
    assert (plag - lag).abs() <= 5 * k * lag_se + 0.02 * var.mean(), (plag, lag)
    pg = gx.var.reshape(GROUPS, 3, D, T).mean((0, 2))
    assert ((pg - e2).abs() <= 5 * k * e2_se + 0.02 * e2).all(), pg / e2


def test_linear_attention_against_monte_carlo():
    _against_monte_carlo(LinearAttention(D, 1e-5), _linear)


def test_cascaded_head_against_monte_carlo():
    """Softmax attention with a relative-position bias (not zero: the rule reads it), one head a group."""
    _against_monte_carlo(SoftmaxAttention(D, D, D**-0.5, _bias()), _softmax)


def test_the_mean_weight_misses():
    """The near-uniform weight (o_i the tokens' mean of v, w_ij = 1/T) is far outside those bounds: the
    ratio's fluctuation is what the rule carries."""
    x, g = _setup()
    _, var, var_se, *_ = _monte_carlo(x, g)
    V = covariance(Field(x.mean[2 * D : 3 * D], x.var[2 * D : 3 * D], x.corr[2 * D : 3 * D]))
    uniform = V.sum((1, 2)).mean() / T**2
    assert ((uniform - var).abs() > 5 * 2 * var_se + 0.02 * var).all(), uniform / var
