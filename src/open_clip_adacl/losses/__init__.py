"""Loss registry: `create_loss(name, ...)`, `list_losses()`.

A new loss is one module in this package: a `Loss` subclass with its `Options` dataclass and
capabilities, decorated with `@register_loss("name")`. Every module here is imported below, which
registers its losses; the trainer derives `--<name>-<option>` flags from the options.
"""

import importlib
import pkgutil

from .base import ContrastiveLoss, EpochGatedLoss, GlobalBatch, Loss, MechanismStats
from .options import DistributedSetup, EpochGatedOptions, LossOption, LossOptions, SampleStateOptions, option
from .registry import create_loss, get_loss_class, list_losses, register_loss

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "ContrastiveLoss",
    "DistributedSetup",
    "EpochGatedLoss",
    "EpochGatedOptions",
    "GlobalBatch",
    "Loss",
    "LossOption",
    "LossOptions",
    "MechanismStats",
    "SampleStateOptions",
    "create_loss",
    "get_loss_class",
    "list_losses",
    "option",
    "register_loss",
]
