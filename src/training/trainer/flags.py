"""Trainer flags declared once, on the fields of the config dataclasses.

A field made with `flag(default, help, ...)` declares an OpenCLIP-style flag (`--batch-size` for a field
`batch_size` unless `name` says otherwise) with its help, default, choices and argparse details; a field
made with `from_flag("epochs")` takes the value of a flag another config declares. `training.trainer.launch.params`
builds the argument parser, and `config_from_args` each config, from these declarations; each config
checks its own values in `check()` (raising `ConfigError`), `RunConfig.check` those spanning configs.

`help` and `choices` may be callables, evaluated when the parser is built, so that what a registry
holds at that moment (losses, LR schedules, dataset types) is what `--help` lists.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

_DECLARED = "flag"
_REFERENCED = "from_flag"
_SAME_AS_FLAG = object()  # field_default not given: the dataclass default is the flag's


# What a flag's value fixes that a resumed run must keep (training.trainer.launch.resume checks them):
SAMPLE_ORDER = "sample_order"  # with the world size, which samples each batch of an epoch holds
MODEL_SHAPE = "model_shape"  # the shapes of the weights
# How this launch runs, not what it trains (timeouts, the rendezvous, the logging cadence): free to change on resume.
LAUNCH_SETTING = "launch_setting"
RESUME_ROLES = (SAMPLE_ORDER, MODEL_SHAPE, LAUNCH_SETTING)


class ConfigError(ValueError):
    """A flag or combination of flags that cannot work; the message says what to change."""


class HelpGroup:
    """The sections of `--help`, in the order they are shown."""

    DATA = "data"
    OPTIMISATION = "optimisation"
    MODEL = "model"
    LOGS = "checkpoints and logs"
    DEVICES = "devices and distribution"
    CLUSTER = "preemption, resume and rendezvous (docs/cluster.md)"
    LOSS = "loss"
    ORDER = (DATA, OPTIMISATION, MODEL, LOGS, DEVICES, CLUSTER, LOSS)


@dataclass(frozen=True)
class _Declaration:
    default: Any
    help: Union[str, Callable[[], str]]
    name: Optional[str]
    type: Optional[Callable[[str], Any]]
    choices: Union[None, Sequence[Any], Callable[[], Sequence[Any]]]
    nargs: Optional[str]
    action: Union[None, str, type]
    metavar: Optional[str]
    group: Optional[str]
    convert: Optional[Callable[[Any], Any]]
    resume: Optional[str] = None


@dataclass(frozen=True)
class _Reference:
    dest: str
    convert: Optional[Callable[[Any], Any]]


@dataclass(frozen=True)
class Flag:
    """One declared flag: where it lives (`owner`.`field`) and how argparse reads it."""

    flag: str  # --batch-size
    dest: str  # batch_size: the namespace attribute and params.txt name
    owner: str  # the declaring config class
    field: str
    group: str
    declaration: _Declaration

    @property
    def default(self) -> Any:
        return self.declaration.default

    def add_to(self, group: argparse._ArgumentGroup) -> None:
        d = self.declaration
        kwargs: Dict[str, Any] = {"dest": self.dest, "default": d.default, "help": self.help_text()}
        if d.action is not None:
            kwargs["action"] = d.action
        if d.type is not None:
            kwargs["type"] = d.type
        if d.choices is not None:
            kwargs["choices"] = list(d.choices() if callable(d.choices) else d.choices)
        if d.nargs is not None:
            kwargs["nargs"] = d.nargs
        if d.metavar is not None:
            kwargs["metavar"] = d.metavar
        group.add_argument(self.flag, **kwargs)

    def help_text(self) -> str:
        """The help, ending with the default unless it is unset (None), off (a store_true flag) or already said."""
        d = self.declaration
        text = d.help() if callable(d.help) else d.help
        if d.default is None or d.default is False or "default" in text.lower():
            return text
        default = ",".join(map(str, d.default)) if isinstance(d.default, (list, tuple)) else str(d.default)
        if not default.strip() or default != default.strip():  # a tab separator, say: shown quoted
            default = repr(default)
        return f"{text} (default: {default.replace('%', '%%')})"

    def converted(self, value: Any, convert: Optional[Callable[[Any], Any]]) -> Any:
        """`convert(value)`; a ValueError it raises becomes a ConfigError naming this flag and the value."""
        if convert is None:
            return value
        try:
            return convert(value)
        except ConfigError:
            raise
        except ValueError as error:
            raise ConfigError(f"{self.flag} {value}: {error}") from None


def flag(
    default: Any,
    help: Union[str, Callable[[], str]],
    *,
    name: Optional[str] = None,
    type: Optional[Callable[[str], Any]] = None,
    choices: Union[None, Sequence[Any], Callable[[], Sequence[Any]]] = None,
    nargs: Optional[str] = None,
    action: Union[None, str, type] = None,
    metavar: Optional[str] = None,
    group: Optional[str] = None,
    convert: Optional[Callable[[Any], Any]] = None,
    field_default: Any = _SAME_AS_FLAG,
    resume: Optional[str] = None,
):
    """A config field that declares a flag: its default, help, and what argparse needs beyond the field's
    annotation (a bool field is a store_true flag; an int, float or str field, optional or not, reads that
    type). `name` defaults to `--<field name with dashes>`; `group` to the class's `FLAG_GROUP`; `convert`
    turns the parsed value into the field's value. `field_default` is the dataclass's default when it
    differs from the flag's (dataclasses.MISSING: the field is required when the class is built in code).
    `resume` says what the value fixes that a resumed run must keep (SAMPLE_ORDER or MODEL_SHAPE), or that it is a
    setting of the launch alone, which a resume may change unremarked (LAUNCH_SETTING)."""
    if resume not in (None, *RESUME_ROLES):
        raise TypeError(f"resume={resume!r}: choose one of {RESUME_ROLES}")
    declaration = _Declaration(default, help, name, type, choices, nargs, action, metavar, group, convert, resume)
    value = default if field_default is _SAME_AS_FLAG else field_default
    metadata = {_DECLARED: declaration}
    if isinstance(value, (dict, list)):
        return dataclasses.field(default_factory=lambda: copy.copy(value), metadata=metadata)
    return dataclasses.field(default=value, metadata=metadata)


def from_flag(dest: str, *, default: Any = dataclasses.MISSING, convert: Optional[Callable[[Any], Any]] = None):
    """A config field whose value is the flag `dest` (e.g. "epochs") that another config declares;
    `default` is the field's default when the class is built in code."""
    return dataclasses.field(default=default, metadata={_REFERENCED: _Reference(dest, convert)})


