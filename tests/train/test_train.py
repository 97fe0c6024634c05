"""The trainer: determinism, exact resume (kill -9 included), the files it writes, its checks.

Every run here is tiny (256 training and 128 test MNIST digits, width 8, one thread) so the whole
file takes seconds; the properties tested do not depend on size.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import gatepool
from gatepool import create_model
from gatepool.data import load_dataset
from gatepool.train import TrainConfig, TrainResult, evaluate, get_lr, train
from gatepool.utils.io import load_checked, read_json

SMALL = dict(train_size=256, test_size=128, epochs=2, batch_size=64, threads=1, model_kwargs={"width": 8})
TIMINGS = ("images_per_s", "seconds")


def fc_norm(model: torch.nn.Module, epoch: int) -> dict:
    """An on_epoch_end that records something of the model (as experiment 12 records τ)."""
    return {"fc_norm": model.head.fc.weight.norm(dim=1), "seen": epoch}


def metrics(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMINGS} for row in history]


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[TrainResult, Path]:
    """An uninterrupted two-epoch run, written to a folder."""
    out = tmp_path_factory.mktemp("reference")
    return train(TrainConfig(**SMALL), out=out, progress=False, verbose=False, on_epoch_end=fc_norm), out


def test_same_seed_same_bits_other_seed_other_bits(reference):
    ref, _ = reference
    again = train(TrainConfig(**SMALL), progress=False, verbose=False, on_epoch_end=fc_norm)
    assert metrics(again.history) == metrics(ref.history)
    assert_same_weights(again.model, ref.model)
    other = train(TrainConfig(**{**SMALL, "seed": 1}), progress=False, verbose=False, on_epoch_end=fc_norm)
    assert metrics(other.history) != metrics(ref.history)


def test_history_has_every_epoch_and_the_extras(reference):
    ref, _ = reference
    assert [row["epoch"] for row in ref.history] == [1, 2]
    steps = 256 // 64  # per epoch; 8 in all
    for row in ref.history:
        assert set(row) >= {"train_loss", "train_acc", "test_loss", "test_acc", "lr", *TIMINGS}
        # accuracies are counts over the 256 training and 128 test digits
        assert row["train_acc"] * 256 == pytest.approx(round(row["train_acc"] * 256), abs=1e-9)
        assert row["test_acc"] * 128 == pytest.approx(round(row["test_acc"] * 128), abs=1e-9)
        last_step = row["epoch"] * steps - 1
        assert row["lr"] == get_lr(last_step, 2 * steps, lr=3e-3, schedule="onecycle", warmup=0.3)
        assert row["images_per_s"] * row["seconds"] >= 256  # the epoch's seconds include its training
        assert row["seen"] == row["epoch"] and len(row["fc_norm"]) == 10  # a tensor, stored as a list
    # the extras are the model's at that epoch: epoch 2's are those of the final weights
    assert ref.history[-1]["fc_norm"] == ref.model.head.fc.weight.norm(dim=1).tolist()
    assert ref.record["initial"]["seen"] == 0
    final = ("train_loss", "train_acc", "test_loss", "test_acc")
    assert ref.record["final"] == {k: ref.history[-1][k] for k in final}


def test_resume_after_an_exception_equals_the_uninterrupted_run(reference, tmp_path):
    ref, _ = reference

    def stop_at_2(model, epoch):
        if epoch == 2:
            raise KeyboardInterrupt
        return fc_norm(model, epoch)

    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(**SMALL), out=tmp_path, progress=False, verbose=False, on_epoch_end=stop_at_2)
    assert (tmp_path / "checkpoint.pt").exists() and not (tmp_path / "results.json").exists()
    with pytest.raises(ValueError, match="seed"):  # the folder holds another configuration's run
        train(TrainConfig(**{**SMALL, "seed": 5}), out=tmp_path, progress=False, verbose=False)

    resumed = train(TrainConfig(**SMALL), out=tmp_path, progress=False, verbose=False, on_epoch_end=fc_norm)
    assert metrics(resumed.history) == metrics(ref.history)  # epoch 1's extras came from the checkpoint
    assert resumed.record["initial"] == ref.record["initial"]
    assert_same_weights(resumed.model, ref.model)


@pytest.mark.slow
def test_resume_after_kill_9_equals_the_uninterrupted_run(reference, tmp_path):
    ref, _ = reference
    script = (
        "import json, os, signal, sys\n"
        "from gatepool.train import TrainConfig, train\n"
        "def kill(model, epoch):\n"
        "    if epoch == 2:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return {'fc_norm': model.head.fc.weight.norm(dim=1), 'seen': epoch}\n"
        "train(TrainConfig(**json.loads(sys.argv[1])), out=sys.argv[2], progress=False, verbose=False,\n"
        "      on_epoch_end=kill)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(gatepool.__file__).parents[1])}
    cmd = [sys.executable, "-c", script, json.dumps(SMALL), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert load_checked(tmp_path / "checkpoint.pt")["epoch"] == 1

    resumed = train(TrainConfig(**SMALL), out=tmp_path, progress=False, verbose=False, on_epoch_end=fc_norm)
    assert metrics(resumed.history) == metrics(ref.history)
    assert_same_weights(resumed.model, ref.model)


def test_results_json_and_safetensors_hold_the_run(reference):
    from safetensors.torch import load_file

    ref, out = reference
    record = read_json(out / "results.json")
    assert record["config"] == TrainConfig(**SMALL).to_dict()
    assert TrainConfig.from_dict(record["config"]) == TrainConfig(**SMALL)
    assert record["config"]["lr"] == 3e-3 and record["config"]["warmup"] == 0.3  # defaults, resolved
    assert record["history"] == json.loads(json.dumps(ref.record["history"]))
    assert {"machine", "torch", "threads", "channels_last", "parameters", "seconds"} <= set(record)

    # Independent check of the final test metrics: the saved weights in a fresh model, on the test
    # subset rebuilt here by hand (randperm(10000) seeded 0, first 128), normalized with MNIST's constants.
    model = create_model("residual_cnn", width=8)
    model.load_state_dict(load_file(out / "model.safetensors"))
    model.eval()
    test = load_dataset("mnist", "test")
    idx = torch.randperm(len(test.labels), generator=torch.Generator().manual_seed(0))[:128]
    x = ((test.images[idx].float() / 255 - 0.1307) / 0.3081).unsqueeze(1)
    with torch.no_grad():
        logits = model(x)
    acc = (logits.argmax(1) == test.labels[idx]).float().mean().item()
    loss = F.cross_entropy(logits, test.labels[idx]).item()
    assert acc == pytest.approx(record["final"]["test_acc"], abs=1e-9)
    assert loss == pytest.approx(record["final"]["test_loss"], rel=1e-4)


def test_a_finished_run_is_loaded_not_retrained(reference):
    ref, out = reference
    calls = []
    again = train(TrainConfig(**SMALL), out=out, verbose=False, on_epoch_end=lambda m, e: calls.append(e))
    assert calls == []
    assert again.record == read_json(out / "results.json")
    assert_same_weights(again.model, ref.model)
    with pytest.raises(ValueError, match="lr"):
        train(TrainConfig(**{**SMALL, "lr": 0.5}), out=out, progress=False, verbose=False)


@pytest.mark.parametrize(
    "field, value",
    [
        ("epochs", 0),
        ("epochs", 2.5),
        ("epochs", True),
        ("batch_size", -1),
        ("train_size", 0),
        ("threads", 0),
        ("seed", -1),
        ("optimizer", "rmsprop"),
        ("schedule", "step"),
        ("lr", 0.0),
        ("lr", math.nan),
        ("warmup", 1.0),
        ("momentum", 1.5),
        ("label_smoothing", -0.1),
        ("channels_last", "yes"),
        ("model", ""),
    ],
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        TrainConfig(**{field: value})


def test_bad_data_is_caught_before_training():
    with pytest.raises(ValueError, match="data"):
        train(TrainConfig(data="cifar"), progress=False, verbose=False)
    with pytest.raises(ValueError, match="train_size"):
        train(TrainConfig(train_size=10**6), progress=False, verbose=False)
    with pytest.raises(ValueError, match="model"):
        train(TrainConfig(model="no_such_model", **{k: SMALL[k] for k in ("train_size", "test_size")}))


def test_in_memory_data_and_subsets_are_nested():
    g = torch.Generator().manual_seed(0)
    data = (torch.randn(64, 1, 28, 28, generator=g), torch.randint(0, 10, (64,), generator=g),
            torch.randn(16, 1, 28, 28, generator=g), torch.randint(0, 10, (16,), generator=g))  # fmt: skip
    cfg = TrainConfig(data="noise", epochs=1, batch_size=16, threads=1, model_kwargs={"width": 8})
    result = train(cfg, data=data, progress=False, verbose=False)
    test = evaluate(result.model, data[2], data[3])  # the given test tensors, not MNIST's
    assert result.final["test_acc"] == test["acc"]
    assert result.final["test_loss"] == pytest.approx(test["loss"])

    from gatepool.train import load_data

    small = load_data(TrainConfig(train_size=8, test_size=4), data=data)
    large = load_data(TrainConfig(train_size=32, test_size=4), data=data)
    assert torch.equal(small.train_x, large.train_x[:8]) and torch.equal(small.train_y, large.train_y[:8])


def test_cli_trains_and_prints_the_record(tmp_path, capsys):
    from gatepool.cli.train import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["train", "--pool", "avg", "--model-kwargs", '{"width": 8}', "--train-size", "128",
         "--test-size", "64", "--epochs", "1", "--batch-size", "32", "--threads", "1", "--seed", "3",
         "--grad-clip", "2.5", "--out", str(tmp_path), "--json"]
    )  # fmt: skip
    assert args.func(args) == 0
    record = json.loads(capsys.readouterr().out)
    want = TrainConfig(model_kwargs={"width": 8, "pool": "avg"}, train_size=128, test_size=64, epochs=1,
                       batch_size=32, threads=1, seed=3, grad_clip=2.5).to_dict()  # fmt: skip
    assert record["config"] == want
    assert record == read_json(tmp_path / "results.json")


TINY = dict(train_size=64, test_size=32, epochs=2, batch_size=32, threads=1)


def test_a_finished_run_with_a_tuple_in_model_kwargs_is_loaded(tmp_path):
    # results.json gives the tuple back as a list; the configs must still compare equal
    cfg = TrainConfig(model_kwargs={"blocks": (1, 1), "width": 8}, **{**TINY, "epochs": 1})
    first = train(cfg, out=tmp_path, progress=False, verbose=False)
    calls = []
    again = train(cfg, out=tmp_path, verbose=False, on_epoch_end=lambda m, e: calls.append(e))
    assert calls == []  # loaded, not retrained
    assert again.record == read_json(tmp_path / "results.json")
    assert_same_weights(again.model, first.model)


def killed_in_epoch_2(out, cfg=None):
    """``cfg`` (the tiny CNN by default) trained into ``out`` and killed in epoch 2, before its
    checkpoint: ``out`` holds epoch 1's."""

    def stop_at_2(model, epoch):
        if epoch == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg or TrainConfig(model_kwargs={"width": 8}, **TINY), out=out, progress=False, verbose=False,
              on_epoch_end=stop_at_2)  # fmt: skip


