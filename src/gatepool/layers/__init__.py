"""The gate family of pooling layers: ``out = Σ_j g_j · v_j`` over a window, six ways to set g.

    max           g = hardmax(v)            avg   g = 1/n
    soft          g = softmax(v/τ)          soft-learned  g = softmax(v/τ_c), τ_c learned
    attention     g = softmax(x·w), v = Vx  conv  g = w_j, set by position

Soft gates pass a gradient to every input: out = V · softmax(V/τ), ∂out/∂v_j = g_j (1 + (v_j − out)/τ).
Arguments in torch's order (``GatedPool2d(3, 2, 1, gate="soft")`` pools the windows of
``nn.MaxPool2d(3, 2, 1)``). Files: ``gate_table.py`` (what each gate is and has: the one table),
``soft_pool.py`` (soft_pool*, windows, the fast path), ``gated_pool.py`` (GatedPool1d/2d/3d,
SoftPool1d/2d/3d, AttentionGatePool1d/2d/3d), ``create_pool.py`` (create_pool), ``global_pool.py``
(GlobalGatedPool1d/2d/3d: a gate over the whole map), ``adaptive_pool.py`` (AdaptiveGatedPool1d/2d/3d:
torch's adaptive windows), ``pool_calls.py`` (pool calls in a forward, found and rewritten by torch.fx),
``convert.py`` (``convert``: a model's pools replaced by a gate; ``gatepool.convert``).
"""

from gatepool.layers.adaptive_pool import AdaptiveGatedPool1d, AdaptiveGatedPool2d, AdaptiveGatedPool3d
from gatepool.layers.create_pool import create_pool, list_pools
from gatepool.layers.gated_pool import (
    GATES,
    AttentionGatePool1d,
    AttentionGatePool2d,
    AttentionGatePool3d,
    GatedPool1d,
    GatedPool2d,
    GatedPool3d,
    GatedPoolNd,
    SoftPool1d,
    SoftPool2d,
    SoftPool3d,
)
from gatepool.layers.global_pool import GlobalGatedPool1d, GlobalGatedPool2d, GlobalGatedPool3d
from gatepool.layers.soft_pool import soft_pool, soft_pool1d, soft_pool2d, soft_pool3d

__all__ = [
    "GATES",
    "AdaptiveGatedPool1d",
    "AdaptiveGatedPool2d",
    "AdaptiveGatedPool3d",
    "AttentionGatePool1d",
    "AttentionGatePool2d",
    "AttentionGatePool3d",
    "GatedPool1d",
    "GatedPool2d",
    "GatedPool3d",
    "GatedPoolNd",
    "GlobalGatedPool1d",
    "GlobalGatedPool2d",
    "GlobalGatedPool3d",
    "SoftPool1d",
    "SoftPool2d",
    "SoftPool3d",
    "create_pool",
    "list_pools",
    "soft_pool",
    "soft_pool1d",
    "soft_pool2d",
    "soft_pool3d",
]
