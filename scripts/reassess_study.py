"""The clone study's committed runs judged again: the collapse rule and the secondary family of the
pre-registration's amendment (docs/preregistration.md), from the per-run CSVs the reports committed.

    python scripts/reassess_study.py    # writes docs/results/reassessed.md, rewrites the regime reports and RESULTS.md

The run folders behind docs/results/<regime>_runs.csv are not in the repository, so the reports cannot be
regenerated with `--report-only`; every number the reports' sections need is in the CSVs. So each regime's
report keeps its header as first written (how, where and when its runs ran) and gets every section from
`## Summary` on rendered again from its CSV under the amended rules, its plot redrawn; RESULTS.md repeats
those sections (scripts/clone_study.py). reassessed.md lists the runs whose verdict changed. Those runs
recorded no code version per run (their reports name one source tree with uncommitted changes), so their
pairs are made across unknown code, and every table says so.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Dict, List, Tuple

from clone_study import READ_FIRST, kept_section_lines
from clone_study import REGIMES as STUDY_REGIMES

from training.loss_comparison.findings import paired_section, primary_table
from training.loss_comparison.preregistration import Preregistration, from_file
from training.loss_comparison.report import KEEP_MARKER, read_runs_csv, rendered_again
from training.loss_comparison.stats import assess_run, summarize, with_endpoint

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
REGIMES = ("scratch", "transfer", "pseudo")
BATCH_SIZE, VAL_SAMPLES = 64, 512  # the study's design (docs/preregistration.md), in every report's header


def records_from_csv(path: Path) -> List[Dict[str, Any]]:
    """Run records as the comparison wrote them, rebuilt from a report's per-run CSV (runs that failed or went
    non-finite keep that status; every other run is judged again)."""
    records = []
    for row in read_runs_csv(path):
        status = row["verdict"] if row["verdict"] in ("failed", "nonfinite") else "ok"
        reasons = "; ".join(row["reasons"])
        records.append(
            {
                "label": row["label"],
                "loss": row["loss"],
                "options": row["options"],
                "seed": row["seed"],
                "name": row["name"],
                "code": row["code"],
                "status": status,
                "error": reasons or None,
                "batch_size": BATCH_SIZE,
                "val_num_samples": VAL_SAMPLES,
                "previous_verdict": row["verdict"],
                "previous_reasons": reasons,
                "metrics": row["metrics"],
            }
        )
    return records


def judged_records(results: Path, regime: str) -> Tuple[List[Dict[str, Any]], Preregistration]:
    """The regime's runs from its CSV, judged by the amended collapse rule, with the registered endpoint."""
    records = [assess_run(record) for record in records_from_csv(results / f"{regime}_runs.csv")]
    preregistration = from_file(f"docs/preregistration.md#{regime}")  # run from the repository root
    return with_endpoint(records, preregistration.metrics, preregistration.key), preregistration


def rewrite_report(results: Path, regime: str, records: List[Dict[str, Any]], preregistration: Preregistration) -> str:
    """The regime's report with its header as first written and every section rendered again from its judged
    `records` (its plot redrawn beside it); returns the new text, also written to results/<regime>.md."""
    note = (
        f"the lines above are as first written, but for the runs' summed time, added from the "
        f"CSV; every section below is rendered again from [{regime}_runs.csv]({regime}_runs.csv) by "
        "`python scripts/reassess_study.py`, under the amended collapse rule and registered secondary family "
        "(docs/preregistration.md); the CSV's verdict column is the first judgment "
        "([reassessed.md](reassessed.md) lists the runs it changed)."
    )
    return rendered_again(results / f"{regime}.md", records, preregistration, note)


