"""Attention: the pooling gate with its score split into a query half and a key half.

A soft pooling gate weighs the values of a window by ``softmax(s)``. Give the score two halves,
``s_ij = q_i · k_j`` with ``q_i = W_Q x_i`` and ``k_j = W_K x_j``, let j run over every position instead
of a window, and divide by √d so that the scores keep unit variance (for unit-variance entries
``Var(q · k) = d``) and the gate stays soft:

    G = softmax(Q Kᵀ / √d)          (N, M)   one gate row per query, summing to 1
    P = G V                          (N, Dv)  each output is a gated average of the values

Shapes, masks and arguments follow ``torch.nn.functional.scaled_dot_product_attention`` (same signature,
plus ``return_weights``): the batch dims (all but the last two) of q, k and v broadcast, as in ``q @ kᵀ``
and ``G @ v`` (q (4, 3, 8) with k, v (4, 4, 6, 8) gives (4, 4, 3, 8)); ``enable_gqa`` lets k and v have
fewer heads (dim -3) than q, a divisor of q's, each serving a group of query heads. Every bool mask here
has one polarity, **True = takes part**:

* a bool ``attn_mask`` says which (query, key) pairs take part (True = attend);
* a float ``attn_mask`` (of q's dtype) is added to the scores (``-inf`` removes a pair);
* both broadcast to the scores' shape (..., N, M), the batch dims of q and k broadcast;
* ``key_mask`` (``MultiHeadAttention``) says which keys take part (True = a real key). It is *not*
  ``nn.MultiheadAttention``'s ``key_padding_mask``, whose True means "padding, ignore": pass
  ``key_mask=~key_padding_mask``;
* ``is_causal=True`` keeps key j for query i only when ``j <= i`` (top-left aligned: ``tril`` of an
  (N, M) block of ones, as torch); unlike torch, which raises, it may be combined with ``attn_mask``
  (both must allow a pair).

A query row whose keys are all masked has no gate to normalise: it gets a zero output and zero weights
(and zero gradients), never NaN, on both paths. torch >= 2.5 does the same on the CPU (its math and
flash kernels, checked with torch 2.13); older versions return NaN there, which the fast path guards.

``scaled_dot_product_attention`` calls torch's fused kernel when the weights are not asked for (the fast
path, memory O(N + M) per row on kernels that tile) and the plain, explicit computation when they are
(``return_weights=True``: the full (N, M) gate is materialised). Both take the same arguments and check
them the same way first, so a bad argument is a ValueError naming it on either path. ``MultiHeadAttention``
runs H of these side by side on ``dim / H``-wide slices and mixes the heads with an output projection.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.utils.checks import check_number

__all__ = ["MultiHeadAttention", "scaled_dot_product_attention"]


def _shapes(*named: tuple[str, torch.Tensor]) -> str:
    return ", ".join(f"{name} {tuple(t.shape)}" for name, t in named)


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enable_gqa: bool) -> None:
    low, dims = (3, "(..., heads, length, features)") if enable_gqa else (2, "(..., length, features)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim < low:
            gqa = " with enable_gqa" if enable_gqa else ""
            raise ValueError(f"{name} must have at least {low} dims {dims}{gqa}, got {tuple(t.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k and v must have the same dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the feature size, got {_shapes(('q', q), ('k', k))}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same length, got {_shapes(('k', k), ('v', v))}")


def _group_heads(t: torch.Tensor, heads: int, name: str) -> torch.Tensor:
    """``t`` with each of its heads (dim -3) repeated for its group of ``heads`` query heads (as torch)."""
    h = t.shape[-3]
    if h == heads:
        return t
    if h == 0 or heads % h:
        raise ValueError(f"with enable_gqa, {name}'s {h} heads (dim -3) must divide q's {heads}")
    return t.repeat_interleave(heads // h, dim=-3)


def _scores_shape(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, ...]:
    """(..., N, M), the batch dims of q and k broadcast; a ValueError unless v's broadcast with them too."""
    batch = q.shape[:-2]
    if not batch == k.shape[:-2] == v.shape[:-2]:  # torch.broadcast_shapes costs ~20 µs: only when needed
        try:
            batch = torch.broadcast_shapes(batch, k.shape[:-2])
            torch.broadcast_shapes(batch, v.shape[:-2])
        except RuntimeError:
            raise ValueError(
                f"the batch dims (all but the last two) of q, k and v must broadcast, got "
                f"{_shapes(('q', q), ('k', k), ('v', v))}"
            ) from None
    return (*batch, q.shape[-2], k.shape[-2])


