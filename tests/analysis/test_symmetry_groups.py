"""The groups, their rules, the multi-part tester and the conservation check: each rule is an action of its
group (``g·(h·x) = (gh)·x``), does what its docstring says, and the tester tells a symmetric function from
one that is not, part by part and in both dtypes."""

from __future__ import annotations

import itertools

import pytest
import torch

from gatepool.analysis.symmetry import (
    E3,
    P4M,
    Delayed,
    EuclideanElement,
    GroupImage,
    Image,
    Invariant,
    Octahedral,
    P4MElement,
    Permutations,
    Permuted,
    Positions,
    Relabeled,
    SphereSignal,
    TimeShifts,
    Vectors,
    check_symmetry,
    conservation_check,
    integrate,
    octahedral_grid,
    rand_matrix,
)
from gatepool.utils.threads import num_threads

GEN = lambda seed=0: torch.Generator().manual_seed(seed)  # noqa: E731


@pytest.fixture(autouse=True)
def one_thread():
    with num_threads(1):  # tiny tensors: one thread is fastest, and a busy machine does not stall it
        yield


def test_rand_matrix_is_a_uniform_rotation():
    R = rand_matrix(20000, generator=GEN())
    torch.testing.assert_close(R @ R.transpose(-1, -2), torch.eye(3, dtype=R.dtype).expand_as(R))
    torch.testing.assert_close(torch.linalg.det(R), torch.ones(20000, dtype=R.dtype))
    # Haar: E[R] = 0, E[R_ij²] = 1/3, and the angle θ has density (1 − cos θ)/π, so E[cos θ] = −1/2 · ... :
    # E[trace] = E[1 + 2 cos θ] = 0
    assert R.mean(0).abs().max() < 0.02
    assert ((R**2).mean(0) - 1 / 3).abs().max() < 0.01
    assert R.diagonal(dim1=-2, dim2=-1).sum(-1).mean().abs() < 0.03
    assert rand_matrix(2, 5).shape == (2, 5, 3, 3)


def test_e3_draws_reflections_every_second_and_its_subgroups():
    els = E3().draw(6, GEN())
    dets = [round(torch.linalg.det(g.R).item()) for g in els]
    assert dets == [1, -1, 1, -1, 1, -1]
    assert all(g.t.abs().max() > 0 for g in els)
    so3 = E3(reflection=False, translation=False).draw(4, GEN())
    assert all(torch.linalg.det(g.R) > 0 and g.t.abs().max() == 0 for g in so3)
    shifts = E3(rotation=False, reflection=False).draw(3, GEN())
    assert all(torch.equal(g.R, torch.eye(3, dtype=torch.float64)) for g in shifts)
    # the same seed, the same elements (the tester uses the same ones in every dtype)
    assert all(torch.equal(a.R, b.R) for a, b in zip(E3().draw(4, GEN(3)), E3().draw(4, GEN(3))))
    with pytest.raises(ValueError, match="rotation or translation"):
        E3(rotation=False, translation=False)
    coins = [E3(translation=False).sample(GEN(k)) for k in range(8)]  # sample: a fair coin for the reflection
    assert {round(torch.linalg.det(g.R).item()) for g in coins} == {1, -1}


def test_positions_move_vectors_only_turn():
    g = E3().draw(1, GEN())[0]
    x = torch.randn(5, 3, dtype=torch.float64)
    torch.testing.assert_close(Positions()(g, x), x @ g.R.T + g.t)
    torch.testing.assert_close(Vectors()(g, x), x @ g.R.T)
    # coordinates along another axis: (B, 3, N) as PointNet holds them
    torch.testing.assert_close(Positions(dim=1)(g, x.T[None]), (x @ g.R.T + g.t).T[None])
    # distances are invariant, differences turn
    y = Positions()(g, x)
    torch.testing.assert_close(torch.cdist(y, y), torch.cdist(x, x))
    torch.testing.assert_close(y[0] - y[1], Vectors()(g, x[0] - x[1]))
    with pytest.raises(ValueError, match="3 coordinates"):
        Positions()(g, torch.randn(5, 2))
    with pytest.raises(TypeError, match="E3"):
        Positions()(P4MElement(1), x)


