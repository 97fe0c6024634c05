"""A strip of digits to caption: up to k MNIST digits in k side-by-side 28×28 slots, read left to right.

    canvas   (1, 28, 28·k) float, background 0, ink up to 1
    n        1..k digits, in n slots chosen at random (order kept), the other slots empty
    caption  the digits' names left to right: "three one four"

Drawn from a ``torch.Generator``: the same seed gives the same strips. Pixels are ``image / 255`` (the
[0, 1] range; no dataset normalization: the canvas is mostly empty).
"""

from __future__ import annotations

import torch

from gatepool.utils.checks import check_int

__all__ = ["DIGIT", "make_strips"]

DIGIT = 28


def make_strips(images: torch.Tensor, labels: torch.Tensor, n: int, slots: int = 3,
                generator: torch.Generator | None = None
                ) -> tuple[torch.Tensor, list[list[int]]]:  # fmt: skip
    """``n`` strips from the digit images (N, 28, 28) uint8 and their labels (N,).

    Returns canvases (n, 1, 28, 28·slots) float32 in [0, 1] and, per canvas, its digits left to right.
    """
    check_int(n, "n", 1)
    check_int(slots, "slots", 1)
    if images.ndim != 3 or tuple(images.shape[1:]) != (DIGIT, DIGIT) or labels.shape != images.shape[:1]:
        raise ValueError(f"images must be (N, 28, 28) with labels (N,), got {tuple(images.shape)} and "
                         f"{tuple(labels.shape)}")  # fmt: skip
    counts = torch.randint(1, slots + 1, (n,), generator=generator)  # (n,)
    order = torch.rand(n, slots, generator=generator).argsort(dim=1)  # a random permutation of the slots
    picks = torch.randint(0, images.shape[0], (n, slots), generator=generator)
    canvas = torch.zeros(n, 1, DIGIT, DIGIT * slots)
    digits = []
    for i in range(n):
        used = order[i, : counts[i]].sort().values.tolist()  # the filled slots, left to right
        row = []
        for j, slot in enumerate(used):
            k = picks[i, j]
            canvas[i, 0, :, slot * DIGIT:(slot + 1) * DIGIT] = images[k].float() / 255.0
            row.append(int(labels[k]))
        digits.append(row)
    return canvas, digits
