"""``dpone refresh --jobs N``: N tables at once, in threads of this one process (the scheduler).

Each table runs in a thread of its own, with its own report, journal, leases, intent,
claim, EXCHANGE and reconcile, so start-up, the store, the pool's credentials and the
run's first look at the catalog are paid once for the run, and tables that ask the
server the same question at once share one read (``publication/sharing/``). A signal
stops handing out tables and is passed once to every running table
(:func:`dpone.errors.pass_signal`): each stops at its next request or report of
progress, runs its own ending and reports; a second signal is passed again and cuts
those endings short. See docs/cli.md (``dpone refresh``).
"""

from __future__ import annotations

import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dpone.errors import (
    forget_passed_signals,
    interruption_signal,
    pass_signal,
    stop_point,
    stopping_signals_held,
)
from dpone.project.config import TableConfig
from dpone.project.refresh import TableReport
from dpone.publication.sharing.run_sharing import RunSharing

POLL_SECONDS = 0.05
# The phases whose steps ask the shared reads (observations, closures).
_ASKING = ("prepare", "publish")
# A running table's name and its progress (None before its first report of one).
Running = tuple[str, dict[str, Any] | None]


class TableProgress:
    """One running table's phase, rows, bytes and the seconds since the phase began.

    A display only, never evidence; each report of progress is also a point where the
    table's thread stops when its run was signalled (:func:`dpone.errors.stop_point`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phase: str | None = None
        self._started = 0.0
        self._counts = (0, 0)

    def __call__(self, phase: str, rows: int, size: int) -> None:
        now = time.monotonic()
        with self._lock:
            if phase != self._phase:
                self._phase, self._started = phase, now
            self._counts = (rows, size)
        stop_point()

    def read(self) -> dict[str, Any] | None:
        """Phase, rows, bytes and seconds in the phase (None before the first report)."""
        with self._lock:
            if self._phase is None:
                return None
            rows, size = self._counts
            seconds = time.monotonic() - self._started
            return {"phase": self._phase, "rows": rows, "bytes": size, "seconds": seconds}

    def finish(self) -> None:
        """Nothing to close: the scheduler drops it with its table."""


# Refreshes one table, reporting its progress to the TableProgress given.
RefreshOne = Callable[[TableConfig, TableProgress], TableReport]


@dataclass
class _Table:
    """A table handed out: its thread, its progress and, once it ended, its report."""

    table: TableConfig
    progress: TableProgress = field(default_factory=TableProgress)
    thread: threading.Thread | None = None
    report: dict[str, Any] | None = None


def run_jobs(
    tables: list[TableConfig],
    jobs: int,
    refresh: RefreshOne,
    *,
    fail_fast: bool,
    on_report: Callable[[dict[str, Any]], None],
    on_change: Callable[[list[Running], int, int], None] | None = None,
    again: Callable[[TableConfig], str],
    sharing: RunSharing | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """Refresh ``tables``, ``jobs`` at a time; one report per table, in the given order,
    and the signal that stopped the run (None when none did).

    ``on_report`` sees each report as its table ends; ``on_change(running, done,
    waiting)`` is called as they run, ``running`` naming each running table with its
    progress. ``again`` is the command that refreshes a table a signal left unstarted.
    ``sharing`` (the run's shared reads) expects as many askers as tables running.
    """
    run = _Run(refresh, on_report)
    if sharing is not None:
        sharing.expect(run.asking)
    stopped = run.drive(deque(tables), jobs, fail_fast, on_change)
    done = [run.reports.get(t.name) or _skipped(t, stopped, again) for t in tables]
    return done, stopped.name if stopped is not None else None


class _Run:
    """The running tables of one ``--jobs`` run and the reports they gave."""

    def __init__(self, refresh: RefreshOne, on_report: Callable[[dict[str, Any]], None]) -> None:
        self.refresh, self.on_report = refresh, on_report
        self.running: list[_Table] = []
        self.reports: dict[str, dict[str, Any]] = {}
        self.stopped: signal.Signals | None = None
        self.closed = False  # no table will be handed out any more

    def drive(
        self,
        waiting: deque[TableConfig],
        jobs: int,
        fail_fast: bool,
        on_change: Callable[[list[Running], int, int], None] | None,
    ) -> signal.Signals | None:
        """Hand out ``waiting`` until every table is reported (or the run stops)."""
        while waiting or self.running:
            try:
                self._hand_out(waiting, jobs)
                with stopping_signals_held():  # a report taken is never lost
                    self._collect(fail_fast, waiting)
                if on_change is not None:
                    on_change(
                        [(t.table.name, t.progress.read()) for t in self.running],
                        len(self.reports),
                        len(waiting),
                    )
                time.sleep(POLL_SECONDS)
            except BaseException as exc:
                signum = interruption_signal(exc)
                if signum is None:  # a bug here: the tables end as a SIGTERM ends them
                    self._pass(signal.SIGTERM)
                    for running in self.running:
                        assert running.thread is not None
                        running.thread.join()
                    raise
                self.stopped = self.stopped or signum
                self._close(waiting)
                self._pass(signum)
        return self.stopped

    def asking(self) -> int:
        """How many running tables may ask the shared reads now: those preparing or
        publishing (at least one, the one asking)."""
        phases = [t.progress.read() for t in list(self.running)]
        return max(1, sum(1 for p in phases if p and p.get("phase") in _ASKING))

    def _hand_out(self, waiting: deque[TableConfig], jobs: int) -> None:
        while waiting and not self.closed and len(self.running) < jobs:
            with stopping_signals_held():  # a table handed out always has its thread listed
                running = _Table(waiting.popleft())
                running.thread = threading.Thread(
                    target=self._one, args=(running,), name=f"dpone-{running.table.name}"
                )
                self.running.append(running)
                running.thread.start()

    def _one(self, running: _Table) -> None:
        """One table's thread: its report, whatever ended it."""
        table = running.table
        try:
            report = self.refresh(table, running.progress).to_dict()
        except BaseException as exc:  # a bug, or a signal after the report's last stop
            signum = interruption_signal(exc)
            report = _failed(
                table,
                {
                    "code": "interrupted" if signum else "internal_error",
                    "message": f"the refresh of {table.name} ended by "
                    f"{signum.name if signum else type(exc).__name__} without its report",
                    "details": {},
                },
            )
        finally:
            assert running.thread is not None
            forget_passed_signals(running.thread)
        running.report = report

    def _collect(self, fail_fast: bool, waiting: deque[TableConfig]) -> None:
        """Take the reports of the tables whose threads ended."""
        for running in list(self.running):
            assert running.thread is not None
            if running.thread.is_alive():
                continue
            running.thread.join()
            forget_passed_signals(running.thread)  # one passed as it ended
            self.running.remove(running)
            report = running.report or _failed(
                running.table,
                {"code": "internal_error", "message": "no report was made", "details": {}},
            )
            self.reports[running.table.name] = report
            self.on_report(report)
            if report.get("interrupted") and self.stopped is None:
                self.stopped = signal.Signals[str(report["interrupted"])]
                self._close(waiting)
            if fail_fast and not report.get("ok"):
                self._close(waiting)

    def _close(self, waiting: deque[TableConfig]) -> None:
        """Hand out no more tables (those not started are reported skipped)."""
        waiting.clear()
        self.closed = True

    def _pass(self, signum: signal.Signals) -> None:
        """Pass the signal once to every running table."""
        for running in self.running:
            if running.thread is not None:
                pass_signal(running.thread, signum)


def _blank(table: TableConfig, outcome: str) -> dict[str, Any]:
    report = TableReport(table.name, table.qualified_target, "")
    report.outcome = outcome
    return report.to_dict()


def _failed(table: TableConfig, error: dict[str, Any]) -> dict[str, Any]:
    return {**_blank(table, "failed"), "error": error}


def _skipped(
    table: TableConfig, stopped: signal.Signals | None, again: Callable[[TableConfig], str]
) -> dict[str, Any]:
    report = _blank(table, "skipped")
    if stopped is not None:  # not started because of the signal: it runs next time
        report["next_commands"] = [again(table)]
    return report
