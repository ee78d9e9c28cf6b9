"""Command line of `python -m training.main`: OpenCLIP 3.3.0's flags plus ours, and their validation.

Every OpenCLIP flag we support keeps OpenCLIP's name, default and meaning (`open_clip_train.params`).
OpenCLIP flags we do not support are still recognised, so that using one is a `ConfigError` naming
the flag instead of argparse's generic "unrecognized arguments" or, worse, silence.

Ours: `--loss` (any registered loss), one flag per loss option (`--<loss>-<option>` or the option's
own `flag`, generated from `open_clip_adacl.get_loss_class(name).Options`), `--caption-key`,
`--val-caption-key`, `--train-group-size`, `--save-every-n-steps`, `--max-nonfinite-steps`, and the
cluster flags `--preempt-signal`, `--slurm-requeue`, `--resume-anyway` and `--dist-timeout`.

This module is the boundary between argparse and the typed world: `parse_args` returns the namespace,
`validate_args` rejects bad combinations before any work, and `run_config` converts the namespace,
once, into the frozen `RunConfig` whose parts the rest of `training` takes.
"""
from __future__ import annotations

import argparse
import difflib
import importlib.util
import os
import shlex
import sys
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Dict, List, Optional, Sequence, Tuple

import open_clip
from open_clip_train.distributed import is_using_distributed, world_info_from_env
from open_clip_train.params import ParseKwargs, get_default_params

import open_clip_adacl  # noqa: F401  (registers our model configs, e.g. adacl-tiny, with open_clip)
from open_clip_adacl import LossOption, LossOptions, get_loss_class, list_losses
from open_clip_adacl.losses.siglip import SIGLIP_INIT_LOGIT_BIAS, SIGLIP_INIT_LOGIT_SCALE

from .checkpoint import CheckpointConfig
from .config import DistributedConfig, LoggingConfig, LossConfig, RunConfig, ValidationConfig
from .data import DataConfig, dataset_type_help, registered_dataset_types
from .distributed import resolved_device_type
from .model import ModelConfig, OptimizerConfig, SchedulerConfig
from .preemption import DEFAULT_PREEMPT_SIGNALS, parse_preempt_signals
from .train import TrainConfig

RESUME_LATEST = "latest"
LR_SCHEDULERS = ("cosine", "const", "const-cooldown")
PRECISIONS = ("amp", "amp_bf16", "amp_bfloat16", "bf16", "fp16", "pure_bf16", "pure_fp16", "fp32")

# OpenCLIP 3.3.0 flags this fork does not implement, with what to do instead.
UNSUPPORTED_FLAGS: Dict[str, str] = {
    "--horovod": "launch with torchrun or srun (DDP) instead",
    "--torchscript": "train the eager model; export with `python -m training.export`",
    "--trace": "train the eager model",
    "--distill-model": "distillation is not implemented",
    "--distill-pretrained": "distillation is not implemented",
    "--coca-caption-loss-weight": "CoCa models are not supported",
    "--coca-contrastive-loss-weight": "CoCa models are not supported",
    "--remote-sync": "sync <logs>/<name> with your own tool",
    "--remote-sync-frequency": "sync <logs>/<name> with your own tool",
    "--remote-sync-protocol": "sync <logs>/<name> with your own tool",
    "--use-bnb-linear": "bitsandbytes layers are not supported",
    "--imagenet-v2": "evaluate ImageNet-v2 with `python -m evaluation` (clip-benchmark)",
    "--copy-codebase": "record the code version yourself (e.g. git rev-parse HEAD)",
    "--momentum": "only AdamW is supported (--opt adamw)",
}


class ConfigError(ValueError):
    """A flag or combination of flags that cannot work; the message says what to change."""


