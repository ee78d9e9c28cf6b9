"""`python -m studies COMMAND ...`: the lab's command line, run from the repository root, one subcommand per
registered command (`studies.command.COMMANDS`: each study's and each measurement's, declared in its module).

    python -m studies list                                        # the registered studies
    python -m studies glyphs --cells finetune-gold --seeds 10-19   # the frozen glyph benchmark
    python -m studies reports                                     # every report from committed files
    python -m studies train --recipe clone-scratch --train-data ...  # the trainer, with the lab's recipes
    python -m studies COMMAND --help                              # a command's own flags

The subcommands are every module's `Command` (`load_lab` imports them all), so a new study or measurement adds
its own; a bad value is one line, `error: ...`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import textwrap
from typing import Optional, Sequence

from . import load_lab
from .command import COMMANDS, Command, register_command
from .study import STUDIES, labels_of

PROG = "python -m studies"


def list_studies(args: argparse.Namespace) -> None:
    for name, study in STUDIES.items():
        seeds = f"{study.seeds[0]}-{study.seeds[-1]}" if len(study.seeds) > 1 else str(study.seeds[0])
        variants = ",".join(labels_of(study))
        print(f"{name}: recipe {study.recipe}, {variants}, seeds {seeds}, report {study.report}")


def train(args: argparse.Namespace) -> None:
    """The trainer's command line with the lab's recipes: a study cell's run by hand (`--recipe clone-pseudo`).

    `python -m training.main`'s flags and exit statuses, in a process that registered the lab's recipes
    (`studies.recipes`: comparison-*, clone-*, glyphs-*), which the product's `--recipe` does not list."""
    from training.main import cli

    sys.argv = [f"{PROG} train", *args.argv]
    cli()


register_command(
    Command("list", "Every registered study: its name, cell recipe, variants, seeds and report.", list_studies)
)
register_command(Command("train", train.__doc__, train, options=None))


def command_parser(command: Command) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{PROG} {command.name}",
        description=command.description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.options(parser)
    return parser


def usage() -> str:
    lines = [f"usage: {PROG} {{{','.join(COMMANDS.names())}}} ...", "", __doc__, "commands:"]
    for name, command in COMMANDS.items():
        lines.append(textwrap.fill(command.summary, 116, initial_indent=f"  {name:<13} ", subsequent_indent=" " * 16))
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    load_lab()
    if argv[:1] in (["-h"], ["--help"]):
        print(usage())
        return
    if not argv or argv[0] not in COMMANDS:
        print(usage(), file=sys.stderr)
        raise SystemExit(2)
    command = COMMANDS.get(argv[0])
    if command.options is None:
        args = argparse.Namespace(argv=argv[1:])
    else:
        args = command_parser(command).parse_args(argv[1:])
    args.command_line = " ".join([PROG, command.name, *map(shlex.quote, argv[1:])])
    command.run(args)


def cli() -> None:
    """The command: a bad value is one line, `error: ...`, and exit status 1."""
    try:
        main()
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
