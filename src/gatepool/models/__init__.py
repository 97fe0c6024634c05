"""Model files and their registry: ``create_model("residual_cnn", pool="soft")``, ``list_models()``.

Importing this package imports every model file, and each registers its constructors.
"""

from gatepool.models.registry import create_model, list_models, register_model  # noqa: I001  (first)
from gatepool.models import conv_attention, residual_cnn, seq, vit  # noqa: F401  (register their models)
from gatepool.models.residual_cnn import PreActBlock, ResidualCNN

__all__ = ["PreActBlock", "ResidualCNN", "create_model", "list_models", "register_model"]
