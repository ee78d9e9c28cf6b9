"""open_clip_adacl: losses (AdaCL and its peers) and model configs for OpenCLIP pretraining.

The library never imports the trainer (`training`); it only needs torch and open_clip.
"""

from .losses import (
    DistributedSetup,
    Loss,
    LossOption,
    LossOptions,
    create_loss,
    get_loss_class,
    list_losses,
    option,
    register_loss,
)
from .models import MODEL_CONFIG_DIR, register_model_configs

register_model_configs()

__all__ = [
    "DistributedSetup",
    "Loss",
    "LossOption",
    "LossOptions",
    "option",
    "create_loss",
    "get_loss_class",
    "list_losses",
    "register_loss",
    "MODEL_CONFIG_DIR",
    "register_model_configs",
]
