"""The README's code runs as written (so it cannot rot)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
VISION = "# needs gatepool[vision]"  # the first line of a block that needs torchvision (make test-vision)


def python_blocks(vision: bool) -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    return [b for b in blocks if b.startswith(VISION) == vision]


@pytest.mark.slow
def test_readme_python_blocks_run(tmp_path, monkeypatch):
    blocks = python_blocks(vision=False)
    assert blocks, "the README has no python example"
    monkeypatch.chdir(tmp_path)  # figures land in the test's folder
    for code in blocks:
        exec(compile(code, str(README), "exec"), {})
    assert (tmp_path / "probe-figures").is_dir()


@pytest.mark.slow
def test_readme_your_own_model_runs(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torchvision")
    blocks = python_blocks(vision=True)
    assert blocks, "the README has no 'your own model' example"
    monkeypatch.chdir(tmp_path)
    for code in blocks:
        exec(compile(code, str(README), "exec"), {})
    printed = capsys.readouterr().out
    assert "('maxpool', 'MaxPool2d', 'SoftPool2d')" in printed and "GlobalGatedPool2d" in printed
    assert "69 of 69 rows predicted" in printed
    assert (tmp_path / "runs" / "resnet18-soft" / "results.json").is_file()
