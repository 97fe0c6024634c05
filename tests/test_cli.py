"""CLI smoke: the commands a user types first."""

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gatepool.cli import main

SRC = str(Path(__file__).resolve().parents[1] / "src")


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


def test_data_fetch_and_generate_take_exactly_the_package_sets(capsys):
    """The parser's lists are written out (``--help`` must not import torch): they must match the package."""
    from gatepool.cli import build_parser
    from gatepool.data import DATASETS, GENERATED, ROTATED, dataset_names

    parser = build_parser()
    for action, names in (("fetch", list(DATASETS)), ("generate", [*GENERATED, *ROTATED])):
        for name in dataset_names():
            if name in names:
                assert parser.parse_args(["data", action, name]).name == name
            else:
                with pytest.raises(SystemExit):
                    parser.parse_args(["data", action, name])
    capsys.readouterr()


def test_list_shows_experiments_with_claims(capsys):
    assert main(["list", "--json"]) == 0
    listed = {e["name"]: e for e in json.loads(capsys.readouterr().out)}
    assert "sqrt-d" in listed and "std-d16" in listed["sqrt-d"]["claims"]


def test_unknown_argument_is_an_error():
    with pytest.raises(SystemExit):
        main(["data", "info", "--bogus"])


def test_help_does_not_import_torch():
    code = "import sys, gatepool.cli; gatepool.cli.build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_train_refuses_a_corrupt_file_in_the_explicit_folder(tmp_path, capsys):
    """The repository's good copy is not a fallback: the file named by --data-dir is refused, by name."""
    import gzip

    mnist = Path(__file__).resolve().parents[1] / "data" / "mnist"
    for f in mnist.glob("*.gz"):
        (tmp_path / f.name).symlink_to(f)
    bad = tmp_path / "t10k-labels-idx1-ubyte.gz"
    raw = bytearray(gzip.decompress(bad.read_bytes()))
    raw[-1] ^= 1  # one label changed: the header still fits, the SHA-256 does not
    bad.unlink()
    bad.write_bytes(gzip.compress(bytes(raw)))
    argv = [
        "train",
        "--data-dir",
        str(tmp_path),
        "--epochs",
        "1",
        "--train-size",
        "100",
        "--test-size",
        "100",
    ]
    code, err = run_main(argv, capsys)
    assert code == 1 and "Traceback" not in err
    assert err.startswith(f"error: {bad}: SHA-256") and "leave out --data-dir" in err


# ----------------------------------------------------------------------------- bad input: exit 2, one line

T = ["train", "--epochs", "1", "--train-size", "100", "--test-size", "100", "--quiet"]

