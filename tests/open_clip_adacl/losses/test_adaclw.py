"""adaclw (ours): negatives weighted by 1 + (weight - 1) p(clone | score), AdaCL's GDA posterior."""

import math

import pytest
import torch

from helpers.loss_equivalence import LOGIT_SCALE, assert_ranks_match_single_process, make_batches, value_and_grads
from open_clip_adacl import adacl_math, create_loss
from open_clip_adacl.distributed import RowGroup
from open_clip_adacl.losses.adaclw import posterior_log_weights
from open_clip_adacl.selection import batch_reference, select_anchor, summarize_rows


def _dense_adaclw(weight, prior_ratio=1.0):
    """The loss written out densely: the fits from the reference rows (found by hand), posterior, weights."""

    def loss(x, y, scale, sample_index):
        total = 0
        for logits in (scale * x @ y.T, scale * y @ x.T):
            n = logits.shape[0]
            eye = torch.eye(n, dtype=torch.bool)
            scores = logits.detach()
            salient = scores.diagonal() - scores.masked_fill(eye, -math.inf).amax(dim=1)
            fits = []
            for row in (int(salient.argmin()), int(salient.argmax())):  # class clone, class not clone
                negatives = scores[row][~eye[row]]
                fits += [negatives.mean(), negatives.std(unbiased=False)]
            posterior = adacl_math.gda_posterior(scores, *fits, prior_ratio=prior_ratio)
            multiplicity = torch.where(eye, 1.0, 1 + (weight - 1) * posterior).to(logits.dtype)
            total = total + ((multiplicity * logits.exp()).sum(dim=1).log() - logits.diagonal()).mean()
        return total / 2

    return loss


def test_matches_the_dense_formula_and_logs_its_activity():
    x, y, index = make_batches(1, 16, 8, data_size=24, seed=1)[0]
    x, y = x.double(), y.double()
    loss_fn = create_loss("adaclw", weight=16.0)
    ours = value_and_grads(loss_fn, x, y, index)
    for a, b in zip(ours, value_and_grads(_dense_adaclw(16.0), x, y, index)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    stats = {name: float(value) for name, value in loss_fn.stats.items()}
    for direction in ("i2t", "t2i"):
        assert 0 < stats[f"{direction}/clone_share"] < 1
        assert 0 < stats[f"{direction}/posterior_mean"] < 1
        assert stats[f"{direction}/weighted_mass"] > 1  # the weights made the negatives heavier
        assert stats[f"{direction}/flat_fit"] == 0


def test_weight_one_is_exactly_clip():
    x, y, index = make_batches(1, 16, 8, data_size=24, seed=2)[0]
    ours = value_and_grads(create_loss("adaclw", weight=1.0), x, y, index)
    for a, b in zip(ours, value_and_grads(create_loss("clip", shared_matmul=True), x, y, index)):
        assert torch.equal(a, b)


def test_a_posterior_equal_to_the_families_gives_the_oracles_weights():
    posterior = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    positive = torch.eye(3, dtype=torch.bool)
    log_weight = posterior_log_weights(posterior, positive, 16.0)
    torch.testing.assert_close(log_weight, torch.where(posterior > 0, math.log(16.0), 0.0).double())


def test_batch_reference_is_the_selections_own_fits():
    x, y, _ = make_batches(1, 12, 8, data_size=12, seed=4)[0]
    logits = LOGIT_SCALE * x @ y.T
    labels = torch.arange(12)
    summary = summarize_rows(logits, labels)
    selection = select_anchor(
        logits,
        summary,
        labels,
        RowGroup(split_across_ranks=False),
        salient="max",
        anchor_stat="median",
        prior_ratio=1.0,
        std_floor=1e-3,
    )
    reference = batch_reference(
        logits, summary, labels, RowGroup(split_across_ranks=False), salient="max", std_floor=1e-3
    )
    assert torch.equal(reference, selection.reference)


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match="weight must be >= 1"):
        create_loss("adaclw", weight=0.5)
    with pytest.raises(ValueError, match="prior_ratio must be > 0"):
        create_loss("adaclw", prior_ratio=0.0)


@pytest.mark.slow
def test_two_ranks_match_single_process():
    assert_ranks_match_single_process("adaclw", {"weight": 16.0}, make_batches(2, 8, 8, data_size=16, seed=3))


