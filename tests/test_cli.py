"""CLI smoke: the commands a user types first."""

import json
import subprocess
import sys

from gatepool.cli import main


def test_help_runs_as_module_and_lists_commands():
    out = subprocess.run(
        [sys.executable, "-m", "gatepool", "--help"], capture_output=True, text=True, check=True
    )
    for cmd in ("reproduce", "run", "list", "train", "probe", "data", "bench"):
        assert cmd in out.stdout


def test_data_info_finds_the_shipped_mnist(capsys):
    assert main(["data", "info", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    mnist = [r for r in rows if r["dataset"] == "mnist"]
    assert len(mnist) == 4 and all(r["verified"] for r in mnist)
    assert main(["data", "info"]) == 0
    assert "search order" in capsys.readouterr().out


def test_list_shows_experiments_with_claims(capsys):
    assert main(["list", "--json"]) == 0
    listed = {e["name"]: e for e in json.loads(capsys.readouterr().out)}
    assert "sqrt-d" in listed and "std-d16" in listed["sqrt-d"]["claims"]


def test_unknown_argument_is_an_error():
    import pytest

    with pytest.raises(SystemExit):
        main(["data", "info", "--bogus"])


def test_help_does_not_import_torch():
    code = "import sys, gatepool.cli; gatepool.cli.build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
