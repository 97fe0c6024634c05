"""What an experiment declares and sees: its claims, its setups, and the context it measures in.

An experiment is a function ``fn(ctx: Context) -> None`` declared with :func:`experiment`. It declares
its claims up front (:class:`Claim`: id, one-line statement, the lecture's value, a tolerance and why that
tolerance), measures, and reports each measurement with ``ctx.check(id, measured, theory=...)``:

* while ``--set`` has changed no setup value the claim ``depends`` on, the measurement is compared with
  the lecture's value (the quick profile's smaller setup too, with its widened, stated tolerances);
* once ``--set`` changes one of them, the lecture's value no longer applies: ``lecture`` is left empty and
  the measurement is compared with ``theory`` (the probe's prediction for the changed setup). A claim with
  no theory for that setup gets the verdict ``not run``, never a guess.

A claim's record is built in one place, :func:`claim_record`: by ``ctx.check``, for a claim never checked
(:func:`not_run_record`), and when a finished run is judged again from its own measurements against the
claims declared now (:func:`rejudge_claims`). The experiment files (``gatepool.lab.experiments``) import
this module; ``harness.py`` runs them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gatepool.utils.io import json_copy, to_json
from gatepool.utils.plotting import save_png

PROFILES = ("quick", "full")
# ``ok`` / ``off``: the measurement ran and meets / misses its bar; ``undecided``: it ran but cannot
# decide (the seeds' spread is wider than half the bar: the note gives the measured spread);
# ``not run``: the measurement did not run (the note says why, e.g. "needs the full profile's second seed").
VERDICTS = ("ok", "off", "undecided", "not run")
# Where a claim's bar comes from:
# "lecture": the lecture's own number (``ref`` points to the passage), and the measurement runs our code
#   on data or on a model, so it could come out otherwise for a correct torch: a reproduction;
# "arithmetic": the lecture's number restated, computed from its own formula or printed numbers or from
#   torch's definition (a sum of its printed numbers, the softmax of its window, the moments of a max of
#   normals or of a ReLU of one, a count or a share fixed by construction such as a max pool's one winner
#   in four, an identity every correct implementation satisfies for any weights such as an equivariance,
#   or the lecture's √d simulation re-run): checked, but no measurement of it could differ, so it is
#   counted apart from the reproductions;
# "ours": a bar of ours (``ref`` says why that bar), on a measurement that could come out otherwise;
# "identity": a check of ours that no correct torch can fail (an identity for any weights or inputs such
#   as W @ x = conv1d(x) or a causal mask's, or torch's own definition sampled such as an init's E[w²]):
#   it tests our code, it measures nothing, so it is counted apart from our measured checks;
# "prediction": our rule engine's prediction checked against the lecture's arithmetic (``ref`` names the
#   rule): a check of ours, not a reproduction;
# "beyond": a question beyond the lecture (``ref`` says what is asked): no bar of the lecture's, the
#   answer as measured (only ``gatepool reproduce --beyond`` runs these experiments).
# Numbers the lecture cites from the literature are not claims: ``Context.cite`` lists them, unjudged.
SOURCES = ("lecture", "arithmetic", "ours", "identity", "prediction", "beyond")
RESTATED = ("arithmetic", "identity")  # checked, but they cannot fail: never counted as measurements
# Why a lecture claim is not ok (``Claim.miss``, its ``miss_why`` saying how), declared with the claim:
MISSES = {
    "not reproduced": "the lecture's number does not reproduce on its own setup",
    "setup differs": "our setup differs from the lecture's",
    "too wide": "the spread is too wide to judge",
}


@dataclass(frozen=True)
class Claim:
    """One claim of the lecture.

    ``kind`` says how ``measured`` is compared with the expected value ``e``:
    ``"abs"``: |m − e| ≤ tol; ``"rel"``: |m − e| ≤ tol·|e|; ``"min"``: m ≥ e − tol; ``"max"``: m ≤ e + tol;
    ``"equal"``: m == e (booleans, strings, counts).
    ``quick_tolerance`` widens the tolerance for the quick profile (smaller samples, shorter training);
    ``why`` says where the tolerance comes from. ``depends`` names the setup keys the lecture's value
    assumes. ``source`` (one of :data:`SOURCES`) and ``ref`` say where the bar comes from: the lecture,
    with a pointer to the passage, or ours, with the reason for that bar. ``miss`` (a key of
    :data:`MISSES`) and ``miss_why`` say, for a lecture claim, why it is not ok where it is not: its number
    does not reproduce, our setup differs (how), or the spread is too wide to judge (an ``undecided``
    verdict is that by itself); the report shows them beside a claim that is not ok.
    """

    id: str
    statement: str
    lecture: Any = None
    tolerance: float = 0.0
    why: str = ""
    kind: str = "abs"
    quick_tolerance: float | None = None
    depends: tuple[str, ...] = ()
    source: str = ""
    ref: str = ""
    miss: str = ""
    miss_why: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("abs", "rel", "min", "max", "equal"):
            raise ValueError(f"Claim {self.id}: kind={self.kind!r} must be abs, rel, min, max or equal")
        if self.source not in SOURCES or not self.ref:
            raise ValueError(
                f"Claim {self.id}: source={self.source!r} must be one of {SOURCES}, with a ref "
                "(the lecture's passage, or the reason for our bar)"
            )
        if self.miss and (self.miss not in MISSES or self.source != "lecture" or not self.miss_why):
            raise ValueError(
                f"Claim {self.id}: miss={self.miss!r} must be one of {tuple(MISSES)}, on a lecture claim, "
                "with a miss_why (how)"
            )

    def tolerance_for(self, profile: str) -> float:
        """The declared tolerance on ``profile``: ``quick_tolerance`` where the quick profile widens it."""
        widened = profile == "quick" and self.quick_tolerance is not None
        return self.quick_tolerance if widened else self.tolerance


def verdict(kind: str, measured: Any, expected: Any, tol: float, undecided: bool = False) -> str:
    """'ok' or 'off' for one comparison; 'not run' when there is nothing to compare; 'undecided' when
    there is a measurement but its caller says it cannot decide."""
    if measured is None or expected is None:
        return "not run"
    if undecided:
        return "undecided"
    if kind == "equal":
        return "ok" if measured == expected else "off"
    m, e = float(measured), float(expected)
    if math.isnan(m):
        return "off"
    ok = {
        "abs": abs(m - e) <= tol,
        "rel": abs(m - e) <= tol * abs(e),
        "min": m >= e - tol,
        "max": m <= e + tol,
    }[kind]
    return "ok" if ok else "off"


@dataclass
class Experiment:
    name: str
    fn: Callable[[Context], None]
    title: str
    order: float
    setup: dict[str, Any]  # the lecture's setup (the full profile)
    quick: dict[str, Any]  # what the quick profile changes
    claims: Callable[[dict[str, Any]], list[Claim]]  # the claims for a setup
    module: str = ""
    beyond: bool = False  # a question beyond the lecture: run by ``reproduce --beyond`` (or ``run``) only

    def claims_digest(self, setup: dict[str, Any]) -> str:
        """A hash of the claims declared for ``setup`` (ids, statements, bars, tolerances, sources): a
        finished record whose digest differs was measured against other claims."""
        specs = [dataclasses.asdict(c) for c in self.claims(setup)]
        for spec in specs:  # why a claim missed enters only where declared: the others hash without it
            for key in ("miss", "miss_why"):
                if not spec[key]:
                    del spec[key]
        return hashlib.sha256(json.dumps(to_json(specs), sort_keys=True).encode()).hexdigest()[:16]

    def resolve_setup(
        self, profile: str, overrides: dict[str, str] | None = None, seed: int | None = None
    ) -> dict[str, Any]:
        """The setup used: the lecture's, then the profile's changes, then ``--set``, then ``--seed``."""
        if profile not in PROFILES:
            raise ValueError(f"profile={profile!r} must be one of {PROFILES}")
        setup = dict(self.setup)
        if profile == "quick":
            setup.update(self.quick)
        for key, text in (overrides or {}).items():
            if key not in setup:
                raise ValueError(
                    f"--set {key}=...: {self.name} has no setting {key!r}; it has {', '.join(sorted(setup))}"
                )
            setup[key] = parse_value(text, self.setup[key], key)
        if seed is not None:
            if "seed" not in setup:
                raise ValueError(f"--seed: {self.name} takes no seed")
            setup["seed"] = int(seed)
        return setup


_REGISTRY: dict[str, Experiment] = {}


def experiment(
    name: str,
    *,
    title: str,
    order: float,
    setup: dict[str, Any],
    quick: dict[str, Any] | None = None,
    claims: Sequence[Claim] | Callable[[dict[str, Any]], list[Claim]] = (),
    beyond: bool = False,
) -> Callable[[Callable[[Context], None]], Callable[[Context], None]]:
    """Register ``fn(ctx)`` as experiment ``name`` (``order`` = its place in the lecture; ``beyond``: an
    extension past the lecture, left out of a plain ``gatepool reproduce``)."""
    quick = dict(quick or {})
    unknown = set(quick) - set(setup)
    if unknown:
        raise ValueError(f"experiment {name}: quick profile changes unknown settings {sorted(unknown)}")
    claim_fn = claims if callable(claims) else (lambda _setup, _c=list(claims): list(_c))

    def deco(fn: Callable[[Context], None]) -> Callable[[Context], None]:
        if name in _REGISTRY and _REGISTRY[name].fn.__qualname__ != fn.__qualname__:
            raise ValueError(f"experiment {name!r} is registered twice")
        _REGISTRY[name] = Experiment(
            name, fn, title, order, dict(setup), quick, claim_fn, fn.__module__, beyond=beyond
        )
        return fn

    return deco


def declared() -> dict[str, Experiment]:
    """Every experiment declared so far, by name (``gatepool.lab.experiments.registry`` imports them all)."""
    return dict(_REGISTRY)


def parse_value(text: str, default: Any, key: str) -> Any:
    """Parse ``--set key=text`` to the type of the setting's default (lists: comma-separated)."""
    try:
        if isinstance(default, bool):
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if isinstance(default, (list, tuple)):
            elem = default[0] if default else ""
            return [parse_value(t.strip(), elem, key) for t in text.split(",") if t.strip()]
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
        if default is None:
            for cast in (int, float):
                try:
                    return cast(text)
                except ValueError:
                    pass
            return None if text.lower() == "none" else text
        return text
    except ValueError:
        kind = "a list" if isinstance(default, (list, tuple)) else type(default).__name__
        raise ValueError(f"--set {key}={text}: expected {kind} like the default {default!r}") from None


