"""Command line of `python -m training.main`: OpenCLIP 3.3.0's flags plus ours, and their validation.

Every OpenCLIP flag we support keeps OpenCLIP's name, default and meaning (`open_clip_train.params`).
OpenCLIP flags we do not support are still recognised, so that using one is a `ConfigError` naming
the flag instead of argparse's generic "unrecognized arguments" or, worse, silence.

The flags are declared once, on the fields of the config dataclasses (`training.trainer.flags`, collected in
`training.trainer.launch.config.run_flags()`); this module generates the parser from them, adds one flag per loss option
(`--<loss>-<option>` or the option's own `flag`: `open_clip_adacl.losses.flags`, which the plug-in for stock
`open_clip_train` shares), the `--siglip` alias and the refused OpenCLIP flags.

This module is the boundary between argparse and the typed world: `parse_args` returns the namespace,
`validate_args` rejects bad combinations before any work (`RunConfig.check`), and `run_config`
converts the namespace, once, into the frozen `RunConfig` whose parts the rest of `training` takes.
"""

from __future__ import annotations

import argparse
import difflib
import os
import shlex
import sys
from types import MappingProxyType
from typing import Any, Dict, List, Mapping, Optional, Sequence

from open_clip_train.distributed import is_using_distributed, world_info_from_env
from open_clip_train.params import get_default_params

import open_clip_adacl  # noqa: F401  (registers our model configs, e.g. adacl-tiny, with open_clip)
from open_clip_adacl import LossOption, LossOptions, get_loss_class
from open_clip_adacl.losses.flags import (
    add_loss_flag,
    given_loss_options,
    loss_flags,
    loss_line,
    loss_option_flag,
    option_of,
)
from open_clip_adacl.losses.siglip import SIGLIP_INIT_LOGIT_BIAS, SIGLIP_INIT_LOGIT_SCALE

from ..data.registry import resolve_dataset_type
from ..data.source import get_data_source
from ..distributed import launch_environment_problem, resolved_device_type, unavailable_device
from ..engine.precision import resolve_precision
from ..engine.schedule import SCHEDULES
from ..flags import ConfigError, HelpGroup, config_from_args
from .config import RUN_PARTS, RunConfig, run_flags, with_canonical_names
from .recipes import RECIPES, RecipeError, recipe_values

RECIPE_HELP = (
    "start from a named recipe's flags (training.trainer.launch.recipes: e.g. cc3m-rn50, cc12m-vitb32, demo); every "
    "flag given beside it overrides the recipe's value"
)
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
    "--imagenet-v2": "evaluate ImageNet-v2 with `python -m training.evaluation` (clip-benchmark)",
    "--copy-codebase": "record the code version yourself (e.g. git rev-parse HEAD)",
    "--momentum": "only AdamW is supported (--opt adamw)",
}


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


def loss_option_dest(loss_name: str, option: LossOption) -> str:
    """The argparse destination of that option's flag (what `args_from_values` takes)."""
    return loss_flags()[loss_option_flag(loss_name, option)].dest


def add_recipe_flag(group: argparse._ActionsContainer, default: Optional[str] = None, note: str = "") -> None:
    """--recipe NAME (training.trainer.launch.recipes); `note` adds what it means in a tool that takes it."""
    group.add_argument(
        "--recipe", default=default, choices=sorted(RECIPES), help=RECIPE_HELP + (f". {note}" if note else "")
    )


def resolve_loss_options(args: argparse.Namespace) -> Dict[str, Any]:
    """The chosen loss's keyword options: given flags, else the chosen preset's value, else the option's
    default. The chosen loss's flags are filled in with those values, so params.txt records what the run
    used (as OpenCLIP fills in --lr from the model); other losses' flags stay None.

    Raises ConfigError for a loss flag given while another loss is chosen, and for a given value that
    contradicts the chosen preset (the values are validated by `validate_args`).
    """
    try:
        given = given_loss_options(args.loss, vars(args))
    except ValueError as error:
        raise ConfigError(str(error)) from None
    own_flags = [
        (loss_flag.dest, option_of(args.loss, loss_flag.flag).name)
        for loss_flag in loss_flags().values()
        if args.loss in loss_flag.losses
    ]
    try:
        options = get_loss_class(args.loss).Options.resolved_values(**given)
    except ValueError as error:
        raise ConfigError(loss_line(args.loss, error)) from None
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
            unknown = [arg.split("=", 1)[0] for arg in message[len(prefix) :].split() if arg.startswith("-")]
            if unknown:
                known = [option for action in self._actions for option in action.option_strings]
                close = difflib.get_close_matches(unknown[0], known, n=1)
                hint = f"; the closest supported flag is {close[0]}" if close else ""
                raise ConfigError(f"unknown flag {unknown[0]}{hint} (python -m training.main --help lists them all)")
            raise ConfigError(
                f"{message}{stray_path_hint(message[len(prefix) :].split())} (python -m training.main "
                "--help lists the flags)"
            )
        raise ConfigError(f"{message} (python -m training.main --help lists the flags)")


