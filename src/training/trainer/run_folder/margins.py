"""AdaCL's margins over training, drawn from a run's metrics.jsonl into RUN_DIR/margins.png.

The trainer redraws the plot at each epoch end of an AdaCL run (rank 0; with matplotlib, the [eval]
extra: without it, one log line and no plot); by hand, for any run folder:

    python -m training.trainer.run_folder.margins RUN_DIR [--output PATH]

Panels, both directions each: m1 / logit_scale, m2, the anchor similarity, p_u and the number of
clone candidates at the logged steps, and the share of steps that fell back to vanilla CL per
window of a fixed number of steps. A step that falls back is logged with its margins at their vanilla
values (m2 = 0, anchor = 0, m1 / scale = 1), which a line through them would draw as collapses:
its margins are gaps (NaN) instead, told apart by its logged `modulated` stat (0). Logged steps are
a sample (one in --log-every-n-steps), so the fallback share comes from the cumulative `fallbacks`
counter instead: (fallbacks at the window's end - at its start) / (steps in it). The windows are at
least the usual gap between logged steps long: the extra line at each epoch's end would otherwise
make a window of one step, whose share is 0 or 1.
"""

from __future__ import annotations

import argparse
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .checkpoint_files import atomic_file
from .layout import RunDir

DIRECTIONS = ("i2t", "t2i")
# Stat name -> panel title; the margins are gaps at fallback steps, the candidates are real counts then.
MARGIN_PANELS = {
    "m1_over_scale": "m1 / logit_scale",
    "m2": "m2",
    "anchor": "anchor similarity a = s_uu",
    "p_u": "anchor probability p_u",
}
COUNT_PANELS = {"candidates": "clone candidates |S~|"}
FALLBACK_TITLE = "share of steps that fell back to vanilla CL, per window of at least {size} step(s)"
PLOT_NAME = "margins.png"
STATS_PREFIX = "stats/"


@dataclass
class MarginTraces:
    """What the plot draws, per direction: values at the logged steps (NaN at fallback steps for the margins),
    and the fallback share of each window (steps[i-1], steps[i]] (the first from step 0)."""

    steps: List[int] = field(default_factory=list)
    values: Dict[str, List[float]] = field(default_factory=dict)  # "i2t/m2" -> one per step
    fallback_share: Dict[str, List[float]] = field(default_factory=dict)  # "i2t" -> one per step
    fallback_counts: Dict[str, List[int]] = field(default_factory=dict)  # "i2t" -> the counter at each step
    fallbacks: Dict[str, int] = field(default_factory=dict)  # "i2t" -> the counter at the last step


def margin_traces(lines: Sequence[dict]) -> MarginTraces:
    """The traces of the "train" lines of a metrics.jsonl holding AdaCL's stats."""
    traces = MarginTraces()
    previous_step, previous_count = 0, {direction: 0 for direction in DIRECTIONS}
    for line in lines:
        if line.get("kind") != "train" or f"{STATS_PREFIX}{DIRECTIONS[0]}/modulated" not in line:
            continue
        step = line["step"]
        traces.steps.append(step)
        for direction in DIRECTIONS:
            stat = {
                name: line.get(f"{STATS_PREFIX}{direction}/{name}", math.nan)
                for name in (*MARGIN_PANELS, *COUNT_PANELS, "modulated", "fallbacks")
            }
            fell_back = stat["modulated"] == 0
            for name in MARGIN_PANELS:
                traces.values.setdefault(f"{direction}/{name}", []).append(math.nan if fell_back else stat[name])
            for name in COUNT_PANELS:
                traces.values.setdefault(f"{direction}/{name}", []).append(stat[name])
            count = int(stat["fallbacks"])
            window = max(step - previous_step, 1)
            traces.fallback_share.setdefault(direction, []).append((count - previous_count[direction]) / window)
            traces.fallback_counts.setdefault(direction, []).append(count)
            previous_count[direction] = traces.fallbacks[direction] = count
        previous_step = step
    return traces