class _UnsupportedFlag(argparse.Action):
    """Recognise an OpenCLIP flag we do not implement and refuse it by name."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs="*", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    def __call__(self, parser, namespace, values, option_string=None):
        raise ConfigError(
            f"{option_string} is not supported by open_clip_adacl (an OpenCLIP flag this fork does not "
            f"implement): {UNSUPPORTED_FLAGS[option_string]}"
        )


# ---------------------------------------------------------------------------------------------
# Loss options -> flags
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LossFlag:
    """One command-line flag carrying a loss option; several losses may share it (e.g. --data-size)."""

    flag: str
    dest: str
    option: LossOption
    losses: Tuple[str, ...]


def loss_option_flag(loss_name: str, option: LossOption) -> str:
    """`option.flag` when the loss sets one, else `--<loss>-<option-with-dashes>`."""
    return option.flag or f"--{loss_name}-{option.name.replace('_', '-')}"


def loss_flags() -> Dict[str, LossFlag]:
    """Every registered loss's options, keyed by flag; refuses two incompatible uses of one flag."""
    flags: Dict[str, LossFlag] = {}
    for loss_name in list_losses():
        for option in get_loss_class(loss_name).Options.specs():
            flag = loss_option_flag(loss_name, option)
            if flag in flags:
                known = flags[flag]
                if known.option.type is not option.type:
                    raise RuntimeError(
                        f"losses {known.losses} and {loss_name!r} declare {flag} with different types "
                        f"({known.option.type.__name__} vs {option.type.__name__}); give one of them another flag"
                    )
                flags[flag] = LossFlag(flag, known.dest, known.option, known.losses + (loss_name,))
            else:
                flags[flag] = LossFlag(flag, flag.lstrip("-").replace("-", "_"), option, (loss_name,))
    return flags


def _add_loss_flag(group: argparse._ArgumentGroup, loss_flag: LossFlag) -> None:
    option = loss_flag.option
    defaults = {name: option_of(name, loss_flag.flag).default for name in loss_flag.losses}
    default_text = (str(option.default) if len(set(map(repr, defaults.values()))) == 1
                    else ", ".join(f"{name}: {value}" for name, value in defaults.items()))
    help_text = f"{option.help} (--loss {'/'.join(loss_flag.losses)}; default {default_text})"
    # None means "not given": the chosen loss's own default applies, and giving a flag that the chosen
    # loss does not declare is an error instead of being silently ignored.
    if option.type is bool:
        group.add_argument(loss_flag.flag, dest=loss_flag.dest, default=None,
                           action=argparse.BooleanOptionalAction, help=help_text)
    else:
        choices = [c for c in option.choices if c is not None] if option.choices else None
        group.add_argument(loss_flag.flag, dest=loss_flag.dest, default=None, type=option.type,
                           choices=choices, help=help_text)


def option_of(loss_name: str, flag: str) -> LossOption:
    """The option of `loss_name` carried by `flag`."""
    for option in get_loss_class(loss_name).Options.specs():
        if loss_option_flag(loss_name, option) == flag:
            return option
    raise KeyError(f"loss {loss_name!r} has no option behind {flag}")


def resolve_loss_options(args: argparse.Namespace) -> Dict[str, Any]:
    """The chosen loss's keyword options: given flags, else the chosen preset's value, else the option's
    default. The chosen loss's flags are filled in with those values, so params.txt records what the run
    used (as OpenCLIP fills in --lr from the model); other losses' flags stay None.

    Raises ConfigError for a loss flag given while another loss is chosen, and for a given value that
    contradicts the chosen preset (the values are validated by `validate_args`).
    """
    given: Dict[str, Any] = {}
    own_flags = []
    for loss_flag in loss_flags().values():
        value = getattr(args, loss_flag.dest)
        if args.loss in loss_flag.losses:
            option = option_of(args.loss, loss_flag.flag)
            own_flags.append((loss_flag.dest, option.name))
            if value is not None:
                given[option.name] = value
        elif value is not None:
            raise ConfigError(
                f"{loss_flag.flag} is an option of --loss {'/'.join(loss_flag.losses)}, but --loss is "
                f"{args.loss!r}; drop the flag or choose one of those losses"
            )
    try:
        options = get_loss_class(args.loss).Options.resolved_values(**given)
    except ValueError as error:
        raise ConfigError(f"--loss {args.loss}: {error}") from None
    for dest, name in own_flags:
        setattr(args, dest, options[name])
    return options


# ---------------------------------------------------------------------------------------------
# Parser
# ---------------------------------------------------------------------------------------------


