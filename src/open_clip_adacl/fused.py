"""The selection's passes over the logits compiled by `torch.compile` (inductor: C++ on the CPU, Triton on
CUDA), so that each pass reads its input once instead of once per torch op (docs/adacl.md §6).

`selection.py` writes each pass as a plain traceable function and calls it through `run`; the
chunked eager passes stay the reference and run wherever the compiled ones do not: for small
matrices, for devices or dtypes the compiler does not handle, when compiling fails, or when the
user turns the fused passes off. Both produce bit-identical selections, so ranks that take
different paths still agree.

`OPEN_CLIP_ADACL_FUSED` selects the passes: `on` for every size, `off` never, and `auto` (default)
whichever is faster here: the first time the selection meets a shape (rows x columns, device type,
dtype), it times both on that call's own inputs and keeps the faster for the process (`decide`),
logging one line with both times. The compiled passes must win by `FUSED_MARGIN`: a pass timed
alone that is a few percent faster is a tie within the noise of a step, and a tie goes to the
eager reference, which needs no compiler; below `AUTO_MIN_ELEMENTS` entries it times the eager passes
alone and compiles nothing, since a compile (seconds) would cost more than the passes could save.
Whether the fused passes are faster depends on the CPU (measured: docs/adacl.md §6.3), so it is
measured rather than assumed. Each pass is compiled once per process, device type and dtype, with
dynamic shapes, so a new batch size does not recompile it; the compile time is logged once. A
pass that fails to compile (no C++ compiler, no Triton, an inductor error) is logged once and
runs eagerly from then on: never an error.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from typing import Callable, Dict, List, Optional, Set, Tuple

import torch

ENV_VARIABLE = "OPEN_CLIP_ADACL_FUSED"
MODES = ("auto", "on", "off")
# `auto` considers the fused passes for matrices from 2048 x 2048 entries up, where the passes cost enough
# that a one-time compile can be repaid within a run (docs/adacl.md §6.1); smaller runs (tests, demos)
# never wait for a compiler.
AUTO_MIN_ELEMENTS = 1 << 22
# `decide` times each path this many times, alternating, after `DECISION_WARMUPS` untimed calls each (the
# first compiles; the second runs the compiled code once before it is timed, as the eager code has run before).
DECISION_WARMUPS = 2
DECISION_ROUNDS = 5
# The compiled passes are kept only when their best time is below this fraction of the eager passes' best:
# their timings on an AMD EPYC (family 25, model 17), 44.6 against 46.0 ms, picked a path no faster in the
# step (docs/adacl.md §6.3).
FUSED_MARGIN = 0.9
DEVICE_TYPES = ("cpu", "cuda")
# The logits' dtypes, and int32 for the passes over the selection's keys.
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32)
# The histogram indices are in range by construction (bit shifts and clamps), so inductor's per-element
# bounds check, which keeps it from vectorising the pass, is left out.
_INDUCTOR_OPTIONS: Dict[str, object] = {"assert_indirect_indexing": False}
# On the CPU, a compiled pass called through inductor's Python wrapper holds Python's GIL until it returns;
# through its C++ wrapper it lets go of it, so that the AdaCL loss's two directions run their passes side
# by side, one thread each (`row_passes.side_by_side`; measured: docs/THROUGHPUT.md). It makes the first
# compile longer (docs/adacl.md §6.1).
_CPU_OPTIONS: Dict[str, object] = {"cpp_wrapper": True}
# On CPUs with AVX-512 the passes are compiled for 256-bit vectors (AVX2): they are bound by memory traffic,
# so wider vectors gain nothing, and the histogram's scatter-add compiled for AVX-512 took 91.5 ms against
# 8.1 ms for AVX2 on an AMD EPYC (family 25, model 17), N = 4096, one thread (docs/adacl.md §6.3).
if torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
    _CPU_OPTIONS["cpp.simdlen"] = 256

_log = logging.getLogger(__name__)
_compiled: Dict[Tuple[Callable, str], Callable] = {}  # per pass and device type
_ready: Set[Tuple[str, str, torch.dtype]] = set()
_failed: Set[str] = set()  # device types where a pass failed to compile: every pass runs eagerly there
# `auto`'s choices, per (passes, device type, dtype, rows, columns).
_decisions: Dict[Tuple[str, str, torch.dtype, int, int], Dict[str, object]] = {}
# The AdaCL loss may select its two directions' anchors on two threads: one compiles (or decides) while the
# other waits, so that each pass is compiled, and each shape timed, once.
_lock = threading.RLock()


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


def wanted(logits: torch.Tensor, passes: str, compiled: Callable[[], object], eager: Callable[[], object]) -> bool:
    """Whether the selection's `passes` over `logits` should run compiled (see the module's docstring).
    `compiled` and `eager` run them each way on this call's inputs (the compiled one raises
    `Unavailable` when it cannot compile), for `auto` to time them the first time it meets a shape."""
    selected = mode()
    if selected == "off" or logits.device.type not in DEVICE_TYPES or logits.dtype not in DTYPES:
        return False
    if logits.numel() == 0:  # a rank without rows: nothing to gain, and no shape to specialise on
        return False
    if selected == "on":
        return True
    key = (passes, logits.device.type, logits.dtype, *logits.shape)
    if key not in _decisions:
        with _lock:
            if key not in _decisions:
                _decisions[key] = decide(key, compiled if logits.numel() >= AUTO_MIN_ELEMENTS else None, eager)
    return _decisions[key]["choice"] == "fused"


def decide(
    key: Tuple[str, str, torch.dtype, int, int], compiled: Optional[Callable[[], object]], eager: Callable[[], object]
) -> Dict[str, object]:
    """`auto`'s choice for `key`: each way timed `DECISION_ROUNDS` times (alternating, the fastest time
    kept: the least disturbed by other jobs) after `DECISION_WARMUPS` untimed calls; the fused passes when
    their time is below `FUSED_MARGIN` times the eager passes', else the eager ones; eager without timing
    `compiled` when it is None (too small to compile) or cannot compile. Logs it."""
    passes, device_type, dtype, rows, cols = key
    paths = {"eager": eager} if compiled is None else {"fused": compiled, "eager": eager}
    try:
        for _ in range(DECISION_WARMUPS):  # the first untimed call compiles
            for path in paths.values():
                path()
    except Unavailable:
        del paths["fused"]
    times: Dict[str, List[float]] = {name: [] for name in paths}
    for _ in range(DECISION_ROUNDS):
        for name, path in paths.items():
            times[name].append(_timed(path, device_type))
    best = {name: min(values) * 1e3 for name, values in times.items()}
    choice = "fused" if "fused" in best and best["fused"] < FUSED_MARGIN * best["eager"] else "eager"
    fused_text = (
        f"fused {best['fused']:.1f} ms"
        if "fused" in best
        else "fused not compiled ("
        + (
            f"below {math.isqrt(AUTO_MIN_ELEMENTS)} squared entries, where compiling costs more than the passes can save"
            if compiled is None
            else "cannot be compiled here"
        )
        + ")"
    )
    _log.info(
        "AdaCL: %s selection passes for %d x %d %s on %s: %s, eager %.1f ms; using the %s passes "
        "(%s=auto, which keeps the fused passes only when they take under %.0f%% of the eager ones' time; "
        "on or off forces one)",
        passes,
        rows,
        cols,
        str(dtype).replace("torch.", ""),
        device_type,
        fused_text,
        best["eager"],
        choice,
        ENV_VARIABLE,
        FUSED_MARGIN * 100,
    )
    return {
        "passes": passes,
        "device": device_type,
        "dtype": str(dtype).replace("torch.", ""),
        "rows": rows,
        "cols": cols,
        "fused_ms": best.get("fused"),
        "eager_ms": best["eager"],
        "choice": choice,
    }


def _timed(path: Callable[[], object], device_type: str) -> float:
    """Wall-clock seconds of one call of `path`, the device synchronised around it."""
    if device_type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    path()
    if device_type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def decisions() -> List[Dict[str, object]]:
    """`auto`'s choices so far in this process, in the order made (JSON-ready; the AdaCL loss's `journals`)."""
    return [dict(decision) for decision in _decisions.values()]


def run(function: Callable, *args: torch.Tensor):
    """`function(*args)` compiled (once per device type and dtype of `args[0]`); raises `Unavailable`
    when it cannot be compiled, after logging why once: the first failure on a device type (most often
    a missing compiler, which every pass would meet) turns all the passes there eager."""
    key = _key(function, args)
    if key[1] in _failed:
        raise Unavailable(key)
    if key in _ready:
        return _compiled[function, key[1]](*args)
    with _lock:  # the first call compiles
        return _first_run(function, key, args)


def _first_run(function: Callable, key: Tuple[str, str, torch.dtype], args: Tuple[torch.Tensor, ...]):
    """`run`'s first call for `key`, which compiles the pass (see `run`)."""
    if key[1] in _failed:
        raise Unavailable(key)
    compiled = _compiled.get((function, key[1]))
    if compiled is None:
        options = {**_INDUCTOR_OPTIONS, **(_CPU_OPTIONS if key[1] == "cpu" else {})}
        compiled = _compiled[function, key[1]] = torch.compile(function, dynamic=True, fullgraph=True, options=options)
    start = time.perf_counter()
    try:
        result = compiled(*args)
    except torch.OutOfMemoryError:
        raise
    except Exception as error:  # whatever the compiler raises, the eager passes give the same result
        _failed.add(key[1])
        reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
        _log.warning(
            "AdaCL: cannot compile the fused selection pass %s for %s %s (%s: %s); using the eager "
            "passes on %s from now on (set %s=off to skip the attempt)",
            key[0],
            key[1],
            key[2],
            type(error).__name__,
            reason[:200],
            key[1],
            ENV_VARIABLE,
        )
        raise Unavailable(key) from error
    if key not in _ready:
        _ready.add(key)
        _log.info(
            "AdaCL: compiled the fused selection pass %s for %s %s in %.1f s",
            key[0],
            key[1],
            key[2],
            time.perf_counter() - start,
        )
    return result


def prepare(function: Callable, *args: torch.Tensor) -> None:
    """Compile `function` for `args`' device type and dtype by running it once, unless that is done;
    raises `Unavailable` when it cannot be compiled."""
    if _key(function, args) not in _ready:
        run(function, *args)
