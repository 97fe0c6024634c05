"""The gradient's first-order response to the tensor's own value, for a sum over the positions
(``Field.coupling``): squeeze-and-excitation's gate gradient ∂L/∂s = Σ_p g_p x_p.

An activation u = f(h) after the gate, h = Σ_c A_kc x_c + (the other channels), passes g_h = f'(h) G with
f'(h) ≈ E[f'] + (E[f' z]/√v_h) (h − m_h) (z = (h − m_h)/√v_h; Stein: E[f' z]/√v_h = E[f'']), so

    g = g⁰ + Λ (x − m),     Λ_h = (E[f' z]/√v_h) G,   Cov(Λ_h, g⁰_h) = E[f'] (E[f' z]/√v_h) E[G²]

per position. A dense conv's outputs read each input by O(1/fan-in), nothing at one position, but over
HW positions Σ_p Λ_p (x_p − m_p) x_p ≈ Λ HW v: coherent where G is (a global pool's gradient is constant
over the positions). With B_ck = ∂h_k/∂x_c, the gain of the linear steps between (1 × 1 convs, norms'
affine maps), g_c = Σ_k B_ck g_h,k and x_c's share of h_k is B_ck x_c, so Λ_c = Σ_k B_ck² λ_k, λ_k the
activations' own (independent over k):

    V_c = E[Λ_c²] = Σ_k B_ck⁴ E[λ_k²],   K_c = Cov(g⁰_c, Λ_c) = Σ_k B_ck³ Cov(g⁰_h,k, λ_k)

B is a sum over the paths (through two convs B_ck = Σ_o W'_ko W_oc): B⁴ is not the product of each
conv's W⁴, so the state carries the signed gain B (C, K), and per source k the maps (K, H, W) of E[λ²]
and Cov(g⁰, λ); Λ's correlation over the positions taken as the gradient's own:

activation   a source: B = I, E[λ²] = (E[f' z]/√v)² E[G²], Cov = E[f'] (E[f' z]/√v) E[G²] (the later
             activations' sources are not carried through it)
affine a_c   (a norm's γ/σ per channel): B's row c times a_c
1 × 1 conv   y = W x: B_in = Wᵀ B_out
two gradients of one tensor (a residual stream): the sources side by side (independent)
stochastic   y = c x, c = b/q random: E[λ²] E[c⁴], Cov E[c³] (B kept)
depth
the gate     y = x · s, g at y: ∂L/∂s = Σ_p g⁰_p x_p + s Σ_p Λ_p (x_p − m_p) x_p, so E[(∂L/∂s)²] gains
             2 E[s] Σ_{p,q} Cov(g⁰_p, Λ_q) m_p v_q + E[s²] Σ_{p,q} Cov(Λ_p, Λ_q) v_p v_q
             (p ≠ q: E[x_p (x_q − m_q) x_q] = m_p v_q, E[(x_p − m_p) x_p (x_q − m_q) x_q] = v_p v_q; at p = q
             x's own cumulants: κ₃ + 2 m v and κ₄ + 3 v² + 2 m κ₃ + m² v)
Every other rule drops it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gatepool.analysis.probe.correlated.field import Field, xcorr

_DEFERRED = 64  # the steps a coupling's terms may wait before they are made (the chain's recursion)


class Coupling:
    """B (C, K) the gain from the tensor's channels to the sources' (None: the identity, C = K); ``l2``,
    ``lk`` (K, H, W) E[λ²] and Cov(g⁰, λ) of each source.

    Made when first read: every step below defers its (B, l2, lk) to a function of the step before, so
    a model whose coupling no gate reads (a transformer: each block's activation adds 4·C sources to its
    stream's, a (C, K) gain through every Linear) never makes it; a chain more than :data:`_DEFERRED`
    steps long is made at once (its reading would recurse that deep)."""

    def __init__(self, B: torch.Tensor | None, l2: torch.Tensor | None = None, lk: torch.Tensor | None = None,
                 *, make: Callable[[], tuple] | None = None, depth: int = 0) -> None:  # fmt: skip
        self._terms, self._make, self.depth = (B, l2, lk), make, depth

    @classmethod
    def after(cls, make: Callable[[], tuple], *inputs: Coupling) -> Coupling:
        """The coupling of ``make()`` (B, l2, lk) over the terms of ``inputs``, made when first read."""
        depth = 1 + max(c.depth for c in inputs)
        return cls(*make()) if depth > _DEFERRED else cls(None, make=make, depth=depth)

    def terms(self) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """(B, l2, lk), made now if they were deferred."""
        if self._make is not None:
            self._terms, self._make, self.depth = self._make(), None, 0
        return self._terms

    @property
    def B(self) -> torch.Tensor | None:
        return self.terms()[0]

    @property
    def l2(self) -> torch.Tensor:
        return self.terms()[1]

    @property
    def lk(self) -> torch.Tensor:
        return self.terms()[2]

    def maps(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(V, K) (C, H, W): Σ_k B_ck⁴ E[λ_k²], Σ_k B_ck³ Cov(g⁰_k, λ_k)."""
        B, l2, lk = self.terms()
        if B is None:
            return l2, lk
        V = torch.einsum("ck,khw->chw", B**4, l2)
        return V, torch.einsum("ck,khw->chw", B**3, lk)


def activation_coupling(g: Field, df_mean: torch.Tensor, df_z: torch.Tensor, x_var: torch.Tensor) -> Coupling:
    """The source at an activation's input h: E[f'] = ``df_mean``, E[f' z] = ``df_z``, v_h = ``x_var``,
    the gradient G at its output ``g``."""
    slope = df_z / x_var.clamp_min(1e-300).sqrt()  # E[f''] for a smooth f
    return Coupling(None, slope * slope * g.var, df_mean * slope * g.var)


def _gain(c: Coupling) -> torch.Tensor:
    B, l2, _ = c.terms()
    return torch.eye(l2.shape[0], dtype=l2.dtype) if B is None else B


def affine_coupling(c: Coupling | None, a: torch.Tensor) -> Coupling | None:
    """Through x ↦ a_c x + b_c, a (C,): B's rows times a."""
    return None if c is None else Coupling.after(lambda: (_gain(c) * a[:, None], c.l2, c.lk), c)


def pointwise_conv_coupling(c: Coupling | None, W: torch.Tensor) -> Coupling | None:
    """Through a 1 × 1 conv of weight W (Co, Ci): B_in = Wᵀ B_out."""
    return None if c is None else Coupling.after(lambda: (W.T @ _gain(c), c.l2, c.lk), c)


def added_coupling(a: Coupling | None, b: Coupling | None) -> Coupling | None:
    """Two gradients of one tensor, independent: their sources side by side (a missing one: none)."""
    if a is None or b is None:
        return a if b is None else b
    return Coupling.after(lambda: (torch.cat([_gain(a), _gain(b)], 1), torch.cat([a.l2, b.l2]),
                                   torch.cat([a.lk, b.lk])), a, b)  # fmt: skip


def scaled_coupling(c: Coupling | None, k4: float, k3: float) -> Coupling | None:
    """Through y = c x, c random and independent of x (stochastic depth's b/q): g_x = c g_y, Λ_x = c² Λ_y:
    E[λ²] E[c⁴] (``k4``), Cov E[c³] (``k3``)."""
    return None if c is None else Coupling.after(lambda: (c.B, c.l2 * k4, c.lk * k3), c)


def gate_coupling_term(g: Field, x: Field, s1: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
    """The gate's E[(∂L/∂s)²] gain (C,): 2 E[s] Σ Cov(g⁰_p, Λ_q) m_p v_q + E[s²] Σ Cov(Λ_p, Λ_q) v_p v_q,
    Λ's correlation over the positions the gradient's (``g.corr``); 0 without ``g.coupling``."""
    C = x.shape[0]
    if g.coupling is None:
        return torch.zeros(C, dtype=x.var.dtype)
    V, K = g.coupling.maps()
    sg = g.var.clamp_min(1e-300).sqrt()
    sl = V.clamp_min(0).sqrt() * x.var
    cross = (g.corr * xcorr(sg * x.mean, K / sg * x.var)).sum((1, 2))
    own = (g.corr * xcorr(sl, sl)).sum((1, 2))
    # p = q: E[x² (x − m)] = κ₃ + 2 m v and E[(x − m)² x²] = κ₄ + 3v² + 2 m κ₃ + m² v, not m v and v²
    v, m = x.var.clamp_min(0), x.mean
    k3 = 0 if x.skew is None else x.skew * v**1.5
    k4 = 0 if x.kurt is None else x.kurt * v * v
    cross = cross + (K * (k3 + m * v)).sum((1, 2))
    own = own + (V * (k4 + 2 * v * v + 2 * m * k3 + m * m * v)).sum((1, 2))
    return 2 * s1.flatten() * cross + s2.flatten() * own
