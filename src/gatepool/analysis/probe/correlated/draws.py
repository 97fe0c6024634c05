"""Draws of a field from its state, and the state of draws: a step whose expectations have no closed form
here (CoaT's factorized attention: a softmax over the tokens, a product of two maps of one x) taken over
Gaussian draws of its input from the predicted statistics (a fixed seed, as the max pool's windows).

draw      x = m + √v · z per channel, z a stationary Gaussian field of correlation ρ over the map's lags:
          circulant embedding on a torus of at least 2H − 1 × 2W − 1 (ρ(d) at d mod the torus), its
          eigenvalues λ = DFT(ρ) (real: ρ(−d) = ρ(d)), the negative ones set to 0 and z rescaled to unit
          variance; z = Re, Im of DFT⁻¹(√λ ξ)·√M, ξ complex N(0, 2) (two independent draws a transform)
state     of S draws (S, C, H, W): m = the draws' mean, v = their variance, the lag sums
          T(e) = (1/S) Σ_s Σ_p x_sp x_s,p+e − Σ_p m_p m_p+e (by the FFTs of :mod:`field`); a gradient's
          mean 0 (linear in an output gradient of mean 0, independent of x)
step      ``fn`` maps a (S, C, H, W) batch of draws to its output and the tensors of inner rows, each
          with the map that lays it (and its gradient) out as (S, C', H', W'); forward: their states
          over the draws; backward: the output gradient drawn from its state (independent of x), the
          draws of x again (the same seed), the gradients at x and at the inner tensors by autograd,
          their states
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe.correlated.field import (
    _DT,
    Field,
    _fast_len,
    _field_from_sums,
    lags_of,
    spectra,
    xcorr,
)


def _roots(f: Field) -> tuple[torch.Tensor, tuple[int, int]]:
    """√λ (C, M₁, M₂) of the circulant embedding of f's correlation, scaled to unit variance."""
    C, H, W = f.shape
    M = (_fast_len(2 * H - 1), _fast_len(2 * W - 1))
    c = torch.zeros((C, *M), dtype=_DT)
    dh = torch.arange(-(H - 1), H) % M[0]
    dw = torch.arange(-(W - 1), W) % M[1]
    c[:, dh[:, None], dw[None, :]] = f.corr.to(_DT)
    lam = torch.fft.fft2(c).real.clamp_min(0)
    lam = lam / lam.mean((1, 2), keepdim=True).clamp_min(1e-300)  # z's variance 1
    return lam.sqrt(), M


def draw(f: Field, samples: int, seed: int, roots=None) -> torch.Tensor:
    """(samples, C, H, W) Gaussian draws of ``f`` (its mean, variance and correlation), seeded; ``roots``
    :func:`_roots` of f where known."""
    C, H, W = f.shape
    root, M = roots or _roots(f)
    gen = torch.Generator().manual_seed(seed)
    xi = torch.complex(
        *(torch.randn(((samples + 1) // 2, C, *M), generator=gen, dtype=_DT) for _ in range(2))
    )
    z = torch.fft.ifft2(root * xi) * (M[0] * M[1]) ** 0.5
    z = torch.cat((z.real, z.imag))[:samples, :, :H, :W]
    return f.mean + f.var.clamp_min(0).sqrt() * z


class Moments:
    """The running sums of draws (S, C, H, W): :meth:`field` their state."""

    def __init__(self) -> None:
        self.n, self.s1, self.s2, self.X = 0, 0.0, 0.0, 0.0

    def add(self, x: torch.Tensor) -> None:
        x = x.detach().to(_DT)
        F, Ff = spectra(x)
        self.n += x.shape[0]
        self.s1 = self.s1 + x.sum(0)
        self.s2 = self.s2 + (x**2).sum(0)
        self.X = self.X + (Ff * F).sum(0)

    def field(self, zero_mean: bool = False) -> Field:
        n = self.n
        H, W = self.s1.shape[-2:]
        mean = torch.zeros_like(self.s1) if zero_mean else self.s1 / n
        T = lags_of(self.X / n, H, W) - xcorr(mean, mean)
        return _field_from_sums(mean, self.s2 / n - mean**2, T)


class Sampled:
    """A step computed over draws: ``fn(x)`` of a (S, C, H, W) batch returns the output and a tuple of
    inner (tensor, layout) pairs, ``layout`` mapping the tensor (and its gradient) to (S, C', H', W');
    ``samples`` draws in chunks of ``chunk``, the input's seed ``seed`` and the output gradient's
    ``seed + 1``. After :meth:`forward`, ``inner`` holds the inner tensors' states; after
    :meth:`backward`, ``inner_grads`` their gradients'."""

    def __init__(self, fn, samples: int = 1024, chunk: int = 32, seed: int = 0, dtype=torch.float32) -> None:
        self.fn, self.samples, self.chunk, self.seed, self.dtype = fn, samples, chunk, seed, dtype

    def _chunks(self, f: Field, seed: int):
        """The draws of ``f`` chunk by chunk, each chunk its own seed (the same draws on every call)."""
        roots = _roots(f)
        for i in range(0, self.samples, self.chunk):
            n = min(self.chunk, self.samples - i)
            yield draw(f, n, seed * 1_000_003 + i, roots).to(self.dtype)

    def forward(self, x: Field) -> Field:
        self.x = x
        out, inner = Moments(), None
        with torch.no_grad():
            for xs in self._chunks(x, self.seed):
                y, parts = self.fn(xs)
                inner = inner or [Moments() for _ in parts]
                out.add(y)
                for m, (p, lay) in zip(inner, parts):
                    m.add(lay(p))
        self.inner = [m.field() for m in inner or []]
        return out.field()

    def backward(self, g: Field) -> Field:
        gx, inner = Moments(), None
        for xs, gs in zip(self._chunks(self.x, self.seed), self._chunks(g, self.seed + 1)):
            with torch.enable_grad():
                xs = xs.requires_grad_(True)
                y, parts = self.fn(xs)
                got = torch.autograd.grad(y, (xs, *(p for p, _ in parts)), gs)
            inner = inner or [Moments() for _ in parts]
            gx.add(got[0])
            for m, p, (_, lay) in zip(inner, got[1:], parts):
                m.add(lay(p))
        zero = not bool(g.mean.any())
        self.inner_grads = [m.field(zero_mean=zero) for m in inner or []]
        return gx.field(zero_mean=zero)
