"""`siglip`: OpenCLIP's SigLipLoss (pairwise sigmoid), behind our loss interface."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from open_clip.loss import SigLipLoss as OpenClipSigLipLoss

from .base import Loss
from .options import DistributedSetup, LossOptions, option
from .registry import register_loss

# The model init of OpenCLIP's `--siglip` (open_clip_train.main passes init_logit_scale=log(10), the
# log of a scale of 10, and init_logit_bias=-10 to create_model); the trainer builds the model with
# these for a loss that needs a logit bias.
SIGLIP_INIT_LOGIT_SCALE = math.log(10)
SIGLIP_INIT_LOGIT_BIAS = -10.0


@register_loss("siglip")
class SigLipLoss(Loss):
    """Sigmoid loss; needs the model's `logit_bias` (the trainer creates it as `--siglip` does)."""

    @dataclass(frozen=True)
    class Options(LossOptions):
        dist_impl: Optional[str] = option(
            None,
            "SigLIP's distributed exchange ('bidir', 'shift', 'reduce', 'gather')",
            choices=(None, "bidir", "shift", "reduce", "gather"),
            flag="--loss-dist-impl",
        )

    needs_logit_bias = True

    def __init__(self, options: Optional[Options] = None, dist: DistributedSetup = DistributedSetup()):
        super().__init__(options, dist)
        self.siglip = OpenClipSigLipLoss(rank=dist.rank, world_size=dist.world_size, dist_impl=self.options.dist_impl)

    def forward(
        self,
        image_features,
        text_features,
        logit_scale,
        logit_bias=None,
        *,
        sample_index=None,
        family=None,
        text_tokens=None,
        output_dict=False,
    ):
        if logit_bias is None:
            raise ValueError(
                "the siglip loss needs the model's logit_bias; build the model with init_logit_bias "
                "(the trainer does this for --loss siglip)"
            )
        self.stats = {}
        loss = self.siglip(image_features, text_features, logit_scale, logit_bias)
        return self.wrap_output(loss, output_dict)