def _dense_flagged_adaclw(weight, threshold, signal):
    """`discovery` with a score: a negative counts `weight` times where `signal(x, y)` (rows x N, for the
    direction's queries) stands `threshold` standard deviations above the row's negatives (population std)."""

    def loss(x, y, scale, sample_index):
        total = 0
        for direction, logits in (("i2t", scale * x @ y.T), ("t2i", scale * y @ x.T)):
            n = logits.shape[0]
            eye = torch.eye(n, dtype=torch.bool)
            scores = signal(x.detach(), y.detach(), direction)
            negatives = scores[~eye].view(n, n - 1)
            z = (scores - negatives.mean(1, keepdim=True)) / negatives.std(1, unbiased=False, keepdim=True)
            multiplicity = torch.where(~eye & (z > threshold), weight, 1.0).to(logits.dtype)
            total = total + ((multiplicity * logits.exp()).sum(dim=1).log() - logits.diagonal()).mean()
        return total / 2

    return loss


SCORE_SIGNALS = {
    "text": lambda x, y, direction: y @ y.T,
    "cross_both": lambda x, y, direction: torch.minimum(x @ y.T, y @ x.T),
}


@pytest.mark.parametrize("discovery", sorted(SCORE_SIGNALS))
def test_a_score_discovery_weights_the_negatives_it_flags(discovery):
    x, y, index = make_batches(1, 16, 8, data_size=24, seed=1)[0]
    x, y = x.double(), y.double()
    loss_fn = create_loss("adaclw", weight=16.0, discovery=discovery, threshold=1.0)
    ours = value_and_grads(loss_fn, x, y, index)
    for a, b in zip(ours, value_and_grads(_dense_flagged_adaclw(16.0, 1.0, SCORE_SIGNALS[discovery]), x, y, index)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)
    shares = [float(loss_fn.stats[f"{direction}/clone_share"]) for direction in ("i2t", "t2i")]
    assert all(0 < share < 0.5 for share in shares)


@pytest.mark.parametrize("discovery", ["gda", "features", "persistence"])
def test_a_step_whose_stats_no_one_reads_leaves_them_out_and_trains_alike(discovery):
    x, y, index = make_batches(1, 16, 8, data_size=24, seed=1)[0]
    logged, unlogged = (create_loss("adaclw", weight=16.0, discovery=discovery) for _ in range(2))
    unlogged.wants_stats = False
    for a, b in zip(value_and_grads(logged, x, y, index), value_and_grads(unlogged, x, y, index)):
        assert torch.equal(a, b)
    assert "i2t/clone_share" in logged.stats and unlogged.stats == {}


@pytest.mark.parametrize("discovery", ["image", "persistence", "random"])
def test_a_threshold_no_row_can_pass_flags_nothing_trains_as_clip_and_says_so(discovery):
    """16 samples: a row's 15 negatives stand at most sqrt(14) standard deviations above their mean
    (`clone_signals.max_standardized_score`); at that threshold the loss is clip to the bit, and it says which
    option makes it so; a posterior (gda) or a quota does not read the threshold."""
    x, y, index = make_batches(1, 16, 8, data_size=24, seed=1)[0]
    bound = math.sqrt(14)
    idle = create_loss("adaclw", weight=16.0, discovery=discovery, threshold=bound)
    for a, b in zip(
        value_and_grads(idle, x, y, index), value_and_grads(create_loss("clip", shared_matmul=True), x, y, index)
    ):
        assert torch.equal(a, b)
    assert float(idle.stats["i2t/clone_share"]) == float(idle.stats["t2i/clone_share"]) == 0
    assert idle.idle_options(16) == [
        f"threshold {bound:g} flags nothing at a global batch of 16: no score of a row's 15 negatives stands more "
        "than sqrt(14) = 3.74 standard deviations above their mean, so every negative counts once and the loss "
        "trains as clip; pass a threshold below 3.74 (the default is 1.5)"
    ]
    assert idle.idle_options(64) == []  # sqrt(62) is out of reach of no threshold below it
    assert create_loss("adaclw", discovery=discovery, threshold=bound - 0.01).idle_options(16) == []
    assert create_loss("adaclw", discovery=discovery, threshold=bound, quota=0.1).idle_options(16) == []
    assert create_loss("adaclw", discovery="gda", threshold=bound).idle_options(16) == []