def _check_mask(attn_mask: torch.Tensor, scores_shape: tuple[int, ...], dtype: torch.dtype | None) -> None:
    """A bool mask, or a float one (of ``dtype`` if given), that broadcasts to ``scores_shape``."""
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    added = attn_mask.is_floating_point() and dtype in (None, attn_mask.dtype)
    if attn_mask.dtype != torch.bool and not added:
        floats = "floating" if dtype is None else f"of q's dtype {dtype}"
        raise ValueError(f"attn_mask must be bool (True = attend) or {floats} (added), got {attn_mask.dtype}")
    fits = attn_mask.shape == scores_shape[len(scores_shape) - attn_mask.ndim :]  # the trailing dims as such
    if not fits:  # torch.broadcast_shapes costs ~12 µs: only when needed
        try:  # the scores take the mask in place: it may not add dims or grow one
            fits = torch.broadcast_shapes(attn_mask.shape, scores_shape) == scores_shape
        except RuntimeError:
            pass
    if not fits:
        raise ValueError(
            f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to the scores' shape "
            f"{tuple(scores_shape)} (..., queries, keys)"
        )


def _causal_mask(n: int, m: int, device: torch.device) -> torch.Tensor:
    """(n, m) bool, True where key j may be seen by query i: ``j <= i`` (top-left aligned, as torch)."""
    return torch.ones(n, m, dtype=torch.bool, device=device).tril()


def _merge_masks(attn_mask: torch.Tensor | None, causal: torch.Tensor) -> torch.Tensor:
    if attn_mask is None:
        return causal
    if attn_mask.dtype == torch.bool:
        return attn_mask & causal
    return attn_mask.masked_fill(~causal, float("-inf"))


