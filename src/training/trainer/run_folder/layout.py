"""A run's folder, `<logs>/<name>/`, read back: the one place that knows the names of its files.

    run = RunDir("logs/my-run")
    run.metrics("train")        # the metrics.jsonl lines of one kind ("train", "epoch", "val", ...)
    run.results()               # checkpoints/results.jsonl: one line per evaluated epoch
    run.final_checkpoint()      # the newest checkpoints/epoch_N.pt
    run.recorded_args()         # the last launch's arguments as values (params.json)

    python -m training.trainer.run_folder.layout logs/my-run --final-checkpoint    # the same, for shell scripts

The trainer writes these files under the same names (`training.trainer.run_folder.logger`, `training.trainer.engine.checkpoint`,
`training.trainer.engine.validation`); every tool and test reads them through this module.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

METRICS_NAME = "metrics.jsonl"
RESULTS_NAME = "results.jsonl"  # in the checkpoint folder, beside the checkpoints it evaluates
PARAMS_NAME = "params.txt"  # every launch's arguments as text, OpenCLIP's format
ARGS_NAME = "params.json"  # the last launch's arguments as values, as its checkpoints store them
LOG_NAME = "out.log"
CHECKPOINT_DIR_NAME = "checkpoints"
LATEST_CHECKPOINT_NAME = "epoch_latest.pt"
CHECKPOINT_FILE_NAME = re.compile(r"^(epoch_(\d+|latest)|step_(\d+))\.pt$")
EPOCH_CHECKPOINT_NAME = re.compile(r"^epoch_(\d+)\.pt$")
STEP_CHECKPOINT_NAME = re.compile(r"^step_(\d+)\.pt$")


def epoch_checkpoint_name(epoch: int) -> str:
    """The checkpoint written after `epoch` completed epochs."""
    return f"epoch_{epoch}.pt"


def step_checkpoint_name(step: int) -> str:
    """The checkpoint written at optimizer step `step` (--save-every-n-steps)."""
    return f"step_{step}.pt"


def step_checkpoint_number(path: Path) -> Optional[int]:
    """N for a step_N.pt file, else None."""
    match = STEP_CHECKPOINT_NAME.match(Path(path).name)
    return int(match.group(1)) if match else None


def numbered_checkpoints(checkpoint_dir: Path, name: re.Pattern) -> List[Path]:
    """The files of `checkpoint_dir` whose name `name` matches (epoch_N.pt or step_N.pt), by N."""
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        return []
    found = [(int(match.group(1)), path) for path in checkpoint_dir.iterdir() if (match := name.match(path.name))]
    return [path for _, path in sorted(found)]


def read_json_lines(path: Path, kind: Optional[str] = None) -> List[dict]:
    """The lines of the JSON-lines file `path` (optionally only those whose "kind" is `kind`); none if it does not
    exist yet. A last line still being written (no newline yet) is left out."""
    path = Path(path)
    if not path.is_file():
        return []
    complete = path.read_text().rpartition("\n")[0]
    lines = [json.loads(line) for line in complete.splitlines() if line.strip()]
    return [line for line in lines if kind is None or line["kind"] == kind]


@dataclass(frozen=True)
class RunDir:
    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_NAME

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / CHECKPOINT_DIR_NAME

    @property
    def results_path(self) -> Path:
        return self.checkpoint_dir / RESULTS_NAME

    @property
    def log_path(self) -> Path:
        return self.path / LOG_NAME

    def metrics(self, kind: Optional[str] = None) -> List[dict]:
        """metrics.jsonl's lines, in the order written (one per step once a resume cut the replayed ones)."""
        return read_json_lines(self.metrics_path, kind)

    def steps(self) -> List[int]:
        """The steps of the "train" lines."""
        return [line["step"] for line in self.metrics("train")]

    def results(self) -> List[dict]:
        """The validation results, one line per evaluated epoch."""
        return read_json_lines(self.results_path)

    def epoch_checkpoint(self, epoch: int) -> Path:
        """Where the checkpoint after `epoch` completed epochs is (or would be) written."""
        return self.checkpoint_dir / epoch_checkpoint_name(epoch)

    def epoch_checkpoints(self) -> List[Path]:
        """The epoch_N.pt files, by N."""
        return numbered_checkpoints(self.checkpoint_dir, EPOCH_CHECKPOINT_NAME)

    def step_checkpoint(self, step: int) -> Path:
        """Where the checkpoint of optimizer step `step` is (or would be) written."""
        return self.checkpoint_dir / step_checkpoint_name(step)

    def step_checkpoints(self) -> List[Path]:
        """The step_N.pt files, by N."""
        return numbered_checkpoints(self.checkpoint_dir, STEP_CHECKPOINT_NAME)

    @property
    def params_path(self) -> Path:
        return self.path / PARAMS_NAME

    def loss_journal_path(self, name: str) -> Path:
        """Where the loss's journal `name` is kept (`Loss.journals`: AdaCL's adacl_selection.json)."""
        return self.path / f"{name}.json"

    @property
    def args_path(self) -> Path:
        return self.path / ARGS_NAME

    def recorded_args(self) -> Dict[str, Any]:
        """The arguments of the run's last launch as values (params.json; a checkpoint's `args` are the same):
        every flag by destination, plus what the trainer derived from them (`loss_options`, `recipe_overrides`).
        `training.trainer.launch.params.config_from_recorded_args` makes them the run's `RunConfig` again. Empty
        before the first launch wrote them."""
        if not self.args_path.is_file():
            return {}
        return json.loads(self.args_path.read_text())

    def final_checkpoint(self) -> Path:
        """The newest epoch_N.pt; a clear error if the run wrote none."""
        checkpoints = self.epoch_checkpoints()
        if not checkpoints:
            raise FileNotFoundError(
                f"the run in {self.path} left no epoch_N.pt checkpoint in {self.checkpoint_dir}; see {self.log_path}"
            )
        return checkpoints[-1]


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="Print a file of a training run's folder (for shell scripts).")
    parser.add_argument("run_dir", type=Path, help="<logs>/<name>, as training.main writes it")
    parser.add_argument(
        "--final-checkpoint", action="store_true", required=True, help="print the path of the newest epoch_N.pt"
    )
    args = parser.parse_args(argv)
    try:
        print(RunDir(args.run_dir).final_checkpoint())
    except FileNotFoundError as error:
        parser.exit(1, f"error: {error}\n")


if __name__ == "__main__":
    main()
