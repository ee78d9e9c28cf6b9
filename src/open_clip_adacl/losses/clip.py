"""`clip`: OpenCLIP's ClipLoss (symmetric InfoNCE over the global batch)."""

from .base import ContrastiveLoss
from .registry import register_loss


@register_loss("clip")
class ClipLoss(ContrastiveLoss):
    """Vanilla CLIP loss; equals `open_clip.ClipLoss` in value and gradient, with full logits and with local_loss."""
