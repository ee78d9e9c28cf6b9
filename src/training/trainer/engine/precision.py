"""Mixed precision as OpenCLIP's trainer runs it: autocast from `open_clip_train.precision`, OpenCLIP's
input dtype, and a gradient scaler for fp16 amp. On CPU, `--precision amp` means fp16 autocast and
`amp_bf16` bf16 autocast; both are slower than fp32 there."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import open_clip
import torch
from open_clip_train.precision import get_autocast

PRECISIONS = ("amp", "amp_bf16", "amp_bfloat16", "bf16", "fp16", "pure_bf16", "pure_fp16", "fp32")


def resolve_precision(precision: Optional[str], device_type: str) -> str:
    """OpenCLIP's default (amp) on accelerators; fp32 on CPU, where fp16 autocast is slow and lossy."""
    if precision is not None:
        return precision
    return "fp32" if device_type == "cpu" else "amp"


@dataclass
class Precision:
    """How a step runs: autocast context, input dtype and the gradient scaler (fp16 amp only)."""

    name: str
    autocast: Callable
    input_dtype: Optional[torch.dtype]
    scaler: Optional[torch.amp.GradScaler]


def build_precision(precision: str, device: torch.device) -> Precision:
    scaler = torch.amp.GradScaler(device=device.type) if precision == "amp" else None
    return Precision(
        name=precision,
        autocast=get_autocast(precision, device_type=device.type),
        input_dtype=open_clip.get_input_dtype(precision),
        scaler=scaler,
    )