def test_permuted_and_relabeled_agree_on_a_graph():
    n = 6
    g = Permutations(n).draw(1, GEN())[0]
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 0], [1, 2, 3, 4, 5, 0, 3]])
    adj = torch.zeros(n, n)
    adj[edge_index[0], edge_index[1]] = 1
    new = Relabeled()(g, edge_index)
    adj_new = torch.zeros(n, n)
    adj_new[new[0], new[1]] = 1
    assert torch.equal(adj_new, Permuted((0, 1))(g, adj))
    P = torch.eye(n)[g.perm]  # new item i is old item perm[i]: rows of the identity
    assert torch.equal(Permuted((0, 1))(g, adj), P @ adj @ P.T)
    x = torch.randn(2, n, 4)
    assert torch.equal(Permuted(1)(g, x), x[:, g.perm])
    assert torch.equal(Permuted(1)(g.inverse(), Permuted(1)(g, x)), x)
    with pytest.raises(ValueError, match="axis"):
        Permuted(1)(g, torch.randn(2, n + 1))
    with pytest.raises(TypeError, match="integer"):
        Relabeled()(g, edge_index.float())
    with pytest.raises(ValueError, match="n must be"):
        Permutations(1)


def test_delayed():
    x = torch.arange(1.0, 7.0).reshape(1, 6, 1)
    y = Delayed(dim=1)(TimeShifts((2,)).elements()[1], x)
    assert y.flatten().tolist() == [0, 0, 1, 2, 3, 4]
    y = Delayed(dim=1, fill=float("nan"))(TimeShifts((2,)).elements()[1], x)
    assert torch.isnan(y[0, :2]).all()
    with pytest.raises(ValueError, match="shorter"):
        Delayed(dim=1)(TimeShifts((6,)).elements()[1], x)
    with pytest.raises(ValueError, match="shifts"):
        TimeShifts((0, 1))


def test_p4m_rules_are_actions():
    p4m = P4M().elements()
    assert len(p4m) == 8 and p4m[0] == P4MElement(0, 0) and len(P4M(reflections=False).elements()) == 4
    img = torch.randn(2, 5, 5)
    fmap = torch.randn(2, 3, 8, 5, 5)  # (B, C, |G|, H, W)
    for g, h in itertools.product(p4m, p4m):
        assert torch.equal(Image()(g * h, img), Image()(g, Image()(h, img)))
        assert torch.equal(GroupImage()(g * h, fmap), GroupImage()(g, GroupImage()(h, fmap)))
        assert g * g.inverse() == P4MElement()
    # the mirror is along the width, the turn counter-clockwise (as torch.rot90)
    x = torch.arange(9.0).reshape(3, 3)
    assert torch.equal(Image()(P4MElement(0, 1), x), x.flip(-1))
    assert torch.equal(Image()(P4MElement(1, 0), x), torch.rot90(x))
    with pytest.raises(ValueError, match="p4 4"):
        GroupImage()(P4MElement(0, 1), torch.randn(1, 4, 5, 5))
    with pytest.raises(ValueError, match="flip"):
        P4MElement(0, 2)
    with pytest.raises(ValueError, match="square"):
        Image()(P4MElement(1), torch.randn(4, 5))


def test_octahedral_group_and_grid():
    rot, full = Octahedral().elements(), Octahedral(reflections=True).elements()
    assert len(rot) == 24 and len(full) == 48
    assert torch.equal(rot[0].R, torch.eye(3, dtype=torch.float64))
    mats = {tuple(g.R.flatten().tolist()) for g in rot}
    assert all(tuple((a.R @ b.R).flatten().tolist()) in mats for a in rot for b in rot)  # closed
    points = octahedral_grid()
    assert points.shape == (74, 3)
    torch.testing.assert_close(points.norm(dim=1), torch.ones(74, dtype=torch.float64))
    rule = SphereSignal(points)
    f = torch.randn(2, 74, dtype=torch.float64)
    for g in full[::4]:
        # f'(p) = f(Rᵀp): a function of the coordinates turns with them
        field = lambda p: p @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) + p[:, 0] ** 2  # noqa: E731
        torch.testing.assert_close(rule(g, field(points)), field(points @ g.R))
        for h in full[::12]:
            gh = EuclideanElement(g.R @ h.R, g.t)
            assert torch.equal(rule(gh, f), rule(g, rule(h, f)))
    with pytest.raises(ValueError, match="does not map the grid"):
        rule(E3(translation=False).draw(1, GEN())[0], f)


