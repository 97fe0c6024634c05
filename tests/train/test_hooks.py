"""The trainer's hooks: drawn batches, another loss, another evaluation, early stop, and the step itself.

The task: 2 "tokens" per example, each to be classified from 4 random features by the sign of one of
them; the batches are drawn fresh every step from the epoch's generator (as the sequence models do), the
loss is per-token cross-entropy, and the evaluation is accuracy on a fixed held-out set.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.train import TrainConfig, get_lr, make_optimizer, train, train_step
from gatepool.utils.io import read_json

B, STEPS = 16, 3  # batch, steps per epoch
HELD_OUT = torch.randn(256, 4, generator=torch.Generator().manual_seed(123))
CFG = dict(model="pairs", data="random pairs", epochs=12, steps_per_epoch=STEPS, batch_size=B, lr=0.05,
           schedule="cosine", threads=1, seed=0)  # fmt: skip


def labels(x: torch.Tensor) -> torch.Tensor:
    return torch.stack([(x[:, 0] > 0), (x[:, 1] > 0)], 1).long()  # (B, 2): one label per token


def batches(g: torch.Generator):
    for _ in range(STEPS):
        x = torch.randn(B, 4, generator=g)  # (B, 4)
        yield x, labels(x)


def token_loss(model, x, y):
    logits = model(x).view(-1, 2, 2)  # (B, tokens, classes)
    return F.cross_entropy(logits.reshape(-1, 2), y.reshape(-1)), logits


@torch.no_grad()
def held_out(model) -> dict:
    hits = model(HELD_OUT).view(-1, 2, 2).argmax(-1) == labels(HELD_OUT)
    return {"val_acc": hits.float().mean().item(), "val_all": hits.all(1).float().mean().item()}


def fresh() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(4, 4)


def run(out=None, **kw):
    kw.setdefault("on_epoch_end", None)
    return train(TrainConfig(**CFG), out=out, progress=False, verbose=False, model=fresh(), batches=batches,
                 loss_fn=token_loss, eval_fn=held_out, **kw)  # fmt: skip


def test_drawn_batches_per_token_loss_and_own_evaluation():
    result = run()
    h = result.history
    assert [row["epoch"] for row in h] == list(range(1, 13))
    assert result.final == {k: h[-1][k] for k in ("train_loss", "train_acc", "val_acc", "val_all")}
    assert "test_acc" not in h[-1]  # no test set was loaded or evaluated
    for row in h:  # accuracy over tokens: 3 batches × 16 examples × 2 tokens
        assert row["train_acc"] * 96 == pytest.approx(round(row["train_acc"] * 96), abs=1e-9)
        last_step = row["epoch"] * STEPS - 1
        assert row["lr"] == get_lr(last_step, 12 * STEPS, lr=0.05, schedule="cosine", warmup=0.05)
    assert h[-1]["val_acc"] == held_out(result.model)["val_acc"] >= 0.9  # it learned the task
    assert h[-1]["train_loss"] < h[0]["train_loss"] - 0.2


def test_stop_fn_ends_training_after_the_epoch_that_meets_it(tmp_path):
    stop = lambda row: row["val_acc"] >= 0.9  # noqa: E731
    result = run(tmp_path, stop_fn=stop)
    accs = [row["val_acc"] for row in result.history]
    assert len(accs) < 12 and accs[-1] >= 0.9 and all(a < 0.9 for a in accs[:-1])
    assert accs == [row["val_acc"] for row in run().history[: len(accs)]]  # the same run, cut short
    assert read_json(tmp_path / "results.json")["history"] == result.history  # written as finished
    calls = []
    again = run(tmp_path, stop_fn=stop, on_epoch_end=lambda m, e: calls.append(e))
    assert calls == [] and again.record == result.record  # loaded, not retrained


def test_drawn_batches_resume_exactly(tmp_path):
    ref = run()

    def stop_at_5(model, epoch):
        if epoch == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, on_epoch_end=stop_at_5)
    resumed = run(tmp_path)
    timings = ("images_per_s", "seconds")
    assert [{k: v for k, v in r.items() if k not in timings} for r in resumed.history] == [
        {k: v for k, v in r.items() if k not in timings} for r in ref.history
    ]
    assert torch.equal(resumed.model.weight, ref.model.weight)


def test_a_loss_without_logits_trains_the_same_and_has_no_accuracy(capsys):
    def loss_only(model, x, y):  # e.g. a contrastive or denoising loss: no classes to score
        return token_loss(model, x, y)[0], None

    ref = run()
    result = train(TrainConfig(**CFG), progress=False, verbose=True, model=fresh(), batches=batches,
                   loss_fn=loss_only, eval_fn=held_out)  # fmt: skip
    assert all(row["train_acc"] is None for row in result.history) and result.final["train_acc"] is None
    assert [r["train_loss"] for r in result.history] == [r["train_loss"] for r in ref.history]
    assert torch.equal(result.model.weight, ref.model.weight)  # the same updates
    assert "epoch 12/12  train loss" in capsys.readouterr().out and " acc " not in capsys.readouterr().out


def test_drawn_batches_need_steps_per_epoch_and_enough_batches():
    with pytest.raises(ValueError, match="steps_per_epoch"):
        train(TrainConfig(**{**CFG, "steps_per_epoch": None}), model=fresh(), batches=batches,
              eval_fn=held_out)  # fmt: skip
    with pytest.raises(ValueError, match="batches gave 3 batches"):
        train(TrainConfig(**{**CFG, "steps_per_epoch": 4}), model=fresh(), batches=batches,
              loss_fn=token_loss, eval_fn=held_out, progress=False, verbose=False)  # fmt: skip
    with pytest.raises(ValueError, match="history already uses"):
        run(on_epoch_end=lambda m, e: {"val_acc": 1.0})
    with pytest.raises(ValueError, match="history already uses"):
        train(TrainConfig(**CFG), model=fresh(), batches=batches, loss_fn=token_loss, progress=False,
              verbose=False, eval_fn=lambda m: {"lr": 1.0})  # fmt: skip


def test_train_step_clips_the_global_gradient_norm():
    x, y = torch.randn(8, 4, generator=torch.Generator().manual_seed(0)), torch.zeros(8, dtype=torch.long)
    for clip, want in ((None, None), (1e-3, 1e-3)):
        model = fresh()
        model.weight.data.mul_(100)  # a large loss: a gradient norm far above 1e-3
        before = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=1.0)  # the update is −grad exactly
        loss, logits = train_step(model, opt, x, y, grad_clip=clip)
        assert logits.shape == (8, 4) and not loss.requires_grad
        grad = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()  # as the step used it
        step = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before)]).norm()
        if want is None:
            assert grad > 1.0 and step == pytest.approx(grad.item(), rel=1e-3)
        else:
            assert grad.item() == pytest.approx(want, rel=1e-5)
            assert step.item() == pytest.approx(want, rel=1e-2)


def test_the_clipped_norm_is_the_stepped_gradients_only():
    """A frozen parameter's leftover gradient (from an earlier stage) is not clipped against."""
    x, y = torch.randn(8, 4, generator=torch.Generator().manual_seed(0)), torch.zeros(8, dtype=torch.long)
    model = fresh()
    model.weight.data.mul_(100)
    model.bias.requires_grad_(False)
    model.bias.grad = torch.full_like(model.bias, 1e6)  # stale: the optimizer never sees it
    before = model.weight.detach().clone()
    opt = torch.optim.SGD([model.weight], lr=1.0)
    train_step(model, opt, x, y, grad_clip=1e-3)
    assert (model.weight.detach() - before).norm().item() == pytest.approx(1e-3, rel=1e-2)


def test_betas_reach_the_optimizer():
    for name in ("adam", "adamw"):
        opt = make_optimizer(TrainConfig(optimizer=name, betas=(0.9, 0.98)), fresh())
        assert opt.param_groups[0]["betas"] == (0.9, 0.98)
    assert make_optimizer(TrainConfig(), fresh()).param_groups[0]["betas"] == (0.9, 0.999)  # torch's default
    for bad in ((0.9,), (0.9, 1.0), (-0.1, 0.9), "ab"):
        with pytest.raises(ValueError, match="betas"):
            TrainConfig(betas=bad)
    with pytest.raises(ValueError, match="grad_clip"):
        TrainConfig(grad_clip=0.0)
