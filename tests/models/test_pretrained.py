"""Shipped lecture models: choosing, verifying and loading them; and the shipped files themselves.

The first half runs on weights written here (any weights will do for the loader's logic); the second
reads the shipped files: each was built by ``gatepool pretrained build`` from the experiments' own
full-profile configs, loads with its hash verified, and reproduces its card's accuracy.
"""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save

from gatepool.cli import main
from gatepool.models import create_model
from gatepool.models.pretrained import PRETRAINED_DIR, cards, find_card
from gatepool.models.registry import load_pretrained
from gatepool.train import RUNTIME_FIELDS
from gatepool.utils.io import CorruptFileError
from gatepool.utils.threads import num_threads

ROOT = Path(__file__).resolve().parents[2]


def write_weights(root: Path, name: str, model: str, kwargs: dict, seed: int, default: bool) -> dict:
    """A card and its weights (a freshly initialized net of ``seed``) in ``root``, as the build writes."""
    torch.manual_seed(seed)
    net = create_model(model, **kwargs)
    data = save({k: v.contiguous() for k, v in net.state_dict().items()})
    (root / f"{name}.safetensors").write_bytes(data)
    card = {"name": name, "model": model, "model_kwargs": kwargs, "default": default, "seed": seed,
            "sha256": hashlib.sha256(data).hexdigest()}  # fmt: skip
    (root / f"{name}.json").write_text(json.dumps(card))
    return {k: v.clone() for k, v in net.state_dict().items()}


@pytest.fixture
def root(tmp_path):
    states = {
        "conv_attention-s0": write_weights(tmp_path, "conv_attention-s0", "conv_attention", {"d": 16}, 0, 1),
        "conv_attention-s1": write_weights(tmp_path, "conv_attention-s1", "conv_attention", {"d": 16}, 1, 0),
        "conv_stem-s0": write_weights(tmp_path, "conv_stem-s0", "conv_stem", {}, 0, True),
    }  # fmt: skip
    return tmp_path, states


def same_weights(model, state) -> bool:
    return all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_the_default_or_the_named_weights_load(root):
    path, states = root
    model = load_pretrained("conv_attention", True, {}, root=path)
    assert model.pretrained_card["name"] == "conv_attention-s0"
    assert same_weights(model, states["conv_attention-s0"])
    model = load_pretrained("conv_attention", "conv_attention-s1", {"d": 16}, root=path)
    assert same_weights(model, states["conv_attention-s1"])
    assert not same_weights(model, states["conv_attention-s0"])  # the two seeds differ: the test can tell
    assert find_card("conv_stem", {}, True, path)["name"] == "conv_stem-s0"


def test_no_match_lists_what_ships(root):
    path, _ = root
    with pytest.raises(ValueError, match=r"no shipped weights for that model and kwargs; shipped: "
                                         r"conv_attention-s0 \(conv_attention\(d=16\), default\)"):
        find_card("conv_attention", {"d": 8}, True, path)
    with pytest.raises(ValueError, match="no shipped weights for that model"):
        find_card("residual_cnn", {}, True, path)
    with pytest.raises(ValueError, match="holds a 'conv_stem' model, not 'conv_attention'"):
        find_card("conv_attention", {}, "conv_stem-s0", path)
    with pytest.raises(ValueError, match="no shipped weights by that name"):
        find_card("conv_attention", {}, "conv_attention-s9", path)
    with pytest.raises(TypeError, match="pretrained must be"):
        find_card("conv_attention", {}, 1.0, path)


def test_several_matches_without_one_default_ask_for_a_name(root):
    path, _ = root
    card = json.loads((path / "conv_attention-s1.json").read_text())
    (path / "conv_attention-s1.json").write_text(json.dumps({**card, "default": True}))
    with pytest.raises(ValueError, match="several shipped weights match.*pretrained='<weights name>'"):
        find_card("conv_attention", {}, True, path)


