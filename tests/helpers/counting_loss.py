"""A clip loss with state that depends on every batch and epoch seen: what a resume must restore.
Registered on demand, also in the training subprocesses the checkpoint tests start and kill."""

import torch

from open_clip_adacl import DistributedSetup, list_losses, register_loss
from open_clip_adacl.losses import ContrastiveLoss

from . import TESTS

COUNTING_LOSS = "test-counting-clip"
TESTS_DIR = str(TESTS)  # put on sys.path, so that training subprocesses import these helpers


class CountingClip(ContrastiveLoss):
    """The clip loss plus state that depends on every batch and epoch seen: what a resume must restore."""

    keeps_state = True

    def __init__(self, options=None, dist=DistributedSetup()):
        super().__init__(options, dist)
        self.register_buffer("num_calls", torch.zeros((), dtype=torch.long))
        self.register_buffer("index_sum", torch.zeros((), dtype=torch.float64))
        self.register_buffer("epoch", torch.full((), -1, dtype=torch.long))

    def on_epoch_start(self, epoch):
        # Called again when a run resumes inside an epoch, so it sets rather than accumulates.
        self.epoch.fill_(epoch)

    def forward(
        self,
        image_features,
        text_features,
        logit_scale,
        logit_bias=None,
        *,
        sample_index=None,
        output_dict=False,
        **inputs,  # what a caller passes every registered loss (family, text tokens): clip's to read or ignore
    ):
        self.num_calls += 1
        self.index_sum += sample_index.double().sum()
        return super().forward(
            image_features,
            text_features,
            logit_scale,
            logit_bias,
            sample_index=sample_index,
            output_dict=output_dict,
            **inputs,
        )


def register_counting_loss():
    """Registered on demand (not at import) so registry-wide tests do not pick it up."""
    if COUNTING_LOSS not in list_losses():
        register_loss(COUNTING_LOSS)(CountingClip)
