"""How often one AdaCL training step (forward and backward) makes the host wait for the device, counted
on the GPU code path forced on the CPU: every read of a tensor's values into Python (`.item()`,
`.tolist()`, `bool()`, `int()`, ...), every op whose output size depends on values (`nonzero`,
boolean-mask indexing, ...) and every tensor made from host values on a device (a copy that waits
for the device's queue). docs/adacl.md §6 states the count; it must not grow with N or the ranks."""

from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from helpers.bench_scripts import bench_script
from helpers.distributed_utils import run_on_ranks
from open_clip_adacl import DistributedSetup, create_loss, fused, row_passes
from open_clip_adacl.losses import ContrastiveLoss

step_costs = bench_script("step_costs")  # the counter, shared with scripts/bench_costs.py
counting_host_reads = step_costs.counting_host_reads
# The loss in one process reads nothing back; with several ranks, the check that every rank holds the
# same number of rows reads its 2-element all-reduce once (distributed.check_equal_local_rows).
EXPECTED = {1: Counter(), 2: Counter({"Tensor.tolist": 1})}


def _features(num, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = F.normalize(torch.randn(num, 16, generator=g), dim=-1)
    return x, F.normalize(x + 0.8 * torch.randn(num, 16, generator=g), dim=-1)


def _step(loss_fn, image, text):
    image, text = image.clone().requires_grad_(), text.clone().requires_grad_()
    loss_fn(image, text, torch.tensor(14.3, requires_grad=True)).backward()


def _counted_steps(rank, world_size, sizes, options, fused_mode):
    """Per N: the reads of the second training step (the first compiles the fused passes)."""
    import os

    os.environ[fused.ENV_VARIABLE] = fused_mode
    row_passes.reading_back_is_free = lambda device: False  # the GPU code path
    counts = {}
    for num in sizes:
        image, text = _features(num)
        rows = slice(rank * num // world_size, (rank + 1) * num // world_size)
        dist = DistributedSetup(
            rank=rank, world_size=world_size, local_loss=world_size > 1, gather_with_grad=world_size > 1
        )
        loss_fn = create_loss("adacl", dist=dist, **options)
        _step(loss_fn, image[rows], text[rows])
        with counting_host_reads(boolean_masks=fused_mode == "off") as reads:
            _step(loss_fn, image[rows], text[rows])
        counts[num] = reads
    return counts, {name for name, _, _ in fused._ready}, set(fused._failed)


OPTIONS = {
    "median": {},
    "mean_gda_queue": {"anchor_stat": "mean", "candidate_region": "gda", "queue_size": 64},
    "max_all": {"anchor_stat": "max", "candidate_region": "all", "mode": "literal"},
}


# "on" compiles the fused passes (about 50 s on 2 cores with an empty compile cache): in the slow tests.
@pytest.mark.parametrize("fused_mode", ["off", pytest.param("on", marks=pytest.mark.slow)])
@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_one_process_reads_nothing_back_whatever_n(options, fused_mode, monkeypatch):
    monkeypatch.setattr(row_passes, "reading_back_is_free", row_passes.reading_back_is_free)  # restored after
    monkeypatch.setenv(fused.ENV_VARIABLE, fused_mode)  # restored after too: later tests of this process run `auto`
    counts, compiled, failed = _counted_steps(0, 1, (24, 80), options, fused_mode)
    assert counts == {24: EXPECTED[1], 80: EXPECTED[1]}
    assert not failed
    if fused_mode == "on" and not options:  # the default median ran its three compiled passes
        assert {"_high_histogram_of_logits", "_low_histogram_of_logits", "_row_min_xor_of_logits"} <= compiled


# "on" compiles the fused passes on each rank (about 30 s on 2 cores): in the slow tests, as in test_selection.
@pytest.mark.slow
@pytest.mark.parametrize("fused_mode", ["off", "on"])
def test_two_ranks_read_back_once_whatever_n(fused_mode):
    for counts, compiled, failed in run_on_ranks(_counted_steps, 2, (24, 80), {}, fused_mode):
        assert counts == {24: EXPECTED[2], 80: EXPECTED[2]}
        assert not failed


def test_the_counter_sees_reads_and_leaves_torch_as_it_was(monkeypatch):
    # The CPU code path reads values back on purpose (they cost nothing there): the counter must see them.
    monkeypatch.setenv(fused.ENV_VARIABLE, "off")
    loss_fn = create_loss("adacl")
    image, text = _features(24)
    with counting_host_reads() as reads:
        _step(loss_fn, image, text)
    assert reads["Tensor.tolist"] >= 2 and reads["Tensor.nonzero"] >= 2 and reads["Tensor.__int__"] >= 2
    with counting_host_reads() as reads:
        torch.tensor([1.0], device="cpu")[torch.tensor([True])] = 0.0
    assert reads == Counter({"torch.tensor": 1, "aten.index_put_ with a boolean mask": 1})
    assert "__getitem__" not in vars(torch.Tensor) and "item" not in vars(torch.Tensor)
    scores, index = torch.zeros(3, 3, dtype=torch.bool), torch.tensor([2, 0, 1])
    scores[torch.arange(len(scores)), index] = True  # as clip_benchmark indexes: fails if a patch is left
    assert scores.sum() == 3


def test_a_full_memory_bank_reads_nothing_back_in_the_loss_call(monkeypatch):
    """docs/adacl.md §7: while the bank holds fewer than bank_size + N entries a step reads how many qualify (one
    int in the loss call, one in commit); from then on the loss call reads nothing and commit its one bool."""
    monkeypatch.setattr(row_passes, "reading_back_is_free", lambda device: False)  # the GPU code path
    monkeypatch.setenv(fused.ENV_VARIABLE, "off")
    loss_fn = create_loss("adacl", bank_size=16, data_size=64)
    reads = []
    for first in (0, 24, 40):  # 24 samples a step: 24, then 48 entries after the commits; 16 + 24 make it full
        image, text = _features(24, seed=first)
        image.requires_grad_()
        with counting_host_reads() as step_reads:
            loss_fn(image, text, torch.tensor(14.3), sample_index=torch.arange(first, first + 24)).backward()
        with counting_host_reads() as commit_reads:
            loss_fn.commit()
        reads.append((step_reads, commit_reads))
    assert reads[1] == (Counter({"Tensor.__int__": 1}), Counter({"Tensor.__bool__": 1, "Tensor.__int__": 1}))
    assert reads[2] == (EXPECTED[1], Counter({"Tensor.__bool__": 1}))


def _every_loss_counted(rank, world_size, num):
    """Per case of scripts/bench_costs.py (every registered loss; adacl in both modes, adaclw with each discovery):
    the host reads of its second step (forward + backward) on the GPU code path, this rank's rows of the batch."""
    bench_costs = bench_script("bench_costs")
    dist = DistributedSetup(
        rank=rank, world_size=world_size, local_loss=world_size > 1, gather_with_grad=world_size > 1
    )
    inputs = bench_costs.step_inputs(num, 16, slice(rank * num // world_size, (rank + 1) * num // world_size))
    counts, gathering = {}, set()
    with step_costs.gpu_code_path():
        for case in bench_costs.loss_cases()[1:]:  # the registered losses (OpenCLIP's ClipLoss first)
            loss_fn = case.build(num, dist)
            counts[case.name] = Counter(bench_costs.count_case(loss_fn, inputs)["host_waits"])
            if isinstance(loss_fn, ContrastiveLoss):  # gathers the batch with distributed.gather_batch
                gathering.add(case.name)
    return counts, gathering


def test_every_registered_loss_reads_nothing_back_on_the_gpu_path():
    from open_clip_adacl import clone_signals, list_losses

    counts, _ = _every_loss_counted(0, 1, 48)
    assert set(counts) >= {f"adaclw/{name}" for name in clone_signals.SIGNALS} | set(list_losses()) - {
        "adacl",
        "adaclw",
    }
    assert counts == dict.fromkeys(counts, EXPECTED[1])


@pytest.mark.slow  # every loss on two fresh processes: about 20 s on 2 cores
def test_every_registered_loss_on_two_ranks_reads_only_the_rank_check():
    """A loss that gathers the batch as ContrastiveLoss does reads the rank check once (EXPECTED); siglip, which
    exchanges the features between ranks itself, reads nothing."""
    for counts, gathering in run_on_ranks(_every_loss_counted, 2, 48):
        assert gathering >= {"adacl (calibrated)", "adaclw/text_image_tokens", "oracle"}
        assert counts == {name: EXPECTED[2 if name in gathering else 1] for name in counts}


def test_a_bad_sample_id_stops_the_gpu_path_with_its_message():
    """The sample ids' checks make no host wait on the GPU path: the device asserts them (here, on the CPU, at
    once), with the message the CPU path raises."""
    with step_costs.gpu_code_path():
        loss_fn = create_loss("adaclw", discovery="persistence")
        image, text = _features(8)
        with pytest.raises(RuntimeError, match=r"sample ids must lie in \[0, 2\*\*31\)"):
            loss_fn(image, text, torch.tensor(14.3), sample_index=torch.arange(8) - 1)
        loss_fn = create_loss("glofnd", data_size=8)
        with pytest.raises(RuntimeError, match="outside the per-sample state bank of data_size=8"):
            loss_fn(image, text, torch.tensor(14.3), sample_index=torch.arange(8) + 1)
