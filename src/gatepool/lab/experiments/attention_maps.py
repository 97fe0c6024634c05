"""Experiment 15 ``attention-maps``: where one query looks, in the gate rows of trained attention nets.

Each seed's attention net (:mod:`gatepool.lab.common.attention_nets`; quick reads the shipped nets) on the
first test "7": its gate rows G[q] for three query tokens, drawn over the token strengths ‖x_j‖, with the
share of the gate the top-3 tokens hold (an even split gives 3/144 = .021), where the corner query's
strongest gate lies, and the net's probability p̂ for the class 7 (the slides' caption, "90.0% test
accuracy, p̂ = 0.97 for this 7": the net's output, not a gate).

The numbers are judged on the mean over the seeds' nets within a spread that includes retraining
(:func:`check_over_seeds`): two trainings of one seed on other machines or thread counts are as far apart
as two seeds, so twice the std over this run's seeds is widened by ``RETRAIN_SPREAD``, what two trainings
of one seed differed by. Where each query looks is claimed in the lecture's words, on the places its
slides name by their query tokens: the bar (rows 2–3: the top-bar query (2, 6) and the corner (3, 8)), its
right end (those rows from column 6 on: the right half of the bar, whose ink spans pixel columns 6–21, token
columns 2–9 by their patches' centres 2c + 2.5) and the stem below it (rows 6 and down: a token (r, c) sees
pixel rows 2r to 2r + 5, wholly below the bar's ink, pixel rows 7–10, from row 6 on).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import torch
import torch.nn as nn

from gatepool.lab.claims import Claim, Context, experiment
from gatepool.lab.common.attention_nets import (
    TRAIN,
    TRAIN_QUICK,
    attention_net,
    first_test_digit,
    shipped_name,
    shipped_nets,
)
from gatepool.utils.plotting import pyplot

LECTURE_SHARES = {(2, 6): 0.31, (3, 8): 0.45, (10, 3): 0.23}
CORNER = (3, 8)  # the lecture's corner query: it "looks 7 rows down, to the bottom of the stem"
LECTURE_CORNER_ROWS, LECTURE_P7 = 7, 0.97
BAR_ROWS, BAR_RIGHT = (2, 3), 6  # the bar's token rows and the first column of its right half
STEM_FROM = 6  # the first token row whose patch lies wholly below the bar
MAPS_REF = "lecture, 'Attention on the 7': the first test 7's gate rows for three queries"
# What two trainings of one seed (seeds 0, 1, 2; the full setup) differed by: the largest |difference| of
# each measure between the 2026-12-01/02 full run (2-core Intel Xeon), the shipped nets (gatepool
# pretrained build, 2026-12-02, AMD EPYC, one thread) and the 2026-12-04 retraining (2-core Intel Xeon;
# seeds 1, 2 on one thread, equal to the first run's in every recorded digit; seed 0 on two threads to
# epoch 15, then one), rounded up; p̂ from the last two (the first did not record it). Measured before
# judging.
# why a map claim of the lecture's is off: its setup is the lecture's (the digit, the queries, 8,000 digits,
# 90% test accuracy), so the nets we train on it simply attend otherwise than the lecture's one net
NETS_DIFFER = ("on the lecture's setup (its 7, its queries, nets at its 90% test accuracy) the seeds' nets, "
               "with the spread of their retrainings, attend otherwise than the lecture's one net")
RETRAIN_SPREAD = {"top3-r2c6": 0.249, "top3-r3c8": 0.139, "top3-r10c3": 0.327, "corner-rows": 8.0,
                  "p7": 0.0003}  # fmt: skip
SEED_TOL = ("twice the std over the seeds' nets (measured in this run; the lecture shows one net), widened "
            "by what two trainings of one seed differed by (RETRAIN_SPREAD: shipped nets against two full "
            "runs), plus half a unit of the printed digit; not judged with one seed, nor when the bar lies "
            "inside a spread wider than half the bar (such a spread can refute the bar, not confirm it); "
            "quick reads the shipped nets of the full profile's seeds 0, 1, 2 (gatepool pretrained). On the "
            "lecture's own setup: off = the lecture's number does not reproduce; undecided = the spread is "
            "too wide to judge")
WHERE_TOL = ("a count of nets: the lecture shows one net, so the claim is that a net trained so does it, "
             "judged as 'in at least half of the seeds' nets' (our bar); not judged with one seed. On the "
             "lecture's own setup: off = the slide's sentence does not reproduce")
MAP_SETUP = {**TRAIN, "seeds": [0, 1, 2], "digit": 7, "queries": ["2:6", "3:8", "10:3"], "corner": "3:8",
             "k": 3, "tokens": 144}  # fmt: skip
MAP_QUICK = {**TRAIN_QUICK, "seeds": [0]}
# where each lecture query looks, in the slides' words: (claim, query, statement, the slide's sentence)
WHERE = [
    ("where-r2c6", (2, 6), "the top-bar query (2, 6) pools from the bar: its top-3 tokens all lie on the bar "
     "(rows 2–3), at least one at its right end (column ≥ 6)",
     "'It pools from the bar itself and the right end where the bar turns down'"),
    ("where-r3c8", (3, 8), "the corner query (3, 8) looks down the stem: its strongest gate lies on a token "
     "wholly below the bar (row ≥ 6)", "'It looks 7 rows down, to the bottom of the stem'"),
    ("where-r10c3", (10, 3), "the bottom-of-stem query (10, 3) looks back up, mostly at the corner and the "
     "bar's right end: at least 2 of its top-3 tokens lie there (rows 2–3, column ≥ 6)",
     "'It looks back up, mostly at the corner and the right end of the bar'"),
]


def parse_queries(queries: list[str], grid: tuple[int, int] = (12, 12)) -> list[tuple[int, int]]:
    """``["2:6", ...]`` -> ``[(2, 6), ...]`` (row, col) on the token grid."""
    out = []
    for q in queries:
        r, sep, c = str(q).partition(":")
        try:
            rc = (int(r), int(c))
        except ValueError:
            rc = None
        if not sep or rc is None or not (0 <= rc[0] < grid[0] and 0 <= rc[1] < grid[1]):
            raise ValueError(f"--set queries: each query is ROW:COL on the {grid[0]}×{grid[1]} grid, "
                             f"got {q!r}")
        out.append(rc)
    return out


def _map_claims(setup: dict[str, Any]) -> list[Claim]:
    on_lecture = setup["k"] == 3 and setup["digit"] == 7
    claims = []
    for r, c in parse_queries(setup["queries"]):
        claims.append(Claim(
            f"top{setup['k']}-r{r}c{c}",
            f"query (row {r}, col {c}): the share of the gate its top-{setup['k']} tokens hold "
            "(mean over seeds)",
            LECTURE_SHARES.get((r, c)) if on_lecture else None, 0.0, SEED_TOL,
            depends=("queries", "digit", "k"), source="lecture",
            ref=f"{MAPS_REF}: 'Top 3 tokens hold … of the gate'", miss="not reproduced",
            miss_why=NETS_DIFFER))  # fmt: skip
    corner = parse_queries([setup["corner"]])[0] == CORNER and setup["digit"] == 7
    claims += [
        Claim("corner-rows",
              "the corner query (3, 8): rows from it down to its strongest gate (mean over seeds)",
              LECTURE_CORNER_ROWS if corner else None, 0.0, SEED_TOL + " (at least half a row)",
              depends=("corner", "digit"), source="lecture", ref=MAPS_REF + ": 'It looks 7 rows down'",
              miss="not reproduced", miss_why=NETS_DIFFER),
        Claim("p7", "the net's probability p̂ for the class 7 on this 7 (softmax of its logits; mean over "
              "seeds)", LECTURE_P7 if setup["digit"] == 7 else None, 0.0, SEED_TOL, depends=("digit",),
              source="lecture", ref=MAPS_REF + ": the caption's '90.0% test accuracy, p̂ = 0.97 for this "
              "7' (p̂ is the net's output, the class probability; the gates are g_ij)",
              miss="not reproduced",
              miss_why="our nets, at the lecture's 90% test accuracy, are surer of this 7"),
    ]  # fmt: skip
    on_queries = on_lecture and parse_queries(setup["queries"]) == [q for _, q, _, _ in WHERE]
    where_bar = 0.5 if on_queries and corner else None
    claims += [Claim(cid, statement + " (share of the seeds' nets)", where_bar, 0.0, WHERE_TOL, kind="min",
                     depends=("queries", "corner", "digit", "k"), source="lecture",
                     ref=f"{MAPS_REF}: {words}; the bar, its right end and the stem are the places the "
                     "slides name by these query tokens", miss="not reproduced", miss_why=NETS_DIFFER)
               for cid, _, statement, words in WHERE]  # fmt: skip
    claims.append(
        Claim("reach", "the corner query's strongest gate lies outside its own receptive field, in every "
              "seed's net (fewest tokens apart)", None, 0.0, "a count: exact", kind="min",
              depends=("corner",), source="ours",
              ref="the lecture's point that one attention layer reaches past the token's patch; "
              "the bar is where the stem's 6×6-pixel patches (stride 2) stop overlapping: ⌈6/2⌉ = 3 tokens"))
    return claims


def _seed_mean(values: list[float], half_unit: float) -> tuple[float | None, float]:
    """(mean over seeds, its tolerance: 2 std + half a printed unit); no mean with one seed."""
    if len(values) < 2:
        return None, 0.0
    return statistics.fmean(values), 2 * statistics.stdev(values) + half_unit


def check_over_seeds(ctx: Context, claim_id: str, values: list[float], half_unit: float, note: str,
                     least: float = 0.0, shipped_model: str | None = None, retrain: float = 0.0
                     ) -> None:  # fmt: skip
    """The mean over the seeds' nets against the claim's bar, within 2 std + ``retrain`` (what two trainings
    of one seed differ by) + half a printed unit, at least ``least``. A spread that wide can refute the
    bar but not confirm it: when the bar lies inside a tolerance wider than half the bar, the verdict is
    ``undecided`` (the mean is kept; the note gives the spread)."""
    mean, tol = _seed_mean(values, half_unit)
    tol = max(tol + retrain, least) if mean is not None else tol
    bar = ctx.bar(claim_id)
    if mean is not None and bar is not None and abs(mean - bar) <= tol and tol > 0.5 * abs(bar):
        ctx.check(claim_id, mean, tolerance=tol, note=note, shipped_model=shipped_model,
                  undecided=f"the spread is too wide to judge: 2 std + retraining {retrain:g} + half a unit "
                  f"= {tol:.3f}, more than half the bar {bar:g}, so it cannot confirm it")  # fmt: skip
        return
    ctx.check(claim_id, mean, tolerance=tol, note=note, shipped_model=shipped_model)


def on_bar(top: list[tuple[int, int]], right_end: bool = False) -> list[bool]:
    """Whether each (row, col) token lies on the first test 7's bar (rows 2–3), or at its right end."""
    return [r in BAR_ROWS and (not right_end or c >= BAR_RIGHT) for r, c in top]