@pytest.mark.parametrize("damage", ["flip", "truncate", "missing"])
def test_a_damaged_file_is_refused_with_the_file_and_the_fix(root, damage):
    path, _ = root
    weights = path / "conv_attention-s0.safetensors"
    data = bytearray(weights.read_bytes())
    if damage == "flip":
        data[-5] ^= 0x01  # one bit of one weight: still a loadable file, so only the hash can tell
        weights.write_bytes(bytes(data))
    elif damage == "truncate":
        weights.write_bytes(bytes(data[:-4]))
    else:
        weights.unlink()
    why = "SHA-256 .* does not match its card" if damage != "missing" else "missing"
    with pytest.raises(CorruptFileError, match=f"{weights}: .*{why}.*gatepool pretrained build"):
        load_pretrained("conv_attention", True, {}, root=path)


def test_create_model_pretrained_false_is_unchanged():
    torch.manual_seed(0)
    a = create_model("conv_stem")
    torch.manual_seed(0)
    b = create_model("conv_stem", pretrained=False)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    with pytest.raises(ValueError, match="model='nope' is unknown"):
        create_model("nope", pretrained=True)


# ----------------------------------------------------------------------------- the shipped files


def shipped_specs():
    from gatepool.lab.pretrained import shipped_specs

    return shipped_specs()


def test_every_shipped_model_is_there_built_from_its_experiments_config():
    every = cards()
    specs = shipped_specs()
    assert sorted(every) == sorted(s["name"] for s in specs)
    for spec in specs:
        card = every[spec["name"]]
        assert card["experiment"] == spec["experiment"] and card["default"] == spec["default"]
        assert card["sha256"] == hashlib.sha256((PRETRAINED_DIR / f"{card['name']}.safetensors").read_bytes()
                                                ).hexdigest()  # fmt: skip
        trained = {k: v for k, v in card["train_config"].items() if k not in RUNTIME_FIELDS}
        if spec["kind"] == "train":
            from gatepool.train import TrainConfig

            wanted = TrainConfig.from_dict(spec["config"]).to_dict()
            assert trained == {k: v for k, v in wanted.items() if k not in RUNTIME_FIELDS}, spec["name"]
        elif spec["kind"] == "variant":
            from gatepool.train.variants import default_config

            assert card["train_config"] == default_config(**spec["config"]), spec["name"]
        else:
            from gatepool.train.seq import seq_config

            c = {k: v for k, v in spec["config"].items() if k not in ("eval_size", "target_acc")}
            wanted = seq_config(**c).to_dict()
            assert trained == {k: v for k, v in wanted.items() if k not in RUNTIME_FIELDS}
        for key in ("data", "seed", "epochs", "steps", "test_size", "test_acc", "torch", "machine",
                    "command"):  # fmt: skip
            assert card[key] is not None, (spec["name"], key)


def test_the_shipped_weights_fit_in_five_megabytes():
    total = sum(p.stat().st_size for p in PRETRAINED_DIR.glob("*.safetensors"))
    assert 0 < total <= 5 * 1024 * 1024


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(cards()))
def test_each_shipped_model_reproduces_its_cards_accuracy(name):
    from gatepool.lab.pretrained import test_accuracy

    card = cards()[name]
    model = create_model(card["model"], pretrained=name)
    with num_threads(1):
        acc = test_accuracy(card, model, card["check"]["first"])
    # the card's figure on the same test items; one item's worth of slack for a float tie that another
    # thread count breaks the other way
    assert abs(acc - card["check"]["acc"]) <= 1 / card["check"]["first"] + 1e-9
    assert card["test_acc"] > {"greedy token accuracy": 0.9}.get(card["test_metric"], 0.5)


def test_pretrained_true_picks_the_lectures_weights():
    def picked(model, **kwargs):
        return create_model(model, pretrained=True, **kwargs).pretrained_card["name"]

    assert picked("residual_cnn", pool="soft") == "residual_cnn-soft-s0"
    assert picked("conv_attention") == "conv_attention-s0" and picked("conv_stem") == "conv_stem-s0"
    assert picked("vit_mnist") == "vit_mnist-n60000-s0" and picked("seq_decoder") == "seq_decoder-reverse-s0"
    with pytest.raises(ValueError, match="several shipped weights match"):
        create_model("residual_cnn", pretrained=True)  # six gates: say which
    with pytest.raises(ValueError, match="no shipped weights for that model and kwargs; shipped: .*"
                                         "residual_cnn-max-s0"):  # fmt: skip
        create_model("residual_cnn", pool="soft", width=16, pretrained=True)


