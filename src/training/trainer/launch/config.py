"""The run's configuration: one frozen `RunConfig`, built once from the command line by
`params.run_config`; each component takes its own part of it.

Every config declares its flags on its fields (`training.trainer.flags`): DataConfig in `training.trainer.data`,
ModelConfig in `training.trainer.engine.model`, OptimizerConfig in `training.trainer.engine.optimizer`, SchedulerConfig in
`training.trainer.engine.schedule`, TrainConfig in `training.trainer.engine.loop`, CheckpointConfig in `training.trainer.engine.checkpoint`; the
ones only `training.main` reads are here. `run_flags()` collects them with the registered data sources' and
LR schedules' own `Options`, refusing a flag declared twice.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import signal
import typing
from dataclasses import MISSING, dataclass
from typing import Any, ClassVar, Dict, Mapping, Optional, Tuple

from open_clip_adacl import LossOptions
from open_clip_adacl.flag_numbers import numbers_problem
from open_clip_adacl.losses import SampleStateOptions
from open_clip_adacl.losses.registry import LOSSES, accepted_loss_names
from open_clip_adacl.registry import Registry

from ..data import DataConfig
from ..data.registry import SOURCES
from ..engine.checkpoint import CheckpointConfig
from ..engine.loop import TrainConfig
from ..engine.model import ModelConfig
from ..engine.optimizer import OptimizerConfig
from ..engine.schedule import SCHEDULES, SchedulerConfig
from ..flags import LAUNCH_SETTING, SAMPLE_ORDER, ConfigError, Flag, HelpGroup, declared_flags, flag, from_flag
from ..preemption import DEFAULT_PREEMPT_SIGNALS, parse_preempt_signals

RESUME_LATEST = "latest"
DASHBOARDS = ("tensorboard", "wandb")
SEED_MAX = 2**32 - 1  # numpy.random.seed takes seeds in [0, 2**32 - 1]; each rank seeds with --seed + its rank


@dataclass(frozen=True)
class LossConfig:
    FLAG_GROUP: ClassVar[str] = HelpGroup.LOSS

    name: str = flag(
        "clip",
        "Registered loss to train with (open_clip_adacl.list_losses()).",
        name="--loss",
        choices=accepted_loss_names,
        field_default=MISSING,
    )
    options: LossOptions  # that loss's validated options: given flags, else the declared defaults
    local_loss: bool = flag(
        False,
        "calculate loss w/ local features @ global (instead of realizing full global @ "
        "global matrix); needs --gather-with-grad for correct gradients",
    )
    gather_with_grad: bool = flag(False, "enable full distributed gradient for feature gather")


@dataclass(frozen=True)
class ValidationConfig:
    """Validation after epochs, on rank 0, as OpenCLIP's `evaluate`."""

    FLAG_GROUP: ClassVar[str] = HelpGroup.LOGS

    total_epochs: int = from_flag("epochs")
    batch_size: int = from_flag("batch_size")  # zero-shot batches and loader workers, as OpenCLIP
    workers: int = from_flag("workers")
    imagenet_val: Optional[str] = flag(
        None, "Path to imagenet val set for conducting zero shot evaluation.", group=HelpGroup.DATA
    )
    zeroshot_frequency: int = flag(2, "How often to run zero shot.")  # (0: never; the last epoch always)
    val_frequency: int = flag(1, "How often to run evaluation with val data.")


def dashboards(value: str) -> Tuple[str, ...]:
    """The dashboards --report-to names (OpenCLIP's 'all' is both; '' and 'none' neither)."""
    names = tuple(name.strip() for name in value.split(",") if name.strip() and name.strip() != "none")
    if not set(names) <= {*DASHBOARDS, "all"}:
        raise ConfigError(
            f"--report-to {value!r}: choose tensorboard, wandb, tensorboard,wandb or all, or leave it out"
        )
    return DASHBOARDS if "all" in names else names


@dataclass(frozen=True)
class LoggingConfig:
    """Where the run writes (<logs>/<name>/) and which dashboards it reports to."""

    FLAG_GROUP: ClassVar[str] = HelpGroup.LOGS

    logs: Optional[str] = flag(
        "./logs/",
        "Where to store logs, metrics and checkpoints (<logs>/<name>/).",
        convert=lambda logs: None if logs is None or logs.lower() == "none" else logs,
    )
    log_local: bool = flag(False, "log files on local master, otherwise global master only.")
    name: Optional[str] = flag(None, "Identifier for the experiment; default: current time and main settings.")
    report_to: Tuple[str, ...] = flag(
        "",
        "Options are ['wandb', 'tensorboard', 'wandb,tensorboard'] (or 'all'); metrics.jsonl is always written. "
        "wandb needs pip install 'open_clip_adacl[wandb]'.",
        type=str,
        convert=dashboards,
    )
    wandb_notes: str = flag("", "Notes if logging with wandb")
    wandb_project_name: str = flag("open-clip", "Name of the project if logging with wandb.")
    debug: bool = flag(False, "If true, more information is logged.")

    def check(self) -> None:
        if self.name is not None and os.path.normpath(self.name.strip() or ".") == ".":
            raise ConfigError(
                f"--name {self.name!r} names the --logs folder itself, where every run would mix its "
                "files; pass a name, or leave --name out for one made of the start time and settings"
            )
        if "wandb" in self.report_to and importlib.util.find_spec("wandb") is None:
            raise ConfigError(
                "--report-to wandb needs the wandb package: pip install 'open_clip_adacl[wandb]' (or pip install wandb)"
            )