class _OneLineErrorParser(argparse.ArgumentParser):
    """argparse errors as one ConfigError line (no usage screen); an unknown flag names the closest one."""

    def error(self, message: str):
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            unknown = [arg.split("=", 1)[0] for arg in message[len(prefix):].split() if arg.startswith("-")]
            if unknown:
                known = [option for action in self._actions for option in action.option_strings]
                close = difflib.get_close_matches(unknown[0], known, n=1)
                hint = f"; the closest supported flag is {close[0]}" if close else ""
                raise ConfigError(f"unknown flag {unknown[0]}{hint} (python -m training.main --help lists them all)")
        raise ConfigError(f"{message} (python -m training.main --help lists the flags)")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrorParser(
        prog="python -m training.main",
        description="CLIP pretraining with OpenCLIP 3.3.0's command line and pluggable losses (--loss).",
    )
    _add_data_flags(parser.add_argument_group("data"))
    _add_training_flags(parser.add_argument_group("optimisation"))
    _add_model_flags(parser.add_argument_group("model"))
    _add_checkpoint_flags(parser.add_argument_group("checkpoints and logs"))
    _add_distributed_flags(parser.add_argument_group("devices and distribution"))
    _add_cluster_flags(parser.add_argument_group("preemption, resume and rendezvous (docs/cluster.md)"))
    loss_group = parser.add_argument_group("loss")
    loss_group.add_argument("--loss", type=str, default="clip", choices=list_losses(),
                            help="Registered loss to train with (open_clip_adacl.list_losses()).")
    loss_group.add_argument("--siglip", default=False, action="store_true",
                            help="OpenCLIP's flag for the sigmoid loss: the same as --loss siglip.")
    loss_group.add_argument("--local-loss", default=False, action="store_true",
                            help="calculate loss w/ local features @ global (instead of realizing full "
                                 "global @ global matrix); needs --gather-with-grad for correct gradients")
    loss_group.add_argument("--gather-with-grad", default=False, action="store_true",
                            help="enable full distributed gradient for feature gather")
    for loss_flag in loss_flags().values():
        _add_loss_flag(loss_group, loss_flag)
    for flag in UNSUPPORTED_FLAGS:
        parser.add_argument(flag, action=_UnsupportedFlag)
    return parser


def _add_data_flags(group) -> None:
    group.add_argument("--train-data", type=str, default=None,
                       help="Training shards (braceexpand patterns); several sources joined with `::`.")
    group.add_argument("--train-data-upsampling-factors", type=str, default=None,
                       help="With --dataset-resampled and several `::` sources: one weight per source "
                            "(e.g. 1::2::0.5). By default sources are sampled uniformly.")
    group.add_argument("--val-data", type=str, default=None, help="Validation shards.")
    group.add_argument("--train-num-samples", type=int, default=None,
                       help="Samples per epoch; needed when the shards have no sizes.json.")
    group.add_argument("--val-num-samples", type=int, default=None, help="Validation samples.")
    group.add_argument("--dataset-type", type=str, default="auto", choices=registered_dataset_types(),
                       help=dataset_type_help())
    group.add_argument("--csv-separator", type=str, default="\t", help="For csv-like datasets, which separator to use.")
    group.add_argument("--csv-img-key", type=str, default="filepath",
                       help="For csv-like datasets, the name of the key for the image paths.")
    group.add_argument("--csv-caption-key", type=str, default="title",
                       help="For csv-like datasets, the name of the key for the captions.")
    group.add_argument("--dataset-resampled", default=False, action="store_true",
                       help="Sample shards with replacement.")
    group.add_argument("--caption-key", type=str, default="txt",
                       help="Caption field of each sample; a comma list samples one field per sample.")
    group.add_argument("--val-caption-key", type=str, default=None,
                       help="Caption field for validation (default: the first of --caption-key), e.g. "
                            "train on pseudo captions, validate on gold ones (docs/data.md).")
    group.add_argument("--train-group-size", type=int, default=1,
                       help="Shuffle runs of this many consecutive samples of a shard as units, so data "
                            "written in families (one-edit siblings) reaches a batch as whole families "
                            "(docs/data.md). 1: shuffle single samples, as OpenCLIP.")
    group.add_argument("--imagenet-val", type=str, default=None,
                       help="Path to imagenet val set for conducting zero shot evaluation.")
    group.add_argument("--workers", type=int, default=4, help="Number of dataloader workers per GPU.")
    group.add_argument("--batch-size", type=int, default=64, help="Batch size per GPU.")


