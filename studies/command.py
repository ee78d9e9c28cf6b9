"""A command of the lab: one subcommand of `python -m studies`, declared by the module it runs beside that module's
studies: its options, what it does, and the committed reports it writes again from committed files.

    register_command(Command("headroom", __doc__, run, options, section_reports=...))

`cli` builds the command line from `COMMANDS` (one subcommand each, its `--help` the command's description),
`reports.write_reports` writes every command's `reports` (`python -m studies reports`) and
`reports.section_reports` gathers every command's `section_reports` (tests/studies/test_reports.py checks each);
`load_lab` imports every module of the lab, so a new study or measurement is its module alone. Beside them, what
the commands that run registered studies share: seeds (`seed_list`), names chosen from a list (`names`), their
flags (`comparison_flags`) and running or reporting their studies (`run_or_report`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Mapping, Optional, Sequence

from open_clip_adacl.registry import Registry

from .comparison import parse_seeds
from .study import Study, report_study, run_study

ReportWriter = Callable[[Path], List[Path]]


def no_options(parser: argparse.ArgumentParser) -> None:
    """A command that takes no flags but --help."""


@dataclass(frozen=True)
class Command:
    """`python -m studies <name>`: `run(args)` with `args` parsed by the flags `options` adds (`args.command_line`
    is the call as a report quotes it); `options=None` takes the arguments as they are (`args.argv`).

    `reports(docs)` writes the command's reports in `docs` (a copy of the repository's docs/) again from committed
    files and returns them; `section_reports` names its comparison reports whose run folders are not committed,
    each with the registration its sections were judged under (`report_sections_of`; None: the comparison's
    defaults): their sections are what the per-run CSV beside them renders."""

    name: str
    description: str  # its --help; the first paragraph is its line in `python -m studies --help`
    run: Callable[[argparse.Namespace], None]
    options: Optional[Callable[[argparse.ArgumentParser], None]] = no_options
    reports: Optional[ReportWriter] = None
    section_reports: Mapping[str, Optional[str]] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        return " ".join(self.description.strip().split("\n\n")[0].split())


COMMANDS: Registry[Command] = Registry("command")


def register_command(command: Command) -> Command:
    return COMMANDS.add(command.name, command)


def report_sections_of(study: Study) -> Mapping[str, str]:
    """A registered study's reports (its own and each other endpoint's) as section reports: report name -> the
    registration it is judged under, as the repository names it."""
    return {study.report_path(endpoint).stem: f"{study.preregistration}#{endpoint}" for endpoint in study.endpoints}


def seed_list(text: str) -> List[int]:
    """`0,1,2`, `10-19` or a mix (`0-2,5`): the seeds, in order."""
    parts = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        parts += [str(seed) for seed in range(int(first), int(last) + 1)] if dash else [part]
    return parse_seeds(",".join(parts))


def names(text: Optional[str], known: Sequence[str], what: str) -> List[str]:
    """The comma-separated `text` (default: every one of `known`), each checked against `known`."""
    chosen = [name.strip() for name in (text or ",".join(known)).split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        raise SystemExit(f"error: unknown {what}(s) {unknown}; choose from {', '.join(known)}")
    return chosen


def comparison_flags(parser: argparse.ArgumentParser, output_dir: str, seeds_help: str) -> None:
    """The flags of a command that runs registered studies (`run_or_report`)."""
    parser.add_argument("--seeds", type=seed_list, default=None, help=f"{seeds_help}; `10-19` is a range")
    parser.add_argument("--losses", default=None, help="run (or report) only these of each study's variants")
    parser.add_argument("--output-dir", type=Path, default=Path(output_dir))
    parser.add_argument("--results-dir", type=Path, default=None, help="the reports (default: docs/results)")
    parser.add_argument("--jobs", type=int, default=None, help="runs at a time (default: the quick budget's)")
    parser.add_argument("--report-only", action="store_true", help="rewrite the reports from the finished runs")


def run_or_report(studies: Sequence[Study], args: argparse.Namespace) -> None:
    """Run each study on `args.seeds` (finished runs reused), or with --report-only write its reports again."""
    for study in studies:
        if args.report_only:
            for endpoint in study.endpoints or (None,):
                report_study(
                    study,
                    output_root=args.output_dir,
                    results_dir=args.results_dir,
                    endpoint=endpoint,
                    losses=args.losses,
                )
            continue
        print(f"== {study.name}", flush=True)
        run_study(
            study,
            args.seeds,
            output_root=args.output_dir,
            results_dir=args.results_dir,
            losses=args.losses,
            jobs=args.jobs,
            command=args.command_line,
        )