def looks_where(claim_id: str, top: list[tuple[int, int]]) -> bool:
    """Whether a query's top tokens (strongest first) are where the slide says it looks (:data:`WHERE`)."""
    if claim_id == "where-r2c6":
        return all(on_bar(top)) and any(on_bar(top, right_end=True))
    if claim_id == "where-r3c8":
        return top[0][0] >= STEM_FROM
    if claim_id == "where-r10c3":
        return sum(on_bar(top, right_end=True)) >= 2
    raise ValueError(f"claim_id must be one of {[w[0] for w in WHERE]}, got {claim_id!r}")


def measure_net(model: nn.Module, x: torch.Tensor, queries: list[tuple[int, int]], corner: tuple[int, int],
                k: int, digit: int) -> dict[str, Any]:  # fmt: skip
    """One net on one digit ``x`` (1, 1, 28, 28): per query its top-k share and tokens; the corner query's
    strongest gate (rows down to it, tokens apart, its value); p̂ for the class ``digit``; the gates G."""
    from gatepool.analysis.attention_maps import top_k_share

    grid = model.grid
    with torch.no_grad():
        tokens = model.tokens(x)  # (1, 144, 32)
        mixed, gates = model.mix(tokens, return_weights=True)  # gates (1, 144, 144): row i = token i's gate
        probs = torch.softmax(model.head(mixed), dim=-1)[0]  # (10,)
    gates = gates[0]
    out: dict[str, Any] = {"tokens": tokens, "gates": gates, "p": float(probs[digit]),
                           "predicted": int(probs.argmax()), "queries": {}}  # fmt: skip
    for r, c in queries:
        info = top_k_share(gates[r * grid[1] + c], k)
        out["queries"][(r, c)] = {**info, "top": [divmod(t, grid[1]) for t in info["tokens"]]}
    g = gates[corner[0] * grid[1] + corner[1]]
    tr, tc = divmod(int(g.argmax()), grid[1])
    out.update(corner_rows=tr - corner[0], corner_gate=float(g.max()),
               corner_dist=max(abs(tr - corner[0]), abs(tc - corner[1])))
    return out


