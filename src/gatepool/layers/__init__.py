"""The gate family of pooling layers: ``out = Σ_j g_j · v_j`` over a window, six ways to set g.

    max           g = hardmax(v)            avg   g = 1/n
    soft          g = softmax(v/τ)          soft-learned  g = softmax(v/τ_c), τ_c learned
    attention     g = softmax(x·w), v = Vx  conv  g = w_j, set by position

Soft gates pass a gradient to every input: ∂out/∂v_j = g_j (1 + (v_j − out)/τ).
Files: ``functional.py`` (soft_pool*, windows, fast path), ``gated.py`` (GatedPool1d/2d/3d),
``factory.py`` (create_pool).
"""

from gatepool.layers.create_pool import create_pool, list_pools
from gatepool.layers.gated_pool import GATES, GatedPool1d, GatedPool2d, GatedPool3d, GatedPoolNd
from gatepool.layers.soft_pool import soft_pool, soft_pool1d, soft_pool2d, soft_pool3d

__all__ = [
    "GATES",
    "GatedPool1d",
    "GatedPool2d",
    "GatedPool3d",
    "GatedPoolNd",
    "create_pool",
    "list_pools",
    "soft_pool",
    "soft_pool1d",
    "soft_pool2d",
    "soft_pool3d",
]
