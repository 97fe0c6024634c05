"""A user's own grid of trainings: gates × seeds × data sets × model and training settings.

A grid file (TOML, or the same keys as JSON)::

    model    = "residual_cnn"            # registry name (gatepool.list_models())
    gates    = ["max", "avg", "soft"]    # the model's ``pool`` argument ("pools" is the same key)
    seeds    = [0, 1, 2]
    datasets = ["mnist", "fashion-mnist"]  # any name gatepool.data.dataset_names() knows

    [model_settings]                     # model keyword arguments; a list is an axis of the grid
    width = [16, 32]

    [train]                              # TrainConfig fields; a list is an axis (betas: a list of pairs)
    epochs = 2
    train_size = 5000                    # not device: that is the command's --device

expands to one training per point of the product (here 3 × 3 × 2 × 2 = 36), each a ``gatepool.train``
run in its own folder ``<out>/<dataset>/<gate>[-key=value...]-s<seed>/`` (checkpoint every epoch, then
results.json), a :class:`gatepool.train.task.TrainTask` run through
:func:`gatepool.train.sweep.run_tasks` (the local process pool or Ray). A rerun skips finished trainings
and resumes started ones. The results: ``results.csv`` and ``results.json`` (one row per training,
failed ones included with their error, and per gate and setting the mean test accuracy over seeds with
its 95% interval, mean ± t₀.₉₇₅,ₙ₋₁ · s/√n; null where it has no value: the interval of one seed, the
mean of none), and ``accuracy.png`` (that mean and interval per gate, a panel per data set).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from gatepool.train.task import TrainTask, train_task
from gatepool.utils.io import atomic_write_json, atomic_write_text

TOP_KEYS = ("model", "gates", "pools", "seeds", "datasets", "model_settings", "train", "out")
GRID_FIELDS = ("model", "model_kwargs", "data", "seed")  # set by the grid, not by [train]
COLUMNS = ["dataset", "gate", "seed", "settings", "status", "test_acc", "test_loss", "train_acc",
           "train_loss", "epochs", "seconds", "out", "error"]  # fmt: skip


@dataclass
class Grid:
    """A parsed grid: the axes, and the settings that are the same for every training."""

    model: str
    gates: list[str]
    seeds: list[int]
    datasets: list[str]
    model_settings: dict[str, list[Any]] = field(default_factory=dict)  # axis name -> values
    train: dict[str, list[Any]] = field(default_factory=dict)  # TrainConfig field -> values
    out: str | None = None

    def points(self) -> list[dict[str, Any]]:
        """Every training: {dataset, gate, seed, model_kwargs, train, settings (what varies, for names)}."""
        axes = {**{("model", k): v for k, v in self.model_settings.items()},
                **{("train", k): v for k, v in self.train.items()}}  # fmt: skip
        varying = [k for k, v in axes.items() if len(v) > 1]
        rows = []
        for data, gate, combo, seed in itertools.product(
            self.datasets, self.gates, itertools.product(*axes.values()), self.seeds
        ):
            chosen = dict(zip(axes, combo))
            rows.append({
                "dataset": data,
                "gate": gate,
                "seed": seed,
                "model_kwargs": {k: v for (kind, k), v in chosen.items() if kind == "model"},
                "train": {k: v for (kind, k), v in chosen.items() if kind == "train"},
                "settings": {k: chosen[(kind, k)] for kind, k in varying},
            })  # fmt: skip
        return rows


def load_grid(path: str | Path) -> Grid:
    """Read and check a grid file (.toml or .json); a ValueError names the file and the key at fault."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such grid file")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
    elif path.suffix == ".toml":
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            raise ValueError(f"{path}: reading TOML needs Python >= 3.11; write the grid as .json") from None
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: not valid TOML ({e})") from None
    else:
        raise ValueError(f"{path}: a grid file ends in .toml or .json")
    try:
        return parse_grid(raw)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from None


