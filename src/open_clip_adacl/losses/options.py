"""How a loss declares its options and receives the distributed setup.

Every loss declares its options once, as a frozen dataclass deriving from `LossOptions` whose
fields are made with `option(default, help, ...)`. Everything else derives from that declaration:
the trainer's `--<loss>-<option>` flags and `params.txt`, the loss comparison's `name:key=value`
variants, and validation (types and choices here, ranges in the dataclass's `check`). Building the
dataclass validates it, so a loss never sees a bad value.

A loss may also name *presets*: a `PRESETS` mapping of name -> option values, chosen by its `preset`
option (`--<loss>-preset NAME`). `Options.build(**given)` fills in the preset's values under the
given ones and refuses a given value that contradicts the preset; an `Options` whose values
disagree with its own preset is refused, so a preset is never silently half applied.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Optional, Sequence, Tuple

from ..flag_numbers import number_problem


@dataclass(frozen=True)
class DistributedSetup:
    """Where a loss runs: OpenCLIP's four distributed arguments of `ClipLoss`, as one object."""

    rank: int = 0
    world_size: int = 1
    local_loss: bool = False  # each rank computes the loss of its own rows only
    gather_with_grad: bool = False  # gathered features carry gradient back to their rank

    def __post_init__(self):
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={self.rank}, world_size={self.world_size}")

    @property
    def splits_rows(self) -> bool:
        """Whether this rank holds only its own rows of the global batch's logits."""
        return self.world_size > 1 and self.local_loss


@dataclass(frozen=True)
class LossOption:
    """One declared option, as the command line and the loss comparison see it."""

    name: str
    type: type  # bool, int, float or str
    default: Any
    help: str
    choices: Optional[Sequence[Any]] = None
    flag: Optional[str] = None  # default: --<loss>-<name with dashes>


def option(default: Any, help: str, *, choices: Optional[Sequence[Any]] = None, flag: Optional[str] = None):
    """A field of a `LossOptions` dataclass: its default, help text, allowed values and flag."""
    return field(default=default, metadata={"help": help, "choices": choices, "flag": flag})


@dataclass(frozen=True)
class LossOptions:
    """Base of every loss's options (a loss without options uses it as is)."""

    # Preset name -> the option values it sets; a loss that declares any declares a `preset` option too.
    PRESETS: ClassVar[Mapping[str, Mapping[str, Any]]] = {}

    def __post_init__(self):
        for spec in self.specs():
            object.__setattr__(self, spec.name, _checked_value(spec, getattr(self, spec.name)))
        preset = getattr(self, "preset", None)
        if preset is not None:
            wrong = {name: value for name, value in self.PRESETS[preset].items() if getattr(self, name) != value}
            if wrong:
                raise ValueError(
                    f"preset {preset!r} sets "
                    + ", ".join(f"{name}={value!r} (got {getattr(self, name)!r})" for name, value in wrong.items())
                    + "; build the options with Options.build(preset=..., ...) to fill them in"
                )
        self.check()

    @classmethod
    def build(cls, **given: Any) -> "LossOptions":
        """The options from the values `given`, the chosen preset's values and the declared defaults
        (`resolved_values`), validated."""
        return cls(**cls.resolved_values(**given))

    @classmethod
    def resolved_values(cls, **given: Any) -> dict:
        """Every option's value: given, else the chosen preset's, else the declared default (not yet
        validated). A given value that contradicts the chosen preset is a ValueError naming both."""
        values = {spec.name: spec.default for spec in cls.specs()}
        preset = given.get("preset")
        if preset is not None:
            if preset not in cls.PRESETS:
                raise ValueError(f"option preset must be one of {sorted(cls.PRESETS)}, got {preset!r}")
            fixed = cls.PRESETS[preset]
            conflicts = {
                name: given[name]
                for name, value in fixed.items()
                if name in given and _checked_value(cls._spec(name), given[name]) != value
            }
            if conflicts:
                raise ValueError(
                    f"preset {preset!r} sets "
                    + ", ".join(f"{name}={fixed[name]!r}" for name in conflicts)
                    + "; drop "
                    + ", ".join(f"{name}={value!r}" for name, value in conflicts.items())
                    + " or the preset"
                )
            values.update(fixed)
        values.update(given)
        return values

    @classmethod
    def _spec(cls, name: str) -> LossOption:
        return next(spec for spec in cls.specs() if spec.name == name)

    def check(self) -> None:
        """Constraints beyond types and choices (ranges, relations between options); raise ValueError."""

    @classmethod
    def specs(cls) -> Tuple[LossOption, ...]:
        """The declared options, in declaration order."""
        hints = typing.get_type_hints(cls)
        undeclared = [f.name for f in dataclasses.fields(cls) if "help" not in f.metadata]
        if undeclared:
            raise TypeError(f"{cls.__qualname__}: declare {', '.join(undeclared)} with option(default, help)")
        return tuple(
            LossOption(
                name=f.name,
                type=_value_type(hints[f.name]),
                default=f.default,
                help=f.metadata["help"],
                choices=f.metadata["choices"],
                flag=f.metadata["flag"],
            )
            for f in dataclasses.fields(cls)
        )


@dataclass(frozen=True)
class SampleStateOptions(LossOptions):
    """Options of a loss that keeps state per training sample (`needs_sample_index`)."""

    data_size: Optional[int] = option(
        None,
        "number of training samples: sample indices must lie in [0, data_size) (sizes the per-sample state bank)",
        flag="--data-size",
    )

    @property
    def keeps_sample_state(self) -> bool:
        """Whether these options keep per-sample state, and so need sample indices and data_size: always for
        a loss that `needs_sample_index`; a loss that keeps it only under some options (AdaCL's memory bank)
        derives its Options from this class with needs_sample_index False and overrides this."""
        return True

    def check(self) -> None:
        super().check()
        if self.keeps_sample_state and (self.data_size is None or self.data_size < 1):
            raise ValueError(
                f"data_size (--data-size) must be the number of training samples, >= 1, got "
                f"{self.data_size}: it sizes the loss's per-sample state"
            )


@dataclass(frozen=True)
class EpochGatedOptions(LossOptions):
    """Options of a loss whose adjustment waits for a warm-up (`EpochGatedLoss`)."""

    start_epoch: int = option(
        0, "first epoch (from 0) whose training steps adjust the loss; earlier ones are plain InfoNCE"
    )

    def check(self) -> None:
        super().check()
        if self.start_epoch < 0:
            raise ValueError(f"start_epoch must be >= 0, got {self.start_epoch}")


def _value_type(hint: Any) -> type:
    """`Optional[T]` -> T; a plain T as is."""
    args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    return args[0] if args else hint


def _checked_value(spec: LossOption, value: Any) -> Any:
    """`value` as the option's type (an int is a valid float), or ValueError naming the option."""
    if value is None and spec.default is None:
        return value
    if spec.type is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, spec.type) or (spec.type is int and isinstance(value, bool)):
        article = "an" if spec.type is int else "a"
        raise ValueError(f"option {spec.name} must be {article} {spec.type.__name__}, got {value!r}")
    problem = number_problem(value)
    if problem:
        raise ValueError(f"option {spec.name}: {problem}")
    if spec.choices is not None and value not in spec.choices:
        raise ValueError(
            f"option {spec.name} must be one of {[c for c in spec.choices if c is not None]}, got {value!r}"
        )
    return value