@dataclass(frozen=True)
class DistributedConfig:
    FLAG_GROUP: ClassVar[str] = HelpGroup.DEVICES

    device: str = flag(
        "cuda",
        "Accelerator to use (the default falls back to cpu with a warning when unavailable; "
        "a device given by name that is unavailable is refused).",
    )
    dist_url: Optional[str] = flag(None, "url used to set up distributed training", resume=LAUNCH_SETTING)
    dist_backend: Optional[str] = flag(
        None, "distributed backend (default: nccl on CUDA, gloo on CPU)", resume=LAUNCH_SETTING
    )
    use_bn_sync: bool = flag(False, "Whether to use batch norm sync.")
    ddp_static_graph: bool = flag(False, "Enable static graph optimization for DDP.")
    no_set_device_rank: bool = flag(False, "Don't set device index from local rank.")
    timeout_s: Optional[float] = flag(
        None,
        "Timeout of the process group (rendezvous and every collective; default: torch's). Ranks that do not "
        "arrive in time stop the run with one error line.",
        name="--dist-timeout",
        metavar="SECONDS",
        group=HelpGroup.CLUSTER,
        resume=LAUNCH_SETTING,
    )

    def check(self) -> None:
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ConfigError(f"--dist-timeout must be > 0 seconds, got {self.timeout_s}")


@dataclass(frozen=True)
class RunConfig:
    FLAG_GROUP: ClassVar[str] = HelpGroup.CLUSTER

    data: DataConfig  # the whole run's data (rank 0 of 1): each rank takes its share with replace
    model: ModelConfig  # precision resolved for the device the run will use
    optimizer: OptimizerConfig
    schedule: SchedulerConfig
    train: TrainConfig
    checkpoints: CheckpointConfig
    validation: ValidationConfig
    logging: LoggingConfig
    distributed: DistributedConfig
    loss: LossConfig
    recorded_args: Mapping[str, Any]
    """Every argument as params.txt, checkpoints and wandb record it (precision resolved; a run
    without --name records the name it gets at start)."""
    epochs: int = flag(32, "Number of epochs to train for.", group=HelpGroup.OPTIMISATION)
    seed: int = flag(0, "Default random seed.", group=HelpGroup.OPTIMISATION, resume=SAMPLE_ORDER)
    torchcompile: bool = flag(False, "torch.compile() the model, requires pytorch 2.0 or later.", group=HelpGroup.MODEL)
    dry_run: bool = flag(
        False, "Validate the arguments and the training shards, print the plan, and exit.", group=HelpGroup.DEVICES
    )
    resume: Optional[str] = flag(
        None,
        f"Checkpoint to resume from: a path, or '{RESUME_LATEST}' for the newest in <logs>/<name>/checkpoints.",
        group=HelpGroup.LOGS,
    )
    reset_loss_state: bool = flag(
        False,
        "With --resume: restart the loss's own state (per-sample banks, running "
        "statistics) instead of restoring it, e.g. after changing the training data.",
        group=HelpGroup.LOGS,
    )
    preempt_signals: Tuple[signal.Signals, ...] = flag(
        DEFAULT_PREEMPT_SIGNALS,
        "Signals that save a step checkpoint at the next step boundary and end the run with "
        "status 75 (comma list, or none).",
        name="--preempt-signal",
        type=str,
        convert=parse_preempt_signals,
    )  # training.trainer.preemption
    slurm_requeue: bool = flag(
        False, "After a preemption save inside a SLURM job, rank 0 runs `scontrol requeue $SLURM_JOB_ID`."
    )
    resume_anyway: bool = flag(
        False,
        "Resume a mid-epoch checkpoint although world size, batch size, workers or data "
        "changed: continues at the same number of samples into the epoch, in the new "
        "order (some samples of that epoch are seen twice or never).",
    )

    def check(self, world_size: int) -> None:
        """Each part's own checks, then those spanning parts; raises ConfigError saying what to change."""
        for dest, value in self.recorded_args.items():
            problem = numbers_problem(value)
            if problem:
                raise ConfigError(f"--{dest.replace('_', '-')} {problem}")
        if not 0 <= self.seed <= SEED_MAX - (world_size - 1):
            raise ConfigError(
                f"--seed must be in [0, {SEED_MAX - (world_size - 1)}], got {self.seed}: each of the {world_size} "
                f"rank(s) seeds numpy with --seed + its rank, and numpy takes seeds in [0, 2**32 - 1]"
            )
        if self.epochs < 1:
            raise ConfigError(
                f"--epochs must be >= 1, got {self.epochs}: such a run trains nothing (to evaluate a "
                "checkpoint: python -m training.evaluation --checkpoint CKPT)"
            )
        for name in RUN_PARTS:
            part = getattr(self, name)
            if hasattr(part, "check"):
                part.check()
        if self.loss.local_loss and not self.loss.gather_with_grad and world_size > 1:
            raise ConfigError(
                "--local-loss without --gather-with-grad gives wrong gradients with several ranks (each "
                "rank's loss then ignores how its features act as other ranks' negatives); add "
                "--gather-with-grad"
            )
        if self.resume not in (None, RESUME_LATEST) and not os.path.isfile(self.resume):
            problem = (
                "no such file"
                if not os.path.exists(self.resume)
                else "a folder, not a checkpoint file"
                if os.path.isdir(self.resume)
                else "not a regular file (a device or a pipe), not a checkpoint"
            )
            raise ConfigError(f"--resume {self.resume}: {problem}; pass an existing checkpoint or --resume latest")
        for given, flag_name in (
            (self.reset_loss_state, "--reset-loss-state"),
            (self.resume_anyway, "--resume-anyway"),
        ):
            if given and self.resume is None:
                raise ConfigError(f"{flag_name} only applies when resuming; add --resume latest or --resume PATH")
        data_size = sample_state_rows(self.loss.options)
        train_num_samples = self.data.train_num_samples
        if data_size is not None and train_num_samples is not None and data_size < train_num_samples:
            raise ConfigError(
                f"--data-size {data_size} is smaller than --train-num-samples {train_num_samples}; the loss keeps "
                f"per-sample state indexed by sample_index, so set --data-size to at least the number of samples "
                f"in the training set"
            )


