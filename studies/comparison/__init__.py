"""The loss comparison: the same tiny model trained with each loss over several seeds, one report.

`python -m studies.comparison` (`cli`), from the repository root; the lab's studies drive it through this package's
face, `PUBLIC_FACE`, with Python values. By responsibility, each module using only those before it:

- `variants`: the loss-variant mini-language (`adacl:mode=literal,...`) and its trainer flags;
- `data`: the budget every run shares (`QUICK`, `FULL`) and the demo data (`training.synthetic_scenes`);
- `preregistration`: the primary endpoint, equivalence margin and reference, from flags or a committed file;
- `jobs`: one (variant, seed) each: its trainer arguments, its process (train with `training`,
  evaluate with `training.evaluation`, on the demo's sets or the user's) and its outcome
  (<comparison>/outcomes/<run>.json: status, timing, metrics);
- `cluster`: the jobs as torchrun scripts, a SLURM array script and a jobs list (`--emit-jobs`);
- `stats`: verdicts (ok, collapsed, nonfinite, failed), means over ok runs, paired differences, the
  primary endpoint's verdict (helps, hurts, no effect, inconclusive) and Holm-corrected secondary tests;
- `report`: the Markdown report, its plot and CSVs;
- `runner`: a whole comparison (data, jobs in parallel, report), its jobs emitted, and `--report-only`;
- `cli`: the command line.

Part of the laboratory (studies/, outside the wheel): it imports the product (the trainer, its evaluation and the
demo data) and the lab's recipes (`studies.recipes`: its budgets `comparison-quick` and `comparison-full`); the
lab's studies import it only through the names below (tests/test_layout.py). Each run trains in a process of its
own, `python -m studies.comparison --run-job JOB` with the repository on its path (`jobs.LAB_PATH`).
"""

from .data import QUICK, Budget, ComparisonData
from .findings import paired_section, primary_table
from .jobs import OK, Benchmarks, outcome_file
from .preregistration import Preregistration, from_file
from .report import KEEP_MARKER, kept_tail, read_runs_csv, rendered_again, report_sections, write_plot
from .runner import COMPARISON_FILE, OwnData, rebuild_report, run_comparison
from .stats import assess_run, paired_difference, primary_verdict, share_of_gain, summarize, with_endpoint
from .variants import LossVariant, loss_variants, parse_loss_variants, parse_seeds

# What a study may use of the comparison: a comparison run with values (`run_comparison`, `rebuild_report`), its
# inputs (budget, data, variants, pre-registration) and what reads a committed per-run CSV back into a report.
__all__ = [
    "QUICK",
    "Budget",
    "ComparisonData",
    "OwnData",
    "Benchmarks",
    "OK",
    "COMPARISON_FILE",
    "Preregistration",
    "from_file",
    "LossVariant",
    "loss_variants",
    "parse_loss_variants",
    "parse_seeds",
    "run_comparison",
    "rebuild_report",
    "outcome_file",
    "read_runs_csv",
    "rendered_again",
    "report_sections",
    "kept_tail",
    "KEEP_MARKER",
    "write_plot",
    "assess_run",
    "summarize",
    "with_endpoint",
    "paired_difference",
    "share_of_gain",
    "primary_verdict",
    "paired_section",
    "primary_table",
]
PUBLIC_FACE = tuple(__all__)
