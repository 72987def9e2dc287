"""``run_phases``: the phase a report names when a run ends between two phases.

Before: a signal (or an error) that came after one phase ended and before the next
began left ``"phase": null`` in the report (issue 35, item 5). Now the report names
the last phase begun, and the message says the signal came after it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dpone.errors import DponeError
from dpone.project.table_run import FIRST_PHASE, Phases, RunReport, run_phases


def _run(body: Callable[[Phases], None]) -> RunReport:
    def run(report: RunReport, phase: Phases) -> None:
        del report
        body(phase)

    return run_phases(RunReport("t", "db.t", "a-1"), run)


def _stage_then(stop: BaseException) -> Callable[[Phases], None]:
    def body(phase: Phases) -> None:
        with phase("check"):
            pass
        with phase("stage"):
            pass
        raise stop  # between stage and the next phase

    return body


def test_a_signal_between_two_phases_names_the_last_one_begun() -> None:
    report = _run(_stage_then(KeyboardInterrupt()))
    assert (report.phase, report.interrupted, report.outcome) == ("stage", "SIGINT", "interrupted")
    assert report.error is not None
    assert report.error["message"] == "stopped by SIGINT after stage"
    assert report.error["details"]["phase"] == "stage"


def test_a_signal_inside_a_phase_names_it() -> None:
    def body(phase: Phases) -> None:
        with phase("check"), phase("export"):
            raise KeyboardInterrupt

    report = _run(body)
    assert report.phase == "export"
    assert report.error is not None and report.error["message"] == "stopped by SIGINT during export"


def test_a_signal_before_any_phase_names_the_first() -> None:
    def body(phase: Phases) -> None:
        del phase
        raise KeyboardInterrupt

    report = _run(body)
    assert report.phase == FIRST_PHASE == "check"
    assert report.error is not None
    assert report.error["message"] == f"stopped by SIGINT before {FIRST_PHASE}"


def test_an_error_between_two_phases_names_the_last_one_begun() -> None:
    report = _run(_stage_then(DponeError("lost", code="some_failure")))
    assert (report.phase, report.outcome) == ("stage", "failed")
    assert report.error is not None and report.error["code"] == "some_failure"


def test_anything_else_is_not_swallowed() -> None:
    with pytest.raises(ValueError, match="a bug"):
        _run(_stage_then(ValueError("a bug")))
