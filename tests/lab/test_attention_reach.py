"""Experiments 13, 15, 16 (attention-reach, attention-maps, shuffle) and 19 (vit-mnist) on tiny trainings.

The accuracies of tiny trainings say nothing about the lecture's; what these tests pin down is the
arithmetic (receptive fields), the symmetry (exact for any weights, so an almost untrained net will do),
the sharing of one trained net between experiments, and numbers recomputed here independently.
"""

import json
import math

import pytest
import torch

from gatepool.lab.common.attention_nets import LR_KEY, train_config
from gatepool.lab.common.receptive_field import layers_to_see, receptive_width
from gatepool.lab.experiments.attention_maps import RETRAIN_SPREAD, parse_queries
from gatepool.lab.experiments.attention_reach import LR_GRID
from gatepool.lab.experiments.shuffle import shuffle_pixels
from gatepool.lab.harness import run_experiment
from gatepool.train.task import run_folder
from gatepool.utils.threads import num_threads

TINY = {"train_size": "256", "test_size": "200", "epochs": "1"}


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny trainings run fastest on one thread, and a 2-thread run on a busy machine crawls."""
    with num_threads(1):
        yield


def explicit_attention(model, x):
    """P = softmax(Q Kᵀ / √d) V W_O + b_O and G, written out in float64 from the model's weights."""
    a = model.attention
    w = {name: getattr(a, name).weight.double() for name in ("to_q", "to_k", "to_v", "to_out")}
    x = x.double()  # (B, T, C)
    q, k, v = x @ w["to_q"].T, x @ w["to_k"].T, x @ w["to_v"].T  # (B, T, d)
    g = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(q.shape[-1]), dim=-1)  # (B, T, T)
    return (g @ v) @ w["to_out"].T + a.to_out.bias.double(), g


@pytest.mark.parametrize("kernel", [3, 5])
def test_receptive_width_is_one_plus_l_times_k_minus_one(kernel):
    for layers in range(1, 5):
        assert receptive_width(layers, kernel) == 1 + layers * (kernel - 1)
    layers, widths = layers_to_see(28, kernel)
    assert layers == math.ceil(27 / (kernel - 1)) and widths[-1] >= 28 > widths[-2]


