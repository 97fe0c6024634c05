"""Devices: one resolver of device names, the trainer on a device (data moved once, the model there, the
record naming it), mixed precision (bf16 on the CPU too, fp16 on CUDA only), checkpoints that load on
any device, one sweep job on a GPU. The tests marked ``gpu`` need CUDA (``make gpu-check``) and are
skipped without it; the rest run anywhere (CUDA is hidden from them where they test its absence).
"""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn as nn

import gatepool.train as trainer
import gatepool.train.sweep as sweep
from gatepool.train import CHECKPOINT, PREVIOUS, TrainConfig, TrainData, data_to_device, model_device, train
from gatepool.utils import environment
from gatepool.utils.environment import check_device, device_info, resolve_device
from gatepool.utils.io import atomic_torch_save, load_checked, read_json

CUDA = torch.cuda.is_available()
CFG = TrainConfig(model_kwargs={"width": 8}, train_size=64, test_size=32, epochs=2, batch_size=32, threads=1,
                  device="cpu")  # fmt: skip
TIMINGS = ("images_per_s", "seconds")


@pytest.fixture
def no_gpu(monkeypatch):
    """This process sees neither CUDA nor MPS (whatever the machine has)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(environment, "_mps_available", lambda: False)


def quiet(config, **kw):
    return train(config, progress=False, verbose=False, **kw)


def metrics(history):
    return [{k: v for k, v in row.items() if k not in TIMINGS} for row in history]


# ----------------------------------------------------------------------------- the resolver


def test_auto_is_the_cpu_without_a_gpu(no_gpu):
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device(None) == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


def test_auto_prefers_cuda_then_mps(monkeypatch):
    monkeypatch.setattr(environment, "_mps_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert resolve_device("auto") == torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("mps")


@pytest.mark.parametrize("name, what", [("cuda", "CUDA"), ("cuda:0", "CUDA"), ("mps", "MPS")])
def test_a_device_that_is_not_here_is_a_value_error_saying_so(no_gpu, name, what):
    with pytest.raises(ValueError, match=f"device '{name}' asked for, but {what} is not available") as e:
        resolve_device(name)
    assert "'cpu'" in str(e.value) and "'auto'" in str(e.value)  # what to use instead


@pytest.mark.parametrize("name", ["tpu", "CUDA", "gpu", "cuda:x", "cpu:0", "", 3])
def test_a_bad_name_is_a_value_error_naming_device_and_the_allowed_values(name):
    for check in (check_device, resolve_device):
        with pytest.raises(ValueError, match="device must be one of auto, cpu, cuda, cuda:N or mps, got"):
            check(name)


def test_the_record_of_a_device_names_it_and_a_gpu_by_name(monkeypatch):
    assert device_info("cpu") == {"device": "cpu"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU 9000")
    assert device_info(torch.device("cuda", 1)) == {"device": "cuda:1", "device_name": "Fake GPU 9000"}


# ----------------------------------------------------------------------------- config, sweep


def test_config_checks_device_and_amp():
    assert TrainConfig().device == "auto" and TrainConfig().amp is None
    assert TrainConfig(device=torch.device("cpu")).device == "cpu"  # a torch.device is stored as its name
    with pytest.raises(ValueError, match="device must be one of"):
        TrainConfig(device="tpu")
    with pytest.raises(ValueError, match="amp must be None, 'bf16' or 'fp16', got 'fp32'"):
        TrainConfig(amp="fp32")
    assert "device" in trainer.RUNTIME_FIELDS  # how to run; amp is not: it changes the numbers
    assert "amp" not in trainer.RUNTIME_FIELDS


def test_sweeps_run_one_job_on_a_gpu(monkeypatch):
    cores = sweep.default_jobs()
    assert sweep.default_jobs("cpu") == cores == max(1, min(4, __import__("os").cpu_count() or 1))
    monkeypatch.setattr(sweep, "resolve_device", lambda name: torch.device("cuda", 0))
    assert sweep.default_jobs("auto") == 1 and sweep.default_jobs() == cores  # None: the CPU, as before


# ----------------------------------------------------------------------------- the trainer on a device


def test_training_on_the_cpu_records_the_device(tmp_path):
    result = quiet(CFG, out=tmp_path)
    assert result.record["device"] == "cpu" and "device_name" not in result.record
    assert result.record["config"]["device"] == "cpu" and result.record["config"]["amp"] is None
    assert read_json(tmp_path / "results.json")["device"] == "cpu"
    assert load_checked(tmp_path / CHECKPOINT)["device"] == "cpu"
    assert model_device(result.model) == torch.device("cpu")


def test_data_already_there_is_not_copied():
    data = TrainData(torch.zeros(4, 1, 2, 2), torch.zeros(4, dtype=torch.long), torch.zeros(2, 1, 2, 2),
                     torch.zeros(2, dtype=torch.long))  # fmt: skip
    moved = data_to_device(data, torch.device("cpu"))
    assert all(a is b for a, b in zip(moved, data))
    assert model_device(nn.ReLU()) == torch.device("cpu")  # no parameters: the CPU


def test_cuda_asked_for_without_cuda_is_refused_before_training(no_gpu, tmp_path):
    with pytest.raises(ValueError, match="CUDA is not available"):
        quiet(TrainConfig(**{**CFG.to_dict(), "device": "cuda"}), out=tmp_path)
    assert not any(tmp_path.iterdir())


def _linear_data(n=64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] > 0).long()
    return TrainData(x, y, x[:16], y[:16])


def test_amp_bf16_on_the_cpu_trains_under_autocast():
    """The documented choice: bf16 autocast runs on the CPU too (CPUs with bf16 units; tests here)."""
    seen = []

    def loss_fn(model, x, y):
        logits = model(x)
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), logits.dtype))
        return nn.functional.cross_entropy(logits, y), logits

    config = TrainConfig(model="linear", epochs=1, batch_size=16, device="cpu", amp="bf16", threads=1)
    torch.manual_seed(0)
    result = quiet(config, model=nn.Linear(8, 2), data=_linear_data(), loss_fn=loss_fn)
    assert seen and all(s == (True, torch.bfloat16, torch.bfloat16) for s in seen)
    assert result.model.weight.dtype == torch.float32  # the weights stay float32
    assert torch.isfinite(torch.tensor(result.record["final"]["train_loss"]))


def test_amp_fp16_on_the_cpu_is_refused_naming_amp():
    config = TrainConfig(model="linear", epochs=1, batch_size=16, device="cpu", amp="fp16")
    with pytest.raises(ValueError, match="amp 'fp16' needs a CUDA device"):
        quiet(config, model=nn.Linear(8, 2), data=_linear_data())


def test_a_step_with_a_grad_scaler_is_the_plain_step():
    """fp16's path through train_step, on the CPU in float32: the loss scaled by 2^10, the gradients
    unscaled before clipping and the step, so the update is bit for bit the plain one."""
    from gatepool.train import train_step

    x, y = _linear_data(16)[:2]
    models = []
    for scaler in (None, torch.amp.GradScaler("cpu", init_scale=2.0**10)):
        torch.manual_seed(0)
        model = nn.Linear(8, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        for _ in range(3):
            train_step(model, optimizer, x, y, grad_clip=0.01, scaler=scaler)  # clipping bites
        models.append(model)
    plain, scaled = models
    assert torch.equal(plain.weight, scaled.weight) and torch.equal(plain.bias, scaled.bias)


# ----------------------------------------------------------------------------- checkpoints on any device


def _stopped_after_epoch_1(config, out):
    def stop(model, epoch):  # called before the epoch's checkpoint: the run dies in epoch 2
        if epoch == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        quiet(config, out=out, on_epoch_end=stop)
    assert load_checked(out / CHECKPOINT)["epoch"] == 1


def _as_if_saved_on(path, device: str, monkeypatch):
    """Rewrite the checkpoint at ``path`` as a GPU would have written it: every storage tagged ``device``
    (what torch.load restores to without map_location) and the checkpoint's own ``device`` entry."""
    import torch.serialization

    ckpt = load_checked(path)
    ckpt["device"] = device
    with monkeypatch.context() as m:
        m.setattr(torch.serialization, "location_tag", lambda storage: device)
        atomic_torch_save(path, ckpt)