def _add_training_flags(group) -> None:
    group.add_argument("--epochs", type=int, default=32, help="Number of epochs to train for.")
    group.add_argument("--epochs-cooldown", type=int, default=None,
                       help="With --lr-scheduler const-cooldown: cool down over the last N epochs.")
    group.add_argument("--lr", type=float, default=None, help="Learning rate (default from the model name).")
    group.add_argument("--beta1", type=float, default=None, help="Adam beta 1.")
    group.add_argument("--beta2", type=float, default=None, help="Adam beta 2.")
    group.add_argument("--eps", type=float, default=None, help="Adam epsilon.")
    group.add_argument("--wd", type=float, default=0.2, help="Weight decay.")
    group.add_argument("--warmup", type=int, default=10000, help="Number of steps to warmup for.")
    group.add_argument("--opt", type=str, default="adamw", help="Optimizer; only adamw is supported.")
    group.add_argument("--skip-scheduler", default=False, action="store_true",
                       help="Use this flag to skip the learning rate decay.")
    group.add_argument("--lr-scheduler", type=str, default="cosine",
                       help="LR scheduler. One of: 'cosine', 'const' (constant), 'const-cooldown'.")
    group.add_argument("--lr-cooldown-end", type=float, default=0.0, help="End learning rate for cooldown.")
    group.add_argument("--lr-cooldown-power", type=float, default=1.0,
                       help="Power for polynomial cooldown schedule (1.0: linear).")
    group.add_argument("--accum-freq", type=int, default=1, help="Update the model every --accum-freq steps.")
    group.add_argument("--grad-clip-norm", type=float, default=None, help="Gradient clip.")
    group.add_argument("--precision", choices=PRECISIONS, default=None,
                       help="Floating point precision. Default: amp on CUDA (as OpenCLIP), fp32 on CPU "
                            "(amp on CPU means fp16 autocast and amp_bf16 bf16 autocast, both slower there).")
    group.add_argument("--seed", type=int, default=0, help="Default random seed.")
    group.add_argument("--max-nonfinite-steps", type=int, default=10,
                       help="Skip steps whose loss is NaN/inf; stop after this many in a row.")


def _add_model_flags(group) -> None:
    group.add_argument("--model", type=str, default="RN50", help="Name of the model (open_clip.list_models()).")
    group.add_argument("--pretrained", type=str, default="",
                       help="Pretrained CLIP weights: a tag or a file path (e.g. an epoch_N.pt).")
    group.add_argument("--pretrained-image", default=False, action="store_true",
                       help="Load imagenet pretrained weights for image tower backbone if available.")
    group.add_argument("--cache-dir", type=str, default=None, help="Cache path for downloads.")
    group.add_argument("--lock-image", default=False, action="store_true",
                       help="Lock full image tower by disabling gradients.")
    group.add_argument("--lock-image-unlocked-groups", type=int, default=0,
                       help="Leave last n image tower layer groups unlocked.")
    group.add_argument("--lock-image-freeze-bn-stats", default=False, action="store_true",
                       help="Freeze BatchNorm running stats in image tower for any locked layers.")
    group.add_argument("--lock-text", default=False, action="store_true",
                       help="Lock full text tower by disabling gradients.")
    group.add_argument("--lock-text-unlocked-layers", type=int, default=0,
                       help="Leave last n text tower layer groups unlocked.")
    group.add_argument("--lock-text-freeze-layer-norm", default=False, action="store_true",
                       help="Freeze LayerNorm running stats in text tower for any locked layers.")
    group.add_argument("--lock-logit-scale", default=False, action="store_true",
                       help="(not in OpenCLIP) Keep logit_scale at its initial or pretrained value: separates a "
                            "loss's effect on the temperature from its effect on the embeddings.")
    group.add_argument("--image-mean", type=float, nargs="+", default=None, metavar="MEAN",
                       help="Override default image mean value of dataset")
    group.add_argument("--image-std", type=float, nargs="+", default=None, metavar="STD",
                       help="Override default image std deviation of dataset")
    group.add_argument("--image-interpolation", default=None, type=str, choices=["bicubic", "bilinear", "random"],
                       help="Override default image resize interpolation")
    group.add_argument("--image-resize-mode", default=None, type=str, choices=["shortest", "longest", "squash"],
                       help="Override default image resize (& crop) mode during inference")
    group.add_argument("--aug-cfg", nargs="*", default={}, action=ParseKwargs,
                       help="Training augmentation overrides, key=value (open_clip AugmentationCfg).")
    group.add_argument("--grad-checkpointing", default=False, action="store_true",
                       help="Enable gradient checkpointing.")
    group.add_argument("--torchcompile", default=False, action="store_true",
                       help="torch.compile() the model, requires pytorch 2.0 or later.")
    group.add_argument("--force-context-length", type=int, default=None, help="Override default context length")
    group.add_argument("--force-image-size", type=int, nargs="+", default=None, help="Override default image size")
    group.add_argument("--force-quick-gelu", default=False, action="store_true",
                       help="Force use of QuickGELU activation for non-OpenAI transformer models.")
    group.add_argument("--force-patch-dropout", default=None, type=float, help="Override the patch dropout.")
    group.add_argument("--force-custom-text", default=False, action="store_true",
                       help="Force use of CustomTextCLIP model (separate text-tower).")


