"""Damaged run files are found, said, and survived: two checkpoints with checksums, rebuilt results.

Each case damages a run stopped after epoch 2 of 3 (or a finished one), resumes it, and compares the
outcome with an uninterrupted run of the same configuration: the same history and the same weights.
"""

from __future__ import annotations

import hashlib
import io

import pytest
import torch

from gatepool.train import CHECKPOINT, PREVIOUS, RESULTS, WEIGHTS, TrainConfig, train
from gatepool.utils.io import CorruptFileError, atomic_write_bytes, checked_bytes, load_checked, read_json

CFG = TrainConfig(model_kwargs={"width": 8}, train_size=64, test_size=32, epochs=3, batch_size=32, threads=1)
TIMINGS = ("images_per_s", "seconds")


def metrics(history):
    return [{k: v for k, v in row.items() if k not in TIMINGS} for row in history]


@pytest.fixture(scope="module")
def reference():
    return train(CFG, progress=False, verbose=False)


def stopped_after_epoch_2(out):
    def stop(model, epoch):  # called before the epoch's checkpoint: the run dies in epoch 3
        if epoch == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(CFG, out=out, progress=False, verbose=False, on_epoch_end=stop)
    assert load_checked(out / CHECKPOINT)["epoch"] == 2 and load_checked(out / PREVIOUS)["epoch"] == 1


def record_epochs(epochs):
    return lambda model, epoch: epochs.append(epoch)


def assert_same_run(result, reference):
    assert metrics(result.history) == metrics(reference.history)
    ref = reference.model.state_dict()
    for k, v in result.model.state_dict().items():
        assert torch.equal(v, ref[k]), k


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_bit(path, at=0.6):
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [truncate, flip_bit])
def test_a_damaged_checkpoint_falls_back_to_the_previous_one(tmp_path, reference, damage, capsys):
    stopped_after_epoch_2(tmp_path)
    damage(tmp_path / CHECKPOINT)
    epochs = []
    result = train(CFG, out=tmp_path, progress=False, verbose=False, on_epoch_end=record_epochs(epochs))
    err = capsys.readouterr().err
    assert "checkpoint.pt" in err and "moved it to checkpoint.pt.corrupt" in err
    assert "resuming from checkpoint.prev.pt (epoch 1)" in err
    assert epochs == [2, 3]  # epoch 2 trained again, from epoch 1's checkpoint
    assert (tmp_path / "checkpoint.pt.corrupt").exists()
    assert_same_run(result, reference)


def test_a_missing_newest_checkpoint_resumes_from_the_previous_one(tmp_path, reference, capsys):
    stopped_after_epoch_2(tmp_path)
    (tmp_path / CHECKPOINT).unlink()  # killed between keeping the previous one and placing the new one
    result = train(CFG, out=tmp_path, progress=False, verbose=False)
    err = capsys.readouterr().err
    assert "is missing (a write was interrupted); resuming from checkpoint.prev.pt" in err
    assert_same_run(result, reference)


def test_both_checkpoints_damaged_starts_over(tmp_path, reference, capsys):
    stopped_after_epoch_2(tmp_path)
    flip_bit(tmp_path / CHECKPOINT)
    truncate(tmp_path / PREVIOUS)
    epochs = []
    result = train(CFG, out=tmp_path, progress=False, verbose=False, on_epoch_end=record_epochs(epochs))
    err = capsys.readouterr().err
    assert err.count("moved it to") == 2 and "no good checkpoint left; the training starts over" in err
    assert epochs == [0, 1, 2, 3]  # 0: the initial call of a fresh start
    assert_same_run(result, reference)


@pytest.mark.parametrize("damage", [flip_bit, truncate])
def test_damaged_weights_of_a_finished_run_are_rebuilt(tmp_path, reference, damage, capsys):
    train(CFG, out=tmp_path, progress=False, verbose=False)
    good = (tmp_path / WEIGHTS).read_bytes()
    assert read_json(tmp_path / RESULTS)["weights_sha256"] == hashlib.sha256(good).hexdigest()
    damage(tmp_path / WEIGHTS)
    epochs = []
    result = train(CFG, out=tmp_path, progress=False, verbose=False, on_epoch_end=record_epochs(epochs))
    assert "model.safetensors does not match results.json's SHA-256" in capsys.readouterr().err
    assert epochs == []  # nothing trained: the last checkpoint holds the final weights
    assert (tmp_path / WEIGHTS).read_bytes() == good
    assert_same_run(result, reference)
    assert train(CFG, out=tmp_path, progress=False, verbose=False).record == result.record  # finished again


def test_a_results_file_that_does_not_parse_is_rebuilt(tmp_path, reference, capsys):
    first = train(CFG, out=tmp_path, progress=False, verbose=False)
    truncate(tmp_path / RESULTS)
    result = train(CFG, out=tmp_path, progress=False, verbose=False)
    assert "results.json does not parse" in capsys.readouterr().err
    assert metrics(result.history) == metrics(first.history)
    assert read_json(tmp_path / RESULTS) == result.record
    assert_same_run(result, reference)


def test_load_checked_finds_every_single_bit_flip_and_reads_plain_torch_files(tmp_path):
    obj = {"w": torch.arange(6.0), "epoch": 3}
    data = checked_bytes(obj)
    path = tmp_path / "c.pt"
    for pos in range(0, len(data), max(1, len(data) // 97)):  # ~100 places: header, archive, tensor bytes
        damaged = bytearray(data)
        damaged[pos] ^= 0x01
        path.write_bytes(bytes(damaged))
        with pytest.raises(CorruptFileError, match="c.pt"):
            load_checked(path)
    path.write_bytes(data)
    assert torch.equal(load_checked(path)["w"], obj["w"])
    buf = io.BytesIO()
    torch.save(obj, buf)  # a checkpoint written before checksums
    path.write_bytes(buf.getvalue())
    assert load_checked(path)["epoch"] == 3


def test_atomic_write_keeps_the_previous_version(tmp_path):
    target, kept = tmp_path / "f", tmp_path / "f.prev"
    atomic_write_bytes(target, b"one", keep=kept)
    assert target.read_bytes() == b"one" and not kept.exists()
    atomic_write_bytes(target, b"two", keep=kept)
    assert target.read_bytes() == b"two" and kept.read_bytes() == b"one"
