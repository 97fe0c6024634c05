"""The report page without a browser: sections, self-containment, what each claim row shows, the dials'
Python side, ``gatepool report`` and ``gatepool compare`` (tests/browser drives the page itself)."""

from __future__ import annotations

import base64
import copy
import html
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from gatepool.cli import main
from gatepool.lab.common.soft_window import WINDOW, printed
from gatepool.lab.experiments.sqrt_d import LECTURE as SQRT_D_LECTURE
from gatepool.lab.report import html_page, markdown, summary, table
from gatepool.lab.report.compare import compare_rows, load_run, tally
from gatepool.lab.report.dials import explorer_readout, normals, sqrt_d_dial, tau_dial
from gatepool.lab.report.sections import OTHER, SECTIONS, group, section_of

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "results" / "quick"


@pytest.fixture(scope="module")
def run():
    data = json.loads((QUICK / "results.json").read_text(encoding="utf-8"))
    return data["meta"], data["experiments"]


def claim(records, exp, cid):
    rec = next(r for r in records if r["name"] == exp)
    return next(c for c in rec["claims"] if c["id"] == cid)


def synthetic_explorer(grid=(12, 12), seed=0):
    """Rows of the explorer's schema: each query looks at the keys near it (a Gaussian in grid distance)."""
    gh, gw = grid
    rng = np.random.default_rng(seed)
    r, c = np.divmod(np.arange(gh * gw), gw)
    d2 = (r[:, None] - r[None]) ** 2 + (c[:, None] - c[None]) ** 2  # (t, t)
    logits = -d2 / 4.0 + 0.1 * rng.standard_normal(d2.shape)
    rows = np.exp(logits - logits.max(1, keepdims=True))
    rows /= rows.sum(1, keepdims=True)
    return {"image": rng.random((28, 28)).round(3).tolist(), "grid": [gh, gw],
            "rows": rows.round(4).tolist(), "label": 7, "seed": seed, "model": "synthetic rows (a test)"}


# --------------------------------------------------------------------------------------------- sections


def test_every_registered_experiment_has_a_lecture_section():
    from gatepool.lab.experiments import registry

    names = [n for _, _, ns in SECTIONS for n in ns]
    assert len(names) == len(set(names)), "an experiment is filed under two sections"
    missing = [n for n in registry() if section_of(n) == OTHER]
    assert not missing, f"no section for {missing}: add them to lab/report/sections.py"


def test_sections_follow_the_lecture_order(run):
    from gatepool.lab.experiments import registry

    order = {n: e.order for n, e in registry().items()}
    _, records = run
    firsts = [min(order[r["name"]] for r in recs) for _, _, recs in group(records)]
    assert firsts == sorted(firsts)
    assert sum(len(recs) for _, _, recs in group(records)) == len(records)


# ------------------------------------------------------------------------------------------------- page


def test_the_page_is_self_contained_and_shows_every_claim(run):
    meta, records = run
    page = html_page(records, meta, QUICK)
    # nothing fetched: no external src/href, no stylesheet or script by URL; figures embedded
    refs = re.findall(r"""(?:src|href)=['"]([^'"]*)['"]""", page)
    assert refs and all(r.startswith(("#", "data:")) for r in refs), {r[:40] for r in refs}
    assert "<link rel='stylesheet'" not in page and "<script src" not in page
    assert page.count("data:image/png;base64,") == sum(len(r["figures"]) for r in records)
    rows = re.findall(r"<tr class='claim v-(\w+)' data-verdict='([^']*)' data-id='([^']*)'>", page)
    assert len(rows) == sum(len(r["claims"]) for r in records)
    for rec in records:
        assert f"id='exp-{rec['name']}'" in page and f"href='#exp-{rec['name']}'" in page
    # the summary counts the lecture's claims apart
    lecture = summary(records, "lecture")
    card = page.split("id='lecture-counts'")[1].split("</div>")[0]
    assert re.findall(r"data-count='([^']*)'>(\d+)<", card) == [(v, str(lecture[v])) for v in lecture]


