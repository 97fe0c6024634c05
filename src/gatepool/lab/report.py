"""The report: for every claim, its bar and where the bar comes from, our measurement and the verdict.

A bar is the lecture's own number (``lecture``), one of ours (``ours``, with the reason), or our rule
engine's prediction held to the lecture's arithmetic (``prediction``: a check of ours, not a
reproduction); the summary counts the three apart.

``table(records)`` is the plain-text table printed at the end of ``gatepool reproduce``;
``write_report(out, records)`` writes ``report.md``, a self-contained ``report.html`` (figures
embedded as base64 PNGs) and ``results.json`` into ``out``.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from gatepool.utils.io import atomic_write_json, atomic_write_text


def fmt(x: Any) -> str:
    """A value as the report prints it."""
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
            return f"{x:.3g}"
        return f"{x:.4g}"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(fmt(v) for v in x) + "]"
    return str(x)


def claim_rows(records: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for rec in records:
        for c in rec.get("claims", []):
            if c.get("basis") == "theory":
                compare = f"{fmt(c.get('expected'))} (theory)"
            else:
                compare = f"{fmt(c.get('bar'))} ({c.get('source') or '?'})"
            rows.append([rec["name"], c["id"], compare, fmt(c["measured"]), tolerance(c), c["verdict"]])
    return rows


def tolerance(c: dict[str, Any]) -> str:
    """How a claim passes: '±0.05', '±4%', 'exact', or the bound itself ('≥ 0.104', '≤ 0.3')."""
    kind, tol, expected = c.get("kind"), c["tolerance"], c.get("expected")
    if kind in ("min", "max"):
        if isinstance(expected, (int, float)) and not isinstance(expected, bool):
            return f"≥ {fmt(expected - tol)}" if kind == "min" else f"≤ {fmt(expected + tol)}"
        return f"≥ expected − {fmt(tol)}" if kind == "min" else f"≤ expected + {fmt(tol)}"
    return {"equal": "exact", "rel": f"±{fmt(100 * tol)}%"}.get(kind, f"±{fmt(tol)}")


HEADER = ["experiment", "claim", "bar (source)", "measured", "tolerance", "verdict"]


def table(records: list[dict[str, Any]]) -> str:
    """Plain-text side-by-side table of every claim."""
    rows = [HEADER] + claim_rows(records)
    widths = [min(max(len(r[i]) for r in rows), 40) for i in range(len(HEADER))]
    lines = []
    for k, r in enumerate(rows):
        lines.append("  ".join(cell[:40].ljust(w) for cell, w in zip(r, widths)).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def summary(records: list[dict[str, Any]], source: str | None = None) -> dict[str, int]:
    """Verdict counts over every claim, or over the claims whose bar comes from ``source``."""
    counts = {"ok": 0, "off": 0, "not run": 0}
    for rec in records:
        for c in rec.get("claims", []):
            if source is None or c.get("source") == source:
                counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
    return counts


SOURCE_NAMES = {
    "lecture": "the lecture's claims",
    "ours": "our own checks",
    "prediction": "prediction checks",
    "beyond": "beyond the lecture ('off': the gates differ)",
}


def _counts(counts: dict[str, int]) -> str:
    return f"{counts['ok']} ok, {counts['off']} off, {counts['not run']} not run"


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def headline(records: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """One sentence: profile, verdict counts, machine, Python and torch, total time."""
    env = meta.get("environment", {})
    parts = "; ".join(f"{name}: {_counts(summary(records, src))}" for src, name in SOURCE_NAMES.items())
    return (
        f"Profile {meta.get('profile')}: {parts}."
        f" Machine: {env.get('processor')} ({env.get('cpu_count')} cores, {env.get('torch_threads')} torch"
        f" threads), Python {env.get('python')}, torch {env.get('torch')}."
        f" Total {meta.get('seconds', 0):.0f} s."
    )


def markdown(records: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    out = [
        "# gatepool: the lecture reproduced",
        "",
        headline(records, meta),
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in claim_rows(records)]
    for rec in records:
        out += ["", f"## {rec['name']}: {rec.get('title', '')}", ""]
        if rec.get("status") != "complete":
            out.append(
                f"**{rec.get('status', 'not run')}**" + (f": {rec['error']}" if rec.get("error") else "")
            )
            out.append("")
        if "setup" in rec:
            setup = ", ".join(f"{k}={fmt(v)}" for k, v in rec["setup"].items())
            out.append(f"Setup ({rec.get('profile')} profile, {rec.get('seconds', 0):.1f} s): {setup}")
            out.append("")
        for c in rec.get("claims", []):
            out.append(
                f"- **{c['id']}** ({c['verdict']}): {c['statement'].rstrip('.')}. Bar {fmt(c.get('bar'))} "
                f"({c.get('source')}: {c.get('ref')}), measured {fmt(c['measured'])}. "
                f"Tolerance: {c.get('why') or fmt(c['tolerance'])}"
                + (f" Note: {c['note']}" if c.get("note") else "")
            )
        for n in rec.get("notes", []):
            out.append(f"- {n}")
        for f in rec.get("figures", []):
            out += ["", f"![{Path(f).stem}]({f})"]
    return "\n".join(out) + "\n"


def html_page(records: list[dict[str, Any]], meta: dict[str, Any], out: Path) -> str:
    esc = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>gatepool report</title><style>",
        "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}",
        "table{border-collapse:collapse;font-size:14px}td,th{border:1px solid #ccc;padding:3px 8px}",
        ".ok{background:#e6f4e6}.off{background:#fbe3e3}.notrun{background:#eee}img{max-width:100%}",
        "</style></head><body><h1>gatepool: the lecture reproduced</h1>",
        f"<p>{esc(headline(records, meta))}</p>",
        "<table><tr>" + "".join(f"<th>{h}</th>" for h in HEADER) + "</tr>",
    ]
    for row in claim_rows(records):
        cls = row[-1].replace(" ", "")
        parts.append(f"<tr class='{cls}'>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>")
    parts.append("</table>")
    for rec in records:
        parts.append(f"<h2>{esc(rec['name'])}: {esc(rec.get('title', ''))}</h2>")
        if rec.get("status") != "complete":
            parts.append(
                f"<p><b>{esc(str(rec.get('status', 'not run')))}</b> {esc(str(rec.get('error') or ''))}</p>"
            )
        if "setup" in rec:
            setup = ", ".join(f"{k}={fmt(v)}" for k, v in rec["setup"].items())
            parts.append(f"<p><small>{esc(setup)} ({rec.get('seconds', 0):.1f} s)</small></p>")
        items = [
            f"<li><b>{esc(c['id'])}</b> ({esc(c['verdict'])}): {esc(c['statement'])} "
            f"<small>[{esc(str(c.get('source')))}: {esc(str(c.get('ref')))}]</small> "
            f"<i>{esc(c.get('why') or '')}</i></li>"
            for c in rec.get("claims", [])
        ]
        items += [f"<li>{esc(n)}</li>" for n in rec.get("notes", [])]
        parts.append("<ul>" + "".join(items) + "</ul>")
        for f in rec.get("figures", []):
            path = out / f
            if path.is_file():
                b64 = base64.b64encode(path.read_bytes()).decode("ascii")
                parts.append(f"<p><img alt='{esc(path.stem)}' src='data:image/png;base64,{b64}'></p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(out: str | Path, records: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Path]:
    """Write results.json, report.md and report.html into ``out``; returns their paths."""
    out = Path(out)
    paths = {
        "results": atomic_write_json(out / "results.json", {"meta": meta, "experiments": records}),
        "markdown": atomic_write_text(out / "report.md", markdown(records, meta)),
        "html": atomic_write_text(out / "report.html", html_page(records, meta, out)),
    }
    return paths