def _add_checkpoint_flags(group) -> None:
    group.add_argument("--logs", type=str, default="./logs/",
                       help="Where to store logs, metrics and checkpoints (<logs>/<name>/).")
    group.add_argument("--log-local", default=False, action="store_true",
                       help="log files on local master, otherwise global master only.")
    group.add_argument("--name", type=str, default=None,
                       help="Identifier for the experiment; default: current time and main settings.")
    group.add_argument("--report-to", type=str, default="",
                       help="Options are ['wandb', 'tensorboard', 'wandb,tensorboard'] (or 'all'); metrics.jsonl "
                            "is always written. wandb needs pip install 'open_clip_adacl[wandb]'.")
    group.add_argument("--wandb-notes", default="", type=str, help="Notes if logging with wandb")
    group.add_argument("--wandb-project-name", type=str, default="open-clip",
                       help="Name of the project if logging with wandb.")
    group.add_argument("--debug", default=False, action="store_true", help="If true, more information is logged.")
    group.add_argument("--log-every-n-steps", type=int, default=100,
                       help="Log every n steps to console/metrics.jsonl/tensorboard.")
    group.add_argument("--save-frequency", type=int, default=1, help="How often (epochs) to save checkpoints.")
    group.add_argument("--save-most-recent", default=False, action="store_true",
                       help="Always save the most recent model trained to epoch_latest.pt.")
    group.add_argument("--save-every-n-steps", type=int, default=0,
                       help="Also save step_N.pt every N optimizer steps (0: off), so a crash loses at most N steps.")
    group.add_argument("--keep-step-checkpoints", type=int, default=0, metavar="K",
                       help="Keep only the K most recent step_N.pt (0: keep all); epoch checkpoints are never "
                            "removed by this flag.")
    group.add_argument("--delete-previous-checkpoint", default=False, action="store_true",
                       help="Delete the previous checkpoint after storing a new one.")
    group.add_argument("--resume", type=str, default=None,
                       help="Checkpoint to resume from: a path, or 'latest' for the newest in <logs>/<name>/checkpoints.")
    group.add_argument("--reset-loss-state", default=False, action="store_true",
                       help="With --resume: restart the loss's own state (per-sample banks, running statistics) "
                            "instead of restoring it, e.g. after changing the training data.")
    group.add_argument("--zeroshot-frequency", type=int, default=2, help="How often to run zero shot.")
    group.add_argument("--val-frequency", type=int, default=1, help="How often to run evaluation with val data.")


def _add_distributed_flags(group) -> None:
    group.add_argument("--dry-run", default=False, action="store_true",
                       help="Validate the arguments and the training shards, print the plan, and exit.")
    group.add_argument("--device", type=str, default="cuda",
                       help="Accelerator to use (falls back to cpu with a warning when unavailable).")
    group.add_argument("--dist-url", type=str, default=None, help="url used to set up distributed training")
    group.add_argument("--dist-backend", type=str, default=None,
                       help="distributed backend (default: nccl on CUDA, gloo on CPU)")
    group.add_argument("--use-bn-sync", default=False, action="store_true", help="Whether to use batch norm sync.")
    group.add_argument("--ddp-static-graph", default=False, action="store_true",
                       help="Enable static graph optimization for DDP.")
    group.add_argument("--no-set-device-rank", default=False, action="store_true",
                       help="Don't set device index from local rank.")


def _add_cluster_flags(group) -> None:
    group.add_argument("--preempt-signal", type=str, default=DEFAULT_PREEMPT_SIGNALS,
                       help="Signals that save a step checkpoint at the next step boundary and end the run with "
                            "status 75 (comma list, or none).")
    group.add_argument("--slurm-requeue", default=False, action="store_true",
                       help="After a preemption save inside a SLURM job, rank 0 runs `scontrol requeue $SLURM_JOB_ID`.")
    group.add_argument("--resume-anyway", default=False, action="store_true",
                       help="Resume a mid-epoch checkpoint although world size, batch size, workers or data "
                            "changed: continues at the same number of samples into the epoch, in the new order "
                            "(some samples of that epoch are seen twice or never).")
    group.add_argument("--dist-timeout", type=float, default=None, metavar="SECONDS",
                       help="Timeout of the process group (rendezvous and every collective; default: torch's). "
                            "Ranks that do not arrive in time stop the run with one error line.")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse the command line (argparse errors exit; our own checks raise ConfigError).

    Fills OpenCLIP's model-dependent optimizer defaults and the chosen loss's options; call
    `validate_args` before any work.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:  # `torchrun ... -m training.main -- FLAGS` and srun scripts may pass it through
        argv = argv[1:]
    args = build_parser().parse_args(argv)
    if args.siglip:
        if args.loss not in ("clip", "siglip"):
            raise ConfigError(f"--siglip means --loss siglip, but --loss is {args.loss!r}; pass only one of them")
        args.loss = "siglip"
    for name, value in get_default_params(args.model).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if isinstance(args.force_image_size, list) and len(args.force_image_size) == 1:
        args.force_image_size = args.force_image_size[0]
    args.loss_options = resolve_loss_options(args)
    return args


