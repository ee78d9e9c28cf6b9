"""Each loss option as a command-line flag, derived from the loss's `Options` declaration: `--<loss>-<option>`
(dashes for underscores), or the option's own `flag` (`--data-size`, shared by the losses that declare it).

The trainer's command line (`training.main`) and the plug-in for stock OpenCLIP's trainer
(`open_clip_adacl.integrations.open_clip_train`) both take their loss flags from here, so a loss option has one
name wherever it is given; `flag_text` words a loss's message (which names its options, as a Python caller passes
them) by those flags, for a user who typed them.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Tuple

from .options import LossOption
from .registry import get_loss_class, list_losses


@dataclass(frozen=True)
class LossFlag:
    """One command-line flag carrying a loss option; several losses may share it (e.g. --data-size)."""

    flag: str
    dest: str
    option: LossOption
    losses: Tuple[str, ...]


def loss_option_flag(loss_name: str, option: LossOption) -> str:
    """`option.flag` when the loss sets one, else `--<loss>-<option-with-dashes>`."""
    return option.flag or f"--{loss_name}-{option.name.replace('_', '-')}"


def loss_flags() -> Dict[str, LossFlag]:
    """Every registered loss's options, keyed by flag; refuses two incompatible uses of one flag."""
    flags: Dict[str, LossFlag] = {}
    for loss_name in list_losses():
        for option in get_loss_class(loss_name).Options.specs():
            flag = loss_option_flag(loss_name, option)
            if flag in flags:
                known = flags[flag]
                if known.option.type is not option.type:
                    raise RuntimeError(
                        f"losses {known.losses} and {loss_name!r} declare {flag} with different types "
                        f"({known.option.type.__name__} vs {option.type.__name__}); give one of them another flag"
                    )
                flags[flag] = LossFlag(flag, known.dest, known.option, known.losses + (loss_name,))
            else:
                flags[flag] = LossFlag(flag, flag.lstrip("-").replace("-", "_"), option, (loss_name,))
    return flags


def flag_text(loss_name: str, message: str) -> str:
    """`message` of `loss_name` (an error of its options, a warning about them) with each of its options named by
    its flag: "option weight: nan ..." and "weight must be >= 1" read "--adaclw-weight: nan ..." and "--adaclw-weight
    must be >= 1". A name is replaced where it stands as a word of its own (not inside another name, a quoted value,
    a `loss:option=value` variant or a call's keyword), and not where the flag already follows it in parentheses."""
    flags = {spec.name: loss_option_flag(loss_name, spec) for spec in get_loss_class(loss_name).Options.specs()}
    if not flags:
        return message
    names = "|".join(sorted(map(re.escape, flags), key=len, reverse=True))  # prior_ratio before prior
    # "option NAME" or NAME, not after a word character, dash, quote, dot or colon, not as "(NAME=", not before a
    # word character, dash, quote or "(", and not before " (--"
    pattern = re.compile(rf"(?:\boption )?(?<![\w\-'.:])(?!(?<=\()(?:{names})=)({names})(?![\w\-'(])(?! \(--)")
    return pattern.sub(lambda match: flags[match.group(1)], message)


def loss_line(loss_name: str, problem: object) -> str:
    """A command line's one line for an error of `--loss loss_name` (its options, its setup) or a warning about
    them, by the flags."""
    return f"--loss {loss_name}: {flag_text(loss_name, str(problem))}"


def option_of(loss_name: str, flag: str) -> LossOption:
    """The option of `loss_name` carried by `flag`."""
    for option in get_loss_class(loss_name).Options.specs():
        if loss_option_flag(loss_name, option) == flag:
            return option
    raise KeyError(f"loss {loss_name!r} has no option behind {flag}")


def add_loss_flag(group: argparse._ActionsContainer, loss_flag: LossFlag) -> None:
    """Add `loss_flag` to a parser or group. Its default is None ("not given"): the chosen loss's own default
    applies, and a flag given while another loss is chosen can be refused (`given_loss_options`)."""
    option = loss_flag.option
    defaults = {name: option_of(name, loss_flag.flag).default for name in loss_flag.losses}
    default_text = (
        str(option.default)
        if len(set(map(repr, defaults.values()))) == 1
        else ", ".join(f"{name}: {value}" for name, value in defaults.items())
    )
    help_text = f"{option.help} (--loss {'/'.join(loss_flag.losses)}; default {default_text})"
    if option.type is bool:
        group.add_argument(
            loss_flag.flag, dest=loss_flag.dest, default=None, action=argparse.BooleanOptionalAction, help=help_text
        )
    else:
        choices = [c for c in option.choices if c is not None] if option.choices else None
        group.add_argument(
            loss_flag.flag, dest=loss_flag.dest, default=None, type=option.type, choices=choices, help=help_text
        )


def given_loss_options(loss_name: str, values: Mapping[str, Any]) -> Dict[str, Any]:
    """The options of `loss_name` that the flag values `values` (by argparse destination; None: not given) set,
    by option name. ValueError for a flag given that is an option of other losses only."""
    given: Dict[str, Any] = {}
    for loss_flag in loss_flags().values():
        value = values.get(loss_flag.dest)
        if loss_name in loss_flag.losses:
            if value is not None:
                given[option_of(loss_name, loss_flag.flag).name] = value
        elif value is not None:
            raise ValueError(
                f"{loss_flag.flag} is an option of --loss {'/'.join(loss_flag.losses)}, but --loss is "
                f"{loss_name!r}; drop the flag or choose one of those losses"
            )
    return given
