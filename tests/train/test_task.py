"""One training as a task (``gatepool.train.task``): its run folder's name, its hooks, resume and load,
and that it pickles for the worker processes."""

from __future__ import annotations

import functools
import pickle

import pytest
import torch
import torch.nn as nn

from gatepool.train import TrainConfig, load_data
from gatepool.train.task import TrainTask, load_trained, run_folder, train_pending, train_task

CONFIG = {"model": "residual_cnn", "model_kwargs": {"width": 8, "pool": "soft-learned"}, "train_size": 64,
          "test_size": 32, "epochs": 2, "batch_size": 32, "threads": 1, "seed": 0}  # fmt: skip


def mean_tau(model: nn.Module, epoch: int) -> dict:
    """A hook: the mean learned τ of the net, per epoch."""
    taus = [m.temperature.mean().item() for m in model.modules()
            if getattr(m, "gate", None) == "soft-learned"]  # fmt: skip
    return {"tau": sum(taus) / len(taus), "hook_epoch": epoch}


def tiny_mlp(config: TrainConfig) -> nn.Module:
    torch.manual_seed(config.seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 10))


def flipped(config: TrainConfig, calls: list) -> object:
    calls.append(config.seed)
    data = load_data(config)
    return type(data)(*(t.flip(-1) if t.is_floating_point() else t for t in data))


def test_the_run_folder_is_named_by_what_trains_not_how():
    threads = run_folder("root", {**CONFIG, "threads": 4, "device": "cuda:0"})
    assert threads == run_folder("root", CONFIG) and threads.parent.name == "root"
    assert threads.name.startswith("residual_cnn-s0-") and len(threads.name) == len("residual_cnn-s0-") + 8
    assert run_folder("root", {**CONFIG, "epochs": 3}) != threads


def test_a_task_trains_with_its_hook_then_loads(tmp_path):
    task = TrainTask(CONFIG, str(tmp_path / "run"), on_epoch_end=mean_tau)
    assert pickle.loads(pickle.dumps(task)) == task  # what the process pool and Ray send
    assert not task.finished()
    record = train_task(task)
    assert task.finished()
    assert [h["hook_epoch"] for h in record["history"]] == [1, 2]
    assert all("tau" in h for h in record["history"])
    again = train_task(TrainTask(CONFIG, task.out))  # finished: loaded, the hook's history with it
    assert again["history"] == record["history"] and again["final"] == record["final"]


def test_a_task_builds_its_model_and_data_and_train_pending_skips_the_finished(tmp_path):
    calls: list = []
    config = {**CONFIG, "model": "tiny-mlp", "model_kwargs": {}, "epochs": 1}
    build = functools.partial(flipped, calls=calls)
    tasks = [TrainTask({**config, "seed": s}, str(tmp_path / f"s{s}"), model=tiny_mlp, data=build)
             for s in (0, 1)]  # fmt: skip
    first = train_pending(tasks[:1])
    assert calls == [0]  # the data built once, for the training; not to load the finished run
    both = train_pending(tasks)
    assert calls == [0, 1] and both[0] == first[0]
    assert both[0]["final"] != both[1]["final"]


def first_eight(config: TrainConfig, data, seen: list):
    """The task's batches: always the first 8 training digits (and a record of the data they came from)."""
    seen.append(len(data.train_y))

    def batches(generator):
        return iter([(data.train_x[:8], data.train_y[:8])] * 3)

    return batches


def test_a_task_draws_its_own_batches_and_load_trained_gives_the_model(tmp_path):

    seen: list = []
    config = {**CONFIG, "model": "tiny-mlp", "model_kwargs": {}, "epochs": 1, "steps_per_epoch": 3}
    task = TrainTask(config, str(tmp_path / "run"), model=tiny_mlp,
                     batches=functools.partial(first_eight, seen=seen))  # fmt: skip
    with pytest.raises(ValueError, match="task.out"):
        load_trained(task)
    record = train_task(task)
    assert seen == [64]  # called once, with the task's training set
    assert record["history"][0]["train_acc"] is not None
    trained = load_trained(task)
    assert trained.record["final"] == record["final"] and seen == [64]  # loaded: no batches drawn again
    x = load_data(TrainConfig.from_dict(config)).test_x
    untrained = tiny_mlp(TrainConfig.from_dict(config))
    assert not torch.equal(trained.model(x), untrained(x))  # the trained weights, not a fresh model
