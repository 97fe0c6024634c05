"""The report: for every claim, its bar and where the bar comes from, our measurement and the verdict.

A bar is the lecture's own number on a measurement (``lecture``) or restated (``arithmetic``), one of ours
on a measurement (``ours``, with the reason) or an identity of ours (``identity``), or our rule engine's
prediction held to the lecture's arithmetic (``prediction``: a check of ours, not a reproduction); the
summary counts the lecture's measured claims apart from the restated ones, which cannot fail, and from
the project's own checks; a lecture claim that is not ok says why.

    text.py      the plain-text table printed by ``gatepool reproduce`` and ``report.md``
    page.py      ``report.html``: one self-contained page (page.css, page.js inlined; figures base64)
    sections.py  which experiment goes under which of the lecture's sections
    dials.py     the page's interactive figures in Python (the browser tests hold the page to them)
    compare.py   two runs' claims side by side (``gatepool compare``)

``write_report(out, records, meta)`` writes ``results.json``, ``report.md`` and ``report.html`` into
``out``; ``write_pages`` rewrites the two pages only (``gatepool report RUN_DIR``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gatepool.lab.report.page import html_page
from gatepool.lab.report.text import (
    HEADER,
    SOURCE_NAMES,
    claim_rows,
    counts_text,
    fmt,
    headline,
    markdown,
    summary,
    table,
    tolerance,
)
from gatepool.utils.io import atomic_write_json, atomic_write_text


def write_pages(out: str | Path, records: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Path]:
    """Write report.md and report.html into ``out`` (figures read from ``out``); returns their paths."""
    out = Path(out)
    return {
        "markdown": atomic_write_text(out / "report.md", markdown(records, meta)),
        "html": atomic_write_text(out / "report.html", html_page(records, meta, out)),
    }


def write_report(out: str | Path, records: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Path]:
    """Write results.json, report.md and report.html into ``out``; returns their paths."""
    out = Path(out)
    results = atomic_write_json(out / "results.json", {"meta": meta, "experiments": records})
    return {"results": results, **write_pages(out, records, meta)}


__all__ = ["HEADER", "SOURCE_NAMES", "claim_rows", "counts_text", "fmt", "headline", "html_page", "markdown",
           "summary", "table", "tolerance", "write_pages", "write_report"]
