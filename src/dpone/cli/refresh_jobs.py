"""``dpone refresh --jobs N``: N tables at once, each in its own ``dpone refresh`` process.

A process per table, not a thread: each run keeps what a single refresh has (its own
attempt, leases, signal handling and one JSON report), the two cores are both used
(the export renders in the process that reads), and a table that fails or crashes
cannot take another down. The children run in their own sessions, so a terminal's
Ctrl-C reaches them once, forwarded by this process, never twice (a second signal
would cut their ending short). A signal here stops starting tables, is forwarded to
every running one, and their reports (each saying what it left) are awaited.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from dpone.errors import interruption_signal
from dpone.project.config import TableConfig
from dpone.project.refresh import TableReport

POLL_SECONDS = 0.05


@dataclass
class _Child:
    table: TableConfig
    process: subprocess.Popen[bytes]
    stdout: IO[bytes]
    stderr: IO[bytes]


def run_jobs(
    config_path: Path,
    tables: list[TableConfig],
    jobs: int,
    *,
    options: list[str],
    fail_fast: bool,
    on_report: Callable[[dict[str, Any]], None],
    on_change: Callable[[list[str], int, int], None] | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """Refresh ``tables``, ``jobs`` at a time; one report per table, in the given order,
    and the signal that stopped the run (None when none did).

    ``on_report`` sees each report as its table ends; ``on_change(running, done,
    waiting)`` when the running set changes (a terminal's status line).
    """
    waiting = deque(tables)
    running: list[_Child] = []
    reports: dict[str, dict[str, Any]] = {}
    stopped: signal.Signals | None = None
    while waiting or running:
        try:
            while waiting and len(running) < jobs and stopped is None:
                with _signals_held():  # a started child is always in `running`
                    running.append(_start(config_path, waiting.popleft(), options))
                _changed(on_change, running, reports, waiting)
            for child in [c for c in running if c.process.poll() is not None]:
                with _signals_held():  # an ended child's report is never lost
                    running.remove(child)
                    report = _report_of(child)
                    reports[child.table.name] = report
                on_report(report)
                if report.get("interrupted") and stopped is None:
                    stopped = signal.Signals[str(report["interrupted"])]
                if fail_fast and not report.get("ok") and stopped is None:
                    waiting.clear()
                _changed(on_change, running, reports, waiting)
            time.sleep(POLL_SECONDS)
        except BaseException as exc:
            signum = interruption_signal(exc)
            if signum is None:
                for child in running:  # a bug here: the children still end as theirs do
                    child.process.send_signal(signal.SIGTERM)
                raise
            stopped = signum
            waiting.clear()
            for child in running:
                if child.process.poll() is None:
                    child.process.send_signal(signum)
    done = [reports.get(t.name) or _skipped(config_path, t, stopped) for t in tables]
    return done, stopped.name if stopped is not None else None


_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold the stopping signals for a few statements; one that came meanwhile is then
    raised (by the CLI's handlers) at the end of the block."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _changed(
    on_change: Callable[[list[str], int, int], None] | None,
    running: list[_Child],
    reports: dict[str, dict[str, Any]],
    waiting: deque[TableConfig],
) -> None:
    if on_change is not None:
        on_change([c.table.name for c in running], len(reports), len(waiting))


def _start(config_path: Path, table: TableConfig, options: list[str]) -> _Child:
    """``options``: the run's own options, passed on to each table's process."""
    argv = [sys.executable, "-m", "dpone", "refresh", table.name, "--config", str(config_path)]
    argv += ["--json", *options]
    # Private files for what the child prints (a pipe could fill while others run);
    # closed by _report_of once the child ended.
    stdout = tempfile.TemporaryFile()  # noqa: SIM115
    stderr = tempfile.TemporaryFile()  # noqa: SIM115
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,  # a terminal's Ctrl-C is forwarded once, by the parent
    )
    return _Child(table, process, stdout, stderr)


def _report_of(child: _Child) -> dict[str, Any]:
    """The child's one report, or a failed one that says why there is none."""
    child.stdout.seek(0)
    out = child.stdout.read().decode("utf-8", "replace")
    child.stderr.seek(0)
    err = child.stderr.read().decode("utf-8", "replace")
    child.stdout.close()
    child.stderr.close()
    try:
        document = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        document = None
    if isinstance(document, dict):
        tables = document.get("tables")
        if isinstance(tables, list) and len(tables) == 1 and isinstance(tables[0], dict):
            return dict(tables[0])
        if isinstance(document.get("error"), dict):  # refused before any table ran
            return _failed(child.table, dict(document["error"]))
    code = child.process.returncode
    return _failed(
        child.table,
        {
            "code": "job_failed",
            "message": f"the refresh process of {child.table.name} ended with exit code "
            f"{code} and no report",
            # The last line only: what a crash printed before dpone's own error boundary
            # ran is never passed on whole.
            "details": {"exit_code": code, "stderr_last_line": _last_line(err)},
        },
    )


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][-300:] if lines else ""


def _blank(table: TableConfig, outcome: str) -> dict[str, Any]:
    report = TableReport(table.name, table.qualified_target, "")
    report.outcome = outcome
    return report.to_dict()


def _failed(table: TableConfig, error: dict[str, Any]) -> dict[str, Any]:
    return {**_blank(table, "failed"), "error": error}


def _skipped(
    config_path: Path, table: TableConfig, stopped: signal.Signals | None
) -> dict[str, Any]:
    report = _blank(table, "skipped")
    if stopped is not None:  # not started because of the signal: it runs next time
        report["next_commands"] = [
            shlex.join(["dpone", "refresh", table.name, "--config", str(config_path)])
        ]
    return report
