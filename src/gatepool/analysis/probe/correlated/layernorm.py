"""LayerNorm over the channels at each position (ConvNeXt's channels-last ``nn.LayerNorm(C)`` after a
permute, timm's and torchvision's ``LayerNorm2d``, a transformer's LayerNorm over a token's features).

At one position p of one sample, over its C channels: µ_p = (1/C) Σ_c x_cp, x̃ = x − µ_p,
σ_p² = (1/C) Σ_c x̃_cp² + eps, y_c = γ_c x̃_c / σ_p + β_c. With the channels uncorrelated (the state):

forward   E[x̃_c] = m_c − m̄,   Var x̃_c = (1 − 2/C) v_c + (1/C²) Σ_c' v_c'
          T_x̃(c, e) = (1 − 2/C) T(c, e) + (1/C²) Σ_c' T(c', e)     (the lag sums of the centred field)
          σ̄_p² = (1/C) Σ_c E[x̃_cp²] + eps, taken at its expectation: Σ_c x̂_c² = C exactly (but for eps),
          so E[x̂_c²] = E[x̃_c²] / σ̄_p² keeps the channels' average right; x̂ keeps x̃'s correlation
backward  g_x = (1/σ)(ĝ − mean_c ĝ − x̂ mean_c(ĝ x̂)), ĝ = γ g, g independent of x̂:
          E[g_x,c²] = (E[ĝ_c²](1 − 2/C − 2E[x̂_c²]/C) + E[m²] + E[x̂_c²] E[t²]) · E[1/σ²],
          E[m²] = (1/C²) Σ_c E[ĝ_c²],  E[t²] = (1/C²) Σ_c E[ĝ_c²] E[x̂_c²],
          E[1/σ²] ≈ (1 + Var σ²/σ̄⁴)/σ̄², Var σ² = (1/C²) Σ_c (2 Var x̃_c² + 4 E[x̃_c]² Var x̃_c) (Gaussian);
          the lags those of ĝ − mean_c ĝ (the x̂ projection's are O(1/C) and dropped)
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gatepool.analysis.probe.correlated.field import _DT, Field, _field_from_sums, xcorr
from gatepool.analysis.probe.correlated.norms import NormAct
from gatepool.analysis.probe.correlated.registry import register_correlated_rule, register_named_rule


def _centred(T: torch.Tensor, C: int) -> torch.Tensor:
    """The lag sums (or variances) of x − mean_c x, per channel, from those of x (channels uncorrelated)."""
    return (1 - 2 / C) * T + T.sum(0, keepdim=True) / C**2


class LayerNorm:
    """LayerNorm over the C channels of a (C, H, W) field at each position, affine γ, β (C,) or None."""

    def __init__(self, weight, bias, eps: float) -> None:
        if not eps >= 0:
            raise ValueError(f"eps must be ≥ 0, got {eps}")
        self.gamma = None if weight is None else weight.detach().to("cpu", _DT).reshape(-1)
        self.beta = None if bias is None else bias.detach().to("cpu", _DT).reshape(-1)
        self.eps = eps

    def _affine(self, C: int) -> tuple[torch.Tensor, torch.Tensor]:
        gam = torch.ones(C, dtype=_DT) if self.gamma is None else self.gamma
        bet = torch.zeros(C, dtype=_DT) if self.beta is None else self.beta
        if len(gam) != C or len(bet) != C:
            raise ValueError(f"weight and bias must have the field's {C} channels, got {len(gam)}")
        return gam[:, None, None], bet[:, None, None]

    def forward(self, x: Field) -> Field:
        C = x.shape[0]
        gam, bet = self._affine(C)
        mean = x.mean - x.mean.mean(0, keepdim=True)  # E[x̃]
        var = _centred(x.var, C).clamp_min(0)  # Var x̃
        s2 = (var + mean**2).mean(0, keepdim=True)  # (1, H, W) σ̄_p² without eps
        self.sigma2 = s2 + self.eps
        var_s2 = (2 * var**2 + 4 * mean**2 * var).sum(0, keepdim=True) / C**2
        self.jensen = 1 + var_s2 / self.sigma2**2
        corr = _field_from_sums(mean, var, _centred(x.lag_sums(), C)).corr
        self.xhat = Field(mean / self.sigma2.sqrt(), var / self.sigma2, corr)
        out_var = gam**2 * self.xhat.var
        s = out_var.sqrt()
        return _field_from_sums(gam * self.xhat.mean + bet, out_var, corr * xcorr(s, s))

    def backward(self, g: Field) -> Field:
        C = g.shape[0]
        gam, _ = self._affine(C)
        gh = gam**2 * g.var  # E[ĝ²]
        xh2 = self.xhat.var + self.xhat.mean**2  # E[x̂²]
        e_m2 = gh.sum(0, keepdim=True) / C**2
        e_t2 = (gh * xh2).sum(0, keepdim=True) / C**2
        var = (gh * (1 - 2 / C - 2 * xh2 / C) + e_m2 + xh2 * e_t2).clamp_min(0) * self.jensen / self.sigma2
        centred = _centred(gam**2 * g.lag_sums(), C)
        corr = _field_from_sums(torch.zeros_like(var), _centred(gh, C), centred).corr
        s = var.sqrt()
        return _field_from_sums(torch.zeros_like(var), var, corr * xcorr(s, s))


@register_correlated_rule(nn.LayerNorm)
@register_named_rule("timm.layers.norm.LayerNorm")
def layernorm_rule(m: nn.LayerNorm, channels_first: bool = False) -> LayerNorm:
    """LayerNorm over one dim: the tensor's last (``nn.LayerNorm(C)``) or its channels (``LayerNorm2d``)."""
    if len(m.normalized_shape) != 1:
        raise NotImplementedError("LayerNorm over more than one dim")
    step = LayerNorm(m.weight if m.elementwise_affine else None, getattr(m, "bias", None), m.eps)
    step.channels_first = channels_first
    return step


register_named_rule("torchvision.models.convnext.LayerNorm2d", "timm.layers.norm.LayerNorm2d")(
    lambda m: layernorm_rule(m, channels_first=True)
)
register_named_rule("timm.layers.norm_act.LayerNormAct")(lambda m: NormAct(m, layernorm_rule(m)))
register_named_rule("timm.layers.norm_act.LayerNormAct2d")(
    lambda m: NormAct(m, layernorm_rule(m, channels_first=True))
)
