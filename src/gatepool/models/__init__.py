"""Model files and their registry: ``create_model("residual_cnn", pool="soft")``, ``list_models()``.

Importing this package imports every model file, and each registers its constructors.
"""

from gatepool.models.registry import create_model, list_models, register_model  # noqa: I001  (first)
from gatepool.models import conv_attention, residual_cnn, resnet_gate, seq, vit  # noqa: F401  (register)
from gatepool.models import dual_encoder, flamingo, gcnn, unet  # noqa: F401  (register)
from gatepool.models.residual_cnn import PreActBlock, ResidualCNN
from gatepool.models.resnet_gate import PreActProjBlock, ResNetGate

__all__ = ["PreActBlock", "PreActProjBlock", "ResNetGate", "ResidualCNN", "create_model", "list_models",
           "register_model"]
