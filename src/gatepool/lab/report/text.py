"""The report as text: for every claim, its bar and where the bar comes from, our measurement and the verdict.

A bar is the lecture's own number on a measurement that could come out otherwise (``lecture``), the
lecture's arithmetic or a definition restated (``arithmetic``: checked, but it cannot fail), one of ours
(``ours``, with the reason), or our rule engine's prediction held to the lecture's arithmetic
(``prediction``: a check of ours, not a reproduction); the summary counts them apart: "the lecture's
measured claims: N ok of M" and "arithmetic and definitions restated: K".

``table(records)`` is the plain-text table printed at the end of ``gatepool reproduce``;
``markdown(records, meta)`` is ``report.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gatepool.lab.claims import VERDICTS


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
    counts = {v: 0 for v in VERDICTS}
    for rec in records:
        for c in rec.get("claims", []):
            if source is None or c.get("source") == source:
                counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
    return counts


SOURCE_NAMES = {
    "lecture": "the lecture's measured claims",
    "arithmetic": "arithmetic and definitions restated",
    "ours": "our own checks",
    "prediction": "prediction checks",
    "beyond": "beyond the lecture ('off': a finding about the question asked, not a failed check)",
}


def counts_text(counts: dict[str, int]) -> str:
    """'3 ok of 5 (1 off, 0 undecided, 1 not run)'."""
    rest = ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS if v != "ok")
    return f"{counts.get('ok', 0)} ok of {sum(counts.values())} ({rest})"


def source_text(src: str, counts: dict[str, int]) -> str:
    """One source's line: 'the lecture's measured claims: 3 ok of 5 (...)'; the restated arithmetic
    by its count ('arithmetic and definitions restated: 12 (12 ok)'), since it cannot fail."""
    name = SOURCE_NAMES.get(src, src)
    if src == "arithmetic":
        bad = ", ".join(f"{counts[v]} {v}" for v in VERDICTS if v != "ok" and counts.get(v))
        return f"{name}: {sum(counts.values())} ({counts.get('ok', 0)} ok{', ' + bad if bad else ''})"
    return f"{name}: {counts_text(counts)}"


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def title(records: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The pages' title: the lecture reproduced, or beyond the lecture when every claim is "beyond"."""
    sources = {c.get("source") for rec in records for c in rec.get("claims", [])}
    what = "beyond the lecture" if sources == {"beyond"} else "the lecture reproduced"
    return f"gatepool: {what} ({meta.get('profile')} profile)"


def headline(records: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """One sentence: profile, verdict counts, machine, Python and torch, total time."""
    env = meta.get("environment", {})
    present = {c.get("source") for rec in records for c in rec.get("claims", [])}
    parts = "; ".join(
        source_text(src, summary(records, src))
        for src in SOURCE_NAMES
        if src in present  # e.g. "beyond" only where a claim has it (a report of --only beyond experiments)
    )
    return (
        f"Profile {meta.get('profile')}: {parts}."
        f" Machine: {env.get('processor')} ({env.get('cpu_count')} cores, {env.get('torch_threads')} torch"
        f" threads), Python {env.get('python')}, torch {env.get('torch')}."
        f" Total {meta.get('seconds', 0):.0f} s."
    )


def markdown(records: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    out = [
        f"# {title(records, meta)}",
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
        if rec.get("rejudged"):
            out += [f"*Judged again:* {rec['rejudged']}", ""]
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
                + (f" (From a shipped model: {c['shipped_model']}.)" if c.get("shipped_model") else "")
            )
        for n in rec.get("notes", []):
            out.append(f"- {n}")
        for cite in rec.get("literature", []):
            out.append(f"- Literature (cited by the lecture, not reproduced): {cite['text']} ({cite['ref']})")
        for f in rec.get("figures", []):
            out += ["", f"![{Path(f).stem}]({f})"]
    return "\n".join(out) + "\n"
