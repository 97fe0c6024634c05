"""The transformer variants' trainings run through gatepool.train's train(): epochs of at most
EPOCH_STEPS steps, a run killed mid-way resumes to the same bits, and a finished run is loaded."""

from __future__ import annotations

import pytest
import torch

import gatepool.train.variants as variants
from gatepool.train.variants import default_config, epoch_length, train_config, train_variant

TINY = {"dual_encoder": dict(steps=4, batch_size=8), "cross_attention_unet": dict(steps=4, batch_size=4),
        "flamingo": dict(steps=4, lm_steps=2, batch_size=4)}  # fmt: skip


def test_an_epoch_is_the_largest_divisor_of_the_steps_up_to_epoch_steps():
    assert [epoch_length(s) for s in (1, 3, 100, 1200, 1500, 2000, 250, 101)] == [1, 3, 100, 100, 100, 100,
                                                                                   50, 1]  # fmt: skip
    cfg = train_config(default_config("flamingo"), "lm")
    assert (cfg.epochs, cfg.steps_per_epoch, cfg.lr, cfg.weight_decay) == (6, 100, 3e-3, 0.0)
    cfg = train_config(default_config("flamingo"), "xattn")
    assert (cfg.epochs, cfg.steps_per_epoch, cfg.lr, cfg.optimizer, cfg.grad_clip) == (15, 100, 5e-3, "adamw",
                                                                                       1.0)  # fmt: skip
    assert (cfg.schedule, cfg.warmup, cfg.threads) == ("cosine", 0.05, 1)


@pytest.mark.parametrize("model", list(TINY))
def test_a_killed_training_resumes_to_the_same_weights(model, tmp_path, monkeypatch):
    monkeypatch.setattr(variants, "EPOCH_STEPS", 2)  # two epochs a stage (the Flamingo's LM: one)
    config = default_config(model, **TINY[model])
    ref, ref_record = train_variant(config)

    train = variants.train

    def killed_in_epoch_2(cfg, *, out, **kw):  # the last stage's second epoch dies after its update
        def die(m, epoch):
            if epoch == 2 and out.name in ("train", "xattn"):
                raise KeyboardInterrupt

        return train(cfg, out=out, on_epoch_end=die, **kw)

    monkeypatch.setattr(variants, "train", killed_in_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        train_variant(config, tmp_path)
    assert not (tmp_path / "results.json").exists()
    monkeypatch.setattr(variants, "train", train)
    model_, record = train_variant(config, tmp_path)
    assert not model_.training and record["weights_sha256"] == ref_record["weights_sha256"]
    assert [h["loss"] for h in record["history"]] == [h["loss"] for h in ref_record["history"]]
    assert [h["step"] for h in record["history"]] == [h["step"] for h in ref_record["history"]]
    for a, b in zip(model_.state_dict().values(), ref.state_dict().values()):
        assert torch.equal(a, b)
    assert set(record) == {"config", "model", "model_kwargs", "parameters", "history", "seconds", "threads",
                           "torch", "weights_sha256"}  # fmt: skip
    again, loaded = train_variant(config, tmp_path)  # finished: loaded, not trained
    assert loaded == record and not again.training
    assert torch.equal(next(iter(again.state_dict().values())), next(iter(model_.state_dict().values())))