@experiment("attention-maps", title="where one query looks: the gate rows of trained attention nets",
            order=15, setup=MAP_SETUP, quick=MAP_QUICK, claims=_map_claims)
def attention_maps(ctx: Context) -> None:
    from gatepool.analysis.attention_maps import plot_attention_map, token_strengths, top_k_share

    x, index = first_test_digit(ctx["digit"])
    corner = parse_queries([ctx["corner"]])[0]
    shipped = shipped_nets(ctx, ("conv_attention",))
    if shipped is not None:  # quick on its own setup: the full profile's nets, shipped
        nets = shipped["conv_attention"]
        ctx.note(f"quick: the maps of the shipped conv_attention nets (the full profile's trainings of seeds "
                 f"{list(nets)}), not of this run's 4-epoch nets")  # fmt: skip
    else:
        nets = {seed: attention_net(ctx, seed) for seed in ctx["seeds"]}
    seeds = list(nets)
    names = ", ".join(shipped_name("conv_attention", s) for s in seeds) if shipped is not None else None
    rows, per_net = [], {}
    for seed, model in nets.items():
        grid = model.grid
        queries = parse_queries(ctx["queries"], grid)
        if ctx["tokens"] != grid[0] * grid[1]:
            raise ValueError(f"tokens={ctx['tokens']}: the net's grid {grid} has {grid[0] * grid[1]} tokens")
        m = per_net[seed] = measure_net(model, x, queries, corner, ctx["k"], ctx["digit"])
        with torch.no_grad():
            torch.manual_seed(seed)
            gates0 = type(model)(d=ctx["d"]).eval().gates(x)[0]  # (144, 144): the same net untrained
        strengths = token_strengths(m["tokens"], grid)[0]  # (12, 12)
        ctx.note(f"seed {seed}: test digit #{index} (label {ctx['digit']}), predicted {m['predicted']}, "
                 f"p̂ = {m['p']:.3f}")
        for r, c in queries:
            q = m["queries"][(r, c)]
            if seed == seeds[0]:  # the first seed's maps, drawn
                path = ctx.out / f"attention-map-r{r}c{c}.png"
                plot_attention_map(m["gates"][r * grid[1] + c], strengths, (r, c), path, k=ctx["k"],
                                   image=x[0, 0],
                                   title=f"test digit #{index}: query token ({r}, {c}), seed {seed}")
                ctx.figures.append(str(path))
            rows.append({"seed": seed, "query": [r, c], "share": q["share"], "top": q["top"],
                         "gates": q["gates"],
                         "untrained_share": top_k_share(gates0[r * grid[1] + c], ctx["k"])["share"]})
        if seed == seeds[0]:
            ctx.figure(_gate_matrix(m["gates"], grid, index, seed), "attention-gate-matrix.png")
            ctx.data["explorer"] = explorer_data(m["gates"], grid, index, ctx["digit"], seed,
                                                 "shipped conv_attention" if shipped is not None
                                                 else "trained in this run")  # fmt: skip
    rf, stride = patch_geometry(model)
    apart = math.ceil(rf / stride)  # tokens this far apart see disjoint patches
    for r, c in queries:
        cid = f"top{ctx['k']}-r{r}c{c}"
        values = [per_net[s]["queries"][(r, c)]["share"] for s in seeds]
        check_over_seeds(ctx, cid, values, 0.005, f"seeds {seeds}: {', '.join(f'{v:.3f}' for v in values)}; "
                         f"even split {ctx['k'] / ctx['tokens']:.3f}", shipped_model=names,
                         retrain=RETRAIN_SPREAD.get(cid, 0.0))  # fmt: skip
    corner_rows = [per_net[s]["corner_rows"] for s in seeds]
    strongest = ", ".join(f"{per_net[s]['corner_gate']:.3f}" for s in seeds)
    check_over_seeds(ctx, "corner-rows", corner_rows, 0.0,
                     f"per seed {corner_rows} rows down (the strongest gate {strongest})", least=0.5,
                     shipped_model=names, retrain=RETRAIN_SPREAD["corner-rows"])  # fmt: skip
    p7 = [per_net[s]["p"] for s in seeds]
    check_over_seeds(ctx, "p7", p7, 0.005, "per seed " + ", ".join(f"{v:.3f}" for v in p7),
                     shipped_model=names, retrain=RETRAIN_SPREAD["p7"])
    for cid, query, _, _ in WHERE:
        if query not in per_net[seeds[0]]["queries"] or ctx.bar(cid) is None:
            continue
        tops = {s: per_net[s]["queries"][query]["top"] for s in seeds}
        held = [s for s in seeds if looks_where(cid, tops[s])]
        note = "top tokens " + "; ".join(f"seed {s}: {', '.join(map(str, t))}" for s, t in tops.items())
        judged = len(seeds) > 1
        ctx.check(cid, len(held) / len(seeds) if judged else None, shipped_model=names,
                  note=f"holds for seeds {held}; {note}" if judged else f"one seed: not judged; {note}")
    corner_dist = [per_net[s]["corner_dist"] for s in seeds]
    ctx.check("reach", min(corner_dist), theory=apart, shipped_model=names,
              note=f"per seed {corner_dist} tokens from the query; patches are {rf} pixels, stride {stride}: "
                   f"≥ {apart} tokens apart they do not overlap")  # fmt: skip
    ctx.data["queries"] = rows
    ctx.data["nets"] = [{"seed": s, "p": per_net[s]["p"], "corner_rows": per_net[s]["corner_rows"],
                         "corner_gate": per_net[s]["corner_gate"]} for s in seeds]  # fmt: skip