def refresh_results_md(results_md: Path, reports: Dict[str, str]) -> None:
    """RESULTS.md's read-first paragraph and each regime's repeated sections (`clone_study.kept_section_lines`)
    from the rewritten reports; its setup lines, which need the run folders, stay as they are."""
    text = results_md.read_text()
    start = text.index("**Read first:**")
    text = text[:start] + READ_FIRST + text[text.index("\n", start) :]
    for regime, report in reports.items():
        heading = text.index(f"## {STUDY_REGIMES[regime].title} (`{regime}`)\n")
        first = text.index("\n### ", heading) + 1
        # up to the next section, or to the part below KEEP_MARKER that clone_study.py keeps
        end = min(
            (index + 1 for index in (text.find("\n## ", first), text.find("\n" + KEEP_MARKER, first)) if index >= 0),
            default=len(text),
        )
        text = text[:first] + "\n".join(kept_section_lines(report)) + "\n" + text[end:]
    results_md.write_text(text)


def regime_lines(regime: str, records: List[Dict[str, Any]], preregistration: Preregistration) -> List[str]:
    """The regime's part of reassessed.md: its collapse counts, the runs whose verdict changed, its pairs."""
    labels = list(dict.fromkeys(record["label"] for record in records))
    changed = [
        f"| `{r['label']}` | {r['seed']} | {r['previous_verdict']} | **{r['verdict']}** | "
        f"{'; '.join(r['reasons']) or '-'} | {r['metrics'].get('train/final_loss', float('nan')):.3f} | "
        f"{r['metrics']['val/clip_loss']:.3f} |"
        for r in records
        if r["verdict"] != r["previous_verdict"]
    ]
    collapsed = {label: sum(r["verdict"] == "collapsed" for r in records if r["label"] == label) for label in labels}
    lines = [
        f"## {regime}",
        "",
        f"From [{regime}_runs.csv]({regime}_runs.csv); the report itself, [{regime}.md]({regime}.md), is "
        "rendered again from it. Collapsed runs per variant under the amended rule: "
        + ", ".join(
            f"`{label}` {count}/{sum(r['label'] == label for r in records)}" for label, count in collapsed.items()
        )
        + ".",
        "",
    ]
    if changed:
        lines += [
            "Runs whose verdict changed:",
            "",
            "| variant | seed | earlier verdict | amended verdict | why | training loss | val CLIP loss |",
            "|---|---|---|---|---|---|---|",
            *changed,
            "",
        ]
    else:
        lines += ["No run's verdict changed.", ""]
    lines += [
        "### Primary endpoint, pairs made again",
        "",
        f"`{preregistration.definition}`, margin ±{preregistration.margin:g}, reference `clip`; each pair's "
        "code is unknown (recorded per report, not per run).",
        "",
        *primary_table(records, labels, "clip", preregistration),
        "",
    ]
    paired = paired_section(records, summarize(records), "clip", preregistration)
    return lines + ["#" + line if line.startswith("## ") else line for line in paired]


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=RESULTS,
        help="the regime reports and their per-run CSVs (rewritten in place)",
    )
    parser.add_argument("--results-md", type=Path, default=ROOT / "docs" / "RESULTS.md")
    args = parser.parse_args(argv)
    lines = [
        "# The clone study's runs, judged by the amended rules",
        "",
        "Generated by `python scripts/reassess_study.py` from the committed per-run CSVs. Collapse, one rule for "
        "every regime: mean val R@1 below 2 x chance (1/512), or the final val CLIP loss within 5% of ln(64) "
        "(its chance value at the study's val batch of 64) with mean val R@1 below 3 x chance (a model at "
        "chance reaches 3 x in under 2% of runs), whatever the training loss (docs/preregistration.md, second "
        "amendment). Secondary tests: exactly the registered "
        "family (per edit type accuracy, cosine margin and its 10th percentile; val R@1), Holm-corrected per "
        "regime (docs/preregistration.md, amendment).",
        "",
    ]
    reports = {}
    for regime in REGIMES:
        records, preregistration = judged_records(args.results_dir, regime)
        lines += regime_lines(regime, records, preregistration)
        reports[regime] = rewrite_report(args.results_dir, regime, records, preregistration)
    output = args.results_dir / "reassessed.md"
    output.write_text("\n".join(lines) + "\n")
    refresh_results_md(args.results_md, reports)
    return output


if __name__ == "__main__":
    print(f"wrote {main()}")