def test_a_corrupt_copy_of_a_shipped_file_is_refused(tmp_path):
    for suffix in (".json", ".safetensors"):
        shutil.copy(PRETRAINED_DIR / f"conv_stem-s0{suffix}", tmp_path / f"conv_stem-s0{suffix}")
    assert load_pretrained("conv_stem", True, {}, root=tmp_path).pretrained_card["name"] == "conv_stem-s0"
    weights = tmp_path / "conv_stem-s0.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x10
    weights.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match="conv_stem-s0.safetensors: SHA-256"):
        load_pretrained("conv_stem", True, {}, root=tmp_path)


def test_vit_mnist_epochs_are_the_full_runs():
    from gatepool.lab.experiments.vit_mnist import FULL_RUN_EPOCHS

    full = json.loads((ROOT / "results" / "full" / "results.json").read_text())
    (rec,) = [e for e in full["experiments"] if e["name"] == "vit-mnist"]
    ran = {(r["model"], r["n"]): r["epochs"] for r in rec["data"]["rows"]}
    assert FULL_RUN_EPOCHS == {k: ran[k] for k in FULL_RUN_EPOCHS}


def test_the_specs_are_the_experiments_own_trainings(tmp_path, monkeypatch):
    """pool-comparison's and attention-reach's full-profile runs, caught on their way to the trainer."""
    from gatepool.lab.claims import Context
    from gatepool.lab.experiments import attention_reach, pool_comparison
    from gatepool.lab.harness import get

    caught = []

    class Caught(Exception):
        pass

    def catch(tasks):
        caught.extend(tasks)
        raise Caught  # stop before any training

    monkeypatch.setattr(pool_comparison, "run_tasks", lambda fn, tasks, jobs, executor=None: catch(tasks))
    monkeypatch.setattr(attention_reach, "train_pending", lambda tasks, jobs, executor=None: catch(tasks))
    for name in ("pool-comparison", "attention-reach"):
        exp = get(name)
        with pytest.raises(Caught):
            exp.fn(Context(exp, "full", exp.resolve_setup("full"), tmp_path / name, progress=False))
    runs = {json.dumps(t.config, sort_keys=True) for t in caught}
    for spec in shipped_specs():
        if spec["experiment"] in ("pool-comparison", "attention-reach"):
            assert json.dumps(spec["config"], sort_keys=True) in runs, spec["name"]


def test_cli_lists_the_cards_and_refuses_unknown_names(tmp_path, capsys):
    assert main(["pretrained", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in cards())
    assert main(["pretrained", "list", "--json"]) == 0
    assert {c["name"] for c in json.loads(capsys.readouterr().out)} == set(cards())
    assert main(["pretrained", "build", "--out", str(tmp_path), "--only", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gatepool pretrained: error: --only: unknown names ['nope']")


def test_build_ships_only_the_weights_a_run_recorded(tmp_path, monkeypatch):
    """A finished run folder whose weights no longer match its results.json is trained again (the trainer
    rebuilds it from its checkpoint), and never copied into the package with a fresh, matching hash."""
    from gatepool.lab import pretrained

    spec = next(s for s in pretrained.shipped_specs() if s["name"] == "conv_stem-s0")
    folder = tmp_path / "runs" / spec["name"]
    folder.mkdir(parents=True)
    weights = save({"w": torch.zeros(3)})
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "results.json").write_text(json.dumps({"weights_sha256": hashlib.sha256(weights).hexdigest()}))
    assert pretrained._finished(folder)
    (folder / "model.safetensors").write_bytes(weights[:-1] + bytes([weights[-1] ^ 1]))  # one flipped bit
    assert not pretrained._finished(folder)

    trained = []
    monkeypatch.setattr(pretrained, "shipped_specs", lambda: [spec])
    monkeypatch.setattr("gatepool.train.sweep.run_tasks", lambda fn, tasks, jobs: trained.extend(tasks))
    with pytest.raises(CorruptFileError, match="delete .* and build again"):
        pretrained.build(tmp_path / "runs", tmp_path / "dest", jobs=1, log=lambda *_: None)
    assert [t["spec"]["name"] for t in trained] == ["conv_stem-s0"]  # sent back to the trainer
    assert not list((tmp_path / "dest").glob("*"))  # nothing shipped
