"""The report page in a real browser (headless Chromium; see conftest.py): no console errors, the
navigation, the τ slider, the √d dial, the padding map and the attention explorer against their Python
values (lab/report/dials.py), the verdict filter, printing, and a screenshot at a laptop's size.

The screenshots land in the test's tmp folder; ``GATEPOOL_SCREENSHOTS=DIR`` also copies those of the
committed reports there (``GATEPOOL_SCREENSHOTS=docs`` refreshes the README's).
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from gatepool.lab.common.soft_window import printed
from gatepool.lab.report import html_page, summary
from gatepool.lab.report.dials import explorer_readout, padding_map, sqrt_d_dial, tau_dial

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"

pytestmark = pytest.mark.slow  # a browser start and a page load: seconds


def first_test_digit(label: int = 7) -> tuple[list[list[float]], int]:
    from gatepool.data import load_dataset

    test = load_dataset("mnist", "test")
    i = int((test.labels == label).nonzero().flatten()[0])
    return (test.images[i].float() / 255).round(decimals=3).tolist(), i


def explorer_rows(image: list[list[float]], grid=(12, 12)) -> list[list[float]]:
    """Synthetic gate rows in the explorer's schema: a query looks near itself and at the ink."""
    gh, gw = grid
    img = np.asarray(image)
    ink = img[2 : 2 + 2 * gh, 2 : 2 + 2 * gw].reshape(gh, 2, gw, 2).mean((1, 3)).reshape(-1)  # (t,) ink
    r, c = np.divmod(np.arange(gh * gw), gw)
    logits = -((r[:, None] - r[None]) ** 2 + (c[:, None] - c[None]) ** 2) / 6.0 + 3.0 * ink[None]
    rows = np.exp(logits - logits.max(1, keepdims=True))
    return (rows / rows.sum(1, keepdims=True)).round(4).tolist()


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """The committed quick run's page, with an explorer record and one claim from a shipped model."""
    data = json.loads((RESULTS / "quick" / "results.json").read_text(encoding="utf-8"))
    records = copy.deepcopy(data["experiments"])
    for rec in records:  # the committed run's own shipped-model marks off: the one below is the only one
        rec.pop("pretrained", None)
        for c in rec["claims"]:
            c.pop("shipped_model", None)
    maps = next(r for r in records if r["name"] == "attention-maps")
    image, index = first_test_digit()
    maps["data"]["explorer"] = {"image": image, "grid": [12, 12], "rows": explorer_rows(image), "label": 7,
                                "seed": 0, "model": f"synthetic rows on test digit #{index} (a test)"}
    maps["claims"][0]["shipped_model"] = "conv_attention seed 0"
    path = tmp_path_factory.mktemp("page") / "report.html"
    path.write_text(html_page(records, data["meta"], RESULTS / "quick"), encoding="utf-8")
    return path, records


@pytest.fixture(scope="module")
def opened(browser, page):
    browser.open(page[0])
    return browser, page[1]


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_loads_without_console_errors(opened):
    browser, _ = opened
    assert browser.evaluate("document.querySelectorAll('[data-widget]').length") == 4
    assert browser.errors() == []


def test_navigation_jumps_to_a_section(opened):
    browser, _ = opened
    browser.evaluate("window.scrollTo(0, 0)")
    x, y = browser.center("nav a[href='#sec-attention']")
    browser.mouse(x, y, "mousePressed")
    browser.mouse(x, y, "mouseReleased")
    assert browser.evaluate("location.hash") == "#sec-attention"
    top = browser.evaluate("document.getElementById('sec-attention').getBoundingClientRect().top")
    assert abs(top) < 2 and browser.evaluate("window.scrollY") > 1000


def _slide(browser, log10_tau: float) -> dict:
    browser.evaluate(f"(() => {{ const s = document.getElementById('tau-slider'); s.value = '{log10_tau}';"
                     "s.dispatchEvent(new Event('input')); })()")
    return browser.evaluate("Object.assign({}, document.getElementById('tau-out').dataset)")


def test_tau_slider_shows_softpool_at_1_and_the_max_at_001(opened):
    browser, records = opened
    window = next(r for r in records if r["name"] == "temperature-dial")["setup"]["window"]
    soft = next(c for r in records if r["name"] == "soft-gate" for c in r["claims"] if c["id"] == "soft-out")
    mx = next(c for r in records if r["name"] == "soft-gate" for c in r["claims"] if c["id"] == "max-out")
    for log10_tau, tau, lecture in [(0, 1.0, soft["bar"]), (-2, 0.01, mx["bar"])]:
        shown = _slide(browser, log10_tau)
        assert float(shown["tau"]) == pytest.approx(tau, rel=1e-12)
        py = tau_dial(window, tau)
        assert float(shown["out"]) == pytest.approx(py["out"], rel=1e-12)
        np.testing.assert_allclose(json.loads(shown["gates"]), py["gates"], rtol=1e-12, atol=1e-300)
        assert abs(float(shown["out"]) - lecture) <= printed(2)  # 8.85 (SoftPool), 9.11 (max)
    _slide(browser, 0)
    text = browser.evaluate("document.getElementById('tau-out').textContent")
    assert "out = softmax(v/τ) · v = 8.85" in text


@pytest.mark.parametrize("d", [1, 16, 256])
def test_sqrt_d_dial_matches_python(opened, d):
    browser, _ = opened
    browser.evaluate(f"(() => {{ const s = document.getElementById('sqrtd-d'); s.value = '{d}';"
                     "s.dispatchEvent(new Event('change')); })()")
    shown = {k: float(browser.evaluate(f"document.getElementById('sqrtd-{k}').dataset.value"))
             for k in ("std", "hard", "soft")}
    py = sqrt_d_dial(d, seed=0, queries=200, tokens=144)
    assert shown["std"] == pytest.approx(py["std"], rel=1e-9)
    assert shown["hard"] == pytest.approx(py["max_gate"], rel=1e-9)
    assert shown["soft"] == pytest.approx(py["max_gate_scaled"], rel=1e-9)