def _dead_rows(attn_mask: torch.Tensor) -> torch.Tensor:
    """(..., N, 1) bool: query rows in which the mask lets no key take part."""
    if attn_mask.dtype == torch.bool:
        return ~attn_mask.any(dim=-1, keepdim=True)
    return torch.isneginf(attn_mask).all(dim=-1, keepdim=True)


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
    return_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``softmax(q kᵀ · scale + mask) v`` with torch's shapes and mask semantics (and its signature).

    Args:
        q: (..., N, E) queries.  k: (..., M, E) keys.  v: (..., M, Ev) values; the batch dims broadcast.
        attn_mask: bool (True = attend) or float of q's dtype (added to the scores), broadcastable to
            (..., N, M), the batch dims of q and k broadcast.
        dropout_p: dropout on the gate weights, in [0, 1] (pass 0.0 in eval mode, as with torch).
        is_causal: keep key j for query i only when j <= i; may be combined with ``attn_mask``.
        scale: score scale, any finite number, default ``1/√E``.
        enable_gqa: k and v may have fewer heads (dim -3) than q, a divisor of q's: key/value head h
            serves query heads ``h·g .. h·g + g - 1`` (g = q's heads / theirs), as torch.
        return_weights: also return the gate weights (..., N, M) (after dropout, as applied).

    Returns:
        (..., N, Ev) output, or ``(output, weights)`` when ``return_weights``. Rows whose keys are all
        masked give zeros in both.
    """
    _check_qkv(q, k, v, enable_gqa)
    if enable_gqa:  # torch's rule, written out so that both paths share it (and torch 2.4 has no flag)
        k, v = _group_heads(k, q.shape[-3], "k"), _group_heads(v, q.shape[-3], "v")
    scores_shape = _scores_shape(q, k, v)
    if attn_mask is not None:
        _check_mask(attn_mask, scores_shape, q.dtype)
    check_number(scale, "scale", optional=True)
    check_number(dropout_p, "dropout_p", 0, 1)
    n, m = scores_shape[-2:]
    if is_causal and attn_mask is not None:  # fold the causal rule into the mask
        attn_mask, is_causal = _merge_masks(attn_mask, _causal_mask(n, m, q.device)), False

    if not return_weights:  # fast path: torch's fused kernel
        if attn_mask is None:
            return F.scaled_dot_product_attention(q, k, v, None, dropout_p, is_causal, scale=scale)
        # Rows with no key left: give torch a harmless row (older versions return NaN there) and zero
        # the result, so output and gradients are 0 on every torch version.
        dead = _dead_rows(attn_mask)  # (..., N, 1)
        safe = attn_mask | dead if attn_mask.dtype == torch.bool else attn_mask.masked_fill(dead, 0.0)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=safe, dropout_p=dropout_p, scale=scale)
        return out.masked_fill(dead, 0.0)

    # plain path: the gate made explicit
    scale = 1.0 / math.sqrt(max(q.shape[-1], 1)) if scale is None else scale  # E = 0: scores 0, any scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., N, M)
    if is_causal:
        attn_mask = _causal_mask(n, m, q.device)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    dead = torch.isneginf(scores).all(dim=-1, keepdim=True)  # (..., N, 1)
    weights = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)  # (..., N, M)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v, weights  # (..., N, Ev), (..., N, M)


class MultiHeadAttention(nn.Module):
    """H heads of scaled dot-product attention side by side, then an output projection.

    ``head_i = softmax(Q_i K_iᵀ / √d_h) V_i``, ``out = concat(head_1..head_H) W_O``, with
    ``Q = x W_Q`` and ``K, V = c W_K, c W_V`` where c = x (self-attention) or the context
    (cross-attention: the output has the queries' length and mixes the context's values).

    Args:
        dim: features of x (and of the output).
        num_heads: H; ``dim`` must be divisible by H unless ``head_dim`` is given.
        context_dim: features of the context (default ``dim``).
        head_dim: d_h, features per head (default ``dim // num_heads``).
        qkv_bias: biases on W_Q, W_K, W_V (the output projection always has one).
        dropout: dropout on the gate weights during training.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        context_dim: int | None = None,
        head_dim: int | None = None,
        qkv_bias: bool = False,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if not isinstance(dim, int) or dim <= 0:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if not isinstance(num_heads, int) or num_heads <= 0:
            raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
        if head_dim is None:
            if dim % num_heads != 0:
                raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads} (or give head_dim)")
            head_dim = dim // num_heads
        if not isinstance(head_dim, int) or head_dim <= 0:
            raise ValueError(f"head_dim must be a positive int, got {head_dim!r}")
        context_dim = dim if context_dim is None else context_dim
        if not isinstance(context_dim, int) or context_dim <= 0:
            raise ValueError(f"context_dim must be a positive int, got {context_dim!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.dim, self.num_heads, self.head_dim, self.context_dim = dim, num_heads, head_dim, context_dim
        self.dropout = dropout
        inner = num_heads * head_dim
        self.to_q = nn.Linear(dim, inner, bias=qkv_bias)
        self.to_k = nn.Linear(context_dim, inner, bias=qkv_bias)
        self.to_v = nn.Linear(context_dim, inner, bias=qkv_bias)
        self.to_out = nn.Linear(inner, dim)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, head_dim={self.head_dim}, dropout={self.dropout}"

    def _split(self, t: torch.Tensor) -> torch.Tensor:  # (B, T, H·d) -> (B, H, T, d)
        b, n, _ = t.shape
        return t.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        return_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend from x (B, N, dim) to itself or to ``context`` (B, M, context_dim).

        Args:
            attn_mask: (N, M), (B, N, M) or (B, H, N, M); bool True = attend, float = added to scores.
            key_mask: (B, M) bool, **True = a real key** that takes part, False = padding (ignored);
                the opposite of ``nn.MultiheadAttention``'s ``key_padding_mask``.
            is_causal: query i sees keys j <= i only.
            return_weights: also return the gates (B, H, N, M).

        Returns:
            (B, N, dim), or ``(out, weights)``.
        """
        if x.ndim != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (B, N, {self.dim}), got {tuple(x.shape)}")
        b = x.shape[0]
        c = x if context is None else context
        if context is not None and (c.ndim != 3 or c.shape[0] != b or c.shape[-1] != self.context_dim):
            raise ValueError(
                f"context must have shape ({x.shape[0]}, M, {self.context_dim}), got {tuple(c.shape)}"
            )
        n, m = x.shape[1], c.shape[1]
        mask = attn_mask
        if mask is not None:
            if not isinstance(mask, torch.Tensor) or mask.ndim not in (2, 3, 4):
                shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
                raise ValueError(f"attn_mask must be (N, M), (B, N, M) or (B, H, N, M), got {shape}")
            if mask.ndim == 3:
                mask = mask.unsqueeze(1)  # (B, 1, N, M): the same mask for every head
            _check_mask(mask, (b, self.num_heads, n, m), None)
        if key_mask is not None:
            if not isinstance(key_mask, torch.Tensor):
                raise TypeError(f"key_mask must be a torch.Tensor or None, got {type(key_mask).__name__}")
            if key_mask.dtype != torch.bool or tuple(key_mask.shape) != (b, m):
                raise ValueError(
                    f"key_mask must be a bool tensor of shape ({b}, {m}) with True = a real key, "
                    f"got {key_mask.dtype} {tuple(key_mask.shape)}"
                )
            keep = key_mask[:, None, None, :]  # (B, 1, 1, M)
            if mask is None:
                mask = keep
            elif mask.dtype == torch.bool:
                mask = mask & keep
            else:
                mask = mask.masked_fill(~keep, float("-inf"))

        q = self._split(self.to_q(x))  # (B, H, N, d)
        k = self._split(self.to_k(c))  # (B, H, M, d)
        v = self._split(self.to_v(c))  # (B, H, M, d)
        if mask is not None and mask.is_floating_point():
            mask = mask.to(q.dtype)  # a float mask takes the scores' dtype, as autocast does for torch's
        p = self.dropout if self.training else 0.0
        res = scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, dropout_p=p, return_weights=return_weights
        )
        out, weights = res if return_weights else (res, None)
        out = self.to_out(out.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim))  # (B, N, dim)
        return (out, weights) if return_weights else out