def test_check_symmetry_tells_a_message_passing_layer_from_one_with_node_ids():
    torch.manual_seed(0)
    n = 7
    x, adj = torch.randn(2, n, 4), (torch.rand(2, n, n) < 0.4).float()
    W = torch.randn(4, 4)
    layer = lambda x, a: (torch.tanh((x + a @ x) @ W.to(x)), (a @ x).sum((1, 2)))  # noqa: E731
    ids = torch.arange(n, dtype=torch.float32)[:, None]
    with_ids = lambda x, a: layer(x + ids.to(x), a)  # noqa: E731
    rules = dict(group=Permutations(n), in_rules=(Permuted(1), Permuted((1, 2))),
                 out_rules=(Permuted(1), Invariant()))
    good = check_symmetry(layer, (x, adj), **rules)
    bad = check_symmetry(with_ids, (x, adj), **rules)
    assert good.ok and not bad.ok
    assert {r.dtype for r in good.rows} == {"float32", "float64"} and len(good.rows) == 2 * 4 * 2
    assert good.max_abs("float64") < 1e-12 < good.max_abs("float32") < 1e-5 < 1e-1 < bad.max_abs()
    assert bad.max_abs(part="output 0") > 0.1 and bad.max_rel(torch.float32) > 0.01
    assert "FAIL" in str(bad) and "pass" in str(good) and "| float32 |" in good.table()
    with pytest.raises(AssertionError, match="not symmetric"):
        bad.assert_ok()
    good.assert_ok()
    # a rule left out (None) is not compared; the wrong rule for a part fails
    assert check_symmetry(with_ids, (x, adj), Permutations(n), (Permuted(1), Permuted((1, 2))),
                          (None, Invariant())).ok is False  # ids change the sum too
    wrong = check_symmetry(layer, (x, adj), Permutations(n), (Permuted(1), Permuted(1)),
                           (Permuted(1), Invariant()))
    assert not wrong.ok  # the adjacency relabeled along one axis only


def test_check_symmetry_arguments():
    f = lambda x: x.sum(1)  # noqa: E731
    x = torch.randn(2, 5)
    with pytest.raises(ValueError, match="in_rules"):
        check_symmetry(f, (x, x), Permutations(5), Permuted(1), Invariant())
    with pytest.raises(ValueError, match="out_rules"):
        check_symmetry(f, x, Permutations(5), Permuted(1), (Invariant(), Invariant()))
    with pytest.raises(TypeError, match="in_rules"):
        check_symmetry(f, x, Permutations(5), None, Invariant())
    with pytest.raises(TypeError, match="Group"):
        check_symmetry(f, x, "S5", Permuted(1), Invariant())
    with pytest.raises(TypeError, match="Permutations"):
        check_symmetry(f, x, P4M(), Permuted(1), Invariant())
    with pytest.raises(ValueError, match="trials"):
        check_symmetry(f, x, Permutations(5), Permuted(1), Invariant(), trials=0)
    linear = torch.nn.Linear(5, 2)  # float32 weights inside a lambda: float64 inputs cannot reach them
    with pytest.raises(RuntimeError, match="pass the module itself"):
        check_symmetry(lambda x: linear(x), x, Permutations(5), Permuted(1), Invariant())
    with pytest.raises(ValueError, match="nothing would be compared"):
        check_symmetry(linear, x, Permutations(5), Permuted(1), None)
    drop = torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.Linear(5, 2))  # in train mode: random
    assert check_symmetry(drop, x, Permutations(5), Invariant(), Invariant(), dtypes=None).ok  # in eval mode
    assert drop.training  # the user's module is left as it was
    per_dtype = check_symmetry(f, x, Permutations(5), Permuted(1), Invariant(),
                               atol={torch.float32: 1e-3, torch.float64: 1e-9})
    assert {(r.dtype, r.tol) for r in per_dtype.rows} == {("float32", 1e-3), ("float64", 1e-9)}
    with pytest.raises(ValueError, match="no tolerance"):
        check_symmetry(f, x, Permutations(5), Permuted(1), Invariant(), atol={torch.float32: 1e-3})
    r = check_symmetry(f, x, Permutations(5), Permuted(1), Invariant(), dtypes=None, atol=0.0, trials=3)
    assert len(r.rows) == 3 and r.rows[0].dtype == "float32"
    d = check_symmetry(lambda x: {"sum": x.sum(1), "x": x}, x, Permutations(5), Permuted(1),
                       {"sum": Invariant(), "x": Permuted(1)})
    assert d.ok and {r.part for r in d.rows} == {"sum", "x"}
    pair = lambda x: (x.sum(1), x)  # noqa: E731
    two = (Invariant(), Permuted(1))
    named = check_symmetry(pair, x, Permutations(5), Permuted(1), two, parts=("sum", "x"))
    assert [r.part for r in named.rows[:2]] == ["sum", "x"] and named.max_abs(part="x") == 0.0
    with pytest.raises(ValueError, match="parts"):
        check_symmetry(pair, x, Permutations(5), Permuted(1), two, parts=("sum",))
    with pytest.raises(ValueError, match="no rows"):
        d.max_abs(part="output")