def test_the_token_discovery_reads_the_token_ids_the_trainer_passes():
    from training.trainer.data import Batch, Skipped
    from training.trainer.engine.loop import loss_inputs

    x, y, index = make_batches(1, 8, 8, data_size=8, seed=5)[0]
    tokens = torch.tensor([[49406, 300 + i // 2, 49407, 0] for i in range(8)])  # captions in pairs
    loss_fn = create_loss("adaclw", weight=16.0, discovery="tokens", threshold=1.5)
    with pytest.raises(ValueError, match="reads the captions' token ids: pass text_tokens="):
        loss_fn(x, y, torch.tensor(LOGIT_SCALE), sample_index=index)
    batch = Batch(torch.zeros(8, 3, 2, 2), tokens, index, Skipped(torch.zeros(0), {}))
    loss_fn(x, y, torch.tensor(LOGIT_SCALE), **loss_inputs(loss_fn, [batch]))
    # each row's one partner caption stands out; 8 of the 56 negatives
    assert float(loss_fn.stats["i2t/clone_share"]) == pytest.approx(8 / 56)


@pytest.mark.parametrize("discovery", ["gda_both", "features", "persistence"])
def test_two_ranks_match_single_process_with_another_discovery(discovery):
    assert_ranks_match_single_process(
        "adaclw", {"weight": 16.0, "discovery": discovery}, make_batches(2, 8, 8, data_size=16, seed=3)
    )


def test_the_persistence_memory_moves_at_commit_only_and_needs_sample_ids():
    batches = make_batches(3, 8, 8, data_size=10, seed=4)  # 8 of 10 ids a step: pairs meet again
    loss_fn = create_loss("adaclw", weight=16.0, discovery="persistence", memory_momentum=0.5)
    x, y, index = batches[0]
    with pytest.raises(ValueError, match="keys its memory by sample ids"):
        loss_fn(x, y, torch.tensor(LOGIT_SCALE))
    loss_fn(x, y, torch.tensor(LOGIT_SCALE), sample_index=index)
    loss_fn(x, y, torch.tensor(LOGIT_SCALE), sample_index=index)  # a forward drops the update staged before it
    assert len(loss_fn.memory) == 0
    loss_fn.commit()
    assert len(loss_fn.memory) == 8 * 7
    loss_fn.eval()
    loss_fn(*batches[1][:2], torch.tensor(LOGIT_SCALE), sample_index=batches[1][2])
    loss_fn.commit()
    assert len(loss_fn.memory) == 8 * 7  # an evaluation pass reads the memory and leaves it
    loss_fn.reset_state()
    assert len(loss_fn.memory) == 0
    with pytest.raises(ValueError, match="memory_momentum must be in"):
        create_loss("adaclw", discovery="persistence", memory_momentum=1.5)


def test_the_persistence_memory_is_the_losss_state_and_resumes_from_it_exactly():
    """The memory is in the loss's state_dict, of whatever size it has grown to: a fresh loss loaded from it
    continues bit for bit (value, gradient, memory); one that starts empty continues otherwise."""
    batches = make_batches(3, 8, 8, data_size=10, seed=4)  # 8 of 10 ids a step: pairs meet again
    scale = torch.tensor(LOGIT_SCALE)

    def step(loss_fn, batch):
        x, y, index = (tensor.detach().clone().requires_grad_(tensor.is_floating_point()) for tensor in batch)
        value = loss_fn(x, y, scale, sample_index=index)
        value.backward()
        loss_fn.commit()
        return value.detach(), x.grad

    original = create_loss("adaclw", weight=16.0, discovery="persistence")
    assert create_loss("adaclw", weight=16.0).state_dict() == {}  # a discovery without memory keeps no state
    for batch in batches[:2]:
        step(original, batch)
    saved = original.state_dict()
    assert set(saved) == {"memory.keys", "memory.averages"} and saved["memory.keys"].numel() > 8 * 7
    resumed, fresh = (create_loss("adaclw", weight=16.0, discovery="persistence") for _ in range(2))
    resumed.load_state_dict(saved)
    expected, got, alone = (step(loss_fn, batches[2]) for loss_fn in (original, resumed, fresh))
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert all(torch.equal(resumed.state_dict()[key], original.state_dict()[key]) for key in saved)
    assert not torch.equal(alone[0], expected[0])  # the memory changed the loss


def _dense_quota_adaclw(weight, count, signal):
    """A quota written out: a negative counts `weight` times where it is among its row's `count` highest by
    `signal(x, y, direction)`, found by sorting each row's negatives."""

    def loss(x, y, scale, sample_index):
        total = 0
        for direction, logits in (("i2t", scale * x @ y.T), ("t2i", scale * y @ x.T)):
            n = logits.shape[0]
            scores = signal(x.detach(), y.detach(), direction)
            flagged = torch.zeros(n, n, dtype=torch.bool)
            for row in range(n):
                negatives = sorted((col for col in range(n) if col != row), key=lambda col: -float(scores[row, col]))
                flagged[row, negatives[:count]] = True
            multiplicity = torch.where(flagged, weight, 1.0).to(logits.dtype)
            total = total + ((multiplicity * logits.exp()).sum(dim=1).log() - logits.diagonal()).mean()
        return total / 2

    return loss


def test_a_quota_weights_each_rows_hardest_negatives_by_its_own_cross_modal_score():
    """The hard control at a fixed dose: `cross` with a quota of 0.2 flags the 3 hardest of each row's 15."""
    x, y, index = make_batches(1, 16, 8, data_size=24, seed=1)[0]
    x, y = x.double(), y.double()
    loss_fn = create_loss("adaclw", weight=16.0, discovery="cross", quota=0.2)
    hardest = _dense_quota_adaclw(16.0, 3, lambda x, y, direction: x @ y.T if direction == "i2t" else y @ x.T)
    for a, b in zip(value_and_grads(loss_fn, x, y, index), value_and_grads(hardest, x, y, index)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)  # as the score discoveries' test
    assert float(loss_fn.stats["i2t/clone_share"]) == pytest.approx(3 / 15)
    with pytest.raises(ValueError, match="quota must be in"):
        create_loss("adaclw", quota=1.0)


def test_the_random_control_flags_a_fresh_quota_each_step_and_counts_its_draws():
    x, y, index = make_batches(1, 16, 8, data_size=24, seed=1)[0]
    loss_fn = create_loss("adaclw", weight=16.0, discovery="random", quota=0.2)
    values = []
    for _ in range(2):
        values.append(loss_fn(x, y, torch.tensor(LOGIT_SCALE), sample_index=index))
        loss_fn.commit()
        assert float(loss_fn.stats["t2i/clone_share"]) == pytest.approx(3 / 15)
    assert values[0] != values[1] and int(loss_fn.state_dict()["draws"]) == 2
    loss_fn.eval()
    loss_fn(x, y, torch.tensor(LOGIT_SCALE), sample_index=index)
    loss_fn.commit()
    assert int(loss_fn.draws) == 2  # an evaluation pass draws no new step
    loss_fn.reset_state()
    assert int(loss_fn.draws) == 0


def test_with_families_the_stats_give_the_flags_precision_and_recall_and_the_sibling_share():
    """Families of 4 in a batch of 8: 3 of each row's 7 negatives are siblings. `cross` with a quota of 1/7 flags
    each row's hardest negative; the stats count those that are siblings, over the flags and over the siblings."""
    x, y, index = make_batches(1, 8, 8, data_size=8, seed=2)[0]
    family = torch.arange(8) // 4
    loss_fn = create_loss("adaclw", weight=16.0, discovery="cross", quota=1 / 7)
    loss_fn(x, y, torch.tensor(LOGIT_SCALE), sample_index=index, family=family)
    logits = x @ y.T
    hardest = logits.masked_fill(torch.eye(8, dtype=torch.bool), float("-inf")).argmax(1)
    siblings_found = int((family[hardest] == family).sum())
    stats = {name: float(value) for name, value in loss_fn.stats.items()}
    assert stats["i2t/sibling_share"] == pytest.approx(3 / 7)
    assert stats["i2t/flag_precision"] == pytest.approx(siblings_found / 8)
    assert stats["i2t/flag_recall"] == pytest.approx(siblings_found / 24)
    loss_fn(x, y, torch.tensor(LOGIT_SCALE), sample_index=index)
    assert "i2t/flag_precision" not in loss_fn.stats  # no families, no such stats
