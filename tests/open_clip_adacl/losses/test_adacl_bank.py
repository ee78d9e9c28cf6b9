"""AdaCL's momentum memory bank (docs/method.md §6, docs/adacl.md §7): the momentum update and the choice of
the most recent entries outside the batch on a hand-made sequence, its options, and an exact resume from its
state_dict. Its entries as extra columns of the selection and the denominator, against a dense re-computation:
test_adacl_readings.py; on gloo ranks: tests/open_clip_adacl/test_adacl_distributed.py; under --accum-freq in a
training run: tests/training/trainer/engine/test_accumulation.py."""

import pytest
import torch
import torch.nn.functional as F

from helpers.loss_equivalence import assert_resume_is_exact, make_batches
from open_clip_adacl import create_loss

SCALE = 14.3
MOMENTUM = 0.5  # a move visible in every entry (the default is the paper's 0.99)


def _step(loss_fn, x, y, index):
    loss_fn(x, y, torch.tensor(SCALE), sample_index=index)
    loss_fn.commit()


def _moved(entry, features):
    """One momentum update of an entry, in float64: normalize(m v + (1 - m) f)."""
    return F.normalize(MOMENTUM * entry.double() + (1 - MOMENTUM) * features.double(), dim=-1)


def test_entries_move_with_momentum_and_the_most_recent_outside_the_batch_are_chosen():
    """3 steps of 4 samples on a bank of 8 samples, 3 entries per step. Step 2 draws sample 4 twice (its last
    occurrence is written); step 3 chooses 3, 2, 1, the most recent entries of samples outside {0, 4, 5, 6}."""
    loss_fn = create_loss("adacl", bank_size=3, bank_momentum=MOMENTUM, data_size=8)
    g = torch.Generator().manual_seed(0)
    steps = [
        (
            F.normalize(torch.randn(4, 3, generator=g), dim=-1),
            F.normalize(torch.randn(4, 3, generator=g), dim=-1),
            torch.tensor(index),
        )
        for index in ([0, 1, 2, 3], [2, 3, 4, 4], [5, 4, 0, 6])
    ]
    (x1, y1, i1), (x2, y2, i2), (x3, y3, i3) = steps

    assert loss_fn.bank_selection(i1).tolist() == []  # nothing written yet
    _step(loss_fn, x1, y1, i1)
    for sample in range(4):  # a first write stores the features
        torch.testing.assert_close(loss_fn.bank_image[sample].double(), x1[sample].double())
    assert loss_fn.bank_selection(i2).tolist() == [1, 0]  # only two entries lie outside the batch
    _step(loss_fn, x2, y2, i2)
    assert loss_fn.bank_selection(i3).tolist() == [3, 2, 1]
    _step(loss_fn, x3, y3, i3)

    expected_image = {
        0: _moved(x1[0], x3[2]),
        1: x1[1],
        2: _moved(x1[2], x2[0]),
        3: _moved(x1[3], x2[1]),
        4: _moved(x2[3], x3[1]),
        5: x3[0],
        6: x3[3],
    }
    expected_text = {
        0: _moved(y1[0], y3[2]),
        1: y1[1],
        2: _moved(y1[2], y2[0]),
        3: _moved(y1[3], y2[1]),
        4: _moved(y2[3], y3[1]),
        5: y3[0],
        6: y3[3],
    }
    for sample in range(7):
        torch.testing.assert_close(loss_fn.bank_image[sample].double(), expected_image[sample].double())
        torch.testing.assert_close(loss_fn.bank_text[sample].double(), expected_text[sample].double())
    assert not loss_fn.bank_image[7].any()  # never seen
    # Written in batch order, steps of 4: sample 4's last occurrence at step 2 was its position 3.
    assert loss_fn.bank_stamp.tolist() == [11, 2, 5, 6, 10, 9, 12, 0]
    assert loss_fn.bank_selection(torch.tensor([6, 0, 7, 1])).tolist() == [4, 5, 3]


def test_state_moves_once_per_committed_step_and_never_in_evaluation():
    loss_fn = create_loss("adacl", bank_size=4, data_size=16)
    x, y, index = make_batches(1, 8, 8, data_size=16)[0]
    for _ in range(3):  # three forwards of one step (as under --accum-freq 3), one commit
        loss_fn(x, y, torch.tensor(SCALE), sample_index=index)
    loss_fn.commit()
    assert sorted(loss_fn.bank_stamp[index].tolist()) == list(range(1, 9))  # one write: stamps 1..8, not 17..24
    loss_fn.eval()
    _step(loss_fn, y, x, index)
    assert sorted(loss_fn.bank_stamp[index].tolist()) == list(range(1, 9))


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(bank_size=8), r"data_size \(--data-size\) must be the number of training samples"),
        (dict(bank_size=8, data_size=16, queue_size=8), "queue_size and bank_size are two kinds of extra negatives"),
        (dict(bank_size=-1, data_size=16), "bank_size must be >= 0"),
        (dict(bank_size=8, data_size=16, bank_momentum=1.0), r"bank_momentum must be in \[0, 1\)"),
    ],
)
def test_invalid_bank_options_are_refused_in_one_line(options, message):
    with pytest.raises(ValueError, match=message):
        create_loss("adacl", **options)


def test_the_bank_needs_sample_indices_and_is_off_by_default():
    assert create_loss("adacl").options.bank_size == 0 and create_loss("adacl").bank_stamp.numel() == 0
    assert create_loss("adacl").options.bank_momentum == 0.99
    x, y, _ = make_batches(1, 8, 8, data_size=8)[0]
    with pytest.raises(ValueError, match="memory bank .* needs each sample's index"):
        create_loss("adacl", bank_size=4, data_size=8)(x, y, torch.tensor(SCALE))


def test_resume_from_the_state_dict_is_exact_and_a_bank_of_another_size_is_refused():
    options = dict(bank_size=20, data_size=40, candidate_region="gda")
    resumed = assert_resume_is_exact("adacl", options, make_batches(4, 16, 8, data_size=40, seed=6))
    assert resumed.bank_image.shape == (40, 8) and (resumed.bank_stamp > 0).sum() > 20
    for changed, message in (
        (dict(data_size=48), "memory bank holds 40 entries but this loss's holds 48"),
        (dict(bank_size=0), "memory bank holds 40 entries but this loss's holds 0"),
    ):
        with pytest.raises(ValueError, match=message):
            create_loss("adacl", **{**options, **changed}).load_state_dict(resumed.state_dict())
    resumed.reset_state()
    assert not resumed.bank_stamp.any() and resumed.bank_selection(torch.arange(4)).numel() == 0
