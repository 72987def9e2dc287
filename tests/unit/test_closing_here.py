"""Leases a thread of this process is closing: seen by the others, awaited to their end."""

from __future__ import annotations

import threading
import time

from dpone.publication.store.holder_process import (
    closed_here_now,
    closing_here,
    wait_closures_begun_here,
    wait_closures_here,
)


def test_a_lease_is_closing_here_only_inside_the_block() -> None:
    assert not closed_here_now("L1")
    with closing_here(["L1", "L2"]):
        assert closed_here_now("L1") and closed_here_now("L2")
        with closing_here(["L1"]):  # two closers of one lease: marked until both end
            pass
        assert closed_here_now("L1")
    assert not closed_here_now("L1") and not closed_here_now("L2")


def test_a_waiter_wakes_when_the_closure_ends_not_at_its_timeout() -> None:
    assert wait_closures_here(5.0) is False  # none running: at once
    started = threading.Event()
    release = threading.Event()

    def closer() -> None:
        with closing_here(["L9"]):
            started.set()
            release.wait(5)

    thread = threading.Thread(target=closer)
    thread.start()
    started.wait(5)
    threading.Timer(0.05, release.set).start()
    began = time.monotonic()
    assert wait_closures_here(5.0) is True
    assert time.monotonic() - began < 2.0
    thread.join(5)
    assert not closed_here_now("L9")


def test_an_observation_waits_for_the_closures_begun_before_it_only() -> None:
    began = time.monotonic()
    wait_closures_begun_here(5.0)  # none running: at once
    assert time.monotonic() - began < 1.0
    first_in, second_in, release = threading.Event(), threading.Event(), threading.Event()

    def closer(lease: str, entered: threading.Event, hold: float) -> None:
        with closing_here([lease]):
            entered.set()
            release.wait(hold)

    first = threading.Thread(target=closer, args=("A", first_in, 0.1))
    first.start()
    first_in.wait(5)
    # Begun after the wait starts: not waited for (it holds for 5 s).
    late = threading.Timer(
        0.02, lambda: threading.Thread(target=closer, args=("B", second_in, 5.0)).start()
    )
    late.start()
    began = time.monotonic()
    wait_closures_begun_here(5.0)
    took = time.monotonic() - began
    assert 0.05 <= took < 2.0, took
    assert not closed_here_now("A")
    release.set()
    first.join(5)
