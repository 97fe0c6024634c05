"""A module that hands back its input tensor itself (``m(x) is x``: an ``nn.Identity``, a dropout at
p = 0): a hook on its output is a hook on that tensor, whose gradient is every user's summed. Where the
tensor also feeds a shortcut (MobileNetV4's ``dw_start`` at the head of its branch), the row's gradient
is the shortcut's and the branch's together, not the branch's alone. Against the measurement."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from test_probe_correlated import DT, assert_walk_holds


class _Branched(nn.Module):
    """A stem, then x + conv(ReLU(BN(conv(start(x))))) with ``start`` an ``nn.Identity`` or a dropout at
    p = 0 (the branch's own head, as timm's ``UniversalInvertedResidual``), then a pooled head."""

    def __init__(self, start: nn.Module, width: int = 6) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU())
        self.start = start
        self.branch = nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                                    nn.Conv2d(width, width, 3, padding=1))  # fmt: skip
        self.head = nn.Linear(width, 5)

    def forward(self, x):
        x = self.stem(x)  # (B, C, H, W)
        x = x + self.branch(self.start(x))
        return self.head(x.mean((2, 3)))  # (B, 5)


@pytest.mark.parametrize("start", [nn.Identity, lambda: nn.Dropout(0.0)], ids=["identity", "dropout0"])
def test_a_module_returning_its_input_has_the_tensors_gradient(start):
    """The start's row: its forward the stem's, its gradient the stem's output's (the branch's and the
    shortcut's summed; the branch's alone is 0.18 of the measurement)."""
    torch.manual_seed(0)
    model = _Branched(start()).double()
    x = torch.randn(1024, 3, 8, 8, generator=torch.Generator().manual_seed(1), dtype=DT)
    pred = assert_walk_holds(model, x, ["stem.2", "start", "branch.0"])
    assert pred["start"].grad_e2 == pred["stem.2"].grad_e2
