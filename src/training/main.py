"""`python -m training.main`: CLIP pretraining with OpenCLIP's command line and any registered loss.

    python -m training.main --train-data 'demo/train/shard-{000000..000007}.tar' --model adacl-tiny \
        --loss clip --batch-size 64 --epochs 5 --lr 1e-3 --warmup 50 --workers 2 --device cpu

Single process, or one process per device under torchrun / srun (DDP). Everything a run writes is
under <logs>/<name>/: out.log, params.txt (one block per launch), metrics.jsonl, checkpoints/,
tensorboard/. Exit status: 0 done, 1 stopped by the data, a diverged loss, a failed final checkpoint or
another rank's failure, 2 a configuration error (one line), 75 preempted (a step checkpoint saved;
docs/cluster.md).
"""

from __future__ import annotations

if __name__ == "__main__":  # before the imports below (seconds): a preemption signal meanwhile is not fatal
    from training.trainer.preemption import remember_early_signals

    remember_early_signals()

import logging
import os
import sys
from typing import Optional, Sequence

try:
    from .trainer.data import DataError, data_error_reason
    from .trainer.distributed import failed_collective
    from .trainer.engine.loop import NonFiniteLossError
    from .trainer.flags import ConfigError
    from .trainer.launch import params
    from .trainer.launch.config import RunConfig
    from .trainer.launch.trainer import FinalCheckpointError, RunSummary, Trainer
    from .trainer.preemption import Preempted
    from .trainer.run_folder.logger import end_logging
except ModuleNotFoundError as missing:  # without the [training] extra: one line as a command, the error as a library
    if __name__ != "__main__":
        raise
    from .trainer.extras import exit_for_missing_extra

    exit_for_missing_extra(missing, "python -m training.main", "training")


def main(argv: Optional[Sequence[str]] = None) -> Optional[RunSummary]:
    """The command line's run: `run(config)` of the parsed, checked flags (None for --dry-run)."""
    return run(_config(argv))


def _config(argv: Optional[Sequence[str]]) -> RunConfig:
    """The checked run config of a command line; from here on nothing reads args."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = params.parse_args(argv)
    params.check_named_device(argv, args.device)
    return params.checked_config(args)


def run(cfg: RunConfig) -> Optional[RunSummary]:
    """Train (or, with `cfg.dry_run`, only check) the run `cfg` describes, on the ranks the environment
    announces: `Trainer(cfg).run()` (`training.trainer.launch.trainer`); build `cfg` with
    `training.trainer.launch.params.config_from_values` (or `checked_config` of parsed flags).
    Returns what this rank trained; `RunSummary.run_folder` reads the run folder (metrics, checkpoints, results).
    The run's log handlers end with it: the caller's later lines stay out of its out.log."""
    try:
        return Trainer(cfg).run()
    finally:
        end_logging()


def cli() -> None:
    """Console entry point: a configuration problem prints one line and exits with status 2; data that
    cannot fill an epoch (every shard of a rank unreadable), a diverged run, a final checkpoint that
    could not be written or a collective that failed (another rank died or timed out) is logged in one
    line and exits with 1; a preempted run (its step checkpoint saved) exits with 75 (PREEMPTED_EXIT_CODE)."""
    try:  # the run's log handlers stay until the process exits: the lines below reach the console and out.log
        Trainer(_config(sys.argv[1:])).run()
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except NonFiniteLossError:
        sys.exit(1)  # the reason and what to change were logged
    except Preempted as stop:
        sys.exit(stop.exit_code)  # the one line was logged
    except FinalCheckpointError as error:
        logging.error(str(error))
        sys.exit(1)
    except DataError as error:
        logging.error(f"training data: {data_error_reason(error)}")
        sys.exit(1)
    except RuntimeError as error:
        reason = failed_collective(error)
        if reason is None:
            raise
        rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID", "0")
        logging.error(
            f"rank {rank}: a collective with the other ranks failed ({reason}): another rank died or did not "
            "answer within --dist-timeout (its log says why); stopping, --resume latest continues from the "
            "last checkpoint"
        )
        sys.exit(1)


if __name__ == "__main__":
    cli()