def test_a_claim_row_shows_statement_bar_value_tolerance_reason_and_verdict(run):
    meta, records = run
    page = html_page(records, meta, QUICK)
    c = claim(records, "soft-gate", "soft-out")
    row = page.split("data-id='soft-out'>")[1].split("</tr>")[0]
    for text in ["SoftPool (τ = 1) = V · softmax(V)", "8.85", "lecture", "8.851", "±0.00",
                 html.escape(c["why"]), c["verdict"]]:
        assert text in row, text


def test_shipped_model_badge_and_missing_explorer(run, tmp_path):
    meta, records = run
    records = copy.deepcopy(records)
    for rec in records:  # a run that used no shipped model and saved no gate rows
        rec.pop("pretrained", None)
        rec.get("data", {}).pop("explorer", None)
        for c in rec["claims"]:
            c.pop("shipped_model", None)
    page = html_page(records, meta, QUICK)
    assert "from a shipped model" not in page
    assert "This run has no saved gate rows" in page and "data-widget='explorer'" not in page
    maps = next(r for r in records if r["name"] == "attention-maps")
    maps["claims"][0]["shipped_model"] = "conv_attention seed 0"
    maps["pretrained"] = {"conv_attention_s0": "ab" * 32}
    maps.setdefault("data", {})["explorer"] = synthetic_explorer()
    page = html_page(records, meta, tmp_path)  # no figures there: each named as missing
    row = page.split(f"data-id='{maps['claims'][0]['id']}'>")[1].split("</tr>")[0]
    assert "from a shipped model: conv_attention seed 0" in row
    assert "conv_attention_s0 (sha256 abababababab…)" in page
    assert "data-widget='explorer'" in page and "no saved gate rows" not in page
    assert page.count("is missing from") == sum(len(r["figures"]) for r in records)
    assert "(From a shipped model: conv_attention seed 0.)" in markdown(records, meta)


def test_no_string_in_a_record_can_break_out_of_the_page(run):
    meta, records = run
    records = copy.deepcopy(records)
    maps = next(r for r in records if r["name"] == "attention-maps")
    maps.setdefault("data", {})["explorer"] = {**synthetic_explorer(), "model": "</script><b>x"}
    maps["notes"].append("<img src=x onerror=alert(1)>")
    page = html_page(records, meta, QUICK)
    assert "</script><b>x" not in page and "<img src=x" not in page


def test_beyond_claims_get_their_own_card_only_when_present(run):
    meta, records = run
    records = copy.deepcopy(records)
    assert not any(c.get("source") == "beyond" for r in records for c in r["claims"])
    page = html_page(records, meta, QUICK)
    assert "id='beyond-counts'" not in page and "Beyond the lecture" not in page
    own_before = page.split("id='own-counts'")[1].split("<div class='why'>")[0]
    beyond = {"name": "gate-matters", "title": "beyond", "status": "complete", "figures": [], "claims": [
        {"id": f"same-cnn-{d}", "statement": "no gate differs", "source": "beyond", "kind": "equal",
         "tolerance": 0.0, "measured": m, "bar": 0, "verdict": v}
        for d, m, v in (("cluttered-mnist", 2, "off"), ("distractor-mnist", None, "not run"))]}
    page = html_page(records + [beyond], meta, QUICK)
    card = page.split("id='beyond-counts'")[1].split("</div></div>")[0]
    assert "<h3>Beyond the lecture</h3>" in card and "'off' here means the gates differ" in card
    assert re.findall(r"data-count='([^']*)'>(\d+)<", card) == [
        ("ok", "0"), ("off", "1"), ("undecided", "0"), ("not run", "1")]
    own = page.split("id='own-counts'")[1].split("<div class='why'>")[0]
    assert own == own_before  # the own-checks card does not count them
    lecture = page.split("id='lecture-counts'")[1].split("</div>")[0]
    assert re.findall(r"data-count='([^']*)'>(\d+)<", lecture) == [
        (v, str(n)) for v, n in summary(records, "lecture").items()]
    assert "beyond the lecture" not in page.split("id='own-counts'")[1].split("</div></div>")[0]


