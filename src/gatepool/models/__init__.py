"""Model files; importing this package registers every model with ``gatepool.registry``."""

from gatepool.models import residual_cnn  # noqa: F401
from gatepool.models.residual_cnn import PreActBlock, ResidualCNN

__all__ = ["PreActBlock", "ResidualCNN"]
from gatepool.models import conv_attention, seq, vit  # noqa: F401