class OneOrSeveral(argparse.Action):
    """nargs="+" that keeps a single value as itself (OpenCLIP's --force-image-size 48 -> 48, not [48])."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs="+", **{k: v for k, v in kwargs.items() if k != "nargs"})

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values[0] if len(values) == 1 else values)


@dataclass(frozen=True)
class NoOptions:
    """The options of a component (a data source, an LR schedule) that declares none of its own."""


def check_component_options(kind: str, name: str, options: type) -> None:
    """A component's `Options` is a frozen dataclass whose every field declares a flag (`flag(...)`) and that
    says its --help section (`FLAG_GROUP`); the flags are collected with the configs' (`training.trainer.launch.config`)."""
    if not (isinstance(options, type) and dataclasses.is_dataclass(options) and options.__dataclass_params__.frozen):
        raise TypeError(f"{kind} {name!r}: its Options must be a @dataclass(frozen=True)")
    plain = [f.name for f in dataclasses.fields(options) if _DECLARED not in f.metadata]
    if plain:
        raise TypeError(
            f"{kind} {name!r}: declare {', '.join(plain)} with flag(default, help) (a component's options are flags)"
        )
    if dataclasses.fields(options) and getattr(options, "FLAG_GROUP", None) not in HelpGroup.ORDER:
        raise TypeError(f"{kind} {name!r}: its Options needs FLAG_GROUP, one of {HelpGroup.ORDER}")