def stray_path_hint(unrecognized: Sequence[str]) -> str:
    """A hint for paths left over after a flag's value: the shell split an unquoted list (a glob, or two paths
    after --train-data), and each flag takes one string."""
    if not any("/" in arg or arg.endswith((".tar", ".csv", ".tsv")) for arg in unrecognized):
        return ""
    return (
        "; a second path after a flag that takes one? Quote the list, with braces for a range "
        "('dir/{00000..00099}.tar') or '::' between sources, instead of a glob or spaces"
    )


def build_parser() -> argparse.ArgumentParser:
    """The parser generated from the declared flags (`config.run_flags()`), the generated loss flags and
    the refused OpenCLIP flags; help and choices that come from registries are read now."""
    parser = _OneLineErrorParser(
        prog="python -m training.main",
        description="CLIP pretraining with OpenCLIP 3.3.0's command line and pluggable losses (--loss).",
    )
    groups = {name: parser.add_argument_group(name) for name in HelpGroup.ORDER}
    for declared in run_flags().values():
        declared.add_to(groups[declared.group])
    add_recipe_flag(parser)
    groups[HelpGroup.LOSS].add_argument(
        "--siglip",
        default=False,
        action="store_true",
        help="OpenCLIP's flag for the sigmoid loss: the same as --loss siglip.",
    )
    for loss_flag in loss_flags().values():
        add_loss_flag(groups[HelpGroup.LOSS], loss_flag)
    for flag in UNSUPPORTED_FLAGS:
        parser.add_argument(flag, action=_UnsupportedFlag)
    return parser


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse the command line (argparse errors exit; our own checks raise ConfigError).

    Fills OpenCLIP's model-dependent optimizer defaults and the chosen loss's options; call
    `validate_args` before any work.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:  # `torchrun ... -m training.main -- FLAGS` and srun scripts may pass it through
        argv = argv[1:]
    parser = build_parser()
    recipe = _recipe_named_in(argv)
    recipe_defaults = apply_recipe(parser, recipe, batch_size_given=_gives(argv, "--batch-size")) if recipe else {}
    return _completed(parser.parse_args(argv), recipe_defaults)


def check_named_device(argv: Sequence[str], device: str) -> None:
    """A `--device` the command line names that this machine lacks is refused (ConfigError): only OpenCLIP's
    default falls back to the CPU, since a device asked for by name would otherwise train on the CPU unnoticed."""
    problem = unavailable_device(device) if _gives(argv, "--device") else None
    if problem:
        raise ConfigError(problem)


def _gives(argv: Sequence[str], flag: str) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for arg in argv)


def args_from_values(values: Mapping[str, Any], recipe: Optional[str] = None) -> argparse.Namespace:
    """What `parse_args` returns for a command line giving these flag values, keyed by argparse destination
    (`{"batch_size": 64, "adacl_preset": "paper"}`), on top of `recipe`'s: how Python code states a run."""
    values = dict(values)
    recipe = values.pop("recipe", None) or recipe
    parser = build_parser()
    actions = {action.dest: action for action in parser._actions if action.option_strings}
    unknown = sorted(set(values) - set(actions))
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(actions), n=1)
        raise ConfigError(
            f"{unknown} are no flags of the trainer"
            + (f"; the closest is {close[0]!r}" if close else "")
            + " (python -m training.main --help lists them, by destination: --batch-size is batch_size)"
        )
    for dest, value in values.items():
        choices = actions[dest].choices
        if choices is not None and value is not None and value not in choices:
            raise ConfigError(
                f"{actions[dest].option_strings[0]} {value!r}: choose one of {', '.join(map(str, choices))}"
            )
    recipe_defaults = apply_recipe(parser, recipe, batch_size_given="batch_size" in values) if recipe else {}
    args = parser.parse_args([])
    for dest, value in values.items():
        setattr(args, dest, value)
    args.recipe = recipe
    return _completed(args, recipe_defaults)


