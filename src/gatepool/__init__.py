"""gatepool: pooling is a gate.

Max pooling is ``V · hardmax(V)``, the same shape as ReLU = ``H(y) · y``. Soften the gate
(``softmax(V/τ)``), learn τ, give the gate its own score (attention pooling), split the score into
query and key and drop the window: attention. This package holds those layers, the models of the
lecture, a signal-propagation probe, a symmetry tester and the experiments that reproduce the lecture.
"""

from gatepool.registry import create_model, list_models, register_model

__version__ = "0.1.0"

__all__ = ["__version__", "create_model", "create_pool", "list_models", "register_model"]


def create_pool(name: str, channels: int | None = None, kernel_size: int | tuple[int, ...] = 2, **kwargs):
    """Build a pooling layer by gate name: ``gatepool.pool.create_pool`` (imported lazily, with torch)."""
    from gatepool.pool import create_pool as _create_pool

    return _create_pool(name, channels, kernel_size, **kwargs)