# (arguments, what the one line must contain: the argument's name, then the allowed values or range).
# FILE stands for an existing file; the run/reproduce cases use the private experiment "toy".
BAD_INPUT = [
    (T + ["--model", "nosuch"], ["--model", "residual_cnn"]),
    (T + ["--pool", "nosuch"], ["--pool", "soft"]),
    (T + ["--model", "conv_attention", "--pool", "max"], ["--pool", "takes attention"]),
    (T + ["--data", "cifar10"], ["--data", "fashion-mnist"]),
    (T + ["--data-dir", "/nonexistent/gatepool"], ["--data-dir", "no such folder"]),
    (T + ["--epochs", "0"], ["--epochs", ">= 1"]),
    (T + ["--epochs", "-3"], ["--epochs", ">= 1"]),
    (T + ["--epochs", "two"], ["--epochs", ">= 1"]),
    (T + ["--batch-size", "0"], ["--batch-size", ">= 1"]),
    (T + ["--batch-size", "101"], ["--batch-size", "choose 1 to 100"]),
    (["train", "--epochs", "1", "--batch-size", "60001"], ["--batch-size", "choose 1 to 60000"]),
    (T + ["--lr", "nan"], ["--lr", "(0, inf)"]),
    (T + ["--lr", "-0.1"], ["--lr", "(0, inf)"]),
    (T + ["--lr", "0"], ["--lr", "(0, inf)"]),
    (T + ["--lr", "inf"], ["--lr", "(0, inf)"]),
    (T + ["--momentum", "1.5"], ["--momentum", "[0, 1)"]),
    (T + ["--weight-decay", "-1"], ["--weight-decay", "[0, inf)"]),
    (T + ["--warmup", "2"], ["--warmup", "[0, 1)"]),
    (T + ["--label-smoothing", "nan"], ["--label-smoothing", "[0, 1)"]),
    (T + ["--optimizer", "sgdd"], ["--optimizer", "adamw"]),
    (T + ["--schedule", "linear"], ["--schedule", "cosine"]),
    (T + ["--seed", "-1"], ["--seed", ">= 0"]),
    (T + ["--threads", "0"], ["--threads", ">= 1"]),
    (T + ["--channels-last", "maybe"], ["--channels-last", "auto"]),
    (T + ["--train-size", "0"], ["--train-size", "'all' or an integer >= 1"]),
    (T + ["--train-size", "60001"], ["--train-size", "choose 1 to 60000"]),
    (T + ["--test-size", "10001"], ["--test-size", "choose 1 to 10000"]),
    (T + ["--model-kwargs", "{width: 64"], ["--model-kwargs", "JSON object"]),
    (T + ["--model-kwargs", "[1, 2]"], ["--model-kwargs", "JSON object"]),
    (T + ["--model-kwargs", '{"nosuch": 1}'], ["--model-kwargs", "takes pool, width"]),
    (T + ["--out", "FILE"], ["--out", "is a file"]),
    (T + ["--out", "FILE/run"], ["--out", "is a file"]),
    (T + ["--bogus"], ["--bogus", "unrecognized"]),
    (["run", "nosuch"], ["experiment", "toy"]),
    (["run"], ["name", "required"]),
    (["run", "toy", "--set", "n"], ["--set", "KEY=VALUE"]),
    (["run", "toy", "--set", "=3"], ["--set", "KEY=VALUE"]),
    (["run", "toy", "--set", "bogus=1"], ["--set", "it has n, seed"]),
    (["run", "toy", "--set", "n=abc"], ["--set", "expected int"]),
    (["run", "toy", "--n"], ["--set", "expected int"]),
    (["run", "toy", "stray"], ["'stray'", "--set KEY=VALUE"]),
    (["run", "toy", "--profile", "huge"], ["--profile", "quick"]),
    (["run", "toy", "--jobs", "0"], ["--jobs", ">= 1"]),
    (["run", "toy", "--seed", "-2"], ["--seed", ">= 0"]),
    (["run", "toy", "--out", "FILE"], ["--out", "is a file"]),
    (["reproduce", "--only", "nosuch"], ["--only", "toy"]),
    (["reproduce", "--out", "FILE"], ["--out", "is a file"]),
    (["reproduce", "--jobs", "-1"], ["--jobs", ">= 1"]),
    (["reproduce", "--profile", "slow"], ["--profile", "full"]),
    (["probe", "--batch", "0"], ["--batch", ">= 1"]),
    (["probe", "--batch", "60001"], ["--batch", "choose 1 to 60000"]),
    (["probe", "--model", "nosuch"], ["--model", "residual_cnn"]),
    (["probe", "--pool", "nosuch"], ["--pool", "soft"]),
    (["probe", "--data", "cifar10"], ["--data", "noise"]),
    (["probe", "--data", "noise", "--out", "FILE"], ["--out", "is a file"]),
    (["probe", "--backward", "up"], ["--backward", "unit-noise"]),
    (["data", "fetch", "imagenet"], ["name", "fashion-mnist"]),
    (["data", "fetch", "mnist", "--dest", "FILE"], ["--dest", "is a file"]),
    (["data"], ["ACTION", "required"]),
    (["bench", "train", "--threads", "0"], ["--threads", ">= 1"]),
    (["bench", "train", "--out", "DIR"], ["--out", "is a folder"]),
    (["bench", "flops"], ["BENCH", "attention"]),
    (["nosuch"], ["COMMAND", "reproduce"]),
]


@pytest.fixture
def toy(monkeypatch):
    """A private registry holding one experiment, 'toy', that records that it ran."""
    import gatepool.lab.experiments  # noqa: F401  (the real ones register in the real registry first)
    from gatepool.lab import claims

    monkeypatch.setattr(claims, "_REGISTRY", {})  # the experiment files are imported already: not re-declared
    ran = []

    @claims.experiment("toy", title="toy", order=1, setup={"n": 1, "seed": 0},
                       claims=[claims.Claim("n", "n is n", 1, 0, source="ours", ref="a test")])  # fmt: skip
    def toy_fn(ctx):
        ran.append(ctx["n"])
        ctx.check("n", ctx["n"])

    return ran