def explorer_data(gates: torch.Tensor, grid: tuple[int, int], index: int, label: int, seed: int, model: str
                  ) -> dict[str, Any]:  # fmt: skip
    """What the report's attention explorer draws: test digit ``index`` (28×28, pixels in [0, 1]) and the
    whole gate G (T, T) of the net's one attention head, row q = query token q's softmax over the T keys,
    rounded to 4 decimals."""
    from gatepool.data import load_dataset

    image = load_dataset("mnist", "test").images[index].double() / 255.0  # (28, 28) raw pixels
    return {"image": [[round(v, 4) for v in row] for row in image.tolist()], "grid": list(grid),
            "rows": [[round(v, 4) for v in row] for row in gates.double().tolist()], "label": int(label),
            "seed": int(seed), "model": model}  # fmt: skip


def _gate_matrix(gates: torch.Tensor, grid: tuple[int, int], index: int, seed: int):
    """The whole (t, t) gate: row i is query token i's softmax over every key token (log colour scale)."""
    from matplotlib.colors import LogNorm

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 5))
    t = grid[0] * grid[1]
    im = ax.imshow(gates.clamp_min(1e-6).numpy(), norm=LogNorm(vmin=1e-6, vmax=1.0), cmap="magma")
    ax.set(xlabel="key token (row-major on the grid)", ylabel="query token",
           title=f"the full {t} × {t} gate, test digit #{index}, seed {seed}")  # fmt: skip
    fig.colorbar(im, ax=ax, shrink=0.8, label="gate")
    return fig


def patch_geometry(model: nn.Module) -> tuple[int, int]:
    """(side of the pixel patch one stem token sees, pixels between neighbouring tokens), from the stem's
    conv and pool: a k×k conv then a p×p pool of stride s sees k + (p − 1) pixels; tokens are s apart."""
    conv, pool = model.stem.conv, model.stem.pool
    k, cs = conv.kernel_size[0], conv.stride[0]
    p = pool.kernel_size if isinstance(pool.kernel_size, int) else pool.kernel_size[0]
    s = pool.stride if isinstance(pool.stride, int) else pool.stride[0]
    return k + (p - 1) * cs, s * cs