# ---------------------------------------------------------------------------------------------
# Validation before any work
# ---------------------------------------------------------------------------------------------


def validate_args(args: argparse.Namespace, world_size: int) -> None:
    """Reject combinations that cannot work, each with a message saying what to change."""
    checks: List[Tuple[bool, str]] = [
        (args.opt.lower() != "adamw",
         f"--opt {args.opt} is not supported by open_clip_adacl; only --opt adamw is implemented"),
        (not set(report_to(args.report_to)) <= {"tensorboard", "wandb"},
         f"--report-to {args.report_to!r}: choose tensorboard, wandb, tensorboard,wandb or all, or leave it out"),
        ("wandb" in report_to(args.report_to) and importlib.util.find_spec("wandb") is None,
         "--report-to wandb needs the wandb package: pip install 'open_clip_adacl[wandb]' (or pip install wandb)"),
        (args.train_data is None and args.dataset_type != "synthetic",
         "--train-data is required (shards such as 'data/train/shard-{000000..000009}.tar'); "
         "or use --dataset-type synthetic for a smoke test"),
        (args.batch_size < 1, f"--batch-size must be >= 1, got {args.batch_size}"),
        (args.accum_freq < 1, f"--accum-freq must be >= 1, got {args.accum_freq}"),
        (args.epochs < 0, f"--epochs must be >= 0, got {args.epochs}"),
        (args.warmup < 0, f"--warmup must be >= 0, got {args.warmup}"),
        (args.workers < 0, f"--workers must be >= 0, got {args.workers}"),
        (args.log_every_n_steps < 1, f"--log-every-n-steps must be >= 1, got {args.log_every_n_steps}"),
        (args.save_every_n_steps < 0,
         f"--save-every-n-steps must be >= 0 (0 turns step checkpoints off), got {args.save_every_n_steps}"),
        (args.keep_step_checkpoints < 0,
         f"--keep-step-checkpoints must be >= 0 (0 keeps every step checkpoint), got {args.keep_step_checkpoints}"),
        (args.max_nonfinite_steps < 1, f"--max-nonfinite-steps must be >= 1, got {args.max_nonfinite_steps}"),
        (args.grad_clip_norm is not None and not args.grad_clip_norm > 0,
         f"--grad-clip-norm must be > 0, got {args.grad_clip_norm}"),
        (args.lr_scheduler not in LR_SCHEDULERS,
         f"--lr-scheduler {args.lr_scheduler!r} is unknown; choose one of {', '.join(LR_SCHEDULERS)}"),
        (args.lr_scheduler == "const-cooldown" and args.epochs_cooldown is None,
         "--lr-scheduler const-cooldown needs --epochs-cooldown N (the number of cooldown epochs)"),
        (args.epochs_cooldown is not None and not 0 <= args.epochs_cooldown <= args.epochs,
         f"--epochs-cooldown must be between 0 and --epochs ({args.epochs}), got {args.epochs_cooldown}"),
        (args.local_loss and not args.gather_with_grad and world_size > 1,
         "--local-loss without --gather-with-grad gives wrong gradients with several ranks (each rank's "
         "loss then ignores how its features act as other ranks' negatives); add --gather-with-grad"),
        (args.resume not in (None, RESUME_LATEST) and not os.path.isfile(args.resume),
         f"--resume {args.resume}: no such file; pass an existing checkpoint or --resume latest"),
        (args.reset_loss_state and args.resume is None,
         "--reset-loss-state only applies when resuming; add --resume latest or --resume PATH"),
        (args.resume_anyway and args.resume is None,
         "--resume-anyway only applies when resuming; add --resume latest or --resume PATH"),
        (args.dist_timeout is not None and not args.dist_timeout > 0,
         f"--dist-timeout must be > 0 seconds, got {args.dist_timeout}"),
        (args.train_num_samples is not None and args.train_num_samples < 1,
         f"--train-num-samples must be >= 1, got {args.train_num_samples}"),
    ]
    for failed, message in checks:
        if failed:
            raise ConfigError(message)
    _validate_model_name(args.model)
    _validate_image_size(args.force_image_size)
    try:
        parse_preempt_signals(args.preempt_signal)
    except ValueError as error:
        raise ConfigError(f"--preempt-signal {args.preempt_signal}: {error}") from None
    loss_options = validated_loss_options(args)
    data_size = loss_options.data_size if get_loss_class(args.loss).needs_sample_index else None
    if data_size is not None and args.train_num_samples is not None and data_size < args.train_num_samples:
        raise ConfigError(
            f"--data-size {data_size} is smaller than --train-num-samples {args.train_num_samples}; the loss "
            f"keeps per-sample state indexed by sample_index, so set --data-size to at least the number of "
            f"samples in the training set"
        )


