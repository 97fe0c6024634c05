"""CLI smoke: the commands a user types first."""

import json
import subprocess
import sys
from pathlib import Path

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
    assert all(r["rule"] == "repository" for r in mnist)
    assert main(["data", "info"]) == 0
    out = capsys.readouterr().out
    assert "search order: repository:" in out and "mnist: loaded from " in out and "(repository)" in out


def test_data_info_names_the_explicit_copy_or_what_it_looked_for(tmp_path, capsys):
    assert main(["data", "info", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"mnist: --data-dir {tmp_path}: no mnist files in {tmp_path / 'mnist'} or {tmp_path}" in out
    mnist = Path(__file__).resolve().parents[1] / "data" / "mnist"
    for f in mnist.glob("*.gz"):
        (tmp_path / f.name).symlink_to(f)
    assert main(["data", "info", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"mnist: loaded from {tmp_path} (explicit (--data-dir))" in out
    assert "fashion-mnist: loaded from" in out and "SHA-256 mismatch (it is mnist's" in out


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
