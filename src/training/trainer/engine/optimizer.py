"""The optimizer, built as OpenCLIP's trainer builds it: AdamW with two parameter groups."""

from __future__ import annotations

import logging
from dataclasses import MISSING, dataclass
from typing import ClassVar

import torch

from ..flags import ConfigError, HelpGroup, flag


@dataclass(frozen=True)
class OptimizerConfig:
    FLAG_GROUP: ClassVar[str] = HelpGroup.OPTIMISATION

    # lr and the Adam constants default to None on the command line: OpenCLIP then takes them from the
    # model name (open_clip_train.params.get_default_params), so in code they must be given.
    lr: float = flag(None, "Learning rate (default from the model name).", field_default=MISSING)
    beta1: float = flag(None, "Adam beta 1.", field_default=MISSING)
    beta2: float = flag(None, "Adam beta 2.", field_default=MISSING)
    eps: float = flag(None, "Adam epsilon.", field_default=MISSING)
    wd: float = flag(0.2, "Weight decay.")
    opt: str = flag("adamw", "Optimizer; only adamw is supported.")

    def check(self) -> None:
        for name, value, valid, rule in (
            ("--lr", self.lr, lambda v: v >= 0, ">= 0"),
            ("--beta1", self.beta1, lambda v: 0 <= v < 1, "in [0, 1)"),
            ("--beta2", self.beta2, lambda v: 0 <= v < 1, "in [0, 1)"),
            ("--eps", self.eps, lambda v: v >= 0, ">= 0"),
            ("--wd", self.wd, lambda v: v >= 0, ">= 0"),
        ):
            if value is not None and not valid(value):  # AdamW's own checks, as one line before any work
                raise ConfigError(f"{name} must be {rule} (AdamW's rule), got {value}")
        if self.opt.lower() != "adamw":
            raise ConfigError(f"--opt {self.opt} is not supported by open_clip_adacl; only --opt adamw is implemented")


def exclude_from_weight_decay(name: str, param: torch.nn.Parameter) -> bool:
    """OpenCLIP's rule: no weight decay on gains, biases, norms and logit_scale."""
    return param.ndim < 2 or "bn" in name or "ln" in name or "bias" in name or "logit_scale" in name


def build_optimizer(model: torch.nn.Module, cfg: OptimizerConfig) -> torch.optim.AdamW:
    """AdamW with OpenCLIP's two parameter groups (decayed weights, undecayed gains/biases)."""
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    no_decay = [p for name, p in trainable if exclude_from_weight_decay(name, p)]
    decay = [p for name, p in trainable if not exclude_from_weight_decay(name, p)]
    optimizer = torch.optim.AdamW(
        [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": cfg.wd}],
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
    )
    logging.info(
        f"Created AdamW optimizer: lr {cfg.lr}, betas ({cfg.beta1}, {cfg.beta2}), eps {cfg.eps}, "
        f"weight decay {cfg.wd} on {len(decay)} tensors, 0 on {len(no_decay)}"
    )
    return optimizer