def parse_grid(raw: dict[str, Any]) -> Grid:
    """A grid from its keys (see the module doc), checked: every training's config is built once here."""
    from gatepool.data import dataset_names
    from gatepool.models import create_model, list_models
    from gatepool.train.config import TrainConfig

    if not isinstance(raw, dict):
        raise ValueError("a grid is a table of keys (model, gates, seeds, datasets, ...)")
    unknown = sorted(set(raw) - set(TOP_KEYS))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown}; a grid has {', '.join(TOP_KEYS)}")
    if "gates" in raw and "pools" in raw:
        raise ValueError("give gates or pools (the same key), not both")
    model = raw.get("model", "residual_cnn")
    if model not in list_models():
        raise ValueError(f"model {model!r} is unknown; choose one of {', '.join(list_models())}")
    gates = _list(raw, "pools" if "pools" in raw else "gates", str, default=None)
    seeds = _list(raw, "seeds", int, default=[0])
    if any(s < 0 for s in seeds):
        raise ValueError(f"seeds must be integers >= 0, got {seeds}")
    datasets = _list(raw, "datasets", str, default=["mnist"])
    for d in datasets:
        if d not in dataset_names():
            raise ValueError(f"datasets: {d!r} is unknown; choose from {', '.join(dataset_names())}")
    model_settings = {k: _axis(v, k) for k, v in _table(raw, "model_settings").items()}
    if "pool" in model_settings:
        raise ValueError("model_settings.pool: the gates key sets the pool")
    train = {k: _axis(v, k, pairs=(k == "betas")) for k, v in _table(raw, "train").items()}
    if "device" in train:  # the command's --device sets it for every training
        raise ValueError("train.device: the device is not a grid setting; use the command's --device")
    known = {f.name for f in fields(TrainConfig)} - set(GRID_FIELDS)
    bad = sorted(set(train) - known)
    if bad:
        raise ValueError(f"train: unknown or grid-set field(s) {bad}; TrainConfig fields: {sorted(known)}")
    out = raw.get("out")
    if out is not None and not isinstance(out, str):
        raise ValueError(f"out must be a folder name (a string), got {out!r}")
    grid = Grid(model, gates, seeds, datasets, model_settings, train, out)
    for p in grid.points():  # every config and model is built once: a bad value fails now, not in hour 3
        kwargs = {**p["model_kwargs"], "pool": p["gate"]}
        try:
            create_model(model, **kwargs)
            TrainConfig(model=model, model_kwargs=kwargs, data=p["dataset"], seed=p["seed"], **p["train"])
        except (ValueError, TypeError) as e:
            where = ", ".join(f"{k}={v!r}" for k, v in {"gate": p["gate"], **p["settings"]}.items())
            raise ValueError(f"the training with {where}: {e}") from None
    return grid


def _list(raw: dict[str, Any], key: str, kind: type, *, default: list | None) -> list:
    what = {str: "names", int: "integers"}[kind]
    if key not in raw:
        if default is None:
            raise ValueError(f"{key} is missing: a list of {what}")
        return list(default)
    v = raw[key]
    v = v if isinstance(v, list) else [v]
    if not v or any(isinstance(x, bool) or not isinstance(x, kind) for x in v):
        raise ValueError(f"{key} must be a non-empty list of {what}, got {raw[key]!r}")
    if len(set(map(str, v))) != len(v):
        raise ValueError(f"{key} lists a value twice: {v}")
    return list(v)


def _table(raw: dict[str, Any], key: str) -> dict[str, Any]:
    v = raw.get(key, {})
    if not isinstance(v, dict):
        raise ValueError(f"{key} must be a table of settings, got {v!r}")
    return v


def _axis(value: Any, key: str, *, pairs: bool = False) -> list[Any]:
    """A setting's values: a list is an axis, anything else one value (``pairs``: a list of lists is)."""
    is_axis = isinstance(value, list) and (not pairs or all(isinstance(x, list) for x in value))
    if is_axis and not value:
        raise ValueError(f"{key}: an empty list gives no trainings")
    return list(value) if is_axis else [value]


def run_name(point: dict[str, Any]) -> str:
    """``<dataset>/<gate>[-key=value...]-s<seed>``: the training's folder under the grid's out."""
    settings = "".join(f"-{k}={_short(v)}" for k, v in point["settings"].items())
    return f"{point['dataset']}/{point['gate']}{settings}-s{point['seed']}"


def _short(v: Any) -> str:
    return ",".join(map(str, v)) if isinstance(v, list) else str(v)


def tasks_of(grid: Grid, out: Path, *, device: str = "cpu", progress: bool = False) -> list[TrainTask]:
    """The grid's trainings, one per point (in :meth:`Grid.points`' order), each in ``out/<run_name>``."""
    tasks = []
    for p in grid.points():
        config = {**p["train"], "model": grid.model, "model_kwargs": {**p["model_kwargs"], "pool": p["gate"]},
                  "data": p["dataset"], "seed": p["seed"], "device": device}  # fmt: skip
        tasks.append(TrainTask(config, str(out / run_name(p)), progress))
    return tasks


