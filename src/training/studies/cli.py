"""`python -m training.studies COMMAND ...`: the studies' command line, one subcommand per study or measurement.

    python -m training.studies list                                        # the registered studies
    python -m training.studies glyphs --calibrate                          # the glyph calibration grid
    python -m training.studies glyphs --cells finetune-gold --seeds 10-19   # the frozen glyph benchmark
    python -m training.studies glyphs --summary --cells finetune-gold       # its reports from the per-run CSVs
    python -m training.studies headroom --cells finetune-gold              # the glyphs' headroom calibration
    python -m training.studies headroom --summary                          # docs/results/headroom.md from its CSVs
    python -m training.studies loss-table                                  # the loss table in the frozen cell
    python -m training.studies clone --cells scratch --seeds 0-4           # the clone study, then RESULTS.md
    python -m training.studies reassess                                    # the clone study judged again
    python -m training.studies reports                                     # every report from committed files
    python -m training.studies redraw docs/results/controls.md             # a report's plot from its CSV
    python -m training.studies signals | persistence | learnability | traces | peers | siblings  (each with --help)

`glyphs` and `clone` pick registered studies (`STUDIES`) by cell and run them with `run_study`, passing values;
the measurements take their own flags.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from training.loss_comparison import parse_seeds

from . import load_studies
from .study import STUDIES, Study, report_study, run_study


def seed_list(text: str) -> List[int]:
    """`0,1,2`, `10-19` or a mix (`0-2,5`): the seeds, in order."""
    parts = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        parts += [str(seed) for seed in range(int(first), int(last) + 1)] if dash else [part]
    return parse_seeds(",".join(parts))


def names(text: Optional[str], known: Sequence[str], what: str) -> List[str]:
    chosen = [name.strip() for name in (text or ",".join(known)).split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        raise SystemExit(f"error: unknown {what}(s) {unknown}; choose from {', '.join(known)}")
    return chosen


def comparison_flags(parser: argparse.ArgumentParser, output_dir: str, seeds_help: str) -> None:
    parser.add_argument("--seeds", type=seed_list, default=None, help=f"{seeds_help}; `10-19` is a range")
    parser.add_argument("--losses", default=None, help="run (or report) only these of each study's variants")
    parser.add_argument("--output-dir", type=Path, default=Path(output_dir))
    parser.add_argument("--results-dir", type=Path, default=None, help="the reports (default: docs/results)")
    parser.add_argument("--jobs", type=int, default=None, help="runs at a time (default: the quick budget's)")
    parser.add_argument("--report-only", action="store_true", help="rewrite the reports from the finished runs")


def run_or_report(studies: Sequence[Study], args: argparse.Namespace, command: str) -> None:
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
            command=command,
        )


def glyphs(argv: Sequence[str]) -> None:
    from . import glyph_benchmark as benchmark

    parser = argparse.ArgumentParser(prog="python -m training.studies glyphs", description=benchmark.__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--calibrate", action="store_true", help=f"the calibration grid ({benchmark.CONTROLS})")
    parser.add_argument("--cells", default=None, help=f"comma-separated, of {', '.join(benchmark.CELLS)}")
    parser.add_argument(
        "--summary",
        action="store_true",
        help="from the per-run CSVs in <results-dir>: each glyph report's sections rendered again, and glyphs.md",
    )
    comparison_flags(parser, "runs/glyphs", "default: each study's registered seeds")
    args = parser.parse_args(argv)
    cells = names(args.cells, benchmark.CELLS, "cell")
    if args.summary:
        for page in benchmark.write_summary(args.results_dir or Path("docs/results"), cells):
            print(f"wrote {page}")
        return
    run_or_report(benchmark.glyph_studies(cells, args.calibrate), args, command_of("glyphs", argv))


def headroom(argv: Sequence[str]) -> None:
    from . import headroom as calibration

    parser = argparse.ArgumentParser(prog="python -m training.studies headroom", description=calibration.__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--cells", default=None, help=f"comma-separated, of {', '.join(calibration.CELLS)}")
    parser.add_argument(
        "--summary", action="store_true", help="<results-dir>/headroom.md from the per-run CSVs and the glyph data"
    )
    comparison_flags(parser, "runs/glyphs", "default: the registered seeds (20-24)")
    args = parser.parse_args(argv)
    cells = names(args.cells, calibration.CELLS, "cell")
    if args.summary:
        print(f"wrote {calibration.write_summary(args.output_dir, args.results_dir or Path('docs/results'))}")
        return
    run_or_report(calibration.headroom_studies(cells), args, command_of("headroom", argv))


def loss_table(argv: Sequence[str]) -> None:
    from . import loss_table as table

    parser = argparse.ArgumentParser(prog="python -m training.studies loss-table", description=table.__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--summary", action="store_true", help="<results-dir>/loss_table_shares.md from the table's per-run CSV"
    )
    comparison_flags(parser, "runs/glyphs", "default: the registered seeds (25-34)")
    args = parser.parse_args(argv)
    if args.summary:
        print(
            f"wrote {table.write_summary(args.results_dir or Path('docs/results'), table.FROZEN_CELL, table.FROZEN_WEIGHT)}"
        )
        return
    run_or_report([STUDIES.get(table.NAME)], args, command_of("loss-table", argv))


def clone(argv: Sequence[str]) -> None:
    from . import clone_study as study

    parser = argparse.ArgumentParser(prog="python -m training.studies clone", description=study.__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--cells", default=None, help=f"comma-separated, of {', '.join(study.CELLS)}")
    parser.add_argument(
        "--controls", action="store_true", help="each cell's positive controls (controls_<cell>) instead"
    )
    parser.add_argument(
        "--margins",
        action="store_true",
        help="the registered fine-tuning margin study (docs/preregistration_margins.md): --cells transfer",
    )
    parser.add_argument("--results-md", type=Path, default=Path("docs/RESULTS.md"))
    comparison_flags(parser, "runs/clone_study", "default: each study's registered seeds")
    args = parser.parse_args(argv)
    cells = names(args.cells, study.CELLS, "cell")
    if args.controls and any(study.CELLS[name].controls is None for name in cells):
        raise SystemExit(
            "error: the scratch cell's positive controls are the controls study (docs/results/controls.md); "
            "give --cells " + ",".join(name for name, cell in study.CELLS.items() if cell.controls)
        )
    if args.margins and (cells != ["transfer"] or args.controls):
        raise SystemExit("error: --margins is the transfer cell's study: give --cells transfer, without --controls")
    run_or_report(study.clone_studies(cells, args.controls, args.margins), args, command_of("clone", argv))
    if not (args.controls or args.margins):  # RESULTS.md is assembled from the cells' own studies
        results_dir = args.results_dir or Path("docs/results")
        study.assemble(list(study.CELLS), results_dir, args.results_md, args.output_dir, command_of("clone", argv))
        print(f"wrote {args.results_md}")


def reassess(argv: Sequence[str]) -> None:
    from . import reassessment

    parser = argparse.ArgumentParser(prog="python -m training.studies reassess", description=reassessment.__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--results-dir", type=Path, default=Path("docs/results"))
    parser.add_argument("--results-md", type=Path, default=Path("docs/RESULTS.md"))
    args = parser.parse_args(argv)
    print(f"wrote {reassessment.reassess(args.results_dir, args.results_md)}")


def reports(argv: Sequence[str]) -> None:
    from . import reports as written

    parser = argparse.ArgumentParser(prog="python -m training.studies reports", description=written.__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--docs", type=Path, default=Path("docs"), help="the docs folder whose reports to rewrite")
    for page in written.write_reports(parser.parse_args(argv).docs):
        print(f"wrote {page}")


def redraw(argv: Sequence[str]) -> None:
    from . import reports as written

    parser = argparse.ArgumentParser(prog="python -m training.studies redraw", description=written.__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("reports", type=Path, nargs="+", help="report pages, each beside its _runs.csv")
    for report in parser.parse_args(argv).reports:
        print(f"wrote {written.redraw(report)}")


def studies(argv: Sequence[str]) -> None:
    """Every registered study: its name, cell recipe, variants, seeds and report."""
    argparse.ArgumentParser(prog="python -m training.studies list", description=studies.__doc__).parse_args(argv)
    for name, study in STUDIES.items():
        seeds = f"{study.seeds[0]}-{study.seeds[-1]}" if len(study.seeds) > 1 else str(study.seeds[0])
        print(f"{name}: recipe {study.recipe}, {study.variants}, seeds {seeds}, report {study.report}")


def measurement(module: str) -> Callable[[Sequence[str]], None]:
    """A measurement's own command line (`main(argv)` of module `module`)."""

    def main(argv: Sequence[str]) -> None:
        from importlib import import_module

        import_module(f"{__package__}.{module}").main(list(argv))

    return main