@dataclass
class Context:
    """What an experiment sees: its setup, profile, folder, and the means to report claims and figures."""

    experiment: Experiment
    profile: str
    setup: dict[str, Any]
    out: Path
    jobs: int = 1
    progress: bool = True
    device: str = "cpu"  # where the experiment's trainings run ("cpu", "cuda:0", ...; a string: picklable)
    executor: Any = None  # how its trainings run: run_tasks(fn, tasks, ctx.jobs, ctx.executor); None: local
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)
    figures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    literature: list[dict[str, str]] = field(default_factory=list)  # cited numbers: {text, ref}, unjudged
    data: dict[str, Any] = field(default_factory=dict)
    pretrained: dict[str, str] = field(default_factory=dict)  # shipped models used: name -> SHA-256

    def __post_init__(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self._specs = {c.id: c for c in self.experiment.claims(self.setup)}
        self._base = self.experiment.resolve_setup(self.profile)  # the profile's setup, before --set

    def __getitem__(self, key: str) -> Any:
        return self.setup[key]

    @property
    def quick(self) -> bool:
        return self.profile == "quick"

    def is_lecture(self, *keys: str) -> bool:
        """True while ``--set`` has changed none of the named settings.

        The quick profile's smaller setup still answers to the lecture's values, with the widened
        tolerances it states (``Claim.quick_tolerance``).
        """
        return all(self.setup[k] == self._base[k] for k in keys)

    def bar(self, claim_id: str) -> Any:
        """The declared claim's bar on this setup (None once ``--set`` moved what it depends on)."""
        spec = self._specs[claim_id]
        return spec.lecture if self.is_lecture(*spec.depends) else None

    def check(
        self,
        claim_id: str,
        measured: Any,
        *,
        theory: Any = None,
        note: str = "",
        tolerance: float | None = None,
        shipped_model: str | None = None,
        undecided: str = "",
    ) -> str:
        """Record the measurement for a declared claim and return its verdict.

        ``undecided`` (a reason): the measurement ran but cannot decide (the verdict ``undecided``, the
        measured value kept); ``measured=None`` with a ``note`` saying why: the measurement did not run.

        ``tolerance`` replaces the declared one where the claim's ``why`` says it is measured in the run
        (the spread over seeds, a fit's error). ``shipped_model`` names the shipped model(s) the
        measurement comes from (loaded with :meth:`shipped`) rather than a training in this run.
        """
        if claim_id not in self._specs:
            raise KeyError(f"{self.experiment.name}: claim {claim_id!r} is not declared")
        spec = self._specs[claim_id]
        tol = spec.tolerance_for(self.profile) if tolerance is None else float(tolerance)
        bar = self.bar(claim_id)
        on_lecture = bar is not None
        record = claim_record(
            spec,
            on_lecture=on_lecture,
            measured=measured,
            expected=bar if on_lecture else theory,
            basis=spec.source if on_lecture else ("theory" if theory is not None else None),
            tolerance=tol,
            undecided=undecided,
            note=note,
            shipped_model=shipped_model,
        )
        self.claims[claim_id] = record
        return record["verdict"]

    def shipped(self, model: str, which: bool | str = True, **kwargs: Any) -> Any:
        """A shipped lecture model (``create_model(model, pretrained=which, **kwargs)``, hash verified), in
        eval mode on the CPU; its name and SHA-256 go into the record's ``pretrained``."""
        from gatepool.models.registry import load_pretrained

        net = load_pretrained(model, which, kwargs)
        card = net.pretrained_card
        self.pretrained[card["name"]] = card["sha256"]
        return net.eval()

    def figure(self, fig: Any, filename: str) -> Path:
        """Save a matplotlib figure as ``<out>/<filename>`` (PNG) and list it in the record."""
        path = save_png(fig, self.out / filename, dpi=110)
        self.figures.append(str(path))
        return path

    def note(self, text: str) -> None:
        """A line for the report (printed too, unless quiet)."""
        self.notes.append(text)
        if self.progress:
            print(f"  {self.experiment.name}: {text}", flush=True)

    def cite(self, text: str, ref: str) -> None:
        """A number the lecture cites from the literature (``ref``: the paper): listed in the report as
        literature, neither reproduced nor judged."""
        self.literature.append({"text": text, "ref": ref})

    def claim_records(self) -> list[dict[str, Any]]:
        """Every declared claim, in declaration order; those never checked are 'not run'."""
        rows = []
        for cid, spec in self._specs.items():
            rows.append(self.claims.get(cid) or not_run_record(spec, self.is_lecture(*spec.depends)))
        rows += [r for cid, r in self.claims.items() if cid not in self._specs]
        return rows


def claim_record(
    spec: Claim,
    *,
    on_lecture: bool,
    measured: Any,
    expected: Any,
    basis: str | None,
    tolerance: float,
    undecided: str = "",
    note: str = "",
    shipped_model: str | None = None,
) -> dict[str, Any]:
    """One claim's record: what is claimed, the bar and where it comes from, the measurement, its verdict.

    ``bar`` is the value the claim holds the measurement to on the lecture's setup (None once ``--set``
    moved it: ``on_lecture`` False); ``lecture`` is that bar only when it comes from the lecture (a
    measured claim, or its arithmetic restated). ``expected`` is what the measurement is compared with
    (the bar, or the theory for a changed setup; None: nothing to compare, the verdict ``not run``);
    ``basis`` says which. ``undecided`` (a reason): the measurement ran but cannot decide; the note
    starts with it. ``measured`` and ``expected`` are stored as JSON writes them (floats to 6 digits);
    the verdict compares ``measured`` so stored with ``expected`` as given.
    """
    bar = plain(spec.lecture) if on_lecture else None
    measured = plain(measured)
    record = {
        "id": spec.id,
        "statement": spec.statement,
        "bar": bar,
        "lecture": bar if spec.source in ("lecture", "arithmetic") else None,
        "source": spec.source,
        "ref": spec.ref,
        "measured": measured,
        "expected": plain(expected),
        "basis": basis,
        "tolerance": tolerance,
        "kind": spec.kind,
        "why": spec.why,
        "verdict": verdict(spec.kind, measured, expected, tolerance, undecided=bool(undecided)),
    }
    note = "; ".join(t for t in (f"undecided: {undecided}" if undecided else "", note) if t)
    if note:
        record["note"] = note
    if shipped_model is not None:
        record["shipped_model"] = shipped_model
    if spec.miss and record["verdict"] in ("off", "not run"):  # an undecided one is too wide to judge
        record.update(miss=spec.miss, miss_why=spec.miss_why)
    return record


def not_run_record(spec: Claim, on_lecture: bool = True, note: str = "") -> dict[str, Any]:
    """The record of a declared claim that was not measured (verdict ``not run``; ``note``: why)."""
    return claim_record(spec, on_lecture=on_lecture, measured=None, expected=None, basis=None,
                        tolerance=spec.tolerance, note=note)


def rejudge_claims(
    specs: Sequence[Claim], records: Sequence[dict[str, Any]], profile: str, why: str
) -> list[dict[str, Any]]:
    """The claims declared now (``specs``), judged from the measurements of earlier ``records``.

    A claim keeps its measured value, note and any tolerance measured in the run (one that differs from
    both declared ones), and gets the verdict of the declared claim: on the declared bar where it has one,
    else on the theory the run compared with. A claim judged ``undecided`` stays so (the measured spread
    that made it so is in the run, not in the declared claim). A claim the records never measured is
    ``not run``, its note saying so with ``why``.
    """
    old = {c["id"]: c for c in records}
    claims = []
    for spec in specs:
        prev = old.get(spec.id)
        if prev is None:
            claims.append(not_run_record(spec, note=f"declared after this run; not measured ({why})"))
            continue
        declared = spec.tolerance_for(profile)
        tol = prev["tolerance"] if prev.get("tolerance") not in (None, spec.tolerance, declared) else declared
        note, undecided = prev.get("note") or "", ""
        if prev.get("verdict") == "undecided" and note.startswith("undecided: "):
            undecided, note = note.removeprefix("undecided: "), ""  # the note is the reason, whole
        on_bar = spec.lecture is not None
        row = claim_record(
            spec,
            on_lecture=True,
            measured=prev.get("measured"),
            expected=plain(spec.lecture) if on_bar else prev.get("expected"),
            basis=spec.source if on_bar else prev.get("basis"),
            tolerance=tol,
            undecided=undecided,
            note=note,
            shipped_model=prev.get("shipped_model") or None,
        )
        claims.append(row)
    return claims


def plain(x: Any) -> Any:
    """Tensors and numpy values to plain Python, floats rounded to 6 significant digits."""
    return to_json(x, digits=6)


def jsonable(x: Any) -> Any:
    """``x`` exactly as it reads back from a JSON file (tuples become lists, floats rounded)."""
    return json_copy(x, digits=6)
