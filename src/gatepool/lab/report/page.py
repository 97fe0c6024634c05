"""The report as one self-contained page: ``report.html`` (CSS, JavaScript and figures inline; no network,
opens from disk).

    summary (the lecture's claims: N ok of M measured, off / undecided / not run, K restated beside them;
             the restated ones, which cannot fail (the lecture's arithmetic, our identities), in a card
             of their own; the project's own measured checks apart; the extensions' "beyond the
             lecture" claims in a card of their own, only when the run has any)
    a filter (all | off | undecided | not run | all but ok) and a side navigation by the lecture's sections
    per experiment: each claim's statement, bar (the lecture's value, or ours, with its source), our value,
    the tolerance and its reason, the verdict (a lecture claim that is not ok: why); notes; figures; and
    four interactive figures (τ dial, √d dial, padding map, attention explorer) beside the experiments
    they belong to

The interactive figures are plain JavaScript (``page.js``, inlined): four small dials need no library,
and a vendored one would add weight to every page, a licence to carry and code nobody here reads; plain
JavaScript also runs from ``file://`` in any browser. Their arithmetic mirrors ``dials.py``.
"""

from __future__ import annotations

import base64
import html
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

from gatepool.lab.claims import RESTATED, VERDICTS
from gatepool.lab.report.dials import KERNELS, SQRT_D_CHOICES, TAU_RANGE
from gatepool.lab.report.sections import group
from gatepool.lab.report.text import (
    SOURCE_NAMES,
    counts_text,
    fmt,
    miss_text,
    restated_text,
    summary,
    title,
    tolerance,
)

esc = html.escape
VERDICT_CLASS = {"ok": "ok", "off": "off", "undecided": "undecided", "not run": "notrun"}
FILTERS = [("all", "all claims"), ("off", "only off"), ("undecided", "only undecided"),
           ("not run", "only not run"), ("bad", "all but ok")]


def asset(name: str) -> str:
    """The text of ``page.css`` / ``page.js`` (package data)."""
    return resources.files("gatepool.lab.report").joinpath(name).read_text(encoding="utf-8")


def _json_script(obj: Any) -> str:
    """``obj`` as an inline JSON block (``</`` escaped so no string can close the script)."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    return f"<script type='application/json' class='config'>{text}</script>"


def slug(name: str) -> str:
    return "exp-" + "".join(ch if ch.isalnum() or ch == "-" else "-" for ch in name)


# ----------------------------------------------------------------------------------------------- summary


APART = ("lecture", *RESTATED, "beyond")  # sources with a card of their own


def own_sources(records: list[dict[str, Any]]) -> list[str]:
    """The sources of the project's own measured checks (every source but the lecture's, the restated
    ones and the extensions' "beyond"), in a stable order."""
    seen = {c.get("source") for rec in records for c in rec.get("claims", [])}
    known = [s for s in SOURCE_NAMES if s not in APART]
    return known + sorted(s for s in seen - set(known) - set(APART) if s)


def _counts_html(counts: dict[str, int]) -> str:
    return "".join(
        f"<span class='n {VERDICT_CLASS[v]}' data-count='{v}'>{counts.get(v, 0)}</span>{v} "
        for v in VERDICTS
    )


