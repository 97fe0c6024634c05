"""The worked examples of Project 2's symmetry test: for every network on the course's list, its own test
passes in float32 and float64 to rounding, its baseline's fails in both, and the tester tells them apart by
a clear margin (the baseline's relative error at least 1000× the network's, and over 1%)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from gatepool.analysis.symmetry import ConservationReport
from gatepool.analysis.symmetry.examples import EXAMPLES
from gatepool.utils.threads import num_threads


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_network_passes_and_its_baseline_fails(name):
    with num_threads(1):  # tiny models: one thread is fastest on a busy machine
        network, baseline = importlib.import_module(f"gatepool.analysis.symmetry.examples.{name}").reports()
    assert network and baseline
    for report in network:
        assert report.ok, str(report)
    for report in baseline:
        assert not report.ok, str(report)
        if isinstance(report, ConservationReport):
            assert all(r.rel_drift > report.rtol for r in report.rows), str(report)
        else:  # every part fails in every dtype
            failing = {(r.dtype, r.part) for r in report.rows if not r.ok}
            assert failing == {(r.dtype, r.part) for r in report.rows}, str(report)
    # the network's first (own) test against the baseline's: a clear margin
    assert baseline[0].max_rel() > max(1e-2, 1000 * network[0].max_rel()), (str(network[0]), str(baseline[0]))


def test_every_example_is_listed_and_short():
    folder = Path(importlib.import_module("gatepool.analysis.symmetry.examples").__file__).parent
    files = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    assert files == sorted(EXAMPLES)
    for stem in files:
        assert len((folder / f"{stem}.py").read_text(encoding="utf-8").splitlines()) <= 100, stem


def test_the_docs_show_every_example_as_it_is():
    docs = Path(__file__).resolve().parents[2] / "docs" / "symmetry.md"
    blocks = re.findall(r"^```python\n(.*?)^```", docs.read_text(encoding="utf-8"), flags=re.S | re.M)
    folder = Path(importlib.import_module("gatepool.analysis.symmetry.examples").__file__).parent
    for name in EXAMPLES:
        assert (folder / f"{name}.py").read_text(encoding="utf-8") in blocks, f"docs/symmetry.md: {name}.py"
