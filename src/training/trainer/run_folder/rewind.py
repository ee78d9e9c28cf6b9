"""The run folder rewound to the checkpoint a launch starts from, so that each step and each evaluated epoch
is recorded once.

- Resumed at step S of epoch E: metrics.jsonl loses its lines after step S and results.jsonl those
  after epoch E (the interrupted launch wrote them; this one replays that training).
- Starting over (no checkpoint to resume from, in a folder an earlier launch wrote): metrics.jsonl,
  checkpoints/results.jsonl and any checkpoint files left (unreadable or damaged ones) move into
  `started_over_<time>/` in the run folder, as a roll-back moves newer checkpoints aside: kept, never
  deleted, and out of the way of this launch's files.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import List, Optional

from .checkpoint_files import move_aside
from .layout import CHECKPOINT_FILE_NAME, METRICS_NAME, RESULTS_NAME
from .logger import drop_lines_after


def checkpoint_files(checkpoint_dir: Path) -> List[Path]:
    """The checkpoint files in `checkpoint_dir` (readable or not)."""
    if not checkpoint_dir.is_dir():
        return []
    return sorted(path for path in checkpoint_dir.iterdir() if CHECKPOINT_FILE_NAME.match(path.name))


def rewind_to(run_dir: Path, checkpoint_dir: Path, step: int, epoch: int) -> None:
    """Drop the lines of metrics.jsonl and results.jsonl after the resume point (step `step`, `epoch` completed
    epochs)."""
    dropped = drop_lines_after(str(run_dir / METRICS_NAME), step)
    if dropped:
        logging.info(f"{METRICS_NAME}: removed {dropped} lines after step {step}, which this run replays")
    dropped = drop_lines_after(str(checkpoint_dir / RESULTS_NAME), epoch, key="epoch")
    if dropped:
        logging.info(f"{RESULTS_NAME}: removed {dropped} lines after epoch {epoch}, which this run evaluates again")


def set_aside_earlier_launch(run_dir: Path, checkpoint_dir: Path) -> Optional[Path]:
    """Move an earlier launch's metrics.jsonl, results.jsonl and checkpoint files into `started_over_<time>/` (logged); the
    folder, or None when there was nothing to move."""
    earlier = [path for path in (run_dir / METRICS_NAME, checkpoint_dir / RESULTS_NAME) if path.exists()]
    earlier += checkpoint_files(checkpoint_dir)
    folder = move_aside(earlier, run_dir / f"started_over_{datetime.now():%Y%m%d-%H%M%S}")
    if folder is not None:
        logging.warning(
            f"Starting over from scratch: moved the earlier launch's {', '.join(p.name for p in earlier)} "
            f"to {folder}, so that each step is recorded once"
        )
    return folder