def sample_state_rows(options: LossOptions) -> Optional[int]:
    """The rows of the loss's per-sample state (--data-size) when its options keep one, else None."""
    return options.data_size if isinstance(options, SampleStateOptions) and options.keeps_sample_state else None


# The order of the flags within each --help section.
CONFIGS = (
    DataConfig,
    ValidationConfig,
    OptimizerConfig,
    SchedulerConfig,
    TrainConfig,
    ModelConfig,
    LoggingConfig,
    CheckpointConfig,
    DistributedConfig,
    RunConfig,
    LossConfig,
)


def component_options() -> Tuple[type, ...]:
    """The `Options` of every registered data source and LR schedule that declares flags of its own."""
    classes = [
        *(source.Options for _, source in SOURCES.items()),
        *(schedule.options for _, schedule in SCHEDULES.items()),
    ]
    return tuple(cls for cls in dict.fromkeys(classes) if dataclasses.fields(cls))


def source_option_flags() -> Tuple[str, ...]:
    """The destinations of every registered data source's own flags (e.g. csv's csv_separator)."""
    return tuple(dest for _, source in SOURCES.items() for dest in declared_flags([source.Options]))


def run_flags() -> Dict[str, Flag]:
    """Every flag of a run: the configs' and the registered components' (read when called, so a component
    registered after import brings its flags); TypeError for a flag declared twice or a reference to no flag."""
    return declared_flags((*CONFIGS, *component_options()))


run_flags()  # at import: a flag declared twice among the built-ins fails `import training.trainer.launch.config`
# RunConfig's parts: field name -> config class.
RUN_PARTS: Dict[str, type] = {name: hint for name, hint in typing.get_type_hints(RunConfig).items() if hint in CONFIGS}
# The flags that name a registered component, and each one's registry (aliases: old names still accepted).
COMPONENT_FLAGS: Dict[str, Registry] = {"loss": LOSSES, "dataset_type": SOURCES, "lr_scheduler": SCHEDULES}


def with_canonical_names(args: Mapping[str, Any]) -> Dict[str, Any]:
    """`args` (flag values by destination) with every component named by its registered name, not an old alias:
    a params.txt or checkpoint written before a rename compares equal to a run of today."""
    return {
        **args,
        **{
            dest: registry.canonical(args[dest])
            for dest, registry in COMPONENT_FLAGS.items()
            if isinstance(args.get(dest), str) and args[dest] in registry
        },
    }