def flags_fixing(flags: Dict[str, Flag], role: str) -> Tuple[str, ...]:
    """The destinations of the flags declared with `resume=role`, in declaration order."""
    return tuple(dest for dest, declared in flags.items() if declared.declaration.resume == role)


def declared_flags(configs: Sequence[type]) -> Dict[str, Flag]:
    """Every flag the `configs` declare, keyed by dest, in declaration order. Raises TypeError for a flag
    declared twice, a reference to a flag no config declares, or a field whose flag type cannot be read."""
    flags: Dict[str, Flag] = {}
    for cls in configs:
        for f in dataclasses.fields(cls):
            declaration = f.metadata.get(_DECLARED)
            if declaration is None:
                continue
            option = _flag_name(f, declaration)
            dest = _dest(option)
            if dest in flags:
                first = flags[dest]
                raise TypeError(
                    f"{option} is declared by both {first.owner}.{first.field} and {cls.__name__}.{f.name}; "
                    f"declare it once and give the other field from_flag({dest!r})"
                )
            group = declaration.group or getattr(cls, "FLAG_GROUP", None)
            if group not in HelpGroup.ORDER:
                raise TypeError(
                    f"{cls.__name__}.{f.name}: {option} needs a help group (FLAG_GROUP or group=), "
                    f"one of {HelpGroup.ORDER}; got {group!r}"
                )
            flags[dest] = Flag(option, dest, cls.__name__, f.name, group, _with_argparse_type(cls, f, declaration))
    for cls in configs:
        for f in dataclasses.fields(cls):
            reference = f.metadata.get(_REFERENCED)
            if reference is not None and reference.dest not in flags:
                raise TypeError(
                    f"{cls.__name__}.{f.name} takes from_flag({reference.dest!r}), but no config "
                    f"declares --{reference.dest.replace('_', '-')}"
                )
    return flags


def _flag_name(f: dataclasses.Field, declaration: _Declaration) -> str:
    return declaration.name or f"--{f.name.replace('_', '-')}"


def _dest(flag_name: str) -> str:
    """argparse's attribute for a flag: --batch-size -> batch_size."""
    return flag_name[2:].replace("-", "_")


def _with_argparse_type(cls: type, f: dataclasses.Field, declaration: _Declaration) -> _Declaration:
    """The declaration with argparse's action or type read from the field's annotation when not given."""
    if declaration.action is not None or declaration.type is not None:
        return declaration
    hint = typing.get_type_hints(cls)[f.name]
    inner = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    plain = inner[0] if len(inner) == 1 else hint
    if plain is bool and declaration.default is False:
        return dataclasses.replace(declaration, action="store_true")
    if plain in (int, float, str):
        return dataclasses.replace(declaration, type=plain)
    raise TypeError(
        f"{cls.__name__}.{f.name}: give flag(..., type=...) or action=; the annotation {hint} "
        f"does not say how to read it"
    )


def config_from_args(cls: type, args: argparse.Namespace, flags: Dict[str, Flag], **derived: Any):
    """`cls` built from the parsed flags: declared and referenced fields from `args` (converted as
    declared), the others from `derived`."""
    values: Dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in derived:
            continue
        declaration, reference = f.metadata.get(_DECLARED), f.metadata.get(_REFERENCED)
        if declaration is not None:
            source = flags[_dest(_flag_name(f, declaration))]
            values[f.name] = source.converted(getattr(args, source.dest), declaration.convert)
        elif reference is not None:
            source = flags[reference.dest]
            values[f.name] = source.converted(getattr(args, source.dest), reference.convert)
    return cls(**values, **derived)
