"""``gatepool bench step``'s refusals, each one line and exit 2 before anything is measured: torchvision
missing (it names the fix), and options out of range. The bench itself:
tests/vision/test_bench_step_resnet.py."""

import importlib.util

import pytest

from gatepool.cli import main


def test_bench_step_without_torchvision_says_so_in_one_line(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torchvision" else real(name, *a)
    )
    assert main(["bench", "step", "--quick", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bench step needs torchvision" in err[0]
    assert "pip install gatepool[vision]" in err[0]


@pytest.mark.parametrize(
    "args, says",
    [
        (["--gates", "soft,fancy"], "argument --gates: expected gates among max, avg, soft"),
        (["--gates", ","], "argument --gates"),
        (["--steps", "0"], "argument --steps: must be an integer >= 1"),
        (["--warmup", "0"], "argument --warmup: must be an integer >= 1"),
        (["--batch", "two"], "argument --batch"),
        (["--budget", "-1"], "argument --budget"),
    ],
)
def test_bench_step_refuses_bad_options_in_one_line(args, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "step", "--quick", *args])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_bench_step_help_says_what_the_cpu_default_is_and_why(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "step", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "resnet50 at 224" in text and "resnet18 at 112" in text and "ResNet-50's stem" in text
