"""DDPM training and DDIM sampling with classifier-free guidance, for any ε-predictor ``model(x, t, ids)``.

Forward process (DDPM, linear β from 1e-4 to 0.02 over T steps), ᾱ_t = Π_{s≤t} (1 − β_s)::

    x_t = √ᾱ_t x_0 + √(1 − ᾱ_t) ε,      ε ~ N(0, I)
    L   = E_{t, ε} ‖ε − ε̂(x_t, t, c)‖²                 (ε-prediction, "L_simple")

Classifier-free guidance: during training the caption is replaced by the empty one (``BOS EOS``) with
probability ``p_uncond``, so one network learns ε̂(x, t, c) and ε̂(x, t, ∅); sampling uses

    ε̃ = ε̂(x, t, ∅) + w (ε̂(x, t, c) − ε̂(x, t, ∅))     (w = 1: plain conditional; w > 1: guided)

DDIM (η = 0) walks a subsequence τ_1 > … > τ_S of the T steps deterministically::

    x̂_0     = clamp((x_τ − √(1 − ᾱ_τ) ε̃) / √ᾱ_τ, −1, 1)     (the data live in [−1, 1])
    x_τ'    = √ᾱ_τ' x̂_0 + √(1 − ᾱ_τ') ε̃             (ᾱ at the step after the last: 1)

so the only randomness is x_T ~ N(0, I), drawn from the caller's generator: one seed, one image.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.utils.checks import check_int, check_number

__all__ = ["DDPMSchedule"]


class DDPMSchedule:
    """β, ᾱ of a linear schedule over ``steps`` timesteps, the loss and the DDIM sampler."""

    def __init__(self, steps: int = 1000, beta_start: float = 1e-4, beta_end: float = 0.02) -> None:
        check_int(steps, "steps", 2)
        check_number(beta_start, "beta_start", 0, 1, low_open=True, high_open=True)
        check_number(beta_end, "beta_end", beta_start, 1, high_open=True)
        self.steps = steps
        self.betas = torch.linspace(beta_start, beta_end, steps, dtype=torch.float64)
        self.alpha_bar = torch.cumprod(1 - self.betas, dim=0)  # (T,)

    def _ab(self, t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:  # (B,) -> (B, 1, 1, 1)
        return self.alpha_bar.to(like.device)[t].to(like.dtype).view(-1, *([1] * (like.ndim - 1)))

    def q_sample(self, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """x_t = √ᾱ_t x_0 + √(1 − ᾱ_t) ε."""
        ab = self._ab(t, x0)
        return ab.sqrt() * x0 + (1 - ab).sqrt() * noise

    def loss(self, model: nn.Module, x0: torch.Tensor, ids: torch.Tensor, null_ids: torch.Tensor,
             p_uncond: float = 0.1, generator: torch.Generator | None = None) -> torch.Tensor:  # fmt: skip
        """The ε-prediction loss of a batch x0 (B, 1, H, W) in [−1, 1] with captions ids (B, T); each
        caption becomes ``null_ids`` (T,) with probability ``p_uncond``."""
        b = x0.shape[0]
        t = torch.randint(0, self.steps, (b,), generator=generator).to(x0.device)
        noise = torch.randn(x0.shape, generator=generator).to(x0)
        drop = torch.rand(b, generator=generator).to(x0.device) < p_uncond
        ids = torch.where(drop[:, None], null_ids.to(ids.device)[None], ids)
        return F.mse_loss(model(self.q_sample(x0, t, noise), t, ids), noise)

    @torch.no_grad()
    def ddim_sample(self, model: nn.Module, ids: torch.Tensor, null_ids: torch.Tensor, *, steps: int = 25,
                    guidance: float = 1.0, generator: torch.Generator | None = None,
                    noise: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """Deterministic DDIM from x_T = ``noise`` (or N(0, I) drawn from ``generator``) for captions ids
        (B, T); ``guidance`` w as in the module docstring (w = 1: no unconditional pass). (B, 1, H, W)."""
        check_int(steps, "steps", 1, self.steps)
        check_number(guidance, "guidance", 0.0)
        b, s = ids.shape[0], model.image_size
        device = ids.device
        x = torch.randn((b, 1, s, s), generator=generator).to(device) if noise is None else noise.to(device)
        cond = model.encode_text(ids)
        uncond = model.encode_text(null_ids.to(device)[None].expand(b, -1)) if guidance != 1.0 else None
        times = torch.linspace(self.steps - 1, 0, steps).round().long().tolist()
        for i, t in enumerate(times):
            tt = torch.full((b,), t, dtype=torch.long, device=device)
            eps = model(x, tt, context=cond)
            if uncond is not None:
                eps_u = model(x, tt, context=uncond)
                eps = eps_u + guidance * (eps - eps_u)
            ab = self.alpha_bar[t].item()
            ab_next = self.alpha_bar[times[i + 1]].item() if i + 1 < len(times) else 1.0
            x0 = ((x - (1 - ab) ** 0.5 * eps) / ab**0.5).clamp(-1.0, 1.0)  # the data live in [−1, 1]
            x = ab_next**0.5 * x0 + (1 - ab_next) ** 0.5 * eps
        return x
