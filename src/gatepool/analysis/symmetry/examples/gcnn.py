"""G-CNN on p4m (Cohen & Welling 2016): convolutions with every turned and mirrored copy of each filter.
A lifting layer gives a feature map over the group, ``f(h, x) = [x ⋆ T_h ψ]``, and a group convolution
mixes it, ``f'(h) = Σ_h' f(h') ⋆ T_h ψ(h⁻¹h')``; then ``(g·f)(h) = T_g f(g⁻¹h)`` moves through every layer,
and a mean over the group axis and the image is invariant. Baseline: a plain CNN of the same width.

Test: ``P4M()`` (all 8 elements) with ``Image()`` on the input; the class scores ``Invariant()``, the
last feature map ``GroupImage()`` (turned and mirrored, its group axis permuted). Odd kernels and zero
padding keep the maps exact on a square image.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gatepool.analysis.symmetry import P4M, GroupImage, Image, Invariant, SymmetryReport, check_symmetry

G = P4M().elements()  # h_j, index j = 4·flip + rotation
PRODUCT = torch.tensor([[(a.inverse() * b).index for b in G] for a in G])  # [j, j'] = index of h_j⁻¹ h_j'


class LiftingConv(nn.Module):
    def __init__(self, c_in: int, c_out: int, k: int = 3) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(c_out, c_in, k, k) / (c_in * k * k) ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C_in, H, W)
        w = torch.stack([h.image(self.weight) for h in G], 1)  # (C_out, 8, C_in, k, k): T_h ψ
        out = F.conv2d(x, w.flatten(0, 1), padding=w.shape[-1] // 2)
        return out.unflatten(1, (-1, len(G)))  # (B, C_out, 8, H, W)


class GroupConv(nn.Module):
    def __init__(self, c_in: int, c_out: int, k: int = 3) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(c_out, c_in, len(G), k, k) / (c_in * len(G) * k * k) ** 0.5)

    def forward(self, f: torch.Tensor) -> torch.Tensor:  # (B, C_in, 8, H, W)
        w = torch.stack([h.image(self.weight[:, :, PRODUCT[j]]) for j, h in enumerate(G)], 1)
        out = F.conv2d(f.flatten(1, 2), w.flatten(0, 1).flatten(1, 2), padding=w.shape[-1] // 2)
        return out.unflatten(1, (-1, len(G)))  # (B, C_out, 8, H, W)


class GCNN(nn.Module):
    def __init__(self, c_in: int = 1, width: int = 6, n_classes: int = 3) -> None:
        super().__init__()
        self.lift, self.conv = LiftingConv(c_in, width), GroupConv(width, width)
        self.head = nn.Linear(width, n_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.conv(torch.relu(self.lift(x)))  # (B, width, 8, H, W)
        return self.head(torch.relu(f).mean((2, 3, 4))), f


class CNN(nn.Module):
    """The baseline: the same width, plain convolutions."""

    def __init__(self, c_in: int = 1, width: int = 6, n_classes: int = 3) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(c_in, width, 3, padding=1), nn.Conv2d(width, width, 3, padding=1)
        self.head = nn.Linear(width, n_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.conv2(torch.relu(self.conv1(x)))  # (B, width, H, W)
        return self.head(torch.relu(f).mean((2, 3))), f


def reports(seed: int = 0) -> tuple[list[SymmetryReport], list[SymmetryReport]]:
    """The network's reports (they pass) and the baseline's (they fail)."""
    torch.manual_seed(seed)
    x = torch.randn(2, 1, 9, 9)
    parts = ("scores", "feature map")
    return ([check_symmetry(GCNN(), x, P4M(), Image(), (Invariant(), GroupImage()), seed=seed, parts=parts)],
            [check_symmetry(CNN(), x, P4M(), Image(), (Invariant(), Image()), seed=seed, parts=parts,
                            name="plain CNN")])


if __name__ == "__main__":
    for report in sum(reports(), []):
        print(report)
