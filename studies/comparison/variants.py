"""Loss variants: which loss, with which option values, one row of the comparison is.

A loss variant is `name`, `name:option=value,...` or `name:value` (the one option of `name` whose
choices hold `value`), e.g. `adacl:mode=literal` or `adacl:literal` -> `--loss adacl --adacl-mode
literal`. Several variants are joined with commas (`clip,adacl:mode=literal,eps=0.01,siglip`): a
`key=value` item continues the variant before it. Options, their types, choices and ranges come
from the loss's `Options` declaration: a variant is validated by building it. A loss that
`needs_sample_index` gets the training data's key range as its `data_size` automatically.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from open_clip_adacl import LossOption, get_loss_class
from training.trainer.launch.params import loss_option_dest


@dataclass(frozen=True)
class LossVariant:
    """A registered loss and option values (as typed on the command line) for one comparison row."""

    loss: str
    options: Tuple[Tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        """`name` or `name:key=value,...`: the row's name and, parsed back, the same variant."""
        if not self.options:
            return self.loss
        return f"{self.loss}:" + ",".join(f"{key}={value}" for key, value in self.options)

    @property
    def slug(self) -> str:
        """The label as a file-name part."""
        return re.sub(r"[^A-Za-z0-9.]+", "-", self.label).strip("-")

    def values(self, data_size: int) -> Dict[str, Any]:
        """Trainer flag values by destination (`training.trainer.launch.params.args_from_values`): the loss, one per option
        (typed as its flag reads it), and the data size if the loss needs sample indices."""
        cls = get_loss_class(self.loss)
        specs = _specs(self.loss)
        values: Dict[str, Any] = {"loss": self.loss}
        options = dict(self.options)
        if cls.needs_sample_index:
            options.setdefault("data_size", str(data_size))
        for key, value in options.items():
            option = specs[key]
            values[loss_option_dest(self.loss, option)] = (
                parse_bool(value) if option.type is bool else option.type(value)
            )
        return values


def parse_bool(value: str) -> bool:
    lowered = value.lower()
    if lowered not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f"{value!r} is not a boolean (true/false)")
    return lowered in ("true", "1", "yes")


def parse_loss_variant(spec: str) -> LossVariant:
    """`name`, `name:key=value,...` or `name:value` -> LossVariant; unknown names, options or values
    (type, choices, the loss's own checks) are errors."""
    name, _, rest = spec.strip().partition(":")
    cls = get_loss_class(name)  # raises for an unregistered loss, listing the registered ones
    specs = _specs(name)
    checked = [check_option(name, specs, item) for item in rest.split(",") if item.strip()]
    keys = [key for key, _, _ in checked]
    duplicated = sorted({key for key in keys if keys.count(key) > 1})
    if duplicated:
        raise ValueError(f"{spec!r} sets {', '.join(duplicated)} more than once")
    typed: Dict[str, Any] = {key: typed for key, _, typed in checked}
    if cls.needs_sample_index:
        typed.setdefault("data_size", 1)  # filled in from the data by `flags`; any valid size checks the rest
    try:
        cls.Options.build(**typed)
    except ValueError as error:
        raise ValueError(f"{spec}: {error}") from None
    return LossVariant(name, tuple((key, value) for key, value, _ in checked))


def check_option(loss: str, options: Dict[str, LossOption], item: str) -> Tuple[str, str, Any]:
    """One `key=value` (or bare choice `value`) of `loss`, whose options are `options`: the option
    exists and the value parses as its type; returns (key, value as typed, value as the option's
    type). The loss's `Options` check the values (`parse_loss_variant`)."""
    key, has_value, value = (part.strip() for part in item.partition("="))
    if not has_value:  # a bare value: the option whose choices hold it
        value = key
        owners = [option.name for option in options.values() if option.choices and value in option.choices]
        if len(owners) != 1:
            raise ValueError(
                f"{loss}:{value}: {'no' if not owners else 'more than one'} option of {loss!r} has "
                f"the choice {value!r}; write {loss}:<option>={value} "
                f"(options: {', '.join(options) or 'none'})"
            )
        key = owners[0]
    key = key.replace("-", "_")
    if key not in options:
        raise ValueError(f"loss {loss!r} has no option {key!r}; it has: {', '.join(options) or 'none'}")
    option_type = options[key].type
    try:
        typed = parse_bool(value) if option_type is bool else option_type(value)
    except ValueError as error:
        raise ValueError(f"{loss}:{key}={value}: not a {option_type.__name__} ({error})") from None
    return key, value, typed


def _specs(loss: str) -> Dict[str, LossOption]:
    return {option.name: option for option in get_loss_class(loss).Options.specs()}


def parse_loss_variants(text: str) -> List[LossVariant]:
    """Comma-separated variants; an item with `=` and no `:` belongs to the variant before it."""
    specs: List[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if "=" in item and ":" not in item:
            if not specs:
                raise ValueError(f"option {item!r} comes before any loss name in {text!r}")
            specs[-1] += "," + item
        else:
            specs.append(item)
    variants = [parse_loss_variant(spec) for spec in specs]
    labels = [variant.label for variant in variants]
    if len(set(labels)) != len(labels):
        raise ValueError(f"a loss variant is listed twice in {text!r}")
    return variants


def loss_variants(*specs: str) -> Tuple[LossVariant, ...]:
    """The variants `specs`, one each (`"adaclw:weight=16,discovery=tokens"` is one variant), parsed and checked as
    `parse_loss_variant` does: how a study declares its variants as values."""
    variants = tuple(parse_loss_variant(spec) for spec in specs)
    labels = [variant.label for variant in variants]
    if len(set(labels)) != len(labels):
        raise ValueError(f"a loss variant is listed twice in {labels}")
    return variants


def parse_seeds(text: str) -> List[int]:
    seeds = [int(part) for part in text.split(",") if part.strip()]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds needs distinct integers, got {text!r}")
    return seeds