def window_size(steps: Sequence[int]) -> int:
    """The usual gap between logged steps (--log-every-n-steps): the most common one, the larger on a tie."""
    gaps = [step - previous for previous, step in zip([0, *steps], steps)]
    return max(set(gaps), key=lambda gap: (gaps.count(gap), gap)) if gaps else 1


def fallback_windows(steps: Sequence[int], counts: Sequence[int], size: int) -> Tuple[List[int], List[float]]:
    """Windows of at least `size` steps over the logged `steps` (edges from 0) and the share of their steps that
    fell back, from the cumulative `counts`: a window shorter than `size` (an epoch's last line, the run's
    end) joins its neighbour."""
    edges, ends = [0], []
    for index, step in enumerate(steps):
        if step - edges[-1] >= size:
            edges.append(step)
            ends.append(index)
    if steps and (not ends or ends[-1] != len(steps) - 1):  # a short tail joins the last window
        if ends:
            edges.pop()
            ends.pop()
        edges.append(steps[-1])
        ends.append(len(steps) - 1)
    totals = [0, *(counts[index] for index in ends)]
    shares = [(totals[i + 1] - totals[i]) / (edges[i + 1] - edges[i]) for i in range(len(ends))]
    return edges, shares


def plot_margins(run_dir: str | Path, output: Optional[str | Path] = None) -> Path:
    """Draw the panels into `output` (default RUN_DIR/margins.png, replaced atomically); returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = RunDir(run_dir)
    traces = margin_traces(run.metrics("train"))
    if not traces.steps:
        raise ValueError(
            f"{run.metrics_path} holds no AdaCL stats (train lines with "
            f"'{STATS_PREFIX}i2t/modulated'): is it an AdaCL run?"
        )
    titles = {**MARGIN_PANELS, **COUNT_PANELS}
    figure, axes = plt.subplots(len(titles) + 1, 1, figsize=(8, 2.2 * (len(titles) + 1)), sharex=True)
    for axis, (name, title) in zip(axes, titles.items()):
        for direction in DIRECTIONS:
            # markers too: a value between two fallback steps would otherwise not show at all
            axis.plot(
                traces.steps,
                traces.values[f"{direction}/{name}"],
                label=direction,
                linewidth=1,
                marker=".",
                markersize=2,
            )
        gaps = "; gaps: logged steps that fell back" if name in MARGIN_PANELS else ""
        axis.set_title(title + gaps, fontsize=9)
    fallback_axis, size = axes[-1], window_size(traces.steps)
    for direction in DIRECTIONS:
        edges, shares = fallback_windows(traces.steps, traces.fallback_counts[direction], size)
        fallback_axis.stairs(
            shares,
            edges,
            linewidth=1,
            label=f"{direction} ({traces.fallbacks[direction]} fallbacks in {traces.steps[-1]} steps)",
        )
    fallback_axis.set_ylim(-0.05, 1.05)
    fallback_axis.set_title(FALLBACK_TITLE.format(size=size), fontsize=9)
    for axis in axes:
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8, loc="best")
    axes[-1].set_xlabel("step")
    figure.tight_layout()
    path = Path(output) if output else run.path / PLOT_NAME
    with atomic_file(path) as handle:
        figure.savefig(handle, format="png", dpi=100)
    plt.close(figure)
    return path


def write_margins_plot(run_dir: str | Path) -> Optional[Path]:
    """The trainer's epoch-end plot: RUN_DIR/margins.png, or None with one log line when it cannot be drawn
    (a plot never stops a run)."""
    try:
        return plot_margins(run_dir)
    except ImportError:
        logging.info(f"{PLOT_NAME} not drawn: matplotlib is missing (pip install 'open_clip_adacl[eval]')")
    except (OSError, ValueError) as error:
        logging.warning(f"{PLOT_NAME} not drawn: {error}")
    return None


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m training.trainer.run_folder.margins", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("run_dir", help="a training run's directory, holding metrics.jsonl")
    parser.add_argument("--output", help="PNG path (default RUN_DIR/margins.png)")
    args = parser.parse_args(argv)
    print(plot_margins(args.run_dir, args.output))


if __name__ == "__main__":
    main()