def run_grid(
    grid: Grid,
    out: str | Path,
    *,
    jobs: int = 1,
    executor: Any = None,
    device: str = "cpu",
    progress: bool = False,
) -> dict[str, Any]:
    """Train every point of ``grid`` (resuming) and write results.csv, results.json and accuracy.png."""
    from gatepool.train.sweep import TaskFailed, run_tasks

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = tasks_of(grid, out, device=device, progress=progress and jobs == 1 and executor is None)
    records = run_tasks(train_task, tasks, jobs, executor, failures="return")
    rows = [_row(p, t, r) for p, t, r in zip(grid.points(), tasks, records)]
    for row, rec in zip(rows, records):
        if isinstance(rec, TaskFailed):
            row.update(status="failed", error=rec.error)
    result = {"grid": _grid_dict(grid), "rows": rows, "summary": summarize(rows)}
    atomic_write_json(out / "results.json", result)
    atomic_write_text(out / "results.csv", to_csv(rows))
    figure(result["summary"], out / "accuracy.png")
    return result


def _row(p: dict[str, Any], task: TrainTask, rec: Any) -> dict[str, Any]:
    row = {"dataset": p["dataset"], "gate": p["gate"], "seed": p["seed"], "settings": p["settings"],
           "status": "ok", "out": task.out, "error": ""}  # fmt: skip
    if isinstance(rec, dict):
        final = rec["final"]
        row.update({k: final[k] for k in ("test_acc", "test_loss", "train_acc", "train_loss")})
        row.update(epochs=len(rec["history"]), seconds=rec["seconds"])
    return row


def _grid_dict(grid: Grid) -> dict[str, Any]:
    return {f.name: getattr(grid, f.name) for f in fields(grid)}


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (dataset, settings, gate): n, mean test accuracy over the seeds that finished, 95% interval."""
    from scipy.stats import t as student_t

    groups: dict[tuple, list[float]] = {}
    for r in rows:
        key = (r["dataset"], json.dumps(r["settings"], sort_keys=True), r["gate"])
        groups.setdefault(key, [])
        if r["status"] == "ok":
            groups[key].append(r["test_acc"])
    out = []
    for (data, settings, gate), acc in groups.items():
        n = len(acc)
        mean = statistics.fmean(acc) if n else None  # None (JSON null), not NaN: no seed finished
        half = None  # an interval needs two seeds
        if n > 1:
            half = float(student_t.ppf(0.975, n - 1)) * statistics.stdev(acc) / math.sqrt(n)
        out.append({"dataset": data, "settings": json.loads(settings), "gate": gate, "n": n,
                    "test_acc_mean": mean, "test_acc_ci95": half})  # fmt: skip
    return out


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    settings = sorted({k for r in rows for k in r["settings"]})
    writer = csv.writer(buf, lineterminator="\n")
    head = [c for c in COLUMNS if c != "settings"]
    writer.writerow(head[:3] + settings + head[3:])
    for r in rows:
        values = [r.get(c, "") for c in head]
        writer.writerow(values[:3] + [_short(r["settings"].get(k, "")) for k in settings] + values[3:])
    return buf.getvalue()


def figure(summary: Sequence[dict[str, Any]], path: Path) -> None:
    """Mean test accuracy per gate with its 95% interval over seeds; a panel per data set, a colour per
    setting (an interval needs two seeds: with one, the point alone)."""
    from gatepool.utils.plotting import pyplot, save_png

    plt = pyplot()
    datasets = list(dict.fromkeys(s["dataset"] for s in summary))
    settings = list(dict.fromkeys(json.dumps(s["settings"], sort_keys=True) for s in summary))
    gates = list(dict.fromkeys(s["gate"] for s in summary))
    fig, axes = plt.subplots(1, len(datasets), figsize=(1.2 + 1.1 * len(gates) * len(datasets), 3.4),
                             squeeze=False)  # fmt: skip
    width = 0.8 / len(settings)
    for ax, data in zip(axes[0], datasets):
        for j, setting in enumerate(settings):
            pts = [s for s in summary if s["dataset"] == data and json.dumps(s["settings"], sort_keys=True)
                   == setting]  # fmt: skip
            xs = [gates.index(s["gate"]) + (j - (len(settings) - 1) / 2) * width for s in pts]
            ys = [math.nan if s["test_acc_mean"] is None else 100 * s["test_acc_mean"] for s in pts]
            err = [0.0 if s["test_acc_ci95"] is None else 100 * s["test_acc_ci95"] for s in pts]
            label = ", ".join(f"{k}={_short(v)}" for k, v in json.loads(setting).items()) or None
            ax.errorbar(xs, ys, yerr=err, fmt="o", capsize=3, color=f"C{j}", label=label)
        ax.set_xticks(range(len(gates)), gates)
        ax.set(title=data, ylabel="test accuracy (%)")
        if len(settings) > 1:
            ax.legend(fontsize=7)
    fig.suptitle("mean over seeds, bars: 95% interval (t)", fontsize=9)
    fig.tight_layout()
    save_png(fig, path, dpi=110)
