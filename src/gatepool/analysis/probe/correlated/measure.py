"""Measurement: the input's statistics (that is the data), and a tensor's for comparison.

``measure_field`` (a batch's :class:`~.field.Field`), ``measure_input`` (the input's, with its channels as
uncorrelated components: what the prediction starts from), ``measure_fields`` (every module's output, by
forward hooks: the measurement side, never the prediction's).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from gatepool.analysis.probe.correlated import regime
from gatepool.analysis.probe.correlated.field import _DT, Field, _field_from_sums, xcorr
from gatepool.analysis.probe.correlated.law import quantile_law


@torch.no_grad()
def measure_field(x: torch.Tensor, block: int = 1 << 22) -> Field:
    """The :class:`Field` of a batch ``x`` (B, C, H, W) (or (B, F): F channels of 1×1), over the batch.

    Mean and variance per channel and position; T(c, e) the batch mean of Σ_p x̃_p x̃_{p+e}, x̃ = x − m,
    by FFTs of about ``block`` of x's values at a time (samples by channels: a (32, 256, 112, 112) output's
    spectra in one go are about 3.3 GB each, of complex doubles on 224 × 224, several at once).
    """
    if x.dim() == 2:
        x = x[:, :, None, None]
    if x.dim() != 4:
        raise ValueError(f"x must be (B, C, H, W) or (B, F), got shape {tuple(x.shape)}")
    B, C, H, W = x.shape
    x = x.detach()
    mean, var = torch.zeros((C, H, W), dtype=_DT), torch.zeros((C, H, W), dtype=_DT)
    T = torch.zeros((C, 2 * H - 1, 2 * W - 1), dtype=_DT)
    cs = max(1, min(C, block // (H * W)))  # channels at a time
    bs = max(1, min(B, block // (cs * H * W)))  # samples at a time
    for c in range(0, C, cs):
        ch = slice(c, c + cs)
        for i in range(0, B, bs):  # the block's mean first: each part centred by the batch's
            mean[ch] += x[i : i + bs, ch].to("cpu", _DT).sum(0)
        mean[ch] /= B
        for i in range(0, B, bs):
            part = x[i : i + bs, ch].to("cpu", _DT) - mean[ch]
            var[ch] += part.pow(2).sum(0)
            T[ch] += xcorr(part, part).sum(0)
    return _field_from_sums(mean, var / B, T / B)


SPARSE = 0.9  # the background's share of the pixels above which the input's own law is carried


def measure_input(batch: torch.Tensor, law: bool | None = None) -> Field:
    """The input's statistics: per channel and position mean and variance, the correlation at every lag,
    and the channels' own covariance as uncorrelated components (``Field.components``).

    ``law``: also its own marginal per position (``Field.law``: atoms of the batch's sorted values
    there, :func:`law.quantile_law`; a sparse image's spike at the background and tail of strokes),
    which the prediction then carries through the first conv, the max pools, norms and adds into the
    ReLUs (:mod:`law`), and its regime per sample (``Field.regime``: where it is above its background,
    :mod:`regime`). None (the default): where the batch is sparse, its smallest value (the
    background) at least :data:`SPARSE` of its values (the 60×60 canvases: 0.96; MNIST: 0.81, where
    the normal per position holds).

    The channels of an image are not independent (a grey digit as RGB: three copies of one channel;
    a photograph's colours: mostly one brightness). The pooled channel covariance S = E[(x − m)(x − m)ᵀ]
    (over the batch and the positions, m the mean map) = V Λ Vᵀ; the components z = Vᵀ x with Λ > 1e-9 ·
    max Λ (a copy adds none) are uncorrelated at lag 0 and x − m = V (z − m_z) where S has no other
    direction. A first conv then acts on z with the weights W·V (exact where the channels' covariance
    has the same spatial shape at every lag, as for copies). The prediction
    (:func:`~gatepool.analysis.probe.correlated_predict.predict_correlated`) starts from this and
    nothing else of the batch.
    """
    if law is None:
        law = batch.numel() > 0 and float((batch == batch.min()).float().mean()) >= SPARSE
    f = measure_field(batch)
    f = replace(_with_law(f, batch), regime=regime.of_input(batch)) if law and batch.dim() == 4 else f
    if batch.dim() != 4 or batch.shape[1] < 2:
        return f
    x = batch.detach().to("cpu", _DT)
    xc = x - x.mean(0)
    S = torch.einsum("bchw,bdhw->cd", xc, xc) / (x.shape[0] * x.shape[2] * x.shape[3])  # (C, C)
    lam, V = torch.linalg.eigh(S)
    V = V[:, lam > 1e-9 * lam.max().clamp_min(1e-300)]  # (C, r)
    z = torch.einsum("bchw,cr->brhw", x, V)
    fz = measure_field(z)
    return replace(f, components=(V, _with_law(fz, z) if law else fz))


def _with_law(f: Field, x: torch.Tensor) -> Field:
    """``f`` with the marginal of ``x`` (B, C, H, W) per position as its law."""
    if x.dim() != 4:
        return f
    return replace(f, law=quantile_law(x.detach().to("cpu", _DT).permute(1, 2, 3, 0)))


def measure_fields(model: torch.nn.Module, x: torch.Tensor, names=None) -> dict[str, Field]:
    """The measured :class:`Field` of every named module's (B, C, H, W) or (B, F) output on ``x``
    (forward hooks, removed after; the measurement side, never the prediction's)."""
    out: dict[str, Field] = {}
    handles = []
    for n, m in model.named_modules():
        if n and (names is None or n in names):

            def hook(mod, args, y, n=n):
                if isinstance(y, torch.Tensor) and y.dim() in (2, 4) and n not in out:
                    out[n] = measure_field(y)

            handles.append(m.register_forward_hook(hook))
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            model(x)
    finally:
        for h in handles:
            h.remove()
    return out
