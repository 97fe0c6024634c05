"""The README's code runs as written (so it cannot rot)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.slow
def test_readme_python_blocks_run(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    assert blocks, "the README has no python example"
    monkeypatch.chdir(tmp_path)  # figures land in the test's folder
    for code in blocks:
        exec(compile(code, str(README), "exec"), {})
    assert (tmp_path / "probe-figures").is_dir()