def summary_html(records: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    env = meta.get("environment", {})
    lecture = summary(records, "lecture")
    own = {v: 0 for v in VERDICTS}
    lines = []
    for src in own_sources(records):
        c = summary(records, src)
        if sum(c.values()):
            lines.append(f"{esc(SOURCE_NAMES.get(src, src))}: {counts_text(c)}")
            for v in own:
                own[v] += c.get(v, 0)
    machine = (
        f"{env.get('processor')} ({env.get('cpu_count')} cores, {env.get('torch_threads')} torch threads), "
        f"Python {env.get('python')}, torch {env.get('torch')}, device {env.get('device', 'cpu')}"
    )
    beyond = summary(records, "beyond")
    beyond_card = (
        f"<div class='card' id='beyond-counts'><h3>Beyond the lecture</h3>{_counts_html(beyond)}"
        "<div class='why'>Each claim states that no gate differs from max pool: 'off' here means the gates "
        "differ (a finding, not a failure).</div></div>"
        if sum(beyond.values()) else ""
    )
    restated = {src: summary(records, src) for src in RESTATED}
    # a card only where its claims are in the report (``gatepool report --only gate-matters`` has none of
    # the lecture's)
    lecture_card = (
        f"<div class='card' id='lecture-counts'><h3>The lecture's claims: {lecture['ok']} ok of "
        f"{sum(lecture.values())} measured; {sum(restated['arithmetic'].values())} restated beside them</h3>"
        f"{_counts_html(lecture)}<div class='why'>Each measured claim runs our code on data or on a model "
        "and could come out otherwise; the restated ones are counted apart.</div></div>"
        if sum(lecture.values()) else ""
    )
    both = {v: sum(c.get(v, 0) for c in restated.values()) for v in VERDICTS}
    restated_card = (
        f"<div class='card' id='restated-counts'><h3>Restated, counted apart: {sum(both.values())}</h3>"
        f"{_counts_html(both)}<div class='why'>"
        + "; ".join(f"{esc(SOURCE_NAMES[src])}: {restated_text(c)}" for src, c in restated.items()
                    if sum(c.values()))
        + ". Checked, but no correct torch can fail them: the lecture's number computed from its own "
        "formula or torch's definition, a count fixed by construction, an identity for any weights. "
        "They are not counted as measurements.</div></div>"
        if sum(both.values()) else ""
    )
    own_card = (
        f"<div class='card' id='own-counts'><h3>The project's own measured checks: {own['ok']} ok of "
        f"{sum(own.values())}</h3>{_counts_html(own)}"
        f"<div class='why'>{'; '.join(lines)}</div></div>"
        if sum(own.values()) else ""
    )
    radios = "".join(
        f"<label><input type='radio' name='show' value='{v}'{' checked' if v == 'all' else ''}> {t}</label>"
        for v, t in FILTERS
    )
    return (
        f"<section id='summary'><p class='meta'>Profile <b>{esc(str(meta.get('profile')))}</b>, "
        f"{sum(len(r.get('claims', [])) for r in records)} claims in {len(records)} experiments, "
        f"{sum(r.get('seconds') or 0 for r in records):.0f} s of experiments (the last invocation, which "
        f"resumes finished ones: {meta.get('seconds', 0):.0f} s). Machine: {esc(machine)}. Every experiment "
        f"states its setup and seeds.</p><div class='cards'>"
        f"{lecture_card}{restated_card}{own_card}{beyond_card}</div>"
        f"<div id='filter'>Show: {radios}</div></section>"
    )


# ------------------------------------------------------------------------------------------------ claims


def bar_cell(c: dict[str, Any]) -> str:
    if c.get("basis") == "theory":
        return f"{esc(fmt(c.get('expected')))}<div class='why'>theory (the setup was changed)</div>"
    label = {"lecture": "lecture", "arithmetic": "lecture, restated (cannot fail)", "ours": "our bar",
             "identity": "our identity (cannot fail)", "prediction": "prediction"}.get(
        c.get("source") or "", c.get("source") or "?"
    )
    return f"{esc(fmt(c.get('bar')))}<div class='why'>{esc(label)}</div>"


def claim_row(c: dict[str, Any]) -> str:
    v = c.get("verdict", "not run")
    badges = f"<span class='badge'>{esc(str(c.get('source')))}</span>"
    if c.get("shipped_model"):
        badges += f"<span class='badge shipped'>from a shipped model: {esc(str(c['shipped_model']))}</span>"
    note = f"<div class='note'>Note: {esc(str(c['note']))}</div>" if c.get("note") else ""
    if miss_text(c):
        note += f"<div class='miss'>Why not ok: {esc(miss_text(c))}</div>"
    return (
        f"<tr class='claim v-{VERDICT_CLASS.get(v, 'notrun')}' data-verdict='{esc(v)}' "
        f"data-id='{esc(c['id'])}'>"
        f"<td><code>{esc(c['id'])}</code><br>{badges}</td>"
        f"<td>{esc(c.get('statement', ''))}<div class='ref'>{esc(str(c.get('ref', '')))}</div>{note}</td>"
        f"<td class='num'>{bar_cell(c)}</td><td class='num'>{esc(fmt(c.get('measured')))}</td>"
        f"<td>{esc(tolerance(c))}<div class='why'>{esc(c.get('why') or '')}</div></td>"
        f"<td class='verdict'>{esc(v)}</td></tr>"
    )


def figure_html(out: Path, f: str) -> str:
    """A figure of the record embedded as a data URL; one whose path leaves ``out`` (an untrusted
    results.json naming "../../etc/passwd") is refused and shown as missing."""
    path = (out / f).resolve()
    if not path.is_relative_to(out.resolve()) or not path.is_file():
        return (
            f"<p class='note'>figure {esc(f)} is missing from {esc(str(out))}; "
            f"`gatepool reproduce --force --only …` draws it again</p>"
        )
    b64 = base64.b64encode(path.read_bytes()).decode("ascii")
    return (
        f"<figure><img alt='{esc(path.stem)}' src='data:image/png;base64,{b64}'>"
        f"<figcaption>{esc(f)}</figcaption></figure>"
    )


def experiment_html(rec: dict[str, Any], out: Path) -> str:
    parts = [f"<article class='experiment' id='{slug(rec['name'])}'>",
             f"<h3><code>{esc(rec['name'])}</code>: {esc(rec.get('title', ''))}</h3>"]
    if rec.get("pretrained"):
        shipped = ", ".join(f"{esc(n)} (sha256 {esc(str(h))[:12]}…)" for n, h in rec["pretrained"].items())
        parts.append(f"<p><span class='badge shipped'>from a shipped model</span> {shipped}</p>")
    if rec.get("status") != "complete":
        parts.append(f"<p class='status'><b>{esc(str(rec.get('status', 'not run')))}</b> "
                     f"{esc(str(rec.get('error') or ''))}</p>")
    if rec.get("rejudged"):
        parts.append(f"<p class='note'>Judged again: {esc(str(rec['rejudged']))}</p>")
    if "setup" in rec:
        setup = ", ".join(f"{k}={fmt(v)}" for k, v in rec["setup"].items())
        parts.append(f"<p class='setup'>{esc(str(rec.get('profile')))} profile, "
                     f"{rec.get('seconds', 0):.1f} s. Setup: {esc(setup)}</p>")
    if rec.get("claims"):
        parts.append("<table class='claims'><thead><tr><th>claim</th><th>statement</th><th>bar</th>"
                     "<th>ours</th><th>tolerance</th><th>verdict</th></tr></thead><tbody>")
        parts += [claim_row(c) for c in rec["claims"]]
        parts.append("</tbody></table>")
    if rec.get("notes"):
        parts.append("<ul class='notes'>" + "".join(f"<li>{esc(n)}</li>" for n in rec["notes"]) + "</ul>")
    if rec.get("literature"):
        parts.append("<ul class='literature'>" + "".join(
            f"<li><span class='badge'>literature</span> {esc(c['text'])} <span class='ref'>({esc(c['ref'])})"
            "</span> (cited by the lecture, not reproduced)</li>" for c in rec["literature"]) + "</ul>")
    widget = WIDGETS.get(rec["name"])
    if widget:
        parts.append(widget(rec))
    parts += [figure_html(out, f) for f in rec.get("figures", [])]
    parts.append("</article>")
    return "\n".join(parts)


# ----------------------------------------------------------------------------------- interactive figures


def tau_widget(rec: dict[str, Any]) -> str:
    window = rec.get("setup", {}).get("window")
    if not window:
        return ""
    lo, hi = TAU_RANGE
    return (
        "<div class='widget' data-widget='tau'><h4>The τ dial</h4>"
        "<p class='why'>The lecture's window v (ln of its printed e^v). Slide τ: the gates are softmax(v/τ), "
        "the output softmax(v/τ) · v: the max as τ → 0, SoftPool at τ = 1, the mean as τ → ∞.</p>"
        f"τ = <b id='tau-value'></b> <input type='range' id='tau-slider' min='{math.log10(lo):g}' "
        f"max='{math.log10(hi):g}' step='0.01' value='0' style='width:320px' aria-label='log10 tau'>"
        "<div class='bars'></div><div class='barlabel'></div><p class='readout' id='tau-out'></p>"
        f"{_json_script({'window': window})}</div>"
    )


def sqrt_d_widget(rec: dict[str, Any]) -> str:
    tokens = rec.get("setup", {}).get("tokens", 144)
    options = "".join(f"<option value='{d}'{' selected' if d == 64 else ''}>{d}</option>"
                      for d in SQRT_D_CHOICES)
    bars = {c["id"]: c.get("lecture") for c in rec.get("claims", [])}  # the record's own lecture values
    lecture = {str(d): [bars.get(f"std-d{d}"), bars.get(f"max-gate-d{d}"), bars.get(f"max-gate-scaled-d{d}")]
               for d in SQRT_D_CHOICES}
    cfg = {"queries": 200, "tokens": tokens,
           "lecture": {d: v for d, v in lecture.items() if None not in v}}
    return (
        "<div class='widget' data-widget='sqrtd'><h4>The √d dial</h4>"
        f"<p class='why'>Sampled in this page: 200 queries, each against {tokens} keys, entries N(0, 1) "
        "(a seeded counter-based generator; not the experiment's torch sample, so its digits differ a "
        "little from the table above).</p>"
        f"d = <select id='sqrtd-d'>{options}</select> seed <input id='sqrtd-seed' type='number' min='0' "
        "value='0' style='width:70px'>"
        "<p class='readout'>std of q·k: <b id='sqrtd-std'></b> (theory √d = <span id='sqrtd-theory'></span>)"
        "<br>mean largest gate of softmax(q·k): <b id='sqrtd-hard'></b>"
        "<br>mean largest gate of softmax(q·k/√d): <b id='sqrtd-soft'></b></p>"
        "<div class='hist'></div><div class='why' id='sqrtd-range'></div>"
        f"{_json_script(cfg)}</div>"
    )


def padding_widget(rec: dict[str, Any]) -> str:
    setup = rec.get("setup", {})
    size, k0 = int(setup.get("size", 14)), int(setup.get("kernel", 3))
    ks = "".join(f"<option value='{k}'{' selected' if k == k0 else ''}>{k}×{k}</option>" for k in KERNELS)
    ps = "".join(f"<option value='{p}'{' selected' if p == k0 // 2 else ''}>{p}</option>" for p in range(4))
    return (
        "<div class='widget' data-widget='padding'><h4>The padding map</h4>"
        f"<p class='why'>The theory's map on a {size}×{size} input: each output's share N/k² of the k² taps "
        "that land on real inputs (zero padding adds nothing), i.e. its variance relative to the middle.</p>"
        f"kernel <select id='pad-k'>{ks}</select> padding <select id='pad-p'>{ps}</select>"
        "<p class='readout' id='pad-readout'></p><table class='pmap'></table>"
        f"{_json_script({'size': size})}</div>"
    )


def explorer_widget(rec: dict[str, Any]) -> str:
    ex = (rec.get("data") or {}).get("explorer")
    head = "<div class='widget'{attr}><h4>The attention explorer</h4>"
    if not ex:
        return (head.format(attr=" id='explorer-absent'") + "<p class='why'>This run has no saved gate rows "
                "(its attention-maps record carries no <code>data.explorer</code>), so there is nothing to "
                "explore here; the figures below show the maps it drew.</p></div>")
    gh, gw = ex["grid"]
    cfg = {"explorer": ex, "k": 3, "start": [gh // 2, gw // 2]}
    return (
        head.format(attr=" data-widget='explorer'")
        + f"<p class='why'>Test digit (label {esc(str(ex.get('label')))}), {esc(str(ex.get('model')))}, seed "
        f"{esc(str(ex.get('seed')))}. Hover a token of the {gh} × {gw} grid (each drawn over the centre of "
        "the patch it sees): red shows that query's gate over every key token, its row of "
        "softmax(QKᵀ/√d).</p>"
        "<div class='explorer'><canvas class='digit'></canvas><canvas class='heat'></canvas>"
        "<div class='tokens'></div></div><p class='readout' id='explorer-readout'></p>"
        f"{_json_script(cfg)}</div>"
    )


WIDGETS = {"temperature-dial": tau_widget, "sqrt-d": sqrt_d_widget, "padding-map": padding_widget,
           "attention-maps": explorer_widget}


# --------------------------------------------------------------------------------------------------- page


def nav_html(grouped: list[tuple[str, str, list[dict[str, Any]]]]) -> str:
    items = []
    for sid, heading, recs in grouped:
        sub = []
        for rec in recs:
            c = summary([rec])
            dots = "".join(f"<span class='dot {VERDICT_CLASS[v]}'>{c[v]} {v}</span>"
                           for v in ("off", "undecided", "not run") if c.get(v))
            sub.append(f"<li class='exp'><a href='#{slug(rec['name'])}'><span>{esc(rec['name'])}</span>"
                       f"<span>{dots}</span></a></li>")
        items.append(f"<li class='sec'><a href='#sec-{sid}'>{esc(heading)}</a><ul>{''.join(sub)}</ul></li>")
    return f"<nav id='nav'><h2>The lecture's sections</h2><ul>{''.join(items)}</ul></nav>"


def html_page(records: list[dict[str, Any]], meta: dict[str, Any], out: str | Path) -> str:
    """The whole page: summary, filter, navigation, experiments by section, interactive figures."""
    out = Path(out)
    grouped = group(records)
    body = []
    for sid, heading, recs in grouped:
        body.append(f"<section class='lecture-section' id='sec-{sid}'>"
                    f"<h2 class='section'>{esc(heading)}</h2>")
        body += [experiment_html(rec, out) for rec in recs]
        body.append("</section>")
    name = title(records, meta)
    return "\n".join([
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<link rel='icon' href='data:,'><title>{esc(name)}</title>",
        f"<style>{asset('page.css')}</style></head>",
        "<body>", nav_html(grouped), "<main>", f"<h1>{esc(name)}</h1>", summary_html(records, meta),
        *body, "</main>", f"<script>{asset('page.js')}</script>", "</body></html>",
    ])
