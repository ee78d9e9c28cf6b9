"""SampleStateBank: per-sample state by global sample index."""

import io

import pytest
import torch

from open_clip_adacl.state import SampleStateBank


def _bank(data_size=10):
    return SampleStateBank(data_size, ("lambda", "m", "count"), initial={"lambda": 1.0})


def test_starts_at_initial_values_and_updates_only_given_rows_and_fields():
    bank = _bank()
    assert torch.equal(bank.field("lambda"), torch.ones(10))
    assert torch.equal(bank.field("m"), torch.zeros(10))
    bank.update(torch.tensor([7, 2]), {"lambda": torch.tensor([0.5, -0.25]), "count": torch.tensor([1.0, 3.0])})
    got = bank.gather(torch.tensor([2, 7, 0, 2]))
    assert torch.equal(got["lambda"], torch.tensor([-0.25, 0.5, 1.0, -0.25]))
    assert torch.equal(got["count"], torch.tensor([3.0, 1.0, 0.0, 3.0]))
    assert torch.equal(got["m"], torch.zeros(4))
    assert torch.equal(bank.field("lambda")[[0, 1, 3, 4, 5, 6, 8, 9]], torch.ones(8))


def test_duplicate_indices_last_write_wins():
    bank = _bank()
    index = torch.tensor([3, 5, 3, 9, 3, 5])
    bank.update(index, {"m": torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])})
    assert bank.field("m")[3] == 5.0 and bank.field("m")[5] == 6.0 and bank.field("m")[9] == 4.0
    assert bank.field("m").sum() == 15.0


def test_reset_restores_initial_values():
    bank = _bank()
    bank.update(torch.arange(10), {"lambda": torch.zeros(10), "count": torch.ones(10)})
    bank.reset()
    assert torch.equal(bank.field("lambda"), torch.ones(10))
    assert torch.equal(bank.field("count"), torch.zeros(10))


@pytest.mark.parametrize("bad", [10, 11, -1])
def test_out_of_range_index_is_a_clear_error(bad):
    bank = _bank()
    index = torch.tensor([0, bad, 4])
    for call in (lambda: bank.gather(index), lambda: bank.update(index, {"m": torch.zeros(3)})):
        with pytest.raises(ValueError, match=rf"sample index {bad} .*data_size=10.*--data-size"):
            call()
    assert torch.equal(bank.field("m"), torch.zeros(10))


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="integers"):
        _bank().gather(torch.tensor([0.0]))
    with pytest.raises(ValueError, match="unknown fields"):
        _bank().update(torch.tensor([0]), {"nope": torch.zeros(1)})
    with pytest.raises(ValueError, match="unknown fields"):
        SampleStateBank(4, ("a",), initial={"b": 1.0})
    with pytest.raises(ValueError, match="positive"):
        SampleStateBank(0, ("a",))


def test_state_dict_round_trip_is_exact():
    bank = _bank()
    bank.update(torch.tensor([1, 4]), {"lambda": torch.tensor([0.123456789, -0.987654321])})
    buffer = io.BytesIO()
    torch.save(bank.state_dict(), buffer)
    buffer.seek(0)
    restored = _bank()
    restored.load_state_dict(torch.load(buffer))
    assert list(bank.state_dict()) == ["state"]
    assert torch.equal(restored.state, bank.state)
