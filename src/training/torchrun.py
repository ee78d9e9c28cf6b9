"""`python -m training.torchrun`: torchrun that leaves every flag after `-m training.main` to the trainer.

    python -m training.torchrun --standalone --nproc_per_node 8 -m training.main --logs /ckpt --name run ...

torchrun (2.x) parses the whole command line and abbreviates its own options, so a trainer flag that
prefixes one of them is taken, or refused, by torchrun: `--logs` fails with "ambiguous option: --logs
could match --logs-specs, --logs_specs". Plain torchrun needs `--` after the trainer module; this
launcher inserts it when it is missing and is torchrun otherwise (same options, same environment),
except for its endings: workers that all stopped for a preemption (exit status 75, a step checkpoint
saved; `training.trainer.preemption`) end it with status 75 and one line instead of torchrun's failure report;
a worker that failed ends it with that worker's status (2: a configuration error, whose `error:` line
the worker printed above; 1: stopped by the data, a diverged loss, a failed final checkpoint or a collective
that failed or timed out; 128 +
the signal that killed it) and one line naming it, instead of torchrun's traceback; and a signal that
stops torchrun itself (it passes SIGTERM on to the workers, which save and stop) ends it with 128 + the
signal and one line.
"""

from __future__ import annotations

import signal
import sys
from typing import List, Optional, Sequence

TRAINER_MODULE = "training.main"


def with_separator(argv: Sequence[str]) -> List[str]:
    """`argv` with `--` right after the trainer module (`-m training.main`) unless already there."""
    argv = list(argv)
    for position in range(len(argv) - 1):
        if argv[position] in ("-m", "--module") and argv[position + 1] == TRAINER_MODULE:
            after = position + 2
            if argv[after : after + 1] != ["--"]:
                argv.insert(after, "--")
            return argv
    raise SystemExit(
        f"error: python -m training.torchrun launches the trainer: give -m {TRAINER_MODULE} "
        f"after torchrun's options (e.g. --nproc_per_node 8 -m {TRAINER_MODULE} --train-data ...)"
    )


_STATUS_MEANINGS = {
    1: "stopped by the data, a diverged loss, a failed final checkpoint, or a collective that failed "
    "or timed out (another rank died or stalled past --dist-timeout): its log says which",
    2: "a configuration error: its `error:` line above says what to change",
}


def failed_worker(rank: int, exit_code: int) -> str:
    """What happened to the worker of `rank` that failed first (exit_code < 0: killed by that signal)."""
    if exit_code < 0:
        return f"rank {rank} was killed by {signal.Signals(-exit_code).name}"
    return f"rank {rank} exited with status {exit_code} ({_STATUS_MEANINGS.get(exit_code, 'see its output above')})"


def cli(argv: Optional[Sequence[str]] = None) -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    from .trainer.preemption import PREEMPTED_EXIT_CODE

    try:
        run(parse_args(with_separator(sys.argv[1:] if argv is None else argv)))
    except ChildFailedError as error:
        # Every rank agreed to stop at the same step; torchrun SIGTERMs the others as soon as the first
        # one exits, so a rank may end killed (-SIGTERM) while finishing its own stop.
        exit_codes = {failure.exitcode for failure in error.failures.values()}
        if PREEMPTED_EXIT_CODE in exit_codes and exit_codes <= {PREEMPTED_EXIT_CODE, -signal.SIGTERM}:
            print(
                f"torchrun: the workers stopped for a preemption (exit status {PREEMPTED_EXIT_CODE}) after saving "
                "a step checkpoint; --resume latest continues the run",
                file=sys.stderr,
            )
            sys.exit(PREEMPTED_EXIT_CODE)
        rank, failure = error.get_first_failure()
        print(f"torchrun: {failed_worker(rank, failure.exitcode)}; the other workers were stopped", file=sys.stderr)
        sys.exit(failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode)
    except SignalException as error:
        print(
            f"torchrun: stopped by {error.sigval.name}, which it passed on to the workers (they save a step "
            "checkpoint at their next step when it is one of --preempt-signal; see out.log)",
            file=sys.stderr,
        )
        sys.exit(128 + int(error.sigval))


if __name__ == "__main__":
    cli()
