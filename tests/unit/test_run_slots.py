"""A run's turns at the pool's principals: at most as many tables hold one as slots."""

from __future__ import annotations

import threading
import time

import pytest

from dpone.errors import Terminated, forget_passed_signals, pass_signal
from dpone.project.run_slots import PrincipalSlots


def test_no_more_tables_than_slots_hold_a_role_at_once() -> None:
    slots = PrincipalSlots(2)
    holding, most = [0], [0]
    lock = threading.Lock()

    def table() -> None:
        turn = slots.slot("ingest")
        turn.take()
        with lock:
            holding[0] += 1
            most[0] = max(most[0], holding[0])
        time.sleep(0.02)
        with lock:
            holding[0] -= 1
        turn.give_back()
        turn.give_back()  # twice: given back once

    threads = [threading.Thread(target=table) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert most[0] == 2
    # Every slot was given back: two more turns are taken at once.
    first, second = slots.slot("ingest"), slots.slot("ingest")
    first.take()
    second.take()


def test_roles_have_their_own_slots_and_no_run_means_no_wait() -> None:
    slots = PrincipalSlots(1)
    ingest = slots.slot("ingest")
    ingest.take()
    slots.slot("publisher").take()  # another role's slot is free
    free = PrincipalSlots(None)
    for _ in range(3):
        free.slot("ingest").take()  # nothing to wait for


def test_a_table_waiting_for_its_turn_stops_when_its_run_is_signalled() -> None:
    slots = PrincipalSlots(1)
    slots.slot("ingest").take()  # held by another table
    raised: list[BaseException] = []

    def table() -> None:
        try:
            slots.slot("ingest").take()
        except BaseException as exc:  # the signal passed on, raised while waiting
            raised.append(exc)

    thread = threading.Thread(target=table)
    thread.start()
    time.sleep(0.05)
    pass_signal(thread, 15)
    thread.join(5)
    forget_passed_signals(thread)
    assert not thread.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], Terminated)


@pytest.mark.parametrize("role", ["ingest", "publisher"])
def test_a_slot_given_back_lets_the_waiting_table_take_it(role: str) -> None:
    slots = PrincipalSlots(1)
    held = slots.slot(role)
    held.take()
    took = threading.Event()

    def table() -> None:
        slots.slot(role).take()
        took.set()

    thread = threading.Thread(target=table)
    thread.start()
    assert not took.wait(0.15)
    held.give_back()
    assert took.wait(5)
    thread.join(5)
