"""gatepool: pooling is a gate.

Max pooling is ``V · hardmax(V)``, the same shape as ReLU = ``H(y) · y``. Soften the gate
(``softmax(V/τ)``), learn τ, give the gate its own score (attention pooling), split the score into
query and key and drop the window: attention.

    gatepool.layers     the library: gated pools, attention, attention pooling, positions, blocks
    gatepool.models     model files and their registry (create_model)
    gatepool.analysis   tools for any module: the signal-propagation probe, the symmetry tester
    gatepool.train      one trainer and sweeps of trainings
    gatepool.data       verified data sets: MNIST, Fashion-MNIST and generated 60×60 canvases, by name
    gatepool.lab        the lecture's experiments, reproduce, report, bench (used by the CLI only)

The names below load on first use, so that ``import gatepool`` (and ``gatepool --help``) stay free of torch.
"""

import importlib

__version__ = "0.1.0"

_LAZY = {
    "create_model": "gatepool.models",
    "list_models": "gatepool.models",
    "register_model": "gatepool.models",
    "create_pool": "gatepool.layers",
    "convert": "gatepool.layers.convert",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gatepool' has no attribute {name!r}")
