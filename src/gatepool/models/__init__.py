"""Model files; importing this package registers every model with ``gatepool.registry``."""

from gatepool.models import conv_attention, seq, vit  # noqa: F401  (register their models)
from gatepool.models.residual_cnn import PreActBlock, ResidualCNN

__all__ = ["PreActBlock", "ResidualCNN"]
