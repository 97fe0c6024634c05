"""Shipped lecture models: ``create_model("residual_cnn", pool="soft", pretrained=True)``.

This folder holds, per shipped model, ``<name>.safetensors`` (float32 weights) and ``<name>.json`` (its
card: model name and kwargs, experiment, data, seed, epochs and steps, train and test sizes, the test
accuracy measured on the test set after loading the shipped file, the file's SHA-256, torch, machine and
the command that built it). ``gatepool pretrained build`` writes them (``gatepool.lab.pretrained``: each
model trained with the full profile's setup of its experiment); ``gatepool pretrained list`` shows the
cards.

Loading is:

    card   = the one card whose model is ``name`` and whose kwargs contain every given kwarg
             (several: the card marked ``default``, e.g. seed 0; or ``pretrained="<weights name>"``)
    bytes  = <name>.safetensors;  SHA-256(bytes) == card["sha256"]  (else CorruptFileError, nothing loaded)
    model  = create_model(card["model"], **card["model_kwargs"]);  model.load_state_dict(bytes, strict)

(the last step is ``gatepool.models.registry.load_pretrained``, beside the constructors it calls).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from gatepool.utils.io import CorruptFileError, read_json

__all__ = ["BUILD_COMMAND", "PRETRAINED_DIR", "cards", "find_card", "verified_bytes", "weights_path"]

PRETRAINED_DIR = Path(__file__).resolve().parent
BUILD_COMMAND = "gatepool pretrained build --out runs/pretrained --jobs 2"
_FIX = f"reinstall gatepool, or rebuild the shipped models with `{BUILD_COMMAND}` (in a clone)"


def cards(root: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """Every card in ``root`` (default: the shipped ones), by weights name, sorted."""
    root = Path(root) if root is not None else PRETRAINED_DIR
    out = {}
    for path in sorted(root.glob("*.json")):
        try:
            card = read_json(path)
        except ValueError as e:
            raise CorruptFileError(f"{path}: the card does not parse ({e}); {_FIX}") from None
        out[card["name"]] = card
    return out


def _describe(card: dict[str, Any]) -> str:
    kw = ", ".join(f"{k}={v!r}" for k, v in card["model_kwargs"].items())
    return f"{card['name']} ({card['model']}({kw}){', default' if card.get('default') else ''})"


def find_card(name: str, kwargs: dict[str, Any] | None = None, which: bool | str = True,
              root: str | Path | None = None) -> dict[str, Any]:  # fmt: skip
    """The card of the shipped weights for model ``name`` built with ``kwargs``.

    ``which``: True picks the one card whose kwargs contain ``kwargs`` (among several, the ``default``
    one); a string names the weights (``"conv_attention-s1"``). No match, or no way to choose: a
    ValueError that lists what ships.
    """
    kwargs = dict(kwargs or {})
    every = cards(root)
    shipped = "; ".join(_describe(c) for c in every.values()) or "none (build them: " + BUILD_COMMAND + ")"
    if isinstance(which, str):
        card = every.get(which)
        if card is None:
            raise ValueError(f"pretrained={which!r}: no shipped weights by that name; shipped: {shipped}")
        if card["model"] != name:
            raise ValueError(f"pretrained={which!r} holds a {card['model']!r} model, not {name!r}")
        candidates = [card]
    elif which is True:
        candidates = [c for c in every.values() if c["model"] == name]
    else:
        raise TypeError(f"pretrained must be True, False or a weights name, got {which!r}")
    matches = [c for c in candidates if all(k in c["model_kwargs"] and c["model_kwargs"][k] == v
                                            for k, v in kwargs.items())]  # fmt: skip
    if len(matches) > 1:
        defaults = [c for c in matches if c.get("default")]
        if len(defaults) != 1:
            raise ValueError(f"create_model({name!r}, pretrained=True): several shipped weights match "
                             f"{kwargs or 'no kwargs'}: {'; '.join(_describe(c) for c in matches)}; pass "
                             "the kwargs that tell them apart, or pretrained='<weights name>'")  # fmt: skip
        matches = defaults
    if not matches:
        kw = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        raise ValueError(f"create_model({name!r}{', ' + kw if kw else ''}, pretrained=True): no shipped "
                         f"weights for that model and kwargs; shipped: {shipped}")  # fmt: skip
    return matches[0]


def weights_path(card: dict[str, Any], root: str | Path | None = None) -> Path:
    return (Path(root) if root is not None else PRETRAINED_DIR) / f"{card['name']}.safetensors"


def verified_bytes(card: dict[str, Any], root: str | Path | None = None) -> bytes:
    """The card's weights file, read and checked against the card's SHA-256 (CorruptFileError if not)."""
    path = weights_path(card, root)
    if not path.is_file():
        raise CorruptFileError(f"{path}: the shipped weights file is missing; {_FIX}")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != card["sha256"]:
        raise CorruptFileError(f"{path}: SHA-256 {digest[:16]}… does not match its card's "
                               f"{card['sha256'][:16]}… (a damaged or replaced file); {_FIX}")  # fmt: skip
    return data