@pytest.mark.slow
def test_reach_trains_both_nets_and_maps_reuse_the_attention_net(tmp_path):
    reach = run_experiment("attention-reach", profile="quick", overrides=TINY, out=tmp_path, progress=False)
    assert reach["status"] == "complete", reach["error"]
    claims = {c["id"]: c for c in reach["claims"]}
    assert claims["layers-to-see-28"]["measured"] == 7 and claims["layers-to-see-28"]["verdict"] == "ok"
    for cid in ("stem-acc", "attention-acc", "lift"):  # quick reports unconverged accuracies, no verdict
        assert claims[cid]["verdict"] == "not run"
    runs = sorted(p.name for p in (tmp_path / "attention-reach").iterdir() if p.is_dir())
    assert [r.split("-")[0] for r in runs] == ["conv_attention", "conv_stem"]
    for run in runs:  # the accuracy reported is the run's own final test accuracy
        model = run.split("-")[0]
        final = json.loads((tmp_path / "attention-reach" / run / "results.json").read_text())["final"]
        assert reach["data"]["test_acc"][model] == [pytest.approx(100 * final["test_acc"], abs=1e-3)]

    two_seeds = {**TINY, "seeds": "0,1"}
    maps = run_experiment(
        "attention-maps", profile="quick", overrides=two_seeds, out=tmp_path, progress=False
    )
    assert maps["status"] == "complete", maps["error"]
    after = sorted(p.name for p in (tmp_path / "attention-reach").iterdir() if p.is_dir())
    assert set(runs) < set(after) and len(after) == 3  # seed 0's net reused, seed 1's trained
    # the shares recomputed here: the first test 7 through the explicit attention of each loaded net
    from gatepool.lab.common.attention_nets import attention_net, first_test_digit
    from gatepool.lab.harness import Context, get

    exp = get("attention-maps")
    ctx = Context(exp, "quick", exp.resolve_setup("quick", two_seeds), tmp_path / "attention-maps",
                  progress=False)  # fmt: skip
    x, _ = first_test_digit(7)
    shares, rows_down, dist = {}, [], []
    for seed in (0, 1):
        model = attention_net(ctx, seed)
        with torch.no_grad():
            _, g = explicit_attention(model, model.tokens(x))
        for r, c in parse_queries(["2:6", "3:8", "10:3"]):
            shares.setdefault((r, c), []).append(g[0, r * 12 + c].topk(3).values.sum().item())
        tr, tc = divmod(int(g[0, 3 * 12 + 8].argmax()), 12)  # the corner query (3, 8)
        rows_down.append(tr - 3)
        dist.append(max(abs(tr - 3), abs(tc - 8)))
    claims = {c["id"]: c for c in maps["claims"]}
    for (r, c), values in shares.items():
        claim, mean = claims[f"top3-r{r}c{c}"], sum(values) / 2
        tol = 2 * abs(values[0] - values[1]) / math.sqrt(2) + RETRAIN_SPREAD[f"top3-r{r}c{c}"] + 0.005
        assert claim["measured"] == pytest.approx(mean, abs=1e-5)
        assert claim["tolerance"] == pytest.approx(tol, abs=1e-5)
        if claim["verdict"] == "undecided":  # a spread that wide can refute the bar, not confirm it
            assert abs(mean - claim["bar"]) <= tol and tol > 0.5 * claim["bar"]
    if claims["corner-rows"]["measured"] is not None:
        assert claims["corner-rows"]["measured"] == pytest.approx(sum(rows_down) / 2)
    assert claims["reach"]["measured"] == min(dist)
    assert len(maps["figures"]) == 4 and all((tmp_path / f).stat().st_size > 1000 for f in maps["figures"])

    one_seed = run_experiment("attention-maps", profile="quick", overrides=TINY, out=tmp_path / "one",
                              progress=False)  # fmt: skip
    assert {c["id"]: c["verdict"] for c in one_seed["claims"]}["top3-r2c6"] == "not run"  # no spread to judge


def test_lr_check_trains_every_rate_and_notes_the_best(tmp_path):
    over = {"train_size": "64", "test_size": "50", "epochs": "1", "lr_check": "true"}
    rec = run_experiment("attention-reach", profile="quick", overrides=over, out=tmp_path, progress=False)
    assert rec["status"] == "complete", rec["error"]
    rows = rec["data"]["lr_check"]
    assert {(r["model"], r["lr"]) for r in rows} == {(m, lr) for m in LR_KEY for lr in LR_GRID}
    for m in LR_KEY:
        best = max((r for r in rows if r["model"] == m), key=lambda r: r["test_acc"])
        assert any(n.startswith(f"lr check (1 epochs) {m}:") and n.endswith(f"best {best['lr']:g}")
                   for n in rec["notes"])


def test_shuffle_equivariance_and_contrasts(tmp_path):
    over = {**TINY, "digits": "64", "cnn_epochs": "1", "mlp_epochs": "1"}
    rec = run_experiment("shuffle", profile="quick", overrides=over, out=tmp_path, progress=False)
    assert rec["status"] == "complete", rec["error"]
    claims = {c["id"]: c for c in rec["claims"]}
    for cid in ("equivariance", "same-prediction", "flips"):  # exact symmetry: holds for any weights
        assert claims[cid]["verdict"] == "ok", claims[cid]
    assert claims["equivariance"]["measured"] < 1e-4
    for key in ("cnn plain", "cnn shuffled", "mlp plain", "mlp shuffled"):  # % of the 200 test digits
        count = rec["data"]["test_acc"][key] * int(TINY["test_size"]) / 100
        assert count == pytest.approx(round(count), abs=1e-6), key
    for name in ("mlp-plain", "mlp-shuffled"):  # the reported accuracy is the run's own
        (run,) = [p for p in (tmp_path / "shuffle").iterdir() if p.name.startswith(f"{name}-s0-")]
        final = json.loads((run / "results.json").read_text())["final"]["test_acc"]
        assert rec["data"]["test_acc"][name.replace("-", " ")] == pytest.approx(100 * final, abs=1e-3)

    # independently: the explicit float64 attention of the trained net is equivariant to ~1e-12, and
    # the model's float32 path agrees with it
    from gatepool.train import TrainConfig, train

    exp_setup = {**json.loads(json.dumps(rec["setup"]))}
    config = train_config(exp_setup, "conv_attention", 0)
    model = train(TrainConfig.from_dict(config), out=run_folder(tmp_path / "attention-reach", config),
                  progress=False, verbose=False).model.eval()
    torch.manual_seed(1)
    x = torch.randn(2, 1, 28, 28)
    perm = torch.randperm(144)
    with torch.no_grad():
        t = model.tokens(x)  # (2, 144, 32)
        p, _ = explicit_attention(model, t)
        p_moved, _ = explicit_attention(model, t[:, perm])
        assert (p_moved - p[:, perm]).abs().max().item() < 1e-10
        assert (model.mix(t).double() - p).abs().max().item() < 1e-4


