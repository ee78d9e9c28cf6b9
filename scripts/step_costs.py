"""What one loss step costs on the GPU code path, counted on the CPU: the calls that would make the host wait for
the device, the aten ops (about one kernel launch each on a GPU) and the bytes they touch in N x N matrices.

`gpu_code_path()` forces the path a GPU runs on the CPU: no value read back to skip work
(`row_passes.reading_back_is_free` False), the eager selection passes (OPEN_CLIP_ADACL_FUSED=off) and a GPU's row
chunks (`row_passes.CHUNK_ELEMENTS`). `counting_host_reads()` counts, by name, every read of a tensor's values into
Python (`.item()`, `.tolist()`, `bool()`, `int()`, ...), every op whose output size depends on values (`nonzero`,
boolean-mask indexing, `unique`, ...) and every tensor made from host values on a device; with `costs_of=N` it
also counts the aten ops and their N x N traffic (`StepCosts`). tests/open_clip_adacl/test_host_syncs.py and
scripts/bench_costs.py share it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# Methods that read values back, or whose output shape depends on them.
READING_METHODS = (
    "item",
    "tolist",
    "cpu",
    "numpy",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "nonzero",
    "masked_select",
    "unique",
    "bincount",
    "repeat_interleave",
)
READING_FUNCTIONS = ("nonzero", "masked_select", "unique", "bincount", "repeat_interleave", "argwhere")
INDEXING_OPS = (torch.ops.aten.index, torch.ops.aten.index_put, torch.ops.aten.index_put_)
# Ops that make a tensor without touching its memory: no traffic.
UNWRITTEN_OPS = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")
FLOAT32_BYTES = 4


@dataclass
class StepCosts:
    """The aten ops seen and the bytes of their inputs and outputs that store at least `square` elements (views,
    unwritten allocations and a sparse tensor's unstored entries touch none), in passes over a `square`-element
    float32 matrix."""

    square: int
    ops: int = 0
    big_bytes: int = 0
    op_names: Counter = field(default_factory=Counter)

    @property
    def square_passes(self) -> float:
        return self.big_bytes / (FLOAT32_BYTES * self.square)

    def add(self, func, args, kwargs, output) -> None:
        self.ops += 1
        self.op_names[func.overloadpacket.__name__] += 1
        if func.is_view or func.overloadpacket.__name__ in UNWRITTEN_OPS:
            return
        tensors = [leaf for leaf in tree_leaves((args, kwargs, output)) if isinstance(leaf, torch.Tensor)]
        stored = [(_stored_elements(tensor), tensor.element_size()) for tensor in tensors]
        self.big_bytes += sum(elements * size for elements, size in stored if elements >= self.square)


def _stored_elements(tensor: torch.Tensor) -> int:
    """The elements `tensor` stores: all of a dense one, the values of a sparse one (its indices aside)."""
    if tensor.layout == torch.strided:
        return tensor.numel()
    return (tensor._values() if tensor.layout == torch.sparse_coo else tensor.values()).numel()


class _DispatchCounter(TorchDispatchMode):
    """Counts indexing with a boolean mask (whose output size depends on the values), seen at the aten level:
    setting `Tensor.__getitem__` would make every tensor a Python sequence for good; and, given `costs`, every op."""

    def __init__(self, counts: Counter, costs: Optional[StepCosts]):
        super().__init__()
        self.counts = counts
        self.costs = costs

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket in INDEXING_OPS and any(
            index is not None and index.dtype in (torch.bool, torch.uint8) for index in args[1]
        ):
            self.counts[f"aten.{func.overloadpacket.__name__} with a boolean mask"] += 1
        output = func(*args, **kwargs)
        if self.costs is not None:
            self.costs.add(func, args, kwargs, output)
        return output


@contextlib.contextmanager
def counting_host_reads(boolean_masks: bool = True, costs_of: Optional[int] = None) -> Iterator[Counter]:
    """Counts, by name, the calls that would make the host wait for a device. `boolean_masks`: also
    boolean-mask indexing, through a dispatch mode, under which compiled code does not run (so not
    with the fused passes, whose compiled graphs hold no Python-level indexing). `costs_of=N`: the counter's
    `costs` attribute, a `StepCosts` of the N x N matrices, counts every aten op too (with `boolean_masks`)."""
    counts = Counter()
    counts.costs = StepCosts(costs_of * costs_of) if costs_of is not None else None
    patched = []

    def wrap(owner, name, counts_call=lambda *args, **kwargs: True):
        original = getattr(owner, name)
        own = name in vars(owner)  # else inherited from torch._C.TensorBase: deleted again afterwards

        def counted(*args, **kwargs):
            if counts_call(*args, **kwargs):
                counts[f"{'Tensor' if owner is torch.Tensor else 'torch'}.{name}"] += 1
            return original(*args, **kwargs)

        patched.append((owner, name, original, own))
        setattr(owner, name, counted)

    for name in READING_METHODS:
        if hasattr(torch.Tensor, name):
            wrap(torch.Tensor, name, *_CONDITIONS.get(name, ()))
    for name in READING_FUNCTIONS:
        wrap(torch, name, *_CONDITIONS.get(name, ()))
    for name in ("tensor", "as_tensor"):  # host data copied to a device
        wrap(
            torch,
            name,
            lambda data, *args, **kwargs: (
                kwargs.get("device") is not None
                and not isinstance(data, torch.Tensor)
                and not _generated_by_inductor(sys._getframe(2))
            ),
        )  # 1: `counted`, 2: its caller
    try:
        with _DispatchCounter(counts, counts.costs) if boolean_masks else contextlib.nullcontext():
            yield counts
    finally:
        for owner, name, original, own in reversed(patched):
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)


def _sized_by_values(tensor, repeats=None, dim=None, *, output_size=None) -> bool:
    """Whether a `repeat_interleave` call's output size depends on values: tensor repeats without `output_size`
    (one int repeats every entry alike; one tensor argument is its own repeats)."""
    return output_size is None and (repeats is None or isinstance(repeats, torch.Tensor))


# The reading calls that wait only with some arguments: name -> (whether a call with these arguments waits,).
_CONDITIONS = {"repeat_interleave": (_sized_by_values,)}


def _generated_by_inductor(frame) -> bool:
    """Whether `frame` runs code that inductor generated. The passes compiled for the CPU are called through
    inductor's C++ wrapper (fused.py), whose Python side makes each symbolic size a CPU tensor: not a copy
    to a device, and not made on a GPU, where the passes are compiled without that wrapper."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return os.path.abspath(frame.f_code.co_filename).startswith(os.path.abspath(cache_dir()))


@contextlib.contextmanager
def gpu_code_path(fused_mode: str = "off") -> Iterator[None]:
    """Run the block on the code path a GPU takes (see the module's docstring), the switches restored after."""
    from open_clip_adacl import fused, row_passes

    saved = (row_passes.reading_back_is_free, row_passes.cpu_threads, row_passes.CHUNK_ELEMENTS["cpu"])
    saved_mode = os.environ.get(fused.ENV_VARIABLE)
    row_passes.reading_back_is_free = lambda device: False
    row_passes.cpu_threads = lambda device: 1  # rows walked on the calling thread, calls one after the other
    row_passes.CHUNK_ELEMENTS["cpu"] = row_passes.CHUNK_ELEMENTS["cuda"]
    os.environ[fused.ENV_VARIABLE] = fused_mode
    try:
        yield
    finally:
        row_passes.reading_back_is_free, row_passes.cpu_threads, row_passes.CHUNK_ELEMENTS["cpu"] = saved
        if saved_mode is None:
            os.environ.pop(fused.ENV_VARIABLE, None)
        else:
            os.environ[fused.ENV_VARIABLE] = saved_mode
