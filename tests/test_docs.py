"""The docs' code runs as written (so it cannot rot): every ``python`` block of README.md and docs/**.md.
The README's verdict counts are the committed runs', its links resolve, and it stays short.

A block whose first line is ``# needs gatepool[vision]`` needs torchvision: it runs in ``make
test-vision`` (this file runs there too) and skips elsewhere. Each block runs in a fresh namespace, in
the test's temporary folder, so figures and runs land there.
"""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
VISION = "# needs gatepool[vision]"  # the first line of a block that needs torchvision (make test-vision)
# (page, vision): what its blocks must print, and files they must write, beyond running without an error
EXPECT = {
    ("README.md", False): {"writes": ["probe-figures"]},
    ("README.md", True): {"prints": ["[('maxpool', 'MaxPool2d', 'SoftPool2d'), "
                                     "('avgpool', 'AdaptiveAvgPool2d', 'GlobalGatedPool2d')]"]},
    ("docs/gates.md", False): {"writes": ["probe-figures"]},
    ("docs/gates.md", True): {"prints": ["('maxpool', 'MaxPool2d', 'SoftPool2d')", "GlobalGatedPool2d",
                                         "69 of 69 rows predicted"],
                              "writes": ["runs/resnet18-soft/results.json"]},
    ("docs/probe.md", False): {"prints": ["(output)"], "writes": ["probe-figures"]},
    ("docs/training.md", False): {"prints": ["test_acc"], "writes": ["runs/soft-s0/results.json"]},
    ("docs/symmetry.md", False): {"prints": ["GIN: Permutations(9): pass"]},
}


def name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def python_blocks(page: Path, vision: bool) -> list[str]:
    blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    return [b for b in blocks if b.startswith(VISION) == vision]


def pages_with_blocks(vision: bool) -> list:
    return [pytest.param(p, id=name(p)) for p in PAGES if python_blocks(p, vision)]


def run_blocks(page: Path, vision: bool, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    for code in python_blocks(page, vision):
        exec(compile(code, str(page), "exec"), {})
    printed = capsys.readouterr().out
    expect = EXPECT.get((name(page), vision), {})
    for text in expect.get("prints", []):
        assert text in printed, f"{name(page)} did not print {text!r}"
    for path in expect.get("writes", []):
        assert (tmp_path / path).exists(), f"{name(page)} did not write {path}"


def test_every_expectation_has_its_blocks():
    assert python_blocks(README, vision=False) and python_blocks(README, vision=True)
    for page, vision in EXPECT:
        assert python_blocks(ROOT / page, vision), (page, vision)


@pytest.mark.slow
@pytest.mark.parametrize("page", pages_with_blocks(vision=False))
def test_python_blocks_run(page, tmp_path, monkeypatch, capsys):
    run_blocks(page, False, tmp_path, monkeypatch, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("page", pages_with_blocks(vision=True))
def test_vision_blocks_run(page, tmp_path, monkeypatch, capsys):
    pytest.importorskip("torchvision")
    run_blocks(page, True, tmp_path, monkeypatch, capsys)


def test_readme_is_short():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 250


def test_readme_links_resolve():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    local = [link for link in links if "://" not in link]
    assert len(local) >= 15
    for link in local:
        assert (ROOT / link).is_file(), link
    pages = {name(p) for p in PAGES} - {"README.md"}
    assert pages <= set(local), f"pages the README does not link: {sorted(pages - set(local))}"


def counts(summary: dict, restated: str = "") -> str:
    """'35 ok of 47 measured (10 off, 2 undecided)', zero counts left out; a restated source by its count
    and ``restated`` (the word for it): '49 restated (48 ok, 1 off)'."""
    if restated:
        shown = ", ".join(f"{n} {v}" for v, n in summary.items() if n)
        return f"{sum(summary.values())} {restated} ({shown})"
    rest = ", ".join(f"{n} {v}" for v, n in summary.items() if n and v != "ok")
    return f"{summary.get('ok', 0)} ok of {sum(summary.values())} measured" + (f" ({rest})" if rest else "")


def paragraph(text: str, start: str) -> str:
    """The paragraph (or list item) that ``start`` opens, bold marks dropped, whitespace as single spaces."""
    at = text.index(start)
    return " ".join(re.split(r"\n\s*\n|\n- ", text[at:])[0].replace("**", "").split())


@pytest.mark.parametrize("page", [README, ROOT / "docs" / "reproduce.md"], ids=name)
@pytest.mark.parametrize("profile", ["quick", "full"])
def test_verdict_counts_are_the_committed_runs(page, profile):
    meta = json.loads((ROOT / "results" / profile / "results.json").read_text(encoding="utf-8"))["meta"]
    text = paragraph(page.read_text(encoding="utf-8"), f"**{profile.capitalize()} profile** (")
    summary = meta["summary"]
    # the measured count first, the restated one beside it and never in it
    for label, kind in (("lecture's claims", "lecture"), ("our own checks", "ours")):
        expected = re.escape(counts(summary[kind]))
        assert re.search(rf"{label}:? {expected}(?!,? \d)", text), (label, expected, text)
    for kind, word in (("arithmetic", "restated"), ("identity", "identities")):
        expected = re.escape(counts(summary[kind], restated=word))
        assert re.search(rf"(?<![\d.]){expected}", text), (kind, expected, text)
    expected = re.escape(counts(summary["prediction"]).replace(" measured", ""))
    assert re.search(rf"prediction checks:? {expected}(?!,? \d)", text), ("prediction", expected, text)
    if page == README:
        env = meta["environment"]
        processor = env["processor"].replace("(R)", "").replace(" Processor", "")
        for fact in (processor, f"Python {env['python']}", f"torch {env['torch']}"):
            assert fact in text, fact


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("needs the docs extra (make docs installs it)")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "api" / "layers" / "index.html").is_file()
