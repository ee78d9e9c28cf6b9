"""Loss registry: `create_loss(name, ...)`, `list_losses()`.

A new loss is one module in this package plus one `@register_loss("name")` on its class; its
`options` declare the keyword arguments it takes (and the trainer derives `--<name>-<option>`
command-line flags from them).
"""
from .base import ContrastiveLoss, LossOption
from .registry import create_loss, get_loss_class, list_losses, register_loss

# Importing the modules registers their losses.
from . import adacl, clip, fne, glofnd, siglip  # noqa: E402,F401

__all__ = ["ContrastiveLoss", "LossOption", "create_loss", "get_loss_class", "list_losses", "register_loss"]