def test_delayed_output_nan_is_left_out_and_the_error_is_a_function_of_the_shift():
    x = torch.randn(2, 12, 3)
    causal = lambda x: x.cumsum(1)  # noqa: E731  a running sum from zero: exact under a zero-padded delay
    decay = lambda x: x.cumsum(1) + torch.arange(12.0).to(x)[None, :, None]  # noqa: E731  a clock
    rules = (TimeShifts((1, 3, 5)), Delayed(1), Delayed(1, fill=float("nan")))
    assert check_symmetry(causal, x, *rules).max_abs() < 1e-5
    errors = check_symmetry(decay, x, *rules).errors("float64")
    assert list(errors) == ["shift 1", "shift 3", "shift 5"]
    assert [round(e) for e in errors.values()] == [1, 3, 5]  # the clock is off by the shift


def test_conservation_check_separates_integrator_error_from_a_field_that_loses_energy():
    oscillator = lambda x: torch.cat([x[..., 1:], -x[..., :1]], -1)  # noqa: E731  q' = p, p' = −q
    friction = lambda x: torch.cat([torch.zeros_like(x[..., :1]), x[..., 1:]], -1)  # noqa: E731
    damped = lambda x: oscillator(x) - 0.01 * friction(x)  # noqa: E731
    energy = lambda x: 0.5 * (x**2).sum(-1)  # noqa: E731
    x0 = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    traj = integrate(oscillator, x0, 0.1, 63)
    assert traj.shape == (64, 2, 2)
    t = torch.tensor(6.3, dtype=torch.float64)  # the exact flow turns (q, p) clockwise by t
    turn = torch.stack([torch.stack([t.cos(), -t.sin()]), torch.stack([t.sin(), t.cos()])])
    torch.testing.assert_close(traj[-1].double(), x0.double() @ turn, atol=1e-4, rtol=0)
    good = conservation_check(oscillator, energy, x0, dt=0.1, steps=100)
    bad = conservation_check(damped, energy, x0, dt=0.1, steps=100)
    assert good.ok and not bad.ok
    f64 = good.rows[1]
    assert f64.dtype == "float64" and f64.shrink > 16  # RK4: drift ∝ dt⁴ or faster
    assert bad.rows[1].shrink < 1.1 and bad.max_rel() > 0.05
    # leapfrog on a separable H: bounded energy error, second order
    leap = conservation_check(oscillator, energy, x0, dt=0.1, steps=100, method="leapfrog", dtypes=None)
    assert 3 < leap.rows[0].shrink < 5 and leap.max_rel() < 5e-3
    with pytest.raises(ValueError, match="method"):
        integrate(oscillator, x0, 0.1, 10, method="rk45")
    with pytest.raises(ValueError, match="even"):
        integrate(oscillator, torch.randn(3), 0.1, 10, method="leapfrog")
    assert "FAIL" in str(bad) and "shrinks" in str(good)
