"""The harness: registration, --set, verdicts, resume, atomic results and the report."""

import json

import pytest

from gatepool.cli import main
from gatepool.lab import claims
from gatepool.lab.claims import Claim, experiment, parse_value, verdict
from gatepool.lab.harness import parse_sets, run_experiment
from gatepool.lab.reproduce import reproduce

CALLS: list[dict] = []


@pytest.fixture
def toy(monkeypatch):
    """Two toy experiments in a private registry: 'toy-sum' measures, 'toy-broken' raises."""
    monkeypatch.setattr(claims, "_REGISTRY", {})  # the experiment files are imported already: not re-declared
    CALLS.clear()

    @experiment(
        "toy-sum",
        title="sum of n ones",
        order=1,
        setup={"n": 4, "scale": 1.0, "seed": 0},
        quick={"n": 3},
        claims=[
            Claim("sum", "n ones sum to n", 4, 0.5, "exact arithmetic", depends=("n",), source="lecture",
                  ref="a toy passage"),
            Claim("never", "a claim the experiment does not reach", 1, 0.1, source="ours", ref="a toy bar"),
        ],
    )
    def toy_sum(ctx):
        CALLS.append(dict(ctx.setup))
        ctx.check("sum", float(sum([ctx["scale"]] * ctx["n"])), theory=float(ctx["n"]) * ctx["scale"])

    @experiment("toy-broken", title="breaks", order=2, setup={"k": 1},
                claims=[Claim("x", "x", 1, 0, source="ours", ref="a toy bar")])  # fmt: skip
    def toy_broken(ctx):
        ctx.check("x", 1)
        raise RuntimeError("boom")

    return toy_sum


def test_every_claim_says_where_its_bar_comes_from():
    with pytest.raises(ValueError, match="source"):
        Claim("a", "no source", 1, 0)
    with pytest.raises(ValueError, match="ref"):
        Claim("a", "a source without a pointer", 1, 0, source="lecture")
    with pytest.raises(ValueError, match="source"):
        Claim("a", "an unknown source", 1, 0, source="folklore", ref="x")
    from gatepool.lab.claims import SOURCES
    from gatepool.lab.experiments import registry

    assert SOURCES == ("lecture", "arithmetic", "ours", "identity", "prediction", "beyond")
    for exp in registry().values():
        for c in exp.claims(exp.resolve_setup("full")):
            assert c.source in SOURCES and c.ref, (exp.name, c.id)
            assert (c.source == "beyond") == exp.beyond, (exp.name, c.id)  # extensions' claims only


def test_records_carry_the_source_and_the_report_counts_them_apart(toy, tmp_path):
    from gatepool.lab.report import headline, markdown, summary

    rec = run_experiment("toy-sum", profile="full", out=tmp_path)
    c = {c["id"]: c for c in rec["claims"]}
    assert (c["sum"]["source"], c["sum"]["ref"], c["sum"]["bar"]) == ("lecture", "a toy passage", 4)
    assert c["never"]["source"] == "ours" and c["never"]["lecture"] is None and c["never"]["bar"] == 1
    assert summary([rec], "lecture") == {"ok": 1, "off": 0, "undecided": 0, "not run": 0}
    assert summary([rec], "ours") == {"ok": 0, "off": 0, "undecided": 0, "not run": 1}
    line = headline([rec], {"profile": "full"})
    assert (
        "the lecture's claims: 1 ok of 1 measured (0 off, 0 undecided, 0 not run)" in line
        and "our own checks: 0 ok of 1 measured (0 off, 0 undecided, 1 not run)" in line
    )
    assert "(lecture: a toy passage)" in markdown([rec], {"profile": "full"})


def _relabelled(record: dict, ids: dict[str, str], verdict: str | None = None) -> dict:
    """A copy of ``record`` whose claims ``ids`` have the given sources (and ``verdict``, if given)."""
    claims = [{**c, "source": ids.get(c["id"], c["source"]), "verdict": verdict or c["verdict"]}
              if c["id"] in ids else c for c in record["claims"]]
    return {**record, "claims": claims}


