"""``gatepool bench probe`` needs torchvision: without it, one line and exit 2 (no traceback)."""

import importlib.util

from gatepool.cli import main


def test_bench_probe_without_torchvision_says_so_in_one_line(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torchvision" else real(name, *a)
    )
    assert main(["bench", "probe", "--quick"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs torchvision" in err[0] and "gatepool[vision]" in err[0]
