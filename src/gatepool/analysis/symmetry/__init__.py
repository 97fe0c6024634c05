"""Symmetry tester: is f equivariant or invariant to a transform T?

    equivariant:  f(T x) = T' f(x)     (T' = T unless given: the output moves with the input)
    invariant:    f(T x) = f(x)

Examples from the lecture: self-attention without positions is permutation-equivariant
(``attn(π X) = π attn(X)``: every score ``q_i · k_j`` depends on contents only), a mean over tokens then
makes it invariant, and a positional encoding breaks both; a convolution with circular padding is
equivariant to cyclic shifts of the image.

Transforms (each is a callable with ``.inverse()``): :class:`PermuteTokens`, :class:`CyclicShift`,
:class:`Rotate90`, :class:`Flip`, and :class:`Compose` to chain them. The error functions run ``fn``
under ``torch.no_grad()`` and return the largest absolute difference (a float); models should be in eval
mode (dropout would make f random). When ``fn`` returns a tuple, a list or a dict, ``output=`` picks the
part to compare (an index, a key, or a callable applied to the whole output); a tensor result takes
no index or key.
"""

from __future__ import annotations

from .tester import (
    assert_equivariant,
    assert_invariant,
    default_tolerance,
    equivariance_error,
    invariance_error,
)
from .transforms import Compose, CyclicShift, Flip, PermuteTokens, Rotate90, Transform

__all__ = [
    "Compose",
    "CyclicShift",
    "Flip",
    "PermuteTokens",
    "Rotate90",
    "Transform",
    "assert_equivariant",
    "assert_invariant",
    "default_tolerance",
    "equivariance_error",
    "invariance_error",
]
