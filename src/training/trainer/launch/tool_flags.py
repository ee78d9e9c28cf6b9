"""A tool's parser takes the trainer's own flags: their names, help, types and choices as the trainer declares
them (`training.trainer.launch.config`, the loss flags of `training.trainer.launch.params`), so that no tool declares a trainer flag again.

    add_trainer_flags(parser.add_argument_group("data: the trainer's flags"), ("dataset_type", "batch_size"),
                      defaults={"batch_size": 256})

`tests/test_layout.py` fails when a module types a trainer flag's name in an `add_argument` of its own.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Mapping, Optional, Sequence

from .config import run_flags
from .params import add_loss_flag, add_recipe_flag, loss_flags


class OneLineErrorParser(argparse.ArgumentParser):
    """A tool's parser whose mistakes are one `error:` line and exit status 2, as the trainer's: argparse's
    usage screen before the error hides the line that says what to change."""

    def error(self, message: str):
        self.exit(2, f"error: {message}\n")


def add_trainer_flags(
    group: argparse._ActionsContainer,
    dests: Sequence[str],
    defaults: Optional[Mapping[str, Any]] = None,
    notes: Optional[Mapping[str, str]] = None,
) -> None:
    """Mount the trainer's own flags `dests` (by destination: name, help, type and choices as declared) on a
    tool's parser or group, so that a tool never declares a trainer flag again; `defaults` replaces the
    default of some of them for that tool (None: not given, the tool decides), `notes` adds to their help
    what the flag also means in that tool."""
    defaults, notes = dict(defaults or {}), dict(notes or {})
    by_dest = {loss_flag.dest: loss_flag for loss_flag in loss_flags().values()}
    flags = run_flags()
    for dest in dests:
        if dest in flags:
            declared = flags[dest]
            if dest in defaults or dest in notes:
                declaration = declared.declaration
                help_text = declared.help_text().split(" (default: ")[0] + (f" {notes[dest]}" if dest in notes else "")
                default = defaults.get(dest, declaration.default)
                if "default" in help_text.lower() and default is not None:  # it names the trainer's default
                    help_text += f" Here: {default}."
                declared = dataclasses.replace(
                    declared, declaration=dataclasses.replace(declaration, default=default, help=help_text)
                )
            declared.add_to(group)
        elif dest in by_dest:
            add_loss_flag(group, by_dest[dest])
            if defaults.get(dest) is not None:
                group.set_defaults(**{dest: defaults[dest]})
        elif dest == "recipe":
            add_recipe_flag(group, defaults.get(dest), notes.get(dest, ""))
        else:
            raise KeyError(f"{dest!r} is no flag of the trainer")
