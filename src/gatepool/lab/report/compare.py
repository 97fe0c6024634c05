"""Two runs' claims side by side: quick vs full, or one profile on two machines (``gatepool compare``).

Claims are matched by (experiment, claim id). A row is flagged

    verdict    the verdicts differ (ok → off, off → not run, ...)
    value      same verdict, but the measurement differs at the report's printed precision
    only A/B   the claim is in one run only

``compare_text`` is the terminal's table, ``compare_page`` a self-contained page (the report's CSS inlined,
a filter to show only what changed).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from gatepool.lab.report.page import asset
from gatepool.lab.report.text import fmt, tolerance

esc = html.escape
FLAGS = ("verdict", "value", "only A", "only B")


def load_run(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]], Path]:
    """(meta, records, results.json path) of a run folder or of its results.json; a ValueError names the
    file and what to do when it is missing or not a results file."""
    path = Path(path)
    file = path / "results.json" if path.is_dir() else path
    if not file.is_file():
        where = f"{path} has no results.json" if path.is_dir() else f"{file}: no such file"
        raise ValueError(f"{where}; give a run folder written by `gatepool reproduce --out DIR` or its "
                         "results.json")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{file}: not readable as JSON ({type(e).__name__}: {e}); run `gatepool reproduce` "
                         "again to rewrite it") from None
    if not (isinstance(data, dict) and isinstance(data.get("experiments"), list)
            and all(isinstance(r, dict) and "name" in r for r in data["experiments"])):
        raise ValueError(f"{file}: not a results file (no list of experiments under 'experiments'); give the "
                         "results.json that `gatepool reproduce` writes")
    return data.get("meta") or {}, data["experiments"], file


def _changed(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    if a is None:
        return "only B"
    if b is None:
        return "only A"
    if a.get("verdict") != b.get("verdict"):
        return "verdict"
    if fmt(a.get("measured")) != fmt(b.get("measured")):
        return "value"
    return ""


def compare_rows(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per claim in A or B: {experiment, id, statement, a, b (claim records or None), change}."""
    def index(records):
        return {rec["name"]: {c["id"]: c for c in rec.get("claims", [])} for rec in records}

    ia, ib = index(a), index(b)
    names = list(ia) + [n for n in ib if n not in ia]
    rows = []
    for name in names:
        ca, cb = ia.get(name, {}), ib.get(name, {})
        for cid in list(ca) + [c for c in cb if c not in ca]:
            x, y = ca.get(cid), cb.get(cid)
            rows.append({"experiment": name, "id": cid, "statement": (x or y).get("statement", ""),
                         "a": x, "b": y, "change": _changed(x, y)})
    return rows


def tally(rows: list[dict[str, Any]]) -> dict[str, int]:
    out = {"claims": len(rows), **{f: 0 for f in FLAGS}}
    for r in rows:
        if r["change"]:
            out[r["change"]] += 1
    return out


def _cell(c: dict[str, Any] | None) -> tuple[str, str, str]:
    """(measured, tolerance, verdict) of one side, '' where the claim is absent."""
    if c is None:
        return "", "", ""
    return fmt(c.get("measured")), tolerance(c), c.get("verdict", "")


def describe(meta: dict[str, Any]) -> str:
    env = meta.get("environment", {})
    return (f"profile {meta.get('profile')}, {env.get('processor')} ({env.get('cpu_count')} cores), "
            f"torch {env.get('torch')}, device {env.get('device', 'cpu')}, {meta.get('seconds', 0):.0f} s")


def headline(rows: list[dict[str, Any]]) -> str:
    t = tally(rows)
    moves: dict[str, int] = {}
    for r in rows:
        if r["change"] == "verdict":
            key = f"{r['a']['verdict']} → {r['b']['verdict']}"
            moves[key] = moves.get(key, 0) + 1
    detail = f" ({', '.join(f'{k}: {n}' for k, n in sorted(moves.items()))})" if moves else ""
    return (f"{t['claims']} claims: verdict changed on {t['verdict']}{detail}, "
            f"value changed on {t['value']}, only in A {t['only A']}, only in B {t['only B']}")