def test_a_restated_claim_is_never_counted_as_measured(toy, tmp_path):
    """Restated claims (the lecture's arithmetic, our identities) stand beside the measured count, never in
    it: in the headline, report.md and the page's cards."""
    from gatepool.lab.report import headline, html_page

    rec = run_experiment("toy-sum", profile="full", out=tmp_path)
    meta = {"profile": "full"}
    lecture = headline([rec], meta)
    assert "the lecture's claims: 1 ok of 1 measured (0 off, 0 undecided, 0 not run)" in lecture
    restated = _relabelled(rec, {"sum": "arithmetic", "never": "identity"}, verdict="off")
    line = headline([restated], meta)
    assert "ok of" not in line.split("Machine")[0] and "measured" not in line, line  # nothing measured
    assert "the lecture's claims: 1 restated beside them (0 ok, 1 off)" in line
    assert "our own checks: 1 identities beside them (0 ok, 1 off)" in line
    both = {**rec, "claims": rec["claims"] + [{**c, "id": c["id"] + "-r"} for c in restated["claims"]]}
    line = headline([both], meta)
    assert "the lecture's claims: 1 ok of 1 measured (0 off, 0 undecided, 0 not run), 1 restated" in line
    page = html_page([both], meta, tmp_path)
    card = page.split("id='lecture-counts'")[1].split("</div>")[0]
    assert "1 ok of 1 measured; 1 restated beside them" in card
    assert "data-count='ok'>1<" in card and "data-count='off'>0<" in card  # the restated off is not in it
    own = page.split("id='own-counts'")[1].split("</div>")[0]
    assert "0 ok of 1</h3>" in own and "data-count='not run'>1<" in own and "data-count='off'>0<" in own
    card = page.split("id='restated-counts'")[1].split("</div></div>")[0]
    assert "Restated, counted apart: 2" in card and "data-count='off'>2<" in card


def test_a_lecture_claim_not_ok_says_why(toy, tmp_path):
    """The declared miss (one of three) goes into the record of a claim that is not ok, and the report
    shows it; an undecided claim is 'too wide' by itself; one that says nothing is marked so."""
    import html

    from gatepool.lab.claims import MISSES
    from gatepool.lab.report import html_page, markdown
    from gatepool.lab.report.text import miss_text

    with pytest.raises(ValueError, match="miss"):
        Claim("a", "a", 1, 0, source="lecture", ref="x", miss="bad luck", miss_why="x")
    with pytest.raises(ValueError, match="miss"):
        Claim("a", "a", 1, 0, source="ours", ref="x", miss="setup differs", miss_why="x")
    with pytest.raises(ValueError, match="miss"):
        Claim("a", "a", 1, 0, source="lecture", ref="x", miss="setup differs")
    spec = Claim("s", "s", 4, 0.5, source="lecture", ref="x", miss="setup differs",
                 miss_why="three, not four")
    ok = claims.claim_record(spec, on_lecture=True, measured=4, expected=4, basis="lecture", tolerance=0.5)
    off = claims.claim_record(spec, on_lecture=True, measured=3, expected=4, basis="lecture", tolerance=0.5)
    assert "miss" not in ok and (off["miss"], off["miss_why"]) == ("setup differs", "three, not four")
    assert miss_text(off) == f"{MISSES['setup differs']}: three, not four" and miss_text(ok) == ""
    assert miss_text({**off, "verdict": "undecided", "miss": None}) == MISSES["too wide"]
    assert miss_text({**off, "miss": None}) == "not stated"
    assert miss_text({**off, "source": "ours"}) == ""
    rec = {"name": "toy", "title": "t", "status": "complete", "figures": [], "claims": [off, ok]}
    page, md = html_page([rec], {"profile": "full"}, tmp_path), markdown([rec], {"profile": "full"})
    assert page.count("Why not ok: ") == 1 and f"Why not ok: {html.escape(MISSES['setup differs'])}" in page
    assert f"- **toy / s** (off): {MISSES['setup differs']}: three, not four" in md


def test_a_miss_enters_the_claims_digest_only_where_declared():
    from gatepool.lab.claims import Experiment

    plain = Claim("s", "s", 4, 0.5, source="lecture", ref="x")
    said = Claim("s", "s", 4, 0.5, source="lecture", ref="x", miss="too wide", miss_why="three seeds")

    def digest(c):
        return Experiment("e", lambda ctx: None, "t", 1, {}, {}, lambda setup: [c]).claims_digest({})

    import dataclasses
    import hashlib

    old = [{k: v for k, v in dataclasses.asdict(plain).items() if k not in ("miss", "miss_why")}]
    assert digest(plain) == hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:16]
    assert digest(said) != digest(plain)


def test_a_tolerance_measured_in_the_run_replaces_the_declared_one(toy, tmp_path):
    from gatepool.lab.harness import Context, get

    ctx = Context(
        get("toy-sum"), "full", get("toy-sum").resolve_setup("full"), tmp_path / "t", progress=False
    )
    assert ctx.check("sum", 4.4) == "ok"  # declared ±0.5
    assert ctx.check("sum", 4.4, tolerance=0.2) == "off" and ctx.claims["sum"]["tolerance"] == 0.2


