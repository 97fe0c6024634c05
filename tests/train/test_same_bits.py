"""The trainer's bits are pinned: three small trainings end with the weights they had when this test was
written (SHA-256 of every tensor's bytes, in key order), so a rewrite of the trainer that changes any
number (the batch order, the seeds, the schedule, the step, autocast, the scaler) fails here.

The digests were taken on one thread on the CPU with torch 2.13.0 on AVX512 CPUs (2026-12-02, with the
trainer as it was before its split into config/batches/checkpoint/loop, commit e0cfb2f; the split one gives
the same). The CNN trains with max pooling, torch's own kernel, so the pins follow the trainer and not our
pool kernels (the soft gate's C kernel changes its float rounding when it gets faster). Float bits depend on
the torch version and the CPU's kernels (oneDNN and MKL choose theirs by the CPU's AVX-512 and AMX features:
the same trainer gives other bits on a CPU with AMX), so the digests are kept per CPU kind, by its
AVX-512/AMX flags; the first machine's flags were not recorded, and only its hooks digest is known. Another
torch, capability or CPU kind skips, saying why; the determinism tests in test_train.py hold everywhere. A
new CPU kind: run this file's trainings at e0cfb2f there and add the digests under the flags it prints.
"""

from __future__ import annotations

import hashlib

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.train import TrainConfig, train

PINNED_ON = ("2.13.0", "AVX512")  # torch version (without the local tag), torch's CPU capability
SMALL = dict(model="residual_cnn", train_size=256, test_size=128, epochs=2, batch_size=64, seed=0, threads=1)
MAX = dict(SMALL, model_kwargs={"pool": "max"})
BF16 = dict(MAX, amp="bf16", grad_clip=0.05, label_smoothing=0.1, optimizer="sgd", weight_decay=1e-4)
FIRST = {"hooks": "a846b1638d3bf5ee96ae735ef695f227b401f1fd328cef0db30476864a270aa2"}  # flags not recorded
BY_FLAGS = {  # the CPU's AVX-512/AMX flags -> digests, each taken at e0cfb2f and equal after the split
    "amx_bf16 amx_int8 amx_tile avx512_bf16 avx512_bitalg avx512_fp16 avx512_vbmi2 avx512_vnni "
    "avx512_vpopcntdq avx512bw avx512cd avx512dq avx512f avx512ifma avx512vbmi avx512vl": {  # 2026-12-02
        "max": "05df495bb8c8517851b1275b9cc64d23461f7a5c765c39612fe5817569909ff6",
        "max-bf16-clip-sgd": "22cd91966152af53d99acc39ae37d1854a489ab1ab88cf8033045d6bd1b161da",
        "hooks": "9772029ba89c4bfa867680b0bf89f1a70459cd72e199d03e22cf6774378bbe85",
        "max-final": {"train_loss": 2.3011377453804016, "train_acc": 0.1484375,
                      "test_loss": 2.2645888328552246, "test_acc": 0.1640625},  # fmt: skip
    },
}

def cpu_flags() -> str:
    """This CPU's AVX-512 and AMX flags from /proc/cpuinfo, sorted ("" where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            line = next((row for row in f if row.startswith("flags")), "")
    except OSError:
        line = ""
    return " ".join(sorted(w for w in line.split() if w.startswith(("avx512", "amx"))))


def expected(name: str):
    known = BY_FLAGS.get(cpu_flags(), FIRST)
    if name not in known:
        pytest.skip(f"no {name} digest for a CPU with flags {cpu_flags()!r}")
    return known[name]


def check(model: nn.Module, name: str) -> None:
    want = expected(name)
    got = digest(model)
    assert got == want, f"{name}: {got} on a CPU with flags {cpu_flags()!r}"


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    state = model.state_dict()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


@pytest.fixture(autouse=True)
def pinned_machine():
    here = (torch.__version__.split("+")[0], torch.backends.cpu.get_cpu_capability())
    if here != PINNED_ON:
        pytest.skip(f"digests pinned on torch {PINNED_ON[0]} with {PINNED_ON[1]} kernels, this is {here}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the config says so too; also one thread for anything outside train()
    yield
    torch.set_num_threads(threads)


def quiet(config: dict, **kw):
    return train(TrainConfig(**config), progress=False, verbose=False, **kw)


def test_max_pool_cnn_on_mnist():
    final = expected("max-final")  # skips before training where this CPU kind has no digests
    result = quiet(MAX)
    check(result.model, "max")
    assert result.final == final  # as reported, too


def test_bf16_autocast_clipping_smoothing_and_sgd():
    expected("max-bf16-clip-sgd")
    check(quiet(BF16).model, "max-bf16-clip-sgd")


def test_the_hooks_path():
    """Drawn batches, a per-token loss, an own evaluation, extras and an early stop (test_hooks.py's task)."""
    steps, b = 3, 16

    def labels(x):
        return torch.stack([x[:, 0] > 0, x[:, 1] > 0], 1).long()  # (B, 2)

    def batches(g):
        for _ in range(steps):
            x = torch.randn(b, 4, generator=g)  # (B, 4)
            yield x, labels(x)

    def token_loss(model, x, y):
        logits = model(x).view(-1, 2, 2)  # (B, tokens, classes)
        return F.cross_entropy(logits.reshape(-1, 2), y.reshape(-1)), logits

    held_out = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))

    @torch.no_grad()
    def evaluation(model):
        hits = model(held_out).view(-1, 2, 2).argmax(-1) == labels(held_out)
        return {"val_acc": hits.float().mean().item()}

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.1), nn.ReLU(), nn.Linear(16, 4))
    config = dict(model="pairs", data="random pairs", epochs=6, steps_per_epoch=steps, batch_size=b, lr=0.05,
                  schedule="cosine", optimizer="adamw", weight_decay=0.01, threads=1, seed=3)  # fmt: skip
    result = quiet(config, model=model, batches=batches, loss_fn=token_loss, eval_fn=evaluation,
                   on_epoch_end=lambda m, e: {"w": m[0].weight.norm().item()},
                   stop_fn=lambda row: row["epoch"] == 5)  # fmt: skip
    assert len(result.history) == 5
    check(result.model, "hooks")
