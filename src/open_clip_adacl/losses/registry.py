"""Name -> loss class. Registration checks what a loss declares; duplicate names are refused so two
modules cannot silently shadow each other."""

from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional, Sequence, Type

from ..registry import Registry
from .base import Loss
from .options import DistributedSetup, LossOptions, SampleStateOptions


def register_loss(name: str, aliases: Sequence[str] = ()) -> Callable[[Type[Loss]], Type[Loss]]:
    """`@register_loss("name")`: `--loss name`; `aliases` are old names that still select it."""
    return LOSSES.register(name, aliases)


def _check_declaration(name: str, cls: type) -> None:
    """A registered loss is a `Loss` whose `Options` is a frozen `LossOptions` dataclass of its own
    declaration, consistent with its capabilities."""
    if not (isinstance(cls, type) and issubclass(cls, Loss)):
        raise TypeError(f"loss {name!r}: {cls!r} is not a subclass of open_clip_adacl.losses.Loss")
    options = cls.Options
    if not (
        isinstance(options, type)
        and issubclass(options, LossOptions)
        and dataclasses.is_dataclass(options)
        and options.__dataclass_params__.frozen
        and "__dataclass_fields__" in vars(options)
    ):
        raise TypeError(
            f"loss {name!r}: {cls.__name__}.Options must be a @dataclass(frozen=True) deriving from LossOptions"
        )
    if cls.needs_sample_index and not issubclass(options, SampleStateOptions):
        raise TypeError(
            f"loss {name!r} needs sample indices, so its Options must derive from SampleStateOptions "
            f"(the data_size option)"
        )
    specs = {spec.name: spec for spec in options.specs()}  # every field made with option(): help, choices
    if options.PRESETS:
        preset = specs.get("preset")
        if preset is None or set(preset.choices or ()) - {None} != set(options.PRESETS):
            raise TypeError(
                f"loss {name!r} declares PRESETS {sorted(options.PRESETS)}, so its Options needs a "
                f"'preset' option whose choices are None and exactly those names"
            )
        unknown = {key for values in options.PRESETS.values() for key in values} - set(specs) - {"preset"}
        if unknown:
            raise TypeError(f"loss {name!r}: PRESETS set undeclared option(s) {sorted(unknown)}")


LOSSES: Registry[Type[Loss]] = Registry("loss", check=_check_declaration)


def list_losses() -> List[str]:
    return sorted(LOSSES.names())


def accepted_loss_names() -> List[str]:
    """What --loss accepts: every registered loss, then the old names that still select one."""
    return [*list_losses(), *LOSSES.aliases()]


def get_loss_class(name: str) -> Type[Loss]:
    """The loss registered as `name` (or under the old name `name`)."""
    return LOSSES.get(name)


def create_loss(name: str, *, dist: Optional[DistributedSetup] = None, **options) -> Loss:
    """Build the registered loss `name`; `options` are fields of that loss's `Options`."""
    cls = get_loss_class(name)
    accepted = {spec.name for spec in cls.Options.specs()}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise TypeError(f"loss {name!r} got unknown option(s) {unknown}; it accepts: {sorted(accepted) or 'none'}")
    return cls(cls.Options.build(**options), DistributedSetup() if dist is None else dist)
