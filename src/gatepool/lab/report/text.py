"""The report as text: for every claim, its bar and where the bar comes from, our measurement and the verdict.

A bar is the lecture's own number on a measurement that could come out otherwise (``lecture``), the
lecture's number restated (``arithmetic``: its own formula or torch's definition, checked, but it cannot
fail), one of ours on a measurement (``ours``, with the reason), an identity of ours that no correct torch
can fail (``identity``), or our rule engine's prediction held to the lecture's arithmetic (``prediction``:
a check of ours, not a reproduction). The headline counts the measured apart from the restated: "the
lecture's claims: N ok of M measured (...), K restated beside them (...)"; our own checks the same way.
A lecture claim that is not ok says why (:func:`miss_text`): its number does not reproduce, our setup
differs, or the spread is too wide to judge.

``table(records)`` is the plain-text table printed at the end of ``gatepool reproduce``;
``markdown(records, meta)`` is ``report.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gatepool.lab.claims import MISSES, RESTATED, VERDICTS


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
    "arithmetic": "the lecture's numbers restated",
    "ours": "our own measured checks",
    "identity": "our identities and definitions",
    "prediction": "prediction checks",
    "beyond": "beyond the lecture ('off': a finding about the question asked, not a failed check)",
}
# (measured source, the restated source counted beside it, the line's name, what the restated ones are)
PAIRS = (("lecture", "arithmetic", "the lecture's claims", "restated"),
         ("ours", "identity", "our own checks", "identities"))


def counts_text(counts: dict[str, int]) -> str:
    """'3 ok of 5 (1 off, 0 undecided, 1 not run)'."""
    rest = ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS if v != "ok")
    return f"{counts.get('ok', 0)} ok of {sum(counts.values())} ({rest})"


def restated_text(counts: dict[str, int], words: str = "") -> str:
    """A restated source by its count, since it cannot fail: '12 (12 ok)', '49 restated (48 ok, 1 off)'."""
    bad = [f"{counts[v]} {v}" for v in VERDICTS if v != "ok" and counts.get(v)]
    shown = [f"{counts.get('ok', 0)} ok", *bad]
    return f"{sum(counts.values())}{' ' + words if words else ''} ({', '.join(shown)})"


def source_text(src: str, counts: dict[str, int]) -> str:
    """One source's line: 'the lecture's measured claims: 3 ok of 5 (...)'; a restated source by its count
    ('... restated ...: 12 (12 ok)')."""
    name = SOURCE_NAMES.get(src, src)
    return f"{name}: {restated_text(counts) if src in RESTATED else counts_text(counts)}"


def pair_text(records: list[dict[str, Any]], measured: str, restated: str, name: str, word: str) -> str:
    """'the lecture's claims: 35 ok of 47 measured (10 off, 2 undecided, 0 not run), 49 restated beside
    them (48 ok, 1 off)': the measured count first, the restated one beside it, never in it."""
    m, r = summary(records, measured), summary(records, restated)
    parts = []
    if sum(m.values()):
        rest = ", ".join(f"{m.get(v, 0)} {v}" for v in VERDICTS if v != "ok")
        parts.append(f"{m.get('ok', 0)} ok of {sum(m.values())} measured ({rest})")
    if sum(r.values()):
        parts.append(restated_text(r, f"{word} beside them"))
    return f"{name}: {', '.join(parts)}" if parts else ""


def miss_text(c: dict[str, Any]) -> str:
    """Why a lecture claim is not ok, in words ('' for an ok claim or another source's): the category
    declared with the claim and how, an ``undecided`` verdict's own reason, or that none is stated."""
    if c.get("source") != "lecture" or c.get("verdict") == "ok":
        return ""
    if c.get("verdict") == "undecided":  # whatever was declared for a miss: this one could not be judged
        return MISSES["too wide"]
    if c.get("miss") in MISSES:
        return f"{MISSES[c['miss']]}: {c.get('miss_why', '')}"
    return "not stated"


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def title(records: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The pages' title: the lecture reproduced, or beyond the lecture when every claim is "beyond"."""
    sources = {c.get("source") for rec in records for c in rec.get("claims", [])}
    what = "beyond the lecture" if sources == {"beyond"} else "the lecture reproduced"
    return f"gatepool: {what} ({meta.get('profile')} profile)"


def headline(records: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """One sentence: profile, verdict counts (the measured apart from the restated), machine, Python and
    torch, total time."""
    env = meta.get("environment", {})
    paired = {s for pair in PAIRS for s in pair[:2]}
    present = {c.get("source") for rec in records for c in rec.get("claims", [])}
    parts = [text for pair in PAIRS if (text := pair_text(records, *pair))]
    parts += [source_text(src, summary(records, src))
              for src in SOURCE_NAMES
              if src in present and src not in paired]  # e.g. "beyond" only where a claim has it
    return (
        f"Profile {meta.get('profile')}: {'; '.join(parts)}."
        f" Machine: {env.get('processor')} ({env.get('cpu_count')} cores, {env.get('torch_threads')} torch"
        f" threads), Python {env.get('python')}, torch {env.get('torch')}."
        f" Total {meta.get('seconds', 0):.0f} s."
    )


def misses_md(records: list[dict[str, Any]]) -> list[str]:
    """The lecture's measured claims that are not ok, each with why (a list and a blank line; none: [])."""
    rows = [f"- **{rec['name']} / {c['id']}** ({c['verdict']}): {miss_text(c)}"
            for rec in records for c in rec.get("claims", []) if miss_text(c)]
    return ["The lecture's measured claims that are not ok, and why:", "", *rows, ""] if rows else []


def markdown(records: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    out = [
        f"# {title(records, meta)}",
        "",
        headline(records, meta),
        "",
        *misses_md(records),
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
                + (f" Why not ok: {miss_text(c)}." if miss_text(c) else "")
                + (f" (From a shipped model: {c['shipped_model']}.)" if c.get("shipped_model") else "")
            )
        for n in rec.get("notes", []):
            out.append(f"- {n}")
        for cite in rec.get("literature", []):
            out.append(f"- Literature (cited by the lecture, not reproduced): {cite['text']} ({cite['ref']})")
        for f in rec.get("figures", []):
            out += ["", f"![{Path(f).stem}]({f})"]
    return "\n".join(out) + "\n"