def test_shuffle_pixels_is_one_permutation_for_every_image():
    x = torch.arange(2 * 784, dtype=torch.float32).view(2, 1, 28, 28)
    y = shuffle_pixels(x, 3)
    assert y.shape == x.shape
    perm = y[0].flatten().long()  # image 0 holds 0..783: its shuffle is the permutation itself
    assert sorted(perm.tolist()) == list(range(784)) and not torch.equal(perm, torch.arange(784))
    assert torch.equal(y[1].flatten(), x[1].flatten()[perm])  # the same permutation for image 1
    assert torch.equal(shuffle_pixels(x, 3), y)


def test_bad_queries_raise():
    with pytest.raises(ValueError, match="ROW:COL"):
        parse_queries(["2-6"])
    with pytest.raises(ValueError, match="ROW:COL"):
        parse_queries(["12:0"])


@pytest.mark.slow
def test_vit_mnist_tiny(tmp_path):
    over = {"sizes": "128,256", "budget_s": "0.3,0.3", "test_size": "200", "monitor_size": "20",
            "speed_steps": "1", "batch_size": "32"}
    rec = run_experiment("vit-mnist", profile="quick", overrides=over, out=tmp_path, progress=False)
    assert rec["status"] == "complete", rec["error"]
    rows = rec["data"]["rows"]
    assert {(r["model"], r["n"]) for r in rows} == {(m, n) for m in ("cnn", "vit") for n in (128, 256)}
    speeds = json.loads((tmp_path / "vit-mnist" / "speed.json").read_text())["images_per_s"]
    for r in rows:  # the epochs are the budget's: max(1, round(budget · speed / n))
        assert r["epochs"] == max(1, round(0.3 * speeds[r["model"]] / r["n"]))
    claims = {c["id"]: c for c in rec["claims"]}
    acc = {(r["model"], r["n"]): r["acc"] for r in rows}
    gap = acc[("cnn", 128)] - acc[("vit", 128)]
    assert claims["gap-smallest"]["measured"] == pytest.approx(gap, abs=1e-3)
    # one model re-tested here: the accuracy of its saved weights on the same test digits
    from gatepool.train import TrainConfig, load_data, train

    r = next(r for r in rows if r["model"] == "vit" and r["n"] == 256)
    folder = tmp_path / "vit-mnist" / f"vit-n256-e{r['epochs']}-s0"
    config = TrainConfig.from_dict(json.loads((folder / "results.json").read_text())["config"])
    model = train(config, out=folder, progress=False, verbose=False).model.eval()
    test = load_data(TrainConfig(train_size=1, test_size=200))
    with torch.no_grad():
        mine = 100 * (model(test.test_x).argmax(1) == test.test_y).double().mean().item()
    assert r["acc"] == pytest.approx(mine, abs=1e-3)
    assert claims["pos-neighbours"]["verdict"] == "not run"  # quick: a ViT of seconds has no positions yet

    bad = run_experiment("vit-mnist", profile="quick", overrides={"sizes": "100,200,300"}, out=tmp_path,
                         progress=False)
    assert bad["status"] == "error" and "budget_s" in bad["error"]