def _completed(args: argparse.Namespace, recipe_defaults: Mapping[str, Any]) -> argparse.Namespace:
    """The parsed flags with what they imply filled in: the recipe's overridden values, --siglip, OpenCLIP's
    model-dependent optimizer defaults and the chosen loss's options."""
    _drop_recipe_options_of_other_losses(args, recipe_defaults)
    # params.txt records which of the recipe's values the command line replaced.
    args.recipe_overrides = sorted(dest for dest, value in recipe_defaults.items() if getattr(args, dest) != value)
    vars(args).update(with_canonical_names(vars(args)))  # an old name of a loss, source or schedule
    if args.siglip:
        if args.loss not in ("clip", "siglip"):
            raise ConfigError(f"--siglip means --loss siglip, but --loss is {args.loss!r}; pass only one of them")
        args.loss = "siglip"
    for name, value in get_default_params(args.model).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.loss_options = resolve_loss_options(args)
    return args


def _drop_recipe_options_of_other_losses(args: argparse.Namespace, recipe_defaults: Mapping[str, Any]) -> None:
    """A recipe's loss options belong to its loss: where `--loss` names another one, the options the recipe set for
    it (and the command line did not give) are dropped, so `--recipe demo --loss clip` trains clip."""
    flags_by_dest = {loss_flag.dest: loss_flag for loss_flag in loss_flags().values()}
    for dest, value in recipe_defaults.items():
        loss_flag = flags_by_dest.get(dest)
        if loss_flag and args.loss not in loss_flag.losses and getattr(args, dest) == value:
            setattr(args, dest, None)


def given_values(argv: Sequence[str]) -> Dict[str, Any]:
    """The flags `argv` gives, parsed, by destination (`["--train-group-size", "8"]` -> {"train_group_size": 8}):
    a tool's free-form trainer flags read as values."""
    parser = build_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return vars(parser.parse_args(list(argv)))


def _recipe_named_in(argv: Sequence[str]) -> Optional[str]:
    """The value of --recipe in `argv`, read before the full parse (its values become that parse's defaults)."""
    finder = argparse.ArgumentParser(add_help=False)
    finder.add_argument("--recipe", default=None)
    return finder.parse_known_args(argv)[0].recipe


def apply_recipe(parser: argparse.ArgumentParser, name: str, batch_size_given: bool) -> Dict[str, Any]:
    """Make recipe `name`'s values (for the world size the environment announces) the parser's defaults;
    returns them."""
    try:
        values = recipe_values(name, world_size_from_env(), batch_size_given)
    except RecipeError as error:
        raise ConfigError(f"--recipe {name}: {error}") from None
    known = {action.dest for action in parser._actions}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"--recipe {name} sets {unknown}, which are no flags of this trainer (training.trainer.launch.recipes)"
        )
    parser.set_defaults(**values)
    return values


# ---------------------------------------------------------------------------------------------
# Validation before any work
# ---------------------------------------------------------------------------------------------


def validate_args(args: argparse.Namespace, world_size: int) -> None:
    """Reject combinations that cannot work, each with a message saying what to change: the run's config
    is built (converting values as declared) and checked (`RunConfig.check`)."""
    checked_config(args, world_size)


def checked_config(args: argparse.Namespace, world_size: Optional[int] = None) -> RunConfig:
    """`run_config(args)`, checked for `world_size` ranks (default: what the environment announces)."""
    cfg = run_config(args)
    cfg.check(world_size_from_env() if world_size is None else world_size)
    return cfg


def config_from_values(values: Mapping[str, Any], recipe: Optional[str] = None) -> RunConfig:
    """The checked `RunConfig` of a run given as flag values by destination (`args_from_values`)."""
    return checked_config(args_from_values(values, recipe))


# What `run_config` derives from the flags and records beside them (params.txt, params.json, a checkpoint's args).
DERIVED_ARGS = ("loss_options", "recipe_overrides")


def config_from_recorded_args(recorded: Mapping[str, Any]) -> RunConfig:
    """The `RunConfig` of a recorded run: its arguments as `RunDir.recorded_args` (or a checkpoint's `args`)
    hold them, the derived ones derived again."""
    return config_from_values({name: value for name, value in recorded.items() if name not in DERIVED_ARGS})