@pytest.mark.parametrize("kernel, padding", [(3, 1), (3, 0), (5, 2), (5, 1), (7, 3), (1, 0)])
def test_padding_map_matches_the_theory(opened, kernel, padding):
    browser, _ = opened
    shown = browser.evaluate(
        f"(() => {{ const k = document.getElementById('pad-k'), p = document.getElementById('pad-p');"
        f"k.value = '{kernel}'; p.value = '{padding}'; k.dispatchEvent(new Event('change'));"
        "return [...document.querySelectorAll('table.pmap tr')].map("
        "tr => [...tr.children].map(td => Number(td.dataset.v))); })()")
    np.testing.assert_allclose(shown, padding_map(14, kernel, padding), rtol=0, atol=1e-12)


def test_attention_explorer_follows_the_hovered_token(opened):
    browser, records = opened
    ex = next(r for r in records if r["name"] == "attention-maps")["data"]["explorer"]
    seen = []
    for r, c in [(2, 6), (10, 3)]:
        x, y = browser.center(f".explorer .tokens div[data-r='{r}'][data-c='{c}']")
        browser.mouse(x, y)  # a real pointer move: the token's mouseenter fires
        shown = browser.evaluate("Object.assign({}, document.getElementById('explorer-readout').dataset)")
        py = explorer_readout(ex, r, c)
        assert json.loads(shown["query"]) == [r, c] and json.loads(shown["key"]) == py["key"]
        assert float(shown["gate"]) == pytest.approx(py["gate"])
        assert float(shown["share"]) == pytest.approx(py["share"])
        seen.append((shown["key"], shown["gate"]))
    assert seen[0] != seen[1]
    assert browser.evaluate("document.querySelectorAll('.explorer .tokens div.q').length") == 1


def test_filter_shows_only_off_claims(opened):
    browser, records = opened
    browser.evaluate("document.querySelector(\"#filter input[value='off']\").click()")
    shown = browser.evaluate("[...document.querySelectorAll('tr.claim')].filter(tr => tr.offsetParent)"
                             ".map(tr => tr.dataset.verdict)")
    assert shown == ["off"] * summary(records)["off"]
    articles = browser.evaluate("document.querySelectorAll('article.experiment:not(.hidden)').length")
    assert articles == sum(1 for r in records if any(c["verdict"] == "off" for c in r["claims"]))
    browser.evaluate("document.querySelector(\"#filter input[value='all']\").click()")
    assert browser.evaluate("document.querySelectorAll('tr.claim.hidden').length") == 0


def test_badge_print_and_screenshot(opened, tmp_path):
    browser, records = opened
    assert browser.evaluate("document.querySelectorAll('.badge.shipped').length") == 1
    # printed: no navigation, no filter, the page full width, every claim row shown, several pages
    browser.send("Emulation.setEmulatedMedia", {"media": "print"})
    try:
        assert browser.evaluate("getComputedStyle(document.getElementById('nav')).display") == "none"
        assert browser.evaluate("getComputedStyle(document.getElementById('filter')).display") == "none"
        assert browser.evaluate("getComputedStyle(document.querySelector('main')).marginLeft") == "0px"
    finally:
        browser.send("Emulation.setEmulatedMedia", {"media": ""})
    pdf = base64.b64decode(browser.send("Page.printToPDF", {"printBackground": True})["data"])
    pages = len(re.findall(rb"/Type\s*/Page(?![s\w])", pdf))
    assert pdf.startswith(b"%PDF") and pages >= 10, pages
    browser.evaluate("window.scrollTo(0, 0)")
    shot = browser.screenshot(tmp_path / "report-laptop.png")
    assert png_size(shot) == (1366, 900)
    assert browser.errors() == []


@pytest.mark.parametrize("profile", ["quick", "full"])
def test_committed_reports_open_cleanly(browser, profile, tmp_path):
    path = RESULTS / profile / "report.html"
    browser.open(path)
    assert browser.evaluate("document.querySelectorAll('article.experiment').length") == len(
        json.loads((RESULTS / profile / "results.json").read_text())["experiments"])
    assert browser.errors() == []
    shot = browser.screenshot(tmp_path / f"report-{profile}.png")
    assert png_size(shot) == (1366, 900)
    browser.center("[data-widget='tau']")
    dial = browser.screenshot(tmp_path / f"report-{profile}-tau-dial.png")
    assert png_size(dial) == (1366, 900)
    dest = os.environ.get("GATEPOOL_SCREENSHOTS")
    if dest:
        Path(dest).mkdir(parents=True, exist_ok=True)
        for png in (shot, dial) if profile == "quick" else (shot,):  # the README shows one dial
            shutil.copyfile(png, Path(dest) / png.name)


def test_compare_page_filters_to_what_changed(browser, tmp_path):
    from gatepool.cli import main

    out = tmp_path / "compare.html"
    assert main(["compare", str(RESULTS / "quick"), str(RESULTS / "full"), "--out", str(out)]) == 0
    browser.open(out)
    x, y = browser.center("#only-changed")
    browser.mouse(x, y, "mousePressed")
    browser.mouse(x, y, "mouseReleased")
    shown = browser.evaluate("[...document.querySelectorAll('tr.claim')].filter(tr => tr.offsetParent)"
                             ".map(tr => tr.dataset.change)")
    total = browser.evaluate("document.querySelectorAll('tr.claim').length")
    assert shown and all(shown) and len(shown) < total
    assert browser.errors() == []