def test_a_checkpoint_from_a_gpu_resumes_on_the_cpu(tmp_path, monkeypatch, capsys):
    reference = quiet(CFG)
    _stopped_after_epoch_1(CFG, tmp_path)
    (tmp_path / PREVIOUS).unlink(missing_ok=True)  # only the GPU's checkpoint is left to resume from
    _as_if_saved_on(tmp_path / CHECKPOINT, "cuda:0", monkeypatch)
    if not CUDA:  # the file is really foreign: read without map_location it needs CUDA
        payload = (tmp_path / CHECKPOINT).read_bytes().partition(b"\n")[2]
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(io.BytesIO(payload), weights_only=True)
    capsys.readouterr()
    result = quiet(CFG, out=tmp_path)
    err = capsys.readouterr().err
    assert "ran on cuda:0 and resumes on cpu" in err and "corrupt" not in err  # resumed, not set aside
    assert metrics(result.history) == metrics(reference.history)  # epoch 1 from the file, epoch 2 here
    for k, v in result.model.state_dict().items():
        assert v.device.type == "cpu" and torch.equal(v, reference.model.state_dict()[k]), k


# ----------------------------------------------------------------------------- on CUDA (make gpu-check)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("amp", [None, "bf16", "fp16"])
def test_a_training_on_cuda_with_amp(tmp_path, amp):
    config = TrainConfig(**{**CFG.to_dict(), "device": "cuda", "amp": amp})
    result = quiet(config, out=tmp_path)
    rec = result.record
    assert rec["device"].startswith("cuda:") and rec["device_name"] == torch.cuda.get_device_name()
    assert model_device(result.model).type == "cuda"
    assert all(torch.isfinite(torch.tensor(row["train_loss"])) for row in rec["history"])
    assert rec["final"]["train_acc"] > 0
    ckpt = load_checked(tmp_path / CHECKPOINT)
    assert ckpt["device"] == rec["device"] and ("scaler" in ckpt) == (amp == "fp16")
    assert all(v.device.type == "cpu" for v in ckpt["model"].values())  # read onto the CPU (map_location)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_the_dataset_moves_to_cuda_once():
    data = trainer.load_data(CFG)
    moved = data_to_device(data, torch.device("cuda", 0))
    assert all(t.device.type == "cuda" for t in moved)
    g = torch.Generator().manual_seed(0)
    xb, yb = next(trainer.data_batches(moved, 64, g))
    assert xb.device.type == "cuda" and yb.device.type == "cuda"  # an index_select there, not a copy


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_a_checkpoint_saved_on_cuda_resumes_on_the_cpu(tmp_path, capsys):
    on_gpu = TrainConfig(**{**CFG.to_dict(), "device": "cuda"})
    _stopped_after_epoch_1(on_gpu, tmp_path)
    capsys.readouterr()
    result = quiet(CFG, out=tmp_path)  # the same run, device="cpu": device is how to run, not what
    err = capsys.readouterr().err
    assert "resumes on cpu" in err and "corrupt" not in err
    assert [row["epoch"] for row in result.history] == [1, 2]
    assert result.record["device"] == "cpu" and model_device(result.model).type == "cpu"
