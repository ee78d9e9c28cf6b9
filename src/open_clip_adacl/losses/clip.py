"""`clip`: OpenCLIP's ClipLoss (symmetric InfoNCE over the global batch)."""

from dataclasses import dataclass

from .base import ContrastiveLoss
from .options import LossOptions, option
from .registry import register_loss


@register_loss("clip")
class ClipLoss(ContrastiveLoss):
    """Vanilla CLIP loss; equals `open_clip.ClipLoss` in value and gradient, with full logits and with local_loss."""

    @dataclass(frozen=True)
    class Options(LossOptions):
        shared_matmul: bool = option(
            False,
            "take the text-to-image logits as the image-to-text ones transposed (one matmul, as the project's "
            "other losses do) instead of open_clip.ClipLoss's second matmul, whose bits differ by rounding",
        )

    @property
    def shares_logit_matmul(self) -> bool:
        """Bit-exact `open_clip.ClipLoss` by default; with `shared_matmul`, the reference that the losses equal
        to ClipLoss in a limit (a weight of one, alpha zero) match bit for bit."""
        return self.options.shared_matmul