def test_verdict_kinds():
    assert verdict("abs", 1.04, 1.0, 0.05) == "ok"
    assert verdict("abs", 1.06, 1.0, 0.05) == "off"
    assert verdict("rel", 104, 100, 0.05) == "ok" and verdict("rel", 106, 100, 0.05) == "off"
    assert verdict("min", 0.9, 1.0, 0.05) == "off" and verdict("min", 3.0, 1.0, 0.0) == "ok"
    assert verdict("max", 1.2, 1.0, 0.1) == "off" and verdict("max", -5, 1.0, 0.0) == "ok"
    assert verdict("equal", True, True, 0) == "ok" and verdict("equal", False, True, 0) == "off"
    assert verdict("abs", float("nan"), 1.0, 10) == "off"
    assert verdict("abs", None, 1.0, 1) == "not run"


def test_run_quick_and_set_use_theory_off_lecture(toy, tmp_path):
    rec = run_experiment("toy-sum", profile="quick", out=tmp_path)
    # the quick profile's own change (n = 3) still answers to the lecture's value, with its tolerance
    c = {c["id"]: c for c in rec["claims"]}
    assert rec["setup"] == {"n": 3, "scale": 1.0, "seed": 0}
    assert c["sum"]["lecture"] == 4 and c["sum"]["verdict"] == "off"
    assert c["never"]["verdict"] == "not run"
    # --set n=5 changes what the claim depends on: the lecture's value no longer applies, the theory (5) does
    rec = run_experiment("toy-sum", profile="quick", overrides={"n": "5"}, out=tmp_path)
    c = {c["id"]: c for c in rec["claims"]}
    assert c["sum"]["lecture"] is None and c["sum"]["basis"] == "theory" and c["sum"]["verdict"] == "ok"
    rec = run_experiment("toy-sum", profile="full", out=tmp_path)
    c = {c["id"]: c for c in rec["claims"]}
    assert c["sum"]["lecture"] == 4 and c["sum"]["basis"] == "lecture" and c["sum"]["verdict"] == "ok"
    # a setting the claim does not depend on keeps the lecture's value; the measurement moves, so it is off
    rec = run_experiment("toy-sum", profile="full", overrides={"scale": "2"}, out=tmp_path)
    c = {c["id"]: c for c in rec["claims"]}
    assert rec["setup"]["scale"] == 2.0 and c["sum"]["measured"] == 8.0 and c["sum"]["verdict"] == "off"
    saved = json.loads((tmp_path / "toy-sum" / "result.json").read_text())
    assert saved["setup"]["scale"] == 2.0 and saved["status"] == "complete"
    assert not list(tmp_path.rglob("*.tmp"))


def test_bad_set_names_the_setting(toy, tmp_path):
    with pytest.raises(ValueError, match="no setting 'm'.*n, scale, seed"):
        run_experiment("toy-sum", overrides={"m": "1"}, out=tmp_path)
    with pytest.raises(ValueError, match="n=x: expected int"):
        run_experiment("toy-sum", overrides={"n": "x"}, out=tmp_path)
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_sets(["n"])
    assert parse_sets(["d=1,2", "tokens=3"]) == {"d": "1,2", "tokens": "3"}
    assert parse_value("1,4,16", [1], "d") == [1, 4, 16]


def test_reproduce_resumes_and_reports_not_run(toy, tmp_path):
    records, paths = reproduce(profile="quick", out=tmp_path, only=["toy-sum"], progress=False)
    assert len(CALLS) == 1
    by_name = {r["name"]: r for r in records}
    assert by_name["toy-broken"]["status"] == "not run"
    assert all(c["verdict"] == "not run" for c in by_name["toy-broken"]["claims"])
    md = paths["markdown"].read_text()
    assert "toy-sum" in md and "not run" in md
    assert "<table class='claims'>" in paths["html"].read_text()
    results = json.loads(paths["results"].read_text())
    assert [r["name"] for r in results["experiments"]] == ["toy-sum", "toy-broken"]
    # second run: toy-sum is complete for this profile and setup, so it is skipped
    reproduce(profile="quick", out=tmp_path, progress=False)
    assert len(CALLS) == 1
    rec = json.loads((tmp_path / "toy-broken" / "result.json").read_text())
    assert rec["status"] == "error" and "boom" in rec["error"]
    assert rec["claims"][0]["verdict"] == "ok"  # what was measured before the error stays
    # a torn result file is not trusted: the experiment runs again
    (tmp_path / "toy-sum" / "result.json").write_text('{"name": "toy-su')
    reproduce(profile="quick", out=tmp_path, only=["toy-sum"], progress=False)
    assert len(CALLS) == 2
    reproduce(profile="quick", out=tmp_path, only=["toy-sum"], force=True, progress=False)
    assert len(CALLS) == 3
    # a record measured against claims declared otherwise (an older bar, say) is run again
    path = tmp_path / "toy-sum" / "result.json"
    rec = json.loads(path.read_text())
    path.write_text(json.dumps({**rec, "claims_digest": "an-older-claim-set"}))
    reproduce(profile="quick", out=tmp_path, only=["toy-sum"], progress=False)
    assert len(CALLS) == 4
    reproduce(profile="quick", out=tmp_path, only=["toy-sum"], progress=False)
    assert len(CALLS) == 4  # the fresh record carries the current digest


