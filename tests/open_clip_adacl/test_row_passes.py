"""row_passes' threads: independent calls side by side, each on one torch thread, and passes over rows split
between threads; torch's thread count as it was afterwards."""

import threading

import pytest
import torch

from open_clip_adacl import row_passes

CPU = torch.device("cpu")


@pytest.fixture
def torch_threads():
    """Sets torch's intra-op threads for a test; restores them after it."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def _where_and_how() -> tuple:
    return threading.current_thread(), torch.get_num_threads()


def test_calls_run_side_by_side_each_on_one_torch_thread(torch_threads):
    torch_threads(2)
    assert row_passes.can_run_side_by_side(CPU, 2)
    for _ in range(3):  # the helper threads are kept from call to call
        together = threading.Barrier(2, timeout=10)  # broken unless both calls run at once

        def meet():
            together.wait()
            return _where_and_how()

        (first, first_threads), (second, second_threads) = row_passes.side_by_side(CPU, [meet] * 2)
        assert first is threading.current_thread() and second is not first
        assert first_threads == second_threads == 1
        assert torch.get_num_threads() == 2


def test_with_fewer_torch_threads_than_calls_they_run_in_turn_as_they_are(torch_threads):
    torch_threads(2)
    assert not row_passes.can_run_side_by_side(CPU, 3)
    assert row_passes.side_by_side(CPU, [_where_and_how] * 3) == [(threading.current_thread(), 2)] * 3
    torch_threads(1)
    assert not row_passes.can_run_side_by_side(CPU, 2)
    assert row_passes.side_by_side(CPU, [_where_and_how] * 2) == [(threading.current_thread(), 1)] * 2


def test_an_error_in_a_helper_thread_reaches_the_caller_after_every_call_ended(torch_threads):
    torch_threads(2)
    ended = []

    def fails():
        raise ValueError("bad rows")

    def ends():
        ended.append(True)

    with pytest.raises(ValueError, match="bad rows"):
        row_passes.side_by_side(CPU, [ends, fails])
    assert ended == [True]
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("threads, num_rows", [(1, 10), (2, 10), (3, 10), (3, 2), (2, 0)])
def test_rows_split_between_threads_cover_every_row_once(torch_threads, threads, num_rows):
    torch_threads(threads)
    seen = []
    lock = threading.Lock()
    together = threading.Barrier(max(1, min(threads, num_rows)), timeout=10)  # every share at once

    def work(start, stop):
        together.wait()
        with lock:
            seen.append((start, stop, threading.current_thread(), torch.get_num_threads()))

    row_passes.rows_on_cpu_threads(num_rows, CPU, work)
    covered = sorted(row for start, stop, _, _ in seen for row in range(start, stop))
    assert covered == list(range(num_rows))
    shares = min(threads, num_rows)
    if shares > 1:
        assert len({thread for _, _, thread, _ in seen}) == shares
        assert {torch_count for _, _, _, torch_count in seen} == {1}
    else:
        assert [(start, stop) for start, stop, _, _ in seen] == [(0, num_rows)]
    assert torch.get_num_threads() == threads


def test_a_forked_child_runs_side_by_side_on_threads_of_its_own(torch_threads):
    # A child forked after the helper threads exist has none of them: it makes its own.
    import multiprocessing

    torch_threads(2)
    row_passes.side_by_side(CPU, [_where_and_how] * 2)
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        assert pool.apply_async(_side_by_side_in_child).get(timeout=60) == (2, True)


def _side_by_side_in_child() -> tuple:
    torch.set_num_threads(2)
    together = threading.Barrier(2, timeout=10)

    def meet():
        together.wait()
        return threading.current_thread()

    first, second = row_passes.side_by_side(CPU, [meet] * 2)
    return torch.get_num_threads(), first is not second


def test_more_calls_than_helper_threads_replace_them_and_the_old_ones_end(torch_threads, monkeypatch):
    monkeypatch.setattr(row_passes, "_helpers", None)  # as in a fresh process
    torch_threads(2)
    row_passes.side_by_side(CPU, [_where_and_how] * 2)
    fewer = row_passes._helpers[2]
    torch_threads(3)
    together = threading.Barrier(3, timeout=10)

    def meet():
        together.wait()
        return _where_and_how()

    assert len({thread for thread, _ in row_passes.side_by_side(CPU, [meet] * 3)}) == 3
    assert row_passes._helpers[2] is not fewer
    with pytest.raises(RuntimeError):  # shut down: its threads end once idle
        fewer.submit(_where_and_how)
