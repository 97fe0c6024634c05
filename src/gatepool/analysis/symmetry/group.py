"""A group to test against, and the rules by which its elements act on the parts of a model's input and
output.

A *group* hands the tester the elements to try: :meth:`Group.draw` gives ``trials`` random ones for an
infinite group (rotations drawn uniformly, permutations, translations) and every element but the identity
for a finite one (p4m's 8, the octahedron's 24 or 48). A *rule* says how one element g acts on one tensor:
``rule(g, x) → g·x``. Each part of a model's input and output has its own rule, as e3nn gives each
argument its irreps: a node permutation acts on node features along one axis and on an adjacency along
both, a rotation turns positions and leaves scalar features alone (:class:`Invariant`). A rule is any
callable ``(g, x) → tensor``; the built-in ones check that g comes from a group they know.
"""

from __future__ import annotations

from typing import Any

import torch


class Group:
    """Elements to test f against: random ones (``sample``) or, for a finite group, all of them
    (``elements``, the identity first)."""

    def sample(self, generator: torch.Generator) -> Any:
        raise NotImplementedError

    def elements(self) -> list | None:
        """Every element, the identity first; None for an infinite group."""
        return None

    def draw(self, trials: int, generator: torch.Generator) -> list:
        """What the tester tries: every element but the identity for a finite group, else ``trials``
        random ones."""
        every = self.elements()
        if every is not None:
            return every[1:]
        if not isinstance(trials, int) or trials < 1:
            raise ValueError(f"trials must be an int >= 1, got {trials!r}")
        return [self.sample(generator) for _ in range(trials)]


class Invariant:
    """The rule of a part that does not move: scalar features under a rotation, an energy, a class score.
    ``Invariant()(g, x) = x`` for every g."""

    def __call__(self, g: Any, x: torch.Tensor) -> torch.Tensor:
        return x

    def __repr__(self) -> str:
        return "Invariant()"


def expect_element(rule: object, g: Any, kind: type, group: str) -> None:
    """Raise TypeError unless ``g`` is a ``kind`` (the rules of one group refuse another group's elements)."""
    if not isinstance(g, kind):
        raise TypeError(f"{rule!r} acts by elements of {group}, got {type(g).__name__}")
