"""Symmetry tester: is f equivariant or invariant to a group's action?

    equivariant:  f(g·x) = g·f(x)     (the output moves with the input)
    invariant:    f(g·x) = f(x)

Two levels. For one tensor in and one out, a :class:`Transform` (:class:`PermuteTokens`,
:class:`CyclicShift`, :class:`Rotate90`, :class:`Flip`, :class:`Compose`) and
:func:`equivariance_error` / :func:`assert_equivariant` (``tester.py``): e.g. self-attention without
positions is permutation-equivariant (``attn(π X) = π attn(X)``: every score ``q_i · k_j`` depends on
contents only), a mean over tokens then makes it invariant, a positional encoding breaks both; a
convolution with circular padding is equivariant to cyclic shifts.

For models with several inputs and outputs, :func:`check_symmetry` (``check.py``) draws elements of a
group and gives each part its own rule (as e3nn gives each argument its irreps), in float32 and float64,
and returns a :class:`SymmetryReport`. The groups of the course's Project 2, one file each:

    permutation.py   Permutations(n): Permuted(dims) (features, both axes of an adjacency), Relabeled
    timeshift.py     TimeShifts(shifts): Delayed(dim, fill) (an RNN: the error as a function of the shift)
    euclidean.py     E3(rotation, reflection, translation): Positions, Vectors; rand_matrix (Haar)
    p4m.py           P4M(reflections): Image (H, W), GroupImage (a G-CNN's group axis too)
    sphere.py        Octahedral(reflections): SphereSignal on octahedral_grid() (exact rotations)
    group.py         Group, Invariant (a part that does not move)

and beside them :func:`conservation_check` (``conservation.py``): integrate a learned vector field (RK4 or
leapfrog, fixed step) and report the drift of a quantity along the trajectory. Worked examples, one small
network per entry of the course's list with a baseline that fails, are in ``examples/``.
"""

from __future__ import annotations

from .check import Row, SymmetryReport, check_symmetry
from .conservation import ConservationReport, DriftRow, conservation_check, integrate
from .euclidean import E3, EuclideanElement, Positions, Vectors, quaternion_to_matrix, rand_matrix
from .group import Group, Invariant
from .p4m import P4M, GroupImage, Image, P4MElement
from .permutation import Permutation, Permutations, Permuted, Relabeled
from .sphere import Octahedral, SphereSignal, octahedral_grid
from .tester import (
    assert_equivariant,
    assert_invariant,
    default_tolerance,
    equivariance_error,
    invariance_error,
)
from .timeshift import Delayed, Shift, TimeShifts
from .transforms import Compose, CyclicShift, Flip, PermuteTokens, Rotate90, Transform

__all__ = [
    "E3",
    "P4M",
    "Compose",
    "ConservationReport",
    "CyclicShift",
    "Delayed",
    "DriftRow",
    "EuclideanElement",
    "Flip",
    "Group",
    "GroupImage",
    "Image",
    "Invariant",
    "Octahedral",
    "P4MElement",
    "Permutation",
    "Permutations",
    "PermuteTokens",
    "Permuted",
    "Positions",
    "Relabeled",
    "Rotate90",
    "Row",
    "Shift",
    "SphereSignal",
    "SymmetryReport",
    "TimeShifts",
    "Transform",
    "Vectors",
    "assert_equivariant",
    "assert_invariant",
    "check_symmetry",
    "conservation_check",
    "default_tolerance",
    "equivariance_error",
    "integrate",
    "invariance_error",
    "octahedral_grid",
    "quaternion_to_matrix",
    "rand_matrix",
]