def test_a_figure_path_outside_the_run_is_refused(run, tmp_path):
    meta, records = run
    out = tmp_path / "run"
    (out / "exp").mkdir(parents=True)
    png = b"\x89PNG\r\n\x1a\n" + b"0" * 16
    (out / "exp" / "ok.png").write_bytes(png)
    (tmp_path / "secret.png").write_bytes(b"SECRET" * 8)
    rec = {"name": "he-init", "title": "t", "status": "complete", "claims": [],
           "figures": ["exp/ok.png", "../secret.png", "exp/../../secret.png", str(tmp_path / "secret.png")]}
    page = html_page([rec], meta, out)
    secret = base64.b64encode(b"SECRET" * 8).decode("ascii")[:16]
    assert secret not in page
    assert page.count("data:image/png;base64,") == 1 and base64.b64encode(png).decode("ascii") in page
    assert page.count("is missing from") == 3


# ------------------------------------------------------------------------------------------------ dials


def test_tau_dial_gives_the_lectures_softpool_and_max(run):
    _, records = run
    soft, mx = claim(records, "soft-gate", "soft-out"), claim(records, "soft-gate", "max-out")
    at1, at001 = tau_dial(WINDOW, 1.0), tau_dial(WINDOW, 0.01)
    assert abs(at1["out"] - soft["bar"]) <= printed(2) and abs(at001["out"] - mx["bar"]) <= printed(2)
    assert abs(tau_dial(WINDOW, 100.0)["out"] - 6.34) <= printed(2)  # the dial's lecture value at τ = 100
    assert at1["out"] == pytest.approx(soft["measured"], abs=1e-5)  # the layer's float32 output
    with pytest.raises(ValueError, match="tau"):
        tau_dial(WINDOW, 0.0)


def test_page_normals_are_standard_normal():
    z = normals(0, 200_000)
    assert abs(z.mean()) < 0.01 and abs(z.var() - 1) < 0.01  # 4.5 and 3.2 standard errors
    assert not np.array_equal(normals(0, 100), normals(1, 100))
    np.testing.assert_array_equal(normals(3, 50), normals(3, 100)[:50])  # counter-based: prefixes agree


@pytest.mark.parametrize("d", [1, 4, 16, 64, 256])
def test_sqrt_d_dial_reproduces_the_lectures_table(d):
    """The page's own sample (200 queries × 144 keys, seed 0): std(q·k) ≈ √d within 3 standard errors,
    the largest gates against the lecture's table within the sqrt-d experiment's quick-profile tolerances
    (its sample is the same size)."""
    q, t = 200, 144
    r = sqrt_d_dial(d, seed=0, queries=q, tokens=t)
    # std² ≈ mean over queries of |q|²·(mean over keys of k²)/d: relative SE of std ≈ √(1/(2dQ) + 1/(2Qt))
    se = math.sqrt(1 / (2 * d * q) + 1 / (2 * q * t))
    assert r["std"] == pytest.approx(math.sqrt(d), rel=3 * se)
    _, hard, soft = SQRT_D_LECTURE[d]
    assert abs(r["max_gate"] - hard) <= 0.06 and abs(r["max_gate_scaled"] - soft) <= 0.02


def test_explorer_readout():
    ex = synthetic_explorer()
    r = explorer_readout(ex, 2, 6)
    assert r["key"] == [2, 6] and r["gate"] == max(ex["rows"][2 * 12 + 6])
    assert r["share"] == pytest.approx(sum(sorted(ex["rows"][30], reverse=True)[:3]))
    with pytest.raises(ValueError, match="off the 12×12 grid"):
        explorer_readout(ex, 12, 0)


# ------------------------------------------------------------------------------------- text and commands


def test_text_report_and_table_are_kept(run):
    meta, records = run
    assert "| experiment | claim |" in markdown(records, meta)
    assert table(records).splitlines()[0].split() == ["experiment", "claim", "bar", "(source)", "measured",
                                                      "tolerance", "verdict"]