def run_main(argv, capsys):
    """``main(argv)`` in-process: (exit status, stderr)."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse
        code = e.code
    return code, capsys.readouterr().err


def _case_id(argv: list[str]) -> str:
    return " ".join(["train", *argv[len(T) :]] if argv[: len(T)] == T else argv)


@pytest.mark.parametrize("argv, wanted", BAD_INPUT, ids=[_case_id(a) for a, _ in BAD_INPUT])
def test_bad_input_exits_2_with_one_line_naming_the_argument(argv, wanted, toy, tmp_path, capsys):
    (tmp_path / "FILE").write_text("not a folder")
    (tmp_path / "DIR").mkdir()
    argv = [str(tmp_path / a) if a.split("/")[0] in ("FILE", "DIR") else a for a in argv]
    if argv[0] in ("run", "reproduce") and "--out" not in argv:
        argv += ["--out", str(tmp_path / "runs")]
    code, err = run_main(argv, capsys)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err and lines[0].startswith("gatepool")
    for text in wanted:
        assert text in lines[0], lines[0]
    assert toy == [] and not (tmp_path / "runs").exists()  # refused before anything ran or was written


@pytest.mark.slow
def test_bad_input_as_a_process(tmp_path):
    """The same through ``python -m gatepool``: the real exit status, nothing on stdout, no traceback."""
    env = {**os.environ, "PYTHONPATH": SRC}
    (tmp_path / "f").write_text("")
    for argv, flag in [
        (["train", "--lr", "nan"], "--lr"),
        (["train", "--out", str(tmp_path / "f"), "--epochs", "1"], "--out"),
        (["run", "nosuch"], "experiment"),
    ]:
        r = subprocess.run([sys.executable, "-m", "gatepool", *argv], capture_output=True, text=True, env=env)
        assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and flag in r.stderr


# ----------------------------------------------------------------------------- one writer per --out


def test_second_writer_on_the_same_out_is_refused_naming_the_holder(toy, tmp_path, capsys, lock_holder):
    holder = lock_holder(tmp_path, 60)
    for argv in (
        ["run", "toy", "--out", str(tmp_path)],
        ["reproduce", "--out", str(tmp_path), "--quiet"],
        T + ["--out", str(tmp_path)],
    ):
        code, err = run_main(argv, capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"is in use by pid {holder.pid} on " in err and "(holder-test)" in err and "--wait" in err
    assert toy == [] and not (tmp_path / "toy").exists()


@pytest.mark.slow
def test_wait_waits_for_the_holder_then_runs(toy, tmp_path, capsys, lock_holder):
    holder = lock_holder(tmp_path, 1.0)
    code, err = run_main(["run", "toy", "--out", str(tmp_path), "--wait"], capsys)
    assert code == 0 and toy == [1]
    assert f"waiting for {tmp_path}: in use by pid {holder.pid}" in err
    assert (tmp_path / "released").stat().st_mtime_ns <= (tmp_path / "toy" / "result.json").stat().st_mtime_ns


def test_disk_full_during_the_result_write_is_one_line(toy, tmp_path, capsys, monkeypatch):
    from gatepool.utils import io

    def no_space(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(io.os, "fsync", no_space)
    code, err = run_main(["run", "toy", "--out", str(tmp_path)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"{tmp_path / 'toy' / 'result.json'}: the disk is full" in err
    assert not (tmp_path / "toy" / "result.json").exists() and toy == [1]


# ----------------------------------------------------------------------------- --device (and --amp)


@pytest.fixture
def toy_device(monkeypatch):
    """A private registry holding one experiment, 'toy', that records the device its context names."""
    import gatepool.lab.experiments  # noqa: F401
    from gatepool.lab import claims

    monkeypatch.setattr(claims, "_REGISTRY", {})
    seen = []

    @claims.experiment("toy", title="toy", order=1, setup={"n": 1, "seed": 0},
                       claims=[claims.Claim("n", "n is n", 1, 0, source="ours", ref="a test")])  # fmt: skip
    def toy_fn(ctx):
        seen.append(ctx.device)
        ctx.check("n", ctx["n"])

    return seen


@pytest.fixture
def no_gpu(monkeypatch):
    import torch

    from gatepool.utils import environment

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(environment, "_mps_available", lambda: False)


def test_train_on_device_cpu_records_it(tmp_path, capsys):
    code, err = run_main(T + ["--device", "cpu", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    record = json.loads((tmp_path / "results.json").read_text())
    assert record["device"] == "cpu" and record["config"]["device"] == "cpu"


def test_train_amp_bf16_runs_on_the_cpu(tmp_path, capsys):
    code, err = run_main(T + ["--device", "cpu", "--amp", "bf16", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "results.json").read_text())["config"]["amp"] == "bf16"


@pytest.mark.parametrize("command", ["run", "reproduce"])
def test_run_and_reproduce_hand_the_device_to_the_experiment(command, toy_device, tmp_path, capsys):
    argv = ["run", "toy"] if command == "run" else ["reproduce"]
    code, err = run_main(argv + ["--device", "cpu", "--quiet", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    assert toy_device == ["cpu"]
    assert json.loads((tmp_path / "toy" / "result.json").read_text())["environment"]["device"] == "cpu"


def test_probe_on_device_cpu(tmp_path, capsys):
    argv = ["probe", "--data", "noise", "--batch", "8", "--device", "cpu", "--out", str(tmp_path), "--json",
            "--no-predicted"]  # the device reaches the record (the prediction: test_probe_cli)
    assert main(argv) == 0
    capsys.readouterr()
    assert json.loads((tmp_path / "probe.json").read_text())["setup"]["device"] == "cpu"


@pytest.mark.parametrize("bench", ["train", "pool", "attention"])
def test_bench_hands_the_device_to_the_bench(bench, monkeypatch, capsys):
    import importlib

    import torch

    module = importlib.import_module(f"gatepool.lab.bench.{bench}")
    calls = []
    monkeypatch.setattr(module, "run", lambda quick, device: calls.append((quick, device)) or {"ok": 1})
    assert main(["bench", bench, "--quick", "--device", "cpu", "--json"]) == 0
    assert calls == [(True, torch.device("cpu"))] and json.loads(capsys.readouterr().out) == {"ok": 1}


@pytest.mark.slow
def test_bench_attention_quick_on_device_cpu(tmp_path, capsys):
    out = tmp_path / "a.json"
    argv = ["bench", "attention", "--quick", "--threads", "1", "--device", "cpu", "--out", str(out)]
    assert main(argv) == 0
    assert json.loads(out.read_text())["device"] == "cpu" and "device cpu" in capsys.readouterr().out


DEVICE_COMMANDS = [T, ["run", "toy"], ["reproduce"], ["probe", "--data", "noise", "--batch", "4"],
                   ["bench", "train"], ["bench", "pool"], ["bench", "attention"]]  # fmt: skip
BAD_DEVICE = [
    *[(argv + ["--device", "tpu"], ["argument --device", "auto, cpu, cuda, cuda:N or mps", "'tpu'"])
      for argv in DEVICE_COMMANDS],
    *[(argv + ["--device", "cuda"], ["--device cuda", "CUDA is not available", "'cpu'"])
      for argv in DEVICE_COMMANDS],
    (T + ["--device", "mps"], ["--device mps", "MPS is not available"]),
    (T + ["--device", "cpu", "--amp", "fp16"], ["--amp fp16", "needs a CUDA device", "'bf16'"]),
    (T + ["--amp", "fp32"], ["argument --amp", "'bf16', 'fp16'"]),
]  # fmt: skip


@pytest.mark.parametrize("argv, wanted", BAD_DEVICE, ids=[_case_id(a) for a, _ in BAD_DEVICE])
def test_a_bad_or_absent_device_exits_2_in_one_line(argv, wanted, toy, no_gpu, tmp_path, capsys):
    if argv[0] in ("run", "reproduce"):
        argv = argv + ["--out", str(tmp_path / "runs")]
    code, err = run_main(argv, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for text in wanted:
        assert text in lines[0], lines[0]
    assert toy == [] and not (tmp_path / "runs").exists()  # refused before anything ran or was written
