"""A running table's progress in ``refresh --jobs``, and how it is shown."""

from __future__ import annotations

import threading

import pytest

from dpone.cli.refresh import describe_progress
from dpone.errors import (
    Terminated,
    forget_passed_signals,
    pass_signal,
    stop_point,
    stopping_signals_held,
)
from dpone.project.jobs import TableProgress


def test_the_progress_says_the_phase_counts_and_seconds_in_the_phase() -> None:
    progress = TableProgress()
    assert progress.read() is None
    progress("export", 10_000, 2**20)
    first = progress.read()
    assert first is not None
    assert (first["phase"], first["rows"], first["bytes"]) == ("export", 10_000, 2**20)
    progress("export", 20_000, 2**21)
    again = progress.read()
    assert again is not None and again["rows"] == 20_000 and again["seconds"] >= first["seconds"]
    progress("stage", 0, 0)  # a new phase starts its own seconds
    staged = progress.read()
    assert staged is not None and staged["phase"] == "stage" and staged["seconds"] < 1.0


def test_a_report_of_progress_is_where_a_signalled_table_thread_stops() -> None:
    progress = TableProgress()
    raised: list[BaseException] = []
    passed = threading.Event()

    def table() -> None:
        passed.wait(10)
        try:
            progress("stage", 1, 1)
        except BaseException as exc:  # the signal passed on, raised here
            raised.append(exc)

    thread = threading.Thread(target=table)
    thread.start()
    pass_signal(thread, 15)
    passed.set()
    thread.join(10)
    forget_passed_signals(thread)
    assert len(raised) == 1 and isinstance(raised[0], Terminated)
    assert raised[0].signum == 15
    progress("stage", 2, 2)  # this thread was passed nothing: no stop here


def test_a_running_table_is_described_with_a_rate_only_after_half_a_second() -> None:
    assert describe_progress("t00", None) == "t00: starting"
    early = {"phase": "export", "rows": 5_000, "bytes": 1, "seconds": 0.01}
    assert describe_progress("t00", early) == "t00: export, 5,000 rows"
    later = {"phase": "stage", "rows": 300_000, "bytes": 1, "seconds": 2.0}
    assert describe_progress("t01", later) == "t01: stage, 300,000 rows, 150,000 rows/s"
    waiting = {"phase": "prepare", "rows": 0, "bytes": 0, "seconds": 3.0}
    assert describe_progress("t02", waiting) == "t02: prepare"


@pytest.mark.parametrize("times", [1, 2])
def test_a_signal_passed_n_times_is_raised_n_times_and_held_in_a_held_block(times: int) -> None:
    raised: list[str] = []
    go = threading.Event()

    def table() -> None:
        go.wait(10)
        for _ in range(times):
            try:
                with stopping_signals_held():
                    stop_point()  # held: nothing raised inside
                    raised.append("inside")
            except KeyboardInterrupt:  # raised as the held block ends
                raised.append("end of block")
        stop_point()  # every one passed was raised already

    thread = threading.Thread(target=table)
    thread.start()
    for _ in range(times):
        pass_signal(thread, 2)
    go.set()
    thread.join(10)
    forget_passed_signals(thread)
    assert raised == ["inside", "end of block"] * times


def test_a_signal_passed_to_an_ended_thread_never_reaches_a_new_one() -> None:
    ended = threading.Thread(target=lambda: None)
    ended.start()
    ended.join()
    pass_signal(ended, 2)  # as the run's Ctrl-C met a table that had just ended
    raised: list[BaseException] = []

    def new_thread() -> None:
        try:
            stop_point()
        except BaseException as exc:  # what was passed to the ended one, wrongly here
            raised.append(exc)

    # A new thread often gets the id of the one that ended: it is another thread.
    for _ in range(5):
        thread = threading.Thread(target=new_thread)
        thread.start()
        thread.join(5)
    forget_passed_signals(ended)
    assert raised == []
