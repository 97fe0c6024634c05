"""The lecture's sections: which experiment the report's page files under which heading (one place).

The page's side navigation follows the lecture: convolution, pooling, the network's signal, the soft gate,
attention, normalisation and the flashcards, transformers; then what goes beyond the lecture. An
experiment missing here lands under ``OTHER`` (``tests/lab/test_report_page.py`` checks that every
registered experiment has a section).
"""

from __future__ import annotations

from typing import Any

# (section id, heading, experiments in it), in the lecture's order
SECTIONS: list[tuple[str, str, tuple[str, ...]]] = [
    ("convolution", "Convolution",
     ("conv-forward", "he-init", "he-fan-mode", "padding-map", "conv-unrolled", "conv-backward",
      "weight-uses")),
    ("pooling", "Pooling", ("pool-forward", "max-normals", "pool-backward", "pool-compound")),
    ("signal", "The network's signal",
     ("network-forward", "stream-skew", "network-backward", "orange-numbers", "head-chain")),
    ("soft-gate", "The soft gate",
     ("soft-gate", "temperature-dial", "soft-gradient", "gradient-share", "pool-comparison", "adam-reach")),
    ("attention", "Attention",
     ("attention-reach", "conv-reach", "sqrt-d", "attention-maps", "shuffle", "attention-cost")),
    ("flashcards", "Normalisation and the flashcards", ("batchnorm", "flashcards", "definitions")),
    ("transformers", "Transformers", ("vit-mnist", "seq-demo", "seq-demo-encdec", "transformer-variants")),
    ("beyond", "Beyond the lecture",  # `reproduce --beyond`
     ("gate-matters", "distractor-study", "symmetry-gain")),
]
OTHER = ("other", "Other experiments")


def section_of(name: str) -> tuple[str, str]:
    """(section id, heading) of experiment ``name``."""
    for sid, heading, names in SECTIONS:
        if name in names:
            return sid, heading
    return OTHER


def group(records: list[dict[str, Any]]) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """The records by section, sections in the lecture's order, records in their run order; empty
    sections left out."""
    order = [(sid, heading) for sid, heading, _ in SECTIONS] + [OTHER]
    by: dict[str, list[dict[str, Any]]] = {sid: [] for sid, _ in order}
    for rec in records:
        by[section_of(rec["name"])[0]].append(rec)
    return [(sid, heading, by[sid]) for sid, heading in order if by[sid]]