def compare_text(rows: list[dict[str, Any]], meta_a: dict[str, Any], meta_b: dict[str, Any],
                 a_name: str, b_name: str) -> str:
    """The terminal's side-by-side table; '!' marks a changed verdict, '~' a changed value."""
    mark = {"verdict": "!", "value": "~", "only A": "A", "only B": "B", "": ""}
    header = ["", "experiment", "claim", "A measured", "A verdict", "B measured", "B verdict"]
    table = [header]
    for r in rows:
        (ma, _, va), (mb, _, vb) = _cell(r["a"]), _cell(r["b"])
        table.append([mark[r["change"]], r["experiment"], r["id"], ma, va, mb, vb])
    widths = [min(max(len(row[i]) for row in table), 32) for i in range(len(header))]
    lines = [f"A: {a_name} ({describe(meta_a)})", f"B: {b_name} ({describe(meta_b)})", ""]
    for k, row in enumerate(table):
        lines.append("  ".join(cell[:32].ljust(w) for cell, w in zip(row, widths)).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines += ["", headline(rows) + "  (! verdict changed, ~ value changed, A/B in one run only)"]
    return "\n".join(lines)


def compare_page(rows: list[dict[str, Any]], meta_a: dict[str, Any], meta_b: dict[str, Any],
                 a_name: str, b_name: str) -> str:
    """A self-contained page: both runs' claims side by side, what changed highlighted, a filter."""
    body = []
    for r in rows:
        (ma, ta, va), (mb, tb, vb) = _cell(r["a"]), _cell(r["b"])
        body.append(
            f"<tr class='claim {'changed' if r['change'] else ''}' data-change='{esc(r['change'])}'>"
            f"<td><code>{esc(r['experiment'])}</code></td><td><code>{esc(r['id'])}</code></td>"
            f"<td>{esc(r['statement'])}</td>"
            f"<td class='num'>{esc(ma)}<div class='why'>{esc(ta)}</div></td>"
            f"<td class='verdict v-{esc(va.replace(' ', ''))}'>{esc(va)}</td>"
            f"<td class='num'>{esc(mb)}<div class='why'>{esc(tb)}</div></td>"
            f"<td class='verdict v-{esc(vb.replace(' ', ''))}'>{esc(vb)}</td>"
            f"<td>{esc(r['change'])}</td></tr>"
        )
    css = (asset("page.css") + "main{margin-left:0}td.v-ok{background:var(--ok)}"
           "td.v-off{background:var(--off)}"
           "td.v-notrun{background:var(--notrun)}tr.changed td:last-child{font-weight:600;color:#a32020}")
    script = ("document.getElementById('only-changed').addEventListener('change',e=>{for(const tr of "
              "document.querySelectorAll('tr.claim'))tr.classList.toggle('hidden',e.target.checked&&"
              "!tr.dataset.change)});document.body.dataset.ready='1';")
    return "\n".join([
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><link rel='icon' href='data:,'>",
        f"<title>gatepool compare: {esc(a_name)} vs {esc(b_name)}</title>",
        f"<style>{css}</style></head><body><main>",
        "<h1>Two runs, claim by claim</h1>",
        f"<p class='meta'>A: {esc(a_name)} ({esc(describe(meta_a))})<br>B: {esc(b_name)} "
        f"({esc(describe(meta_b))})</p><p id='headline'>{esc(headline(rows))}</p>",
        "<p id='filter'><label><input type='checkbox' id='only-changed'> only what changed</label></p>",
        "<table class='claims'><thead><tr><th>experiment</th><th>claim</th><th>statement</th><th>A measured"
        "</th><th>A</th><th>B measured</th><th>B</th><th>changed</th></tr></thead><tbody>",
        *body, "</tbody></table></main>", f"<script>{script}</script></body></html>",
    ])