COMMANDS: Dict[str, Callable[[Sequence[str]], None]] = {
    "list": studies,
    "glyphs": glyphs,
    "headroom": headroom,
    "loss-table": loss_table,
    "clone": clone,
    "reassess": reassess,
    "reports": reports,
    "redraw": redraw,
    "signals": measurement("clone_signals"),
    "persistence": measurement("persistence"),
    "learnability": measurement("learnability"),
    "traces": measurement("traces"),
    "peers": measurement("peers"),
    "siblings": measurement("siblings"),
}


def command_of(name: str, argv: Sequence[str]) -> str:
    """The command line that reproduces a call, as a report prints it."""
    return " ".join(["python -m training.studies", name, *map(shlex.quote, argv)])


def main(argv: Optional[Sequence[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = f"usage: python -m training.studies {{{','.join(COMMANDS)}}} ...\n\n{__doc__}"
    if argv[:1] in (["-h"], ["--help"]):
        print(usage)
        return
    if not argv or argv[0] not in COMMANDS:
        print(usage, file=sys.stderr)
        raise SystemExit(2)
    load_studies()
    COMMANDS[argv[0]](argv[1:])


def cli() -> None:
    """Console entry point: a bad value is one line, `error: ...`, and exit status 1."""
    try:
        main()
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
