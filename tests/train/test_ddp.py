"""Data-parallel training under torchrun, 2 CPU processes (gloo), against one process on the same global
batches: the same weights within float32 reduction error, the global metrics logged, and a resume of
every rank from rank 0's checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gatepool.train import TrainConfig, train
from gatepool.train.distributed import Ranks, check_batches, shard

SRC = str(Path(__file__).resolve().parents[2] / "src")
# 256 images in global batches of 63: 32 + 31 rows per rank, then a last batch of 4 (2 + 2): the ranks'
# shares differ, so the loss scale n_r·N/B matters. SGD: Adam divides by √v, which turns a gradient that
# is zero but for rounding (the stem's bias, before a GroupNorm of one channel per group) into steps of
# ±lr: measured 1.6e-3 on that bias with Adam, against ~1e-7 on every weight with SGD
ARGS = {"train_size": 256, "test_size": 256, "batch_size": 63, "epochs": 2, "threads": 1, "seed": 3,
        "model_kwargs": {"width": 8}, "optimizer": "sgd", "lr": 0.05}  # fmt: skip


def torchrun(out: Path, nproc: int = 2) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "gatepool", "train", "--train-size", "256", "--test-size", "256", "--batch-size", "63",
           "--epochs", "2", "--threads", "1", "--seed", "3", "--model-kwargs", '{"width": 8}',
           "--optimizer", "sgd", "--lr", "0.05",
           "--device", "cpu", "--out", str(out), "--quiet"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_shards_cover_the_batch_and_scale_to_its_mean():
    x, y = torch.arange(63.0).view(63, 1), torch.arange(63)
    parts = [shard(x, y, Ranks(r, 2, r)) for r in range(2)]
    assert torch.equal(torch.cat([p[1] for p in parts]), y)  # every row once, in order
    assert [len(p[1]) for p in parts] == [32, 31]
    # (1/N) Σ_r scale_r · mean_r = the global mean, for any per-row values
    assert sum(p[2] * p[0].mean() for p in parts) / 2 == pytest.approx(x.mean().item())
    assert shard(x, y, Ranks()) == (x, y, 1.0)
    with pytest.raises(ValueError, match="batch of 1 rows for 2 processes"):
        check_batches(257, 64, Ranks(0, 2, 0))  # the last batch: 1 row for 2 ranks
    check_batches(256, 63, Ranks(0, 2, 0))


@pytest.mark.slow
def test_two_processes_match_one_on_the_same_global_batches(tmp_path):
    single = train(TrainConfig(**ARGS, device="cpu"), out=tmp_path / "single", progress=False, verbose=False)
    ddp = tmp_path / "ddp"
    torchrun(ddp)
    rec = json.loads((ddp / "results.json").read_text())
    a, b = weights(tmp_path / "single"), weights(ddp)
    scale = max(t.abs().max().item() for t in a.values())
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    # float32 reduction order only, over 10 steps
    assert diff <= 2e-6 * scale, diff
    assert rec["processes"] == 2
    for key in ("train_loss", "test_loss"):  # the global epoch means, not rank 0's half
        assert rec["final"][key] == pytest.approx(single.record["final"][key], rel=1e-5), key
    for key in ("train_acc", "test_acc"):
        assert rec["final"][key] == single.record["final"][key], key

    # every rank killed after epoch 1 (only its checkpoint left): all resume from it, to the same bits
    resumed = tmp_path / "resumed"
    shutil.copytree(ddp, resumed)
    for name in ("results.json", "model.safetensors", "checkpoint.pt"):
        (resumed / name).unlink()
    torchrun(resumed)
    again = json.loads((resumed / "results.json").read_text())
    assert again["weights_sha256"] == rec["weights_sha256"]
    assert again["history"][0]["seconds"] == rec["history"][0]["seconds"]  # epoch 1 was not trained again
