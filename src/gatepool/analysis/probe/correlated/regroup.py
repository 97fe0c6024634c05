"""A map's elements regrouped by reshapes and transposes (MobileViT's unfold into patches' tokens and its
fold back): the field kept as it is, a (C, H, W) map, and the tensor's layout an index of its elements.

index     the tensor at batch 1 (its shape as the trace computed it, the batch taken as 1) holding, at each
          element, the flat c·H·W + p of the map's element it is: ``arange(C·H·W).reshape(1, C, H, W)``
          moved by the same reshapes and transposes as the tensor. Exact on the state: no value moves, only
          its place in the tensor; the batch is the outermost factor of the first dim (a reshape keeps it
          so; a transpose of the first dim is refused by the walk)
channels  a dim is the channels' ("C") where the index along it is c·H·W plus one position; a step over
          that dim (a Linear, a LayerNorm) is the field's step over its channels at each position, and a
          step that changes their count changes the index's channels (:meth:`Regrouped.with_channels`)
cells     of a (R, T, C) tensor (rows, tokens, channels: an attention's batch, tokens and features; or
          (..., T, C), the dims before the tokens' the rows) the positions of each row: row r attends
          within the map's positions index[r, :, 0] mod H·W (MobileViT: a row per in-patch offset (i, j)
          and sample, its tokens the sub-lattice (i + p_h a, j + p_w b) of the patches; MaxViT's
          (B, G, P, C): a row per window, or per offset of its grid); each position's token, its index
          along T
back      an index that is the map's own (``arange(C·H·W)`` as (1, C, H, W), or its channels-last
          (1, H, W, C)) is that layout again
"""

from __future__ import annotations

import torch

_CHW, _HWC = ("C", "H", "W"), ("H", "W", "C")


def _names(index: torch.Tensor, chw: tuple[int, int, int]) -> tuple[str, ...]:
    """The names of ``index``'s dims after the first: "C" where it runs over the channels, "P1", "P2" …
    (positions and channels mixed, or positions alone) elsewhere."""
    C, H, W = chw
    HW = H * W
    names = []
    for d in range(1, index.ndim):
        ch, pos = index // HW, index % HW
        along = torch.arange(index.shape[d]).reshape([-1 if e == d else 1 for e in range(index.ndim)])
        first = pos.narrow(d, 0, 1)
        is_c = index.shape[d] == C and bool((ch == along).all()) and bool((pos == first).all())
        names.append("C" if is_c else f"P{d}")
    return tuple(names)


class Regrouped(tuple):
    """The names of a regrouped tensor's dims after its first (``Regrouped[-1] == "C"``: channels
    last), and its :attr:`where` (the index) on the field of shape :attr:`chw`. Two are equal where
    their indices are."""

    where: torch.Tensor
    chw: tuple[int, int, int]

    def __new__(cls, index: torch.Tensor, chw) -> Regrouped:
        chw = tuple(int(v) for v in chw)
        if index.numel() != chw[0] * chw[1] * chw[2]:
            raise ValueError(f"an index of {index.numel()} elements on a {chw} field")
        self = super().__new__(cls, _names(index, chw))
        self.where, self.chw = index, chw
        return self

    def __eq__(self, other) -> bool:
        if not isinstance(other, Regrouped) or self.chw != other.chw:
            return False
        return self.where.shape == other.where.shape and bool((self.where == other.where).all())

    def __ne__(self, other) -> bool:
        return not self == other

    __hash__ = tuple.__hash__

    def with_channels(self, C: int) -> Regrouped:
        """The same positions at each element, ``C`` channels along the channels' dim (a Linear's output)."""
        if "C" not in self:
            raise NotImplementedError("a step that changes the channels of a regrouped map whose channels "
                                      "are not one of its dims")  # fmt: skip
        d = tuple.index(self, "C") + 1  # the dim of the whole index (its first is the batch's)
        _, H, W = self.chw
        pos = (self.where % (H * W)).narrow(d, 0, 1)
        c = torch.arange(C).reshape([-1 if e == d else 1 for e in range(pos.ndim)])
        return Regrouped(c * (H * W) + pos, (C, H, W))

    def cells(self) -> torch.Tensor:
        """(H·W,): the row of a (..., T, C) tensor (its dims before the tokens' one flattened) that each
        position of the map is in."""
        return self.cells_and_tokens()[0]

    def cells_and_tokens(self, token_dims: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """(H·W,) each: the row of a (..., T, C) tensor each position is in (:meth:`cells`), and its index
        along the tokens' dim (its row's token); ``token_dims`` dims before the channels' the tokens'
        (timm's MaxViT: (N, h, w, C), a window's h·w tokens, flattened row by row)."""
        if self.where.ndim < 2 + token_dims or self[-1] != "C":
            raise NotImplementedError(f"attention over a regrouped map of dims {tuple(self)}: (rows, "
                                      "tokens, channels) only")  # fmt: skip
        _, H, W = self.chw
        T = self.where.shape[-1 - token_dims : -1].numel()
        pos = self.where[..., 0].reshape(-1, T) % (H * W)  # (R, T)
        R = pos.shape[0]
        cell, token = torch.empty(H * W, dtype=torch.long), torch.empty(H * W, dtype=torch.long)
        cell[pos.flatten()] = torch.arange(R).repeat_interleave(T)
        token[pos.flatten()] = torch.arange(T).repeat(R)
        return cell, token


def regrouped(index: torch.Tensor, chw) -> tuple:
    """The layout of a tensor whose elements are ``index`` (at batch 1) on a ``chw`` field: the map's own
    (channels first or last) where the index is, else :class:`Regrouped`."""
    C, H, W = chw
    flat = torch.arange(C * H * W).reshape(C, H, W)
    if index.shape == (1, C, H, W) and bool((index[0] == flat).all()):
        return _CHW
    if index.shape == (1, H, W, C) and bool((index[0] == flat.permute(1, 2, 0)).all()):
        return _HWC
    return Regrouped(index, chw)


def map_index(chw) -> torch.Tensor:
    """The index of the (1, C, H, W) map itself."""
    C, H, W = chw
    return torch.arange(C * H * W).reshape(1, C, H, W)