def _validate_model_name(name: str) -> None:
    if name.startswith(("local-dir:", "hf-hub:")):
        return
    known = open_clip.list_models()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see open_clip.list_models()"
        raise ConfigError(f"--model {name!r} is not a known model config{hint}")
    if "multimodal_cfg" in (open_clip.get_model_config(name) or {}):
        raise ConfigError(f"--model {name} is a CoCa model; CoCa's captioning loss is not supported by open_clip_adacl")


def _validate_image_size(size) -> None:
    if isinstance(size, list) and len(size) != 2:
        raise ConfigError(f"--force-image-size takes one size or height and width, got {size}")


def report_to(value: str) -> Tuple[str, ...]:
    """The dashboards --report-to names (OpenCLIP's 'all' is both; '' and 'none' neither)."""
    names = tuple(name.strip() for name in value.split(",") if name.strip() and name.strip() != "none")
    return ("tensorboard", "wandb") if "all" in names else names


def command_line(values: Dict[str, Any]) -> str:
    """`python -m training.main` with every flag whose recorded value (`arg_values`) is not the default."""
    parts = ["python -m training.main"]
    for action in build_parser()._actions:
        if not action.option_strings or action.dest not in values or action.default is argparse.SUPPRESS:
            continue
        value, flag = values[action.dest], action.option_strings[0]
        if value is None or value == action.default:
            continue
        if isinstance(action, argparse.BooleanOptionalAction):
            parts.append(flag if value else f"--no-{flag[2:]}")
        elif action.nargs == 0:  # store_true
            parts.append(flag)
        elif isinstance(value, dict):
            parts += [flag, *(shlex.quote(f"{key}={item}") for key, item in value.items())]
        elif isinstance(value, (list, tuple)):
            parts += [flag, *(shlex.quote(str(item)) for item in value)]
        else:
            parts += [flag, shlex.quote(str(value))]
    return " ".join(parts)


def world_size_from_env() -> int:
    """The world size torchrun or SLURM announce (1 when launched plainly); reads the environment only."""
    return world_info_from_env()[2] if is_using_distributed() else 1


def resolve_precision(precision: Optional[str], device_type: str) -> str:
    """OpenCLIP's default (amp) on accelerators; fp32 on CPU, where fp16 autocast is slow and lossy."""
    if precision is not None:
        return precision
    return "fp32" if device_type == "cpu" else "amp"


def logit_init_for_loss(loss_name: str) -> Dict[str, float]:
    """Model kwargs a loss needs: OpenCLIP's --siglip init for losses that use a logit bias."""
    if get_loss_class(loss_name).needs_logit_bias:
        return {"init_logit_scale": SIGLIP_INIT_LOGIT_SCALE, "init_logit_bias": SIGLIP_INIT_LOGIT_BIAS}
    return {}


def arg_values(args: argparse.Namespace) -> Dict[str, Any]:
    """All arguments as plain values (what params.txt and checkpoints record)."""
    return {name: getattr(args, name) for name in sorted(vars(args))}


# ---------------------------------------------------------------------------------------------
# Namespace -> the run's typed config (nothing below main sees the namespace)
# ---------------------------------------------------------------------------------------------


def validated_loss_options(args: argparse.Namespace) -> LossOptions:
    """The chosen loss's `Options`, built (and so validated) from the resolved `args.loss_options`."""
    try:
        return get_loss_class(args.loss).Options(**args.loss_options)
    except ValueError as error:
        raise ConfigError(f"--loss {args.loss}: {error}") from None