def test_cli_run_json_and_extra_options(toy, tmp_path, capsys):
    assert main(["run", "toy-sum", "--out", str(tmp_path), "--json", "--n", "5", "--profile", "full"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert (
        rec["setup"]["n"] == 5
        and rec["claims"][0]["verdict"] == "ok"
        and rec["claims"][0]["basis"] == "theory"
    )
    assert main(["run", "toy-sum", "--out", str(tmp_path), "--set", "bogus=1"]) == 2
    assert main(["reproduce", "--out", str(tmp_path), "--only", "nope", "--quiet"]) == 2


def test_report_states_bounds_plainly():
    from gatepool.lab.report import tolerance

    assert tolerance({"kind": "min", "tolerance": 0.25, "expected": 1.0}) == "≥ 0.75"
    assert tolerance({"kind": "max", "tolerance": 0.0, "expected": 0.3}) == "≤ 0.3"
    assert tolerance({"kind": "rel", "tolerance": 0.05, "expected": 2.0}) == "±5%"
    assert tolerance({"kind": "equal", "tolerance": 0, "expected": True}) == "exact"


def test_rejudge_keeps_the_measurements_and_applies_the_declared_claims():
    import copy
    import json
    from pathlib import Path

    from gatepool.lab.harness import rejudge

    root = Path(__file__).resolve().parents[2]
    runs = json.loads((root / "results" / "full" / "results.json").read_text(encoding="utf-8"))["experiments"]
    rec = copy.deepcopy(next(r for r in runs if r["name"] == "pool-comparison"))
    by_id = {c["id"]: c for c in rec["claims"]}
    by_id["tau-min"]["measured"] = 1.0  # a τ that never moved: the two-sided bar catches it
    rec["claims"] = [c for c in rec["claims"] if c["id"] != "tau-max"]  # a claim the record lacks
    out = {c["id"]: c for c in rejudge(rec, "a test")["claims"]}
    assert out["tau-min"]["verdict"] == "off"
    assert out["tau-max"]["verdict"] == "not run" and "a test" in out["tau-max"]["note"]
    assert out["spread"]["measured"] == by_id["spread"]["measured"]

    maps = next(r for r in runs if r["name"] == "attention-maps")
    undecided = {c["id"]: c for c in maps["claims"] if c["verdict"] == "undecided"}
    assert undecided  # the record holds claims its seeds could not decide
    assert rejudge(rejudge(maps, "a test"), "a test")["rejudged"] == rejudge(maps, "a test")["rejudged"]
    assert rejudge(rejudge(maps, "a test"), "again")["rejudged"].endswith("a test; then again")
    twice = {c["id"]: c for c in rejudge(rejudge(maps, "a test"), "again")["claims"]}
    for cid, claim in undecided.items():  # an undecided claim judged again stays undecided, note whole
        assert {k: twice[cid][k] for k in claim} == claim


@pytest.mark.parametrize("profile", ["quick", "full"])
def test_every_committed_record_rejudges_to_its_own_verdicts(profile):
    """The committed records need no parser of a retired format: judged again from their own
    measurements against the claims declared now, every claim keeps its verdict, values and tolerance."""
    from pathlib import Path

    from gatepool.lab.harness import rejudge

    path = Path(__file__).resolve().parents[2] / "results" / profile / "results.json"
    fields = ("id", "verdict", "measured", "expected", "tolerance", "note")

    def rows(claims):
        return [[c.get(k) for k in fields] for c in claims]

    for rec in json.loads(path.read_text(encoding="utf-8"))["experiments"]:
        assert rows(rejudge(rec, "a test")["claims"]) == rows(rec["claims"]), rec["name"]
