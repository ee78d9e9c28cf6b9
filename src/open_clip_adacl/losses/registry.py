"""Name -> loss class. Duplicate names are refused so two modules cannot silently shadow each other."""
from __future__ import annotations

from typing import Callable, Dict, List, Type

import torch.nn as nn

_LOSSES: Dict[str, Type[nn.Module]] = {}


def register_loss(name: str) -> Callable[[Type[nn.Module]], Type[nn.Module]]:
    def decorator(cls: Type[nn.Module]) -> Type[nn.Module]:
        if name in _LOSSES:
            raise ValueError(f"loss {name!r} is already registered by {_LOSSES[name].__module__}")
        _LOSSES[name] = cls
        return cls

    return decorator


def list_losses() -> List[str]:
    return sorted(_LOSSES)


def get_loss_class(name: str) -> Type[nn.Module]:
    if name not in _LOSSES:
        raise ValueError(f"unknown loss {name!r}; choose one of: {', '.join(list_losses())}")
    return _LOSSES[name]


def create_loss(
    name: str,
    *,
    rank: int = 0,
    world_size: int = 1,
    local_loss: bool = False,
    gather_with_grad: bool = False,
    **options,
) -> nn.Module:
    """Build the registered loss `name`; `options` are that loss's own keyword arguments."""
    cls = get_loss_class(name)
    accepted = {option.name for option in getattr(cls, "options", ())}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise TypeError(
            f"loss {name!r} got unknown option(s) {unknown}; it accepts: {sorted(accepted) or 'none'}"
        )
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
    return cls(rank=rank, world_size=world_size, local_loss=local_loss, gather_with_grad=gather_with_grad, **options)