def command_line(values: Mapping[str, Any]) -> str:
    """`python -m training.main` with every flag whose recorded value (`arg_values`) is not the default."""
    return " ".join(["python -m training.main", *map(shlex.quote, argv_from_values(values, skip_defaults=True))])


def argv_from_values(values: Mapping[str, Any], skip_defaults: bool = False) -> List[str]:
    """The trainer's command line for flag values keyed by destination (what `args_from_values` reads):
    for a run that must start in another process or on another machine (torchrun, SLURM)."""
    argv: List[str] = []
    for action in build_parser()._actions:
        if not action.option_strings or action.dest not in values or action.default is argparse.SUPPRESS:
            continue
        value, flag = values[action.dest], action.option_strings[0]
        if value is None or (skip_defaults and value == action.default):
            continue
        if isinstance(action, argparse.BooleanOptionalAction):
            argv.append(flag if value else f"--no-{flag[2:]}")
        elif action.nargs == 0:  # store_true
            argv += [flag] if value else []
        elif isinstance(value, dict):
            argv += [flag, *(f"{key}={item}" for key, item in value.items())]
        elif isinstance(value, (list, tuple)):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv


def world_size_from_env() -> int:
    """The world size torchrun or SLURM announce (1 when launched plainly); reads the environment only, and
    refuses launcher variables that cannot start the run (`launch_environment_problem`) in one line."""
    problem = launch_environment_problem(os.environ)
    if problem:
        raise ConfigError(problem)
    return world_info_from_env()[2] if is_using_distributed() else 1


def logit_init_for_loss(loss_name: str) -> Dict[str, float]:
    """Model kwargs a loss needs: OpenCLIP's --siglip init for losses that use a logit bias."""
    if get_loss_class(loss_name).needs_logit_bias:
        return {"init_logit_scale": SIGLIP_INIT_LOGIT_SCALE, "init_logit_bias": SIGLIP_INIT_LOGIT_BIAS}
    return {}


def dumped_args(recorded: Mapping[str, Any]) -> Dict[str, Any]:
    """The recorded arguments as the run's log lists them ("Params:"): without the option flags of the losses the
    run did not choose (None, every one of them); params.txt and params.json keep every argument."""
    chosen = recorded.get("loss")
    unused = {
        loss_flag.dest
        for loss_flag in loss_flags().values()
        if chosen not in loss_flag.losses and recorded.get(loss_flag.dest) is None
    }
    return {name: value for name, value in recorded.items() if name not in unused}


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
        raise ConfigError(loss_line(args.loss, error)) from None


def run_config(args: argparse.Namespace) -> RunConfig:
    """The run's configuration from the declared flags (`RunConfig.check` validates it); `args` is not
    changed. Only what no flag holds is filled in here: the precision resolved for the device the run will
    use, the model kwargs and validated options of the chosen loss, the options of the data source and LR
    schedule the run uses, and the recorded arguments."""
    flags = run_flags()
    precision = resolve_precision(args.precision, resolved_device_type(args.device))
    derived = {
        "model": {"precision": precision, "model_kwargs": logit_init_for_loss(args.loss)},
        "loss": {"options": validated_loss_options(args)},
        "data": {"source_options": options_from_flags(data_source_options(args), args, flags)},
        "schedule": {"options": options_from_flags(schedule_options(args), args, flags)},
    }
    parts = {name: config_from_args(cls, args, flags, **derived.get(name, {})) for name, cls in RUN_PARTS.items()}
    # params.txt records the precision the run uses (as it did when main filled it into args).
    return config_from_args(
        RunConfig, args, flags, **parts, recorded_args=MappingProxyType({**arg_values(args), "precision": precision})
    )


def data_source_options(args: argparse.Namespace) -> Optional[type]:
    """The `Options` of the source that reads --train-data (else --val-data); None when none can be named
    yet (no data, or a dataset type `check` refuses with its own message)."""
    try:
        return get_data_source(resolve_dataset_type(args.dataset_type, args.train_data or args.val_data)).Options
    except ValueError:
        return None


def schedule_options(args: argparse.Namespace) -> Optional[type]:
    """The `Options` of the chosen --lr-scheduler (None for a name `check` refuses)."""
    return SCHEDULES.get(args.lr_scheduler).options if args.lr_scheduler in SCHEDULES else None


def options_from_flags(options: Optional[type], args: argparse.Namespace, flags: Mapping[str, Any]) -> Any:
    """A component's options built from its flags (None for a component not known yet)."""
    return None if options is None else config_from_args(options, args, flags)