def test_position_similarity_finds_a_grid_in_a_smooth_table():
    from gatepool.lab.experiments.vit_mnist import position_similarity

    side = 4
    r, c = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    angle = math.pi / side
    smooth = torch.stack([torch.cos(r * angle), torch.sin(r * angle), torch.cos(c * angle),
                          torch.sin(c * angle)], -1).reshape(side * side, 4)  # fmt: skip
    sim, near, rest, share = position_similarity(smooth, side)
    assert sim.shape == (16, 16) and torch.allclose(sim.diagonal(), torch.ones(16, dtype=torch.float64))
    assert near > rest and share == 1.0
    shuffled = smooth[torch.randperm(16, generator=torch.Generator().manual_seed(0))]  # the grid lost
    _, near, rest, share = position_similarity(shuffled, side)
    assert near - rest < 0.2 and share < 1.0
    with pytest.raises(ValueError, match="grid"):
        position_similarity(smooth[:15], side)


def test_a_wide_spread_over_seeds_refutes_but_does_not_confirm(tmp_path):
    from gatepool.lab.experiments.attention_maps import check_over_seeds
    from gatepool.lab.harness import Context, get

    exp = get("attention-maps")
    ctx = Context(exp, "full", exp.resolve_setup("full"), tmp_path, progress=False)  # top3-r2c6's bar: .31
    check_over_seeds(ctx, "top3-r2c6", [0.30, 0.33], 0.005, "near")
    assert ctx.claims["top3-r2c6"]["verdict"] == "ok"
    check_over_seeds(ctx, "top3-r2c6", [0.80, 0.83], 0.005, "far, seeds agree")
    assert ctx.claims["top3-r2c6"]["verdict"] == "off"
    check_over_seeds(ctx, "top3-r2c6", [0.05, 0.60], 0.005, "wide")  # the bar inside ±0.78: undecided
    wide = ctx.claims["top3-r2c6"]
    assert wide["verdict"] == "undecided" and wide["note"].startswith("undecided: the spread is too wide")
    assert wide["measured"] == pytest.approx(0.325)  # it ran: the mean is kept
    check_over_seeds(ctx, "top3-r2c6", [1.0, 1.2], 0.005, "wide but far")  # 1.1 ± 0.29, wider than .155
    assert ctx.claims["top3-r2c6"]["verdict"] == "off"  # ... and still far from .31: refuted
    # what two trainings of one seed differ by widens the seeds' spread: near agreeing seeds, far retrainings
    check_over_seeds(ctx, "top3-r2c6", [0.38, 0.40], 0.005, "retrained", retrain=0.06)  # .39 ± .093
    assert ctx.claims["top3-r2c6"]["verdict"] == "ok"
    assert ctx.claims["top3-r2c6"]["tolerance"] == pytest.approx(2 * 0.02 / math.sqrt(2) + 0.065)
    check_over_seeds(ctx, "top3-r2c6", [0.38, 0.40], 0.005, "one training per seed")  # .39 ± .033
    assert ctx.claims["top3-r2c6"]["verdict"] == "off"
    check_over_seeds(ctx, "top3-r2c6", [0.38, 0.40], 0.005, "retrained", retrain=0.2)  # ± .233: too wide
    assert ctx.claims["top3-r2c6"]["verdict"] == "undecided"


def test_where_a_query_looks_on_the_slides_places():
    from gatepool.lab.experiments.attention_maps import looks_where

    assert looks_where("where-r2c6", [(2, 2), (3, 2), (3, 8)])  # on the bar, one at its right end
    assert not looks_where("where-r2c6", [(3, 4), (3, 8), (4, 8)])  # one below the bar
    assert not looks_where("where-r2c6", [(2, 2), (3, 2), (3, 5)])  # none at the right end
    assert looks_where("where-r3c8", [(10, 3), (3, 7), (3, 5)])
    assert not looks_where("where-r3c8", [(5, 8), (10, 3), (10, 4)])  # the strongest overlaps the bar
    assert looks_where("where-r10c3", [(2, 5), (2, 6), (2, 7)])  # 2 of 3 at the right end
    assert not looks_where("where-r10c3", [(3, 9), (5, 8), (2, 5)])
    with pytest.raises(ValueError, match="claim_id"):
        looks_where("top3-r2c6", [(2, 2)])
