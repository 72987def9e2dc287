"""GroupCommit: calls made at once share a batch begun after each was made."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence

import pytest

from dpone.errors import ConfigurationError, Terminated, forget_passed_signals, pass_signal
from dpone.publication.sharing.group_commit import GroupCommit


class _Recorder:
    """A batch that records each call's keys and when it began, answering key * 10."""

    def __init__(self, hold: float = 0.0) -> None:
        self.hold = hold
        self.batches: list[tuple[float, list[int]]] = []
        self.running = 0
        self.overlapped = False
        self.lock = threading.Lock()

    def __call__(self, keys: Sequence[int]) -> Mapping[int, int]:
        began = time.monotonic()
        with self.lock:
            self.batches.append((began, list(keys)))
            self.running += 1
            self.overlapped |= self.running > 1
        time.sleep(self.hold)
        with self.lock:
            self.running -= 1
        return {k: k * 10 for k in keys}


def _run_at_once(group: GroupCommit[int, int], keys: Sequence[int]) -> dict[int, object]:
    """Call ``group`` from one thread per key, all released together; answers by key."""
    answers: dict[int, object] = {}
    called: dict[int, float] = {}
    start = threading.Barrier(len(keys))

    def one(key: int) -> None:
        start.wait()
        called[key] = time.monotonic()
        try:
            answers[key] = group(key)
        except Exception as exc:  # the test compares what each raised
            answers[key] = exc

    threads = [threading.Thread(target=one, args=(k,)) for k in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    answers["called"] = called  # type: ignore[index]
    return answers


def test_one_caller_is_answered_by_a_batch_of_its_own_key() -> None:
    batch = _Recorder()
    group: GroupCommit[int, int] = GroupCommit(batch)
    assert group(3) == 30
    assert [keys for _, keys in batch.batches] == [[3]]
    assert group.batches == [1]


def test_callers_gathered_together_share_one_batch() -> None:
    batch = _Recorder()
    group: GroupCommit[int, int] = GroupCommit(batch, expected=lambda: 4, gather_seconds=5.0)
    answers = _run_at_once(group, [1, 2, 3, 4])
    assert {k: answers[k] for k in (1, 2, 3, 4)} == {1: 10, 2: 20, 3: 30, 4: 40}
    assert [sorted(keys) for _, keys in batch.batches] == [[1, 2, 3, 4]]


def test_no_caller_is_answered_by_a_batch_begun_before_its_call() -> None:
    batch = _Recorder(hold=0.02)
    group: GroupCommit[int, int] = GroupCommit(batch, expected=lambda: 6, gather_seconds=0.05)
    answers = _run_at_once(group, list(range(12)))
    called: dict[int, float] = answers["called"]  # type: ignore[index, assignment]
    assert {k: answers[k] for k in range(12)} == {k: k * 10 for k in range(12)}
    # Every key was in exactly one batch, and that batch began after the key's call.
    seen = [k for _, keys in batch.batches for k in keys]
    assert sorted(seen) == list(range(12))
    for began, keys in batch.batches:
        assert all(called[k] <= began for k in keys)
    assert sum(group.batches) == 12 and len(group.batches) < 12  # some were shared


def test_a_failed_batch_fails_each_of_its_callers_and_not_the_next() -> None:
    calls: list[list[int]] = []

    def batch(keys: Sequence[int]) -> Mapping[int, int]:
        calls.append(list(keys))
        if len(calls) == 1:
            raise RuntimeError("the server did not answer")
        return {k: k for k in keys}

    expected = [2]
    group: GroupCommit[int, int] = GroupCommit(
        batch, expected=lambda: expected[0], gather_seconds=5.0
    )
    answers = _run_at_once(group, [1, 2])
    assert all(isinstance(answers[k], RuntimeError) for k in (1, 2))
    expected[0] = 1  # one caller left in the run: its batch starts at once
    assert group(5) == 5
    assert calls == [[1, 2], [5]] or calls == [[2, 1], [5]]


def test_a_key_the_batch_did_not_answer_is_an_error_for_its_caller_alone() -> None:
    group: GroupCommit[int, int] = GroupCommit(
        lambda keys: {k: k for k in keys if k != 2}, expected=lambda: 2, gather_seconds=5.0
    )
    answers = _run_at_once(group, [1, 2])
    assert answers[1] == 1
    assert isinstance(answers[2], KeyError)


def test_a_repeated_key_waits_for_a_later_batch() -> None:
    batch = _Recorder(hold=0.01)
    group: GroupCommit[int, int] = GroupCommit(batch, expected=lambda: 3, gather_seconds=0.5)
    answers = _run_at_once(group, [7, 7, 8])  # two callers of key 7
    assert answers[7] == 70 and answers[8] == 80
    assert all(len(set(keys)) == len(keys) for _, keys in batch.batches)
    assert sorted(k for _, keys in batch.batches for k in keys) == [7, 7, 8]


def test_the_gather_ends_at_its_deadline_when_fewer_callers_come() -> None:
    batch = _Recorder()
    group: GroupCommit[int, int] = GroupCommit(batch, expected=lambda: 5, gather_seconds=0.05)
    started = time.monotonic()
    assert group(1) == 10
    assert 0.04 <= time.monotonic() - started < 2.0
    assert group.batches == [1]


@pytest.mark.parametrize("hold", [0.0, 0.005])
def test_many_rounds_of_callers_all_get_their_own_answers(hold: float) -> None:
    group: GroupCommit[int, int] = GroupCommit(_Recorder(hold=hold))
    for _ in range(5):
        answers = _run_at_once(group, list(range(6)))
        assert {k: answers[k] for k in range(6)} == {k: k * 10 for k in range(6)}


def test_a_leader_stopped_by_a_signal_raises_it_alone_and_the_others_get_a_later_batch() -> None:
    calls: list[list[int]] = []
    stop_leader = threading.Event()

    def batch(keys: Sequence[int]) -> Mapping[int, int]:
        calls.append(list(keys))
        if not stop_leader.is_set():
            stop_leader.set()
            raise KeyboardInterrupt  # the signal passed to the leader's own thread
        return {k: k * 10 for k in keys}

    group: GroupCommit[int, int] = GroupCommit(batch, expected=lambda: 3, gather_seconds=0.3)
    answers: dict[int, object] = {}
    start = threading.Barrier(3)

    def one(key: int) -> None:
        start.wait()
        try:
            answers[key] = group(key)
        except KeyboardInterrupt as exc:
            answers[key] = exc

    threads = [threading.Thread(target=one, args=(k,)) for k in (1, 2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    stopped = [k for k, v in answers.items() if isinstance(v, KeyboardInterrupt)]
    assert len(stopped) == 1  # the leader alone
    assert {k: v for k, v in answers.items() if k not in stopped} == {
        k: k * 10 for k in (1, 2, 3) if k not in stopped
    }
    assert len(calls) == 2 and sorted(calls[1]) == sorted(k for k in (1, 2, 3) if k not in stopped)


def test_a_call_made_while_a_batch_runs_does_not_wait_for_it_to_end() -> None:
    batch = _Recorder(hold=0.3)
    group: GroupCommit[int, int] = GroupCommit(batch)
    first = threading.Thread(target=group, args=(1,))
    first.start()
    time.sleep(0.05)  # the first batch runs now
    began = time.monotonic()
    assert group(2) == 20
    assert time.monotonic() - began < 0.55  # its own batch, begun before the first ended
    first.join(5)
    assert batch.overlapped
    assert [keys for _, keys in batch.batches] == [[1], [2]]


def test_a_batch_runs_the_function_its_leader_brought() -> None:
    ran: list[str] = []

    def of(name: str) -> Callable[[Sequence[int]], Mapping[int, int]]:
        def batch(keys: Sequence[int]) -> Mapping[int, int]:
            ran.append(name)
            return {k: k for k in keys}

        return batch

    group: GroupCommit[int, int] = GroupCommit(of("group's"))
    assert group(1, of("first caller's")) == 1
    assert group(2) == 2
    assert ran == ["first caller's", "group's"]


def test_each_caller_of_a_failed_batch_raises_its_own_copy() -> None:
    def batch(keys: Sequence[int]) -> Mapping[int, int]:
        try:
            raise OSError("the socket closed")
        except OSError as cause:
            raise ConfigurationError("no answer", code="catalog_unobservable", at=1) from cause

    group: GroupCommit[int, int] = GroupCommit(batch, expected=lambda: 3, gather_seconds=5.0)
    answers = _run_at_once(group, [1, 2, 3])
    errors = [answers[k] for k in (1, 2, 3)]
    assert all(isinstance(e, ConfigurationError) for e in errors)
    assert len({id(e) for e in errors}) == 3  # one object a caller
    for error in errors:
        assert isinstance(error, ConfigurationError)
        assert (error.code, dict(error.details), error.message) == (
            "catalog_unobservable",
            {"at": 1},
            "no answer",
        )
        assert isinstance(error.__cause__, OSError)


def test_a_caller_waiting_for_a_batch_stops_at_a_signal_and_the_group_goes_on() -> None:
    release = threading.Event()

    def slow(keys: Sequence[int]) -> Mapping[int, int]:
        release.wait(5)
        return {k: k for k in keys}

    expected = [2]  # the first caller waits for the second: both in one slow batch
    group: GroupCommit[int, int] = GroupCommit(
        slow, expected=lambda: expected[0], gather_seconds=5.0
    )
    first = threading.Thread(target=group, args=(1,))
    first.start()
    time.sleep(0.05)  # it gathers
    raised: list[BaseException] = []

    def waiting() -> None:
        try:
            group(2)
        except BaseException as exc:  # the signal passed to this thread
            raised.append(exc)

    second = threading.Thread(target=waiting)
    second.start()
    time.sleep(0.05)
    pass_signal(second, 15)
    second.join(2)
    forget_passed_signals(second)
    assert not second.is_alive() and len(raised) == 1 and isinstance(raised[0], Terminated)
    release.set()
    first.join(5)
    expected[0] = 1
    assert group(3) == 3  # the abandoned call left nothing behind
    assert group.batches == [2, 1]
