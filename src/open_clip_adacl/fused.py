"""The selection's passes over the logits compiled by `torch.compile` (inductor: C++ on the CPU, Triton on
CUDA), so that each pass reads its input once instead of once per torch op (docs/adacl.md §6).

`selection.py` writes each pass as a plain traceable function and calls it through `run`; the
chunked eager passes stay the reference and run wherever the compiled ones do not: for small
matrices, for devices or dtypes the compiler does not handle, when compiling fails, or when the
user turns the fused passes off. Both produce bit-identical selections, so ranks that take
different paths still agree.

`OPEN_CLIP_ADACL_FUSED` selects the passes: `auto` (default) compiles them for matrices of at
least `AUTO_MIN_ELEMENTS` entries, where the time they save pays for compiling them once; `on`
for every size; `off` never. Each pass is compiled once per process, device type and dtype, with
dynamic shapes, so a new batch size does not recompile it; the compile time is logged once. A
pass that fails to compile (no C++ compiler, no Triton, an inductor error) is logged once and
runs eagerly from then on: never an error.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Callable, Dict, Set, Tuple

import torch

ENV_VARIABLE = "OPEN_CLIP_ADACL_FUSED"
MODES = ("auto", "on", "off")
# `auto` compiles for matrices from 2048 x 2048 entries up, where the passes cost enough that a one-time
# compile is repaid within a run (measured in docs/adacl.md §6.1); smaller runs (tests, demos) never
# wait for a compiler.
AUTO_MIN_ELEMENTS = 1 << 22
DEVICE_TYPES = ("cpu", "cuda")
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
# The histogram indices are in range by construction (bit shifts and clamps), so inductor's per-element
# bounds check, which keeps it from vectorising the pass, is left out.
_INDUCTOR_OPTIONS = {"assert_indirect_indexing": False}

_log = logging.getLogger(__name__)
_compiled: Dict[Callable, Callable] = {}
_ready: Set[Tuple[str, str, torch.dtype]] = set()
_failed: Set[Tuple[str, str, torch.dtype]] = set()


def _key(function: Callable, args: Tuple[torch.Tensor, ...]) -> Tuple[str, str, torch.dtype]:
    return function.__name__, args[0].device.type, args[0].dtype


class Unavailable(Exception):
    """The pass cannot run compiled here; the caller runs the eager passes."""


def mode() -> str:
    """The value of OPEN_CLIP_ADACL_FUSED (default `auto`)."""
    value = os.environ.get(ENV_VARIABLE, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"{ENV_VARIABLE}={value!r} is not one of {', '.join(MODES)}; unset it or use one of them")
    return value


def wanted(logits: torch.Tensor) -> bool:
    """Whether the selection over `logits` should run its compiled passes (see the module's docstring)."""
    selected = mode()
    if selected == "off" or logits.device.type not in DEVICE_TYPES or logits.dtype not in DTYPES:
        return False
    if logits.numel() == 0:  # a rank without rows: nothing to gain, and no shape to specialise on
        return False
    return selected == "on" or logits.numel() >= AUTO_MIN_ELEMENTS


def run(function: Callable, *args: torch.Tensor):
    """`function(*args)` compiled (once per device type and dtype of `args[0]`); raises `Unavailable`
    when it cannot be compiled, after logging why once."""
    key = _key(function, args)
    if key in _failed:
        raise Unavailable(key)
    compiled = _compiled.get(function)
    if compiled is None:
        compiled = _compiled[function] = torch.compile(function, dynamic=True, fullgraph=True,
                                                       options=_INDUCTOR_OPTIONS)
    start = time.perf_counter()
    try:
        result = compiled(*args)
    except torch.OutOfMemoryError:
        raise
    except Exception as error:  # whatever the compiler raises, the eager passes give the same result
        _failed.add(key)
        reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
        _log.warning("AdaCL: cannot compile the fused selection pass %s for %s %s (%s: %s); using the eager "
                     "passes (set %s=off to skip the attempt)", key[0], key[1], key[2], type(error).__name__,
                     reason[:200], ENV_VARIABLE)
        raise Unavailable(key) from error
    if key not in _ready:
        _ready.add(key)
        _log.info("AdaCL: compiled the fused selection pass %s for %s %s in %.1f s", key[0], key[1], key[2],
                  time.perf_counter() - start)
    return result


def prepare(function: Callable, *args: torch.Tensor) -> None:
    """Compile `function` for `args`' device type and dtype by running it once, unless that is done;
    raises `Unavailable` when it cannot be compiled."""
    if _key(function, args) not in _ready:
        run(function, *args)