def run_config(args: argparse.Namespace) -> RunConfig:
    """The run's configuration, built once after `validate_args`; `args` is not changed after it."""
    precision = resolve_precision(args.precision, resolved_device_type(args.device))
    return RunConfig(
        data=data_config(args),
        model=model_config(args, precision),
        optimizer=OptimizerConfig(lr=args.lr, wd=args.wd, beta1=args.beta1, beta2=args.beta2, eps=args.eps),
        schedule=SchedulerConfig(name=args.lr_scheduler, lr=args.lr, warmup=args.warmup, epochs=args.epochs,
                                 epochs_cooldown=args.epochs_cooldown, lr_cooldown_power=args.lr_cooldown_power,
                                 lr_cooldown_end=args.lr_cooldown_end),
        train=TrainConfig(accum_freq=args.accum_freq, grad_clip_norm=args.grad_clip_norm,
                          log_every_n_steps=args.log_every_n_steps, max_nonfinite_steps=args.max_nonfinite_steps,
                          skip_scheduler=args.skip_scheduler),
        checkpoints=CheckpointConfig(save_frequency=args.save_frequency, save_most_recent=args.save_most_recent,
                                     save_every_n_steps=args.save_every_n_steps,
                                     delete_previous=args.delete_previous_checkpoint,
                                     keep_step_checkpoints=args.keep_step_checkpoints, total_epochs=args.epochs),
        validation=ValidationConfig(val_frequency=args.val_frequency, zeroshot_frequency=args.zeroshot_frequency,
                                    imagenet_val=args.imagenet_val, total_epochs=args.epochs,
                                    batch_size=args.batch_size, workers=args.workers),
        logging=LoggingConfig(logs=None if args.logs is None or args.logs.lower() == "none" else args.logs,
                              name=args.name, log_local=args.log_local, debug=args.debug,
                              report_to=report_to(args.report_to), wandb_project_name=args.wandb_project_name,
                              wandb_notes=args.wandb_notes),
        distributed=DistributedConfig(device=args.device, dist_backend=args.dist_backend, dist_url=args.dist_url,
                                      no_set_device_rank=args.no_set_device_rank, use_bn_sync=args.use_bn_sync,
                                      ddp_static_graph=args.ddp_static_graph, timeout_s=args.dist_timeout),
        loss=LossConfig(name=args.loss, options=validated_loss_options(args),
                        local_loss=args.local_loss, gather_with_grad=args.gather_with_grad),
        epochs=args.epochs,
        seed=args.seed,
        torchcompile=args.torchcompile,
        resume=args.resume,
        reset_loss_state=args.reset_loss_state,
        resume_anyway=args.resume_anyway,
        preempt_signals=parse_preempt_signals(args.preempt_signal),
        slurm_requeue=args.slurm_requeue,
        dry_run=args.dry_run,
        # params.txt records the precision the run uses (as it did when main filled it into args).
        recorded_args=MappingProxyType({**arg_values(args), "precision": precision}),
    )


def model_config(args: argparse.Namespace, precision: str) -> ModelConfig:
    return ModelConfig(
        name=args.model,
        pretrained=args.pretrained,
        precision=precision,
        force_image_size=(tuple(args.force_image_size) if isinstance(args.force_image_size, list)
                          else args.force_image_size),
        force_context_length=args.force_context_length,
        force_quick_gelu=args.force_quick_gelu,
        force_custom_text=args.force_custom_text,
        force_patch_dropout=args.force_patch_dropout,
        pretrained_image=args.pretrained_image,
        image_mean=args.image_mean,
        image_std=args.image_std,
        image_interpolation=args.image_interpolation,
        image_resize_mode=args.image_resize_mode,
        aug_cfg=dict(args.aug_cfg),
        cache_dir=args.cache_dir,
        lock_image=args.lock_image,
        lock_image_unlocked_groups=args.lock_image_unlocked_groups,
        lock_image_freeze_bn_stats=args.lock_image_freeze_bn_stats,
        lock_text=args.lock_text,
        lock_logit_scale=args.lock_logit_scale,
        lock_text_unlocked_layers=args.lock_text_unlocked_layers,
        lock_text_freeze_layer_norm=args.lock_text_freeze_layer_norm,
        grad_checkpointing=args.grad_checkpointing,
        model_kwargs=logit_init_for_loss(args.loss),
    )


def data_config(args: argparse.Namespace) -> DataConfig:
    """The whole run's data (rank 0 of 1, from the start): validation as it runs, and what each
    training rank takes its share of (`dataclasses.replace` with its rank, world size and position)."""
    return DataConfig(
        train_data=args.train_data,
        train_data_upsampling_factors=args.train_data_upsampling_factors,
        train_num_samples=args.train_num_samples,
        val_data=args.val_data,
        val_num_samples=args.val_num_samples,
        dataset_type=args.dataset_type,
        dataset_resampled=args.dataset_resampled,
        batch_size=args.batch_size,
        workers=args.workers,
        seed=args.seed,
        caption_key=args.caption_key,
        val_caption_key=args.val_caption_key,
        group_size=args.train_group_size,
        csv_separator=args.csv_separator,
        csv_img_key=args.csv_img_key,
        csv_caption_key=args.csv_caption_key,
    )