def test_resume_with_another_thread_count_warns_and_records_both(tmp_path, capsys):
    killed_in_epoch_2(tmp_path)
    assert load_checked(tmp_path / "checkpoint.pt")["threads"] == 1
    capsys.readouterr()
    resumed = train(TrainConfig(model_kwargs={"width": 8}, **{**TINY, "threads": 2}), out=tmp_path,
                    progress=False, verbose=False)  # fmt: skip
    err = capsys.readouterr().err
    assert "warning" in err and "1 torch threads" in err and "resumes with 2" in err
    assert [row["threads"] for row in resumed.history] == [1, 2]
    assert [row["threads"] for row in read_json(tmp_path / "results.json")["history"]] == [1, 2]


def test_cli_missing_data_prints_an_error_not_a_traceback(tmp_path, monkeypatch, capsys):
    import gatepool.data.idx
    from gatepool.cli import main

    # the repo's data/ and the system folder come after --data-dir in the search order: look only there
    search_roots = gatepool.data.idx.search_roots
    monkeypatch.setattr(gatepool.data.idx, "search_roots", lambda data_dir=None: search_roots(data_dir)[:1])
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["train", "--data-dir", str(empty), "--epochs", "1", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    assert "train-images-idx3-ubyte" in err and str(empty) in err and "gatepool data fetch mnist" in err


def test_a_run_resumed_on_another_machine_records_where_each_epoch_ran(tmp_path, monkeypatch):
    import gatepool.train.loop

    cfg = TrainConfig(model_kwargs={"width": 8}, **TINY)
    killed_in_epoch_2(tmp_path, cfg)
    here = gatepool.train.loop.cpu_model()
    monkeypatch.setattr(gatepool.train.loop, "cpu_model", lambda: "Another CPU")  # the next session's machine
    resumed = train(cfg, out=tmp_path, progress=False, verbose=False)
    assert [row["cpu"] for row in resumed.history] == [here, "Another CPU"]
    assert [row["cpu"] for row in read_json(tmp_path / "results.json")["history"]] == [here, "Another CPU"]


NEW_FIELDS = ("steps_per_epoch", "betas", "grad_clip")  # added to TrainConfig after runs were saved


def test_runs_saved_before_the_new_fields_load_and_resume(tmp_path):
    cfg = TrainConfig(model_kwargs={"width": 8}, **TINY)
    reference = train(cfg, progress=False, verbose=False)
    killed_in_epoch_2(tmp_path, cfg)
    ckpt = load_checked(tmp_path / "checkpoint.pt")
    for k in NEW_FIELDS:  # a checkpoint as the trainer wrote it before these fields and eval_fn
        del ckpt["config"][k]
    del ckpt["metrics"]
    torch.save(ckpt, tmp_path / "checkpoint.pt")
    resumed = train(cfg, out=tmp_path, progress=False, verbose=False)
    assert metrics(resumed.history) == metrics(reference.history)
    assert resumed.final == reference.final

    record = read_json(tmp_path / "results.json")
    for k in NEW_FIELDS:
        del record["config"][k]
    (tmp_path / "results.json").write_text(json.dumps(record))
    calls = []
    train(cfg, out=tmp_path, verbose=False, on_epoch_end=lambda m, e: calls.append(e))
    assert calls == []  # loaded, not retrained
    with pytest.raises(ValueError, match="grad_clip"):  # a missing field is its default, not anything
        train(TrainConfig(model_kwargs={"width": 8}, grad_clip=1.0, **TINY), out=tmp_path, verbose=False)


@pytest.mark.slow
def test_compile_trains_through_torch_compile_to_the_eager_result(tmp_path):
    from torch._dynamo.utils import counters

    def run(compile_: bool):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 10))  # fmt: skip
        config = TrainConfig(model="mlp", epochs=1, train_size=512, test_size=128, batch_size=64,
                             threads=1, compile=compile_, device="cpu")  # fmt: skip
        return train(config, model=model, progress=False, verbose=False)

    eager = run(False)
    counters.clear()
    compiled = run(True)
    assert counters["stats"]["unique_graphs"] >= 1  # dynamo traced the training forward
    assert compiled.record["config"]["compile"] is True
    for a, b in zip(eager.model.parameters(), compiled.model.parameters()):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)  # inductor's fusions round a little otherwise
    with pytest.raises(TypeError, match="compile"):
        TrainConfig(compile="yes")
