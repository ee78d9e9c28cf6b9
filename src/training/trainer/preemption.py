"""Graceful preemption: a signal saves a step checkpoint at the next step boundary and ends the run.

A cluster announces the end of a job with a signal: SLURM sends SIGTERM at preemption or the time
limit (then SIGKILL after its KillWait), and `#SBATCH --signal=B:USR1@120` sends SIGUSR1 to the job
script 120 s before the limit. The signals of `--preempt-signal` (default TERM,USR1) only set a flag
here; the trainer reads it at each step boundary inside the step's existing all-reduce (so every rank
stops after the same step, with no extra collective), saves `step_N.pt`, logs one line and exits with
PREEMPTED_EXIT_CODE. With `--slurm-requeue` inside a SLURM job, rank 0 then runs
`scontrol requeue $SLURM_JOB_ID`; the requeued job's `--resume latest` continues from that step.

Ctrl-C (SIGINT) and a closed terminal (SIGHUP) stop the run the same way, whatever `--preempt-signal` says, but
never requeue it: they are a person's stop, not the cluster's. The first Ctrl-C says so in one line on stderr; a
second one quits at once (the signal's default action), losing the steps since the last checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
from typing import Iterator, Optional, Sequence, Tuple

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL (sysexits.h): stopped early, to be continued
DEFAULT_PREEMPT_SIGNALS = "TERM,USR1"
INTERACTIVE_STOP_SIGNALS = (signal.SIGINT, signal.SIGHUP)  # Ctrl-C, a closed terminal: stopped, not requeued
_CTRL_C_LINE = (
    b"Ctrl-C: the run stops after this step with a checkpoint (status 75; --resume latest continues); "
    b"press Ctrl-C again to quit at once, losing the steps since the last checkpoint\n"
)
_REQUEUE_TIMEOUT_S = 60
_early_signals: list = []  # preemption signals received before the run's handler took over
_watching_flags: list = []  # the PreemptionFlags handling signals now (`PreemptionFlag.watching`)


def parse_preempt_signals(text: str) -> Tuple[signal.Signals, ...]:
    """ "TERM,USR1" (names with or without SIG, or numbers) -> the signals; "none" -> (). ValueError
    names an unknown one."""
    if text.strip().lower() == "none":
        return ()
    signals = []
    for name in (part.strip() for part in text.split(",") if part.strip()):
        try:
            signals.append(
                signal.Signals(int(name))
                if name.isdigit()
                else signal.Signals["SIG" + name.upper().removeprefix("SIG")]
            )
        except (KeyError, ValueError):
            raise ValueError(f"unknown signal {name!r}; use names such as TERM,USR1 (or none)") from None
    if signal.SIGKILL in signals or signal.SIGSTOP in signals:
        raise ValueError("SIGKILL and SIGSTOP cannot be caught; use TERM, USR1, USR2, INT, ...")
    return tuple(signals)


def remember_early_signals() -> None:
    """Note the default preemption signals from the first moment of `python -m training.main` (installed
    before its imports, which take seconds): `PreemptionFlag.watching` honours one received meanwhile, so
    a job preempted during startup stops after its first step with a checkpoint and status 75, instead
    of dying of the signal (status -15)."""
    for sig in parse_preempt_signals(DEFAULT_PREEMPT_SIGNALS):
        signal.signal(sig, lambda signum, frame: _early_signals.append(signal.Signals(signum)))


def preemption_requested() -> bool:
    """Whether this process has received a preemption signal: during startup (`remember_early_signals`) or
    while a run watches for one. A read that blocks (a stalled `pipe:` shard, training.trainer.data.pipes) gives up
    when it is set, so the run reaches its stop path (a checkpoint, status 75) instead of waiting for data."""
    return bool(_early_signals) or any(flag.requested for flag in _watching_flags)


class PreemptionFlag:
    """Set by the first of the watched signals; the trainer reads `requested` at step boundaries."""

    def __init__(self) -> None:
        self.signal_name: Optional[str] = None
        self.preemption_signals: Tuple[signal.Signals, ...] = ()
        self.pid = os.getpid()

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def _handle(self, signum: int, frame) -> None:  # only a flag: nothing here may block or allocate much
        if signum == signal.SIGINT:  # the next Ctrl-C takes the default action: the process ends at once
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            if os.getpid() == self.pid:  # not from the DataLoader workers, which the terminal signals too
                os.write(2, _CTRL_C_LINE)
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name

    def stopped_by_a_person(self) -> bool:
        """Whether the signal was Ctrl-C or a closed terminal and not one of --preempt-signal: no requeue."""
        interactive = {sig.name for sig in INTERACTIVE_STOP_SIGNALS} - {sig.name for sig in self.preemption_signals}
        return self.signal_name in interactive

    @contextlib.contextmanager
    def watching(self, signals: Sequence[signal.Signals]) -> Iterator["PreemptionFlag"]:
        """Handle `signals` while the block runs (DataLoader workers forked meanwhile inherit the handler,
        so a signal sent to the whole process group does not kill them first); restores the previous
        handlers after. Outside the main thread (a run started from a thread pool) Python cannot handle
        signals: the flag is never set, and the signals keep their previous effect."""
        self.preemption_signals, self.pid = tuple(signals), os.getpid()
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        handled = dict.fromkeys((*signals, *INTERACTIVE_STOP_SIGNALS))
        previous = {sig: signal.signal(sig, self._handle) for sig in handled}
        _watching_flags.append(self)
        for sig in _early_signals[:1]:
            if sig in signals:
                self._handle(sig, None)
            else:  # not a preemption signal of this run (--preempt-signal): the effect it would have had
                signal.signal(sig, signal.SIG_DFL)
                signal.raise_signal(sig)
        try:
            yield self
        finally:
            _watching_flags.remove(self)
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class Preempted(Exception):
    """The run stopped at a preemption signal (its checkpoint saved, or the reason it was not logged)."""

    def __init__(self, message: str, exit_code: int = PREEMPTED_EXIT_CODE):
        super().__init__(message)
        self.exit_code = exit_code


def requeue_slurm_job(enabled: bool) -> str:
    """With --slurm-requeue inside a SLURM job, `scontrol requeue $SLURM_JOB_ID`; what happened, for the log line."""
    if not enabled:
        return "not requeued (no --slurm-requeue)"
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return "not requeued (--slurm-requeue, but SLURM_JOB_ID is not set: not a SLURM job)"
    try:
        result = subprocess.run(
            ["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=_REQUEUE_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        logging.error(f"scontrol requeue {job_id} failed ({error!r}); resubmit the job to continue")
        return f"requeue of SLURM job {job_id} FAILED"
    if result.returncode != 0:
        logging.error(
            f"scontrol requeue {job_id} exited with {result.returncode}: {result.stderr.strip()[:300]}; "
            "resubmit the job to continue (was it submitted with --requeue?)"
        )
        return f"requeue of SLURM job {job_id} FAILED"
    return f"requeued SLURM job {job_id}"