def test_report_rebuilds_the_pages_and_leaves_results_alone(tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(QUICK, run_dir)
    (run_dir / "report.html").unlink()
    before = (run_dir / "results.json").read_bytes()
    inode = (run_dir / "results.json").stat().st_ino  # an atomic rewrite, even of the same bytes, changes it
    assert main(["report", str(run_dir)]) == 0
    assert "Profile quick" in capsys.readouterr().out
    assert (run_dir / "results.json").read_bytes() == before
    assert (run_dir / "results.json").stat().st_ino == inode
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    figures = sum(len(r["figures"]) for r in json.loads(before)["experiments"])
    assert figures > 0 and page.count("data:image/png;base64,") == figures and "is missing from" not in page
    assert (run_dir / "report.md").is_file()


def test_report_only_shows_the_named_experiments_and_keeps_results_whole(tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(QUICK, run_dir)
    data = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
    beyond = {"id": "same-cnn-cluttered-mnist", "statement": "no gate differs", "source": "beyond",
              "kind": "equal", "tolerance": 0.0, "measured": 2, "bar": 0, "verdict": "off"}
    data["experiments"].append({"name": "gate-matters", "title": "beyond", "status": "complete",
                                "figures": [], "claims": [beyond]})
    (run_dir / "results.json").write_text(json.dumps(data), encoding="utf-8")
    before = (run_dir / "results.json").read_bytes()
    assert main(["report", str(run_dir), "--only", "gate-matters"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "Profile quick: beyond the lecture ('off': a finding about the question asked, not a failed "
        "check): 0 ok of 1 (1 off, 0 undecided, 0 not run).")
    assert (run_dir / "results.json").read_bytes() == before
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "<h1>gatepool: beyond the lecture (quick profile)</h1>" in page
    assert "id='beyond-counts'" in page
    assert "id='lecture-counts'" not in page and "id='own-counts'" not in page
    assert "1 claims in 1 experiments" in page and "conv-forward" not in page
    md = (run_dir / "report.md").read_text(encoding="utf-8")
    assert md.startswith("# gatepool: beyond the lecture (quick profile)") and "conv-forward" not in md
    # the whole run still titles itself the lecture's and shows every card
    assert main(["report", str(run_dir)]) == 0
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "<h1>gatepool: the lecture reproduced (quick profile)</h1>" in page
    assert all(f"id='{c}-counts'" in page for c in ("lecture", "own", "beyond"))
    assert main(["report", str(run_dir), "--only", "gate-matters", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--only: nope not in" in err


@pytest.mark.parametrize("content, says", [(None, "has no results.json"),
                                           ("{not json", "not readable as JSON"),
                                           ('{"meta": {}}', "not a results file")])
def test_report_refuses_in_one_line(tmp_path, capsys, content, says):
    if content is not None:
        (tmp_path / "results.json").write_text(content)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and str(tmp_path) in err and "Traceback" not in err


def test_compare_flags_what_changed(run, tmp_path, capsys):
    meta, records = run
    b = copy.deepcopy(records)
    c = claim(b, "soft-gate", "soft-out")
    c["verdict"], c["measured"] = "off", 9.0
    claim(b, "padding-map", "middle")["measured"] = 1.2
    b[0]["claims"].pop()
    rows = compare_rows(records, b)
    t = tally(rows)
    assert (t["verdict"], t["value"], t["only A"], t["only B"]) == (1, 1, 1, 0)
    run_b = tmp_path / "b"
    run_b.mkdir()
    (run_b / "results.json").write_text(json.dumps({"meta": meta, "experiments": b}))
    out = tmp_path / "pages" / "cmp.html"
    assert main(["compare", str(QUICK), str(run_b / "results.json"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    line = next(ln for ln in text.splitlines() if " soft-out " in ln)
    assert line.startswith("!") and "ok" in line and "off" in line
    assert "verdict changed on 1 (ok → off: 1), value changed on 1, only in A 1" in text
    page = out.read_text(encoding="utf-8")
    assert page.count("data-change='verdict'") == 1 and "http" not in page
    assert load_run(run_b)[1] == b


def test_compare_names_the_missing_run(tmp_path, capsys):
    assert main(["compare", str(QUICK), str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope: no such file" in err
    assert main(["compare", str(QUICK), str(QUICK), "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
