"""LR schedules: name -> how to build it, registered like losses. A new schedule is one module:

    @register_schedule("linear", "linear decay to 0 after the warmup")
    def linear(optimizer, cfg: SchedulerConfig, steps_per_epoch: float, total_steps: float):
        return ...  # a function step -> lr that also sets the optimizer's lr

`--lr-scheduler` lists what is registered when the parser is built. The built-ins are OpenCLIP's
(`open_clip_train.scheduler`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional, Sequence, Tuple

import torch
from open_clip_train.scheduler import const_lr, const_lr_cooldown, cosine_lr

from open_clip_adacl.registry import Registry

from ..flags import ConfigError, HelpGroup, NoOptions, check_component_options, flag, from_flag

LrFunction = Callable[[int], float]


@dataclass(frozen=True)
class Schedule:
    name: str
    help: str
    build: Callable[..., LrFunction]  # (optimizer, cfg, steps_per_epoch, total_steps) -> step -> lr
    check: Optional[Callable[["SchedulerConfig"], None]]  # raises ConfigError for settings it cannot use
    options: type = NoOptions  # its own flags (a frozen dataclass of flag(...) fields): cfg.options in build


SCHEDULES: Registry[Schedule] = Registry("LR schedule")


def register_schedule(
    name: str,
    help: str,
    *,
    check: Optional[Callable[["SchedulerConfig"], None]] = None,
    options: type = NoOptions,
    aliases: Sequence[str] = (),
):
    """Register the decorated builder as `--lr-scheduler name` (and its old names `aliases`); `check`
    validates the config for it; `options` declares its own flags (their values: `cfg.options`)."""

    def decorator(build: Callable[..., LrFunction]) -> Callable[..., LrFunction]:
        check_component_options("LR schedule", name, options)
        SCHEDULES.add(name, Schedule(name, help, build, check, options), aliases)
        return build

    return decorator


def registered_schedules() -> Tuple[str, ...]:
    """The registered schedule names, in registration order."""
    return SCHEDULES.names()


def _schedules_help() -> str:
    return "LR scheduler, one of: " + "; ".join(f"'{s.name}' ({s.help})" for _, s in SCHEDULES.items()) + "."


@dataclass(frozen=True)
class SchedulerConfig:
    FLAG_GROUP: ClassVar[str] = HelpGroup.OPTIMISATION

    # Checked against the registry in check(), not by argparse, as OpenCLIP leaves the name free.
    name: str = flag("cosine", _schedules_help, name="--lr-scheduler")
    lr: float = from_flag("lr", default=5e-4)
    warmup: int = flag(10000, "Number of steps to warmup for.")
    epochs: int = from_flag("epochs", default=32)
    options: Any = None  # the chosen schedule's Options (None: its declared defaults)

    @property
    def schedule_options(self):
        """The chosen schedule's options: `options`, or its declared defaults."""
        declared = SCHEDULES.get(self.name).options
        return self.options if isinstance(self.options, declared) else declared()

    def check(self) -> None:
        if self.warmup < 0:
            raise ConfigError(f"--warmup must be >= 0, got {self.warmup}")
        if self.name not in SCHEDULES:
            raise ConfigError(
                f"--lr-scheduler {self.name!r} is unknown; choose one of {', '.join(registered_schedules())}"
            )
        if SCHEDULES.get(self.name).check is not None:
            SCHEDULES.get(self.name).check(self)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: SchedulerConfig, steps_per_epoch: float) -> LrFunction:
    """The registered schedule `cfg.name`: a function `step -> lr` that also sets the optimizer's lr."""
    if cfg.name not in SCHEDULES:
        raise ValueError(f"unknown LR scheduler {cfg.name!r}")
    return SCHEDULES.get(cfg.name).build(optimizer, cfg, steps_per_epoch, steps_per_epoch * cfg.epochs)


@register_schedule("cosine", "warmup, then cosine decay to 0")
def _cosine(optimizer, cfg: SchedulerConfig, steps_per_epoch: float, total_steps: float) -> LrFunction:
    return cosine_lr(optimizer, cfg.lr, cfg.warmup, total_steps)


@register_schedule("const", "constant after the warmup")
def _const(optimizer, cfg: SchedulerConfig, steps_per_epoch: float, total_steps: float) -> LrFunction:
    return const_lr(optimizer, cfg.lr, cfg.warmup, total_steps)


@dataclass(frozen=True)
class CooldownOptions:
    FLAG_GROUP: ClassVar[str] = HelpGroup.OPTIMISATION

    epochs_cooldown: Optional[int] = flag(None, "With --lr-scheduler const-cooldown: cool down over the last N epochs.")
    lr_cooldown_power: float = flag(1.0, "Power for polynomial cooldown schedule (1.0: linear).")
    lr_cooldown_end: float = flag(0.0, "End learning rate for cooldown.")


def _check_cooldown(cfg: SchedulerConfig) -> None:
    cooldown = cfg.schedule_options.epochs_cooldown
    if cooldown is None:
        raise ConfigError("--lr-scheduler const-cooldown needs --epochs-cooldown N (the number of cooldown epochs)")
    if not 0 <= cooldown <= cfg.epochs:
        raise ConfigError(f"--epochs-cooldown must be between 0 and --epochs ({cfg.epochs}), got {cooldown}")


@register_schedule(
    "const-cooldown",
    "constant, then a polynomial cooldown over the last --epochs-cooldown epochs",
    check=_check_cooldown,
    options=CooldownOptions,
)
def _const_cooldown(optimizer, cfg: SchedulerConfig, steps_per_epoch: float, total_steps: float) -> LrFunction:
    cooldown = cfg.schedule_options
    return const_lr_cooldown(
        optimizer,
        cfg.lr,
        cfg.warmup,
        total_steps,
        steps_per_epoch * cooldown.epochs_cooldown,
        cooldown.lr_cooldown_power,
        cooldown.lr_cooldown_end,
    )
