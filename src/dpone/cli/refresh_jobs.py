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

import contextlib
import json
import os
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

from dpone.cli.output import MIN_RATE_SECONDS
from dpone.errors import interruption_signal
from dpone.project.config import TableConfig
from dpone.project.refresh import TableReport

POLL_SECONDS = 0.05
# The file a table's process writes its phase and counts to, for the parent's line.
JOB_PROGRESS_ENV = "DPONE_JOB_PROGRESS"
_WRITE_SECONDS = 0.2


class JobProgress:
    """A table's progress as one small JSON file its parent reads (a child's ``progress``).

    Phase, rows, bytes and the seconds since the phase began, replaced atomically at
    most every 0.2 s (at once when the phase changes). A display only: never evidence.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._phase: str | None = None
        self._started = self._written = 0.0

    @classmethod
    def from_env(cls) -> JobProgress | None:
        """The progress file the parent named for this process, if it named one."""
        named = os.environ.get(JOB_PROGRESS_ENV)
        return cls(Path(named)) if named else None

    def __call__(self, phase: str, rows: int, size: int) -> None:
        now = time.monotonic()
        if phase != self._phase:
            self._phase, self._started, self._written = phase, now, 0.0
        elif now - self._written < _WRITE_SECONDS:
            return
        self._written = now
        document = {"phase": phase, "rows": rows, "bytes": size, "seconds": now - self._started}
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        with contextlib.suppress(OSError):  # a display: a failed write costs nothing else
            partial.write_text(json.dumps(document), encoding="utf-8")
            os.replace(partial, self.path)

    def finish(self) -> None:
        """Nothing to close: the file is the parent's to remove."""


def describe_progress(name: str, progress: dict[str, Any] | None) -> str:
    """``name: phase, rows, rate`` for one running table (the rate after half a second)."""
    if not progress:
        return f"{name}: starting"
    parts = [str(progress.get("phase"))]
    rows, seconds = int(progress.get("rows") or 0), float(progress.get("seconds") or 0)
    if rows > 0:
        parts.append(f"{rows:,} rows")
        if seconds >= MIN_RATE_SECONDS:
            parts.append(f"{rows / seconds:,.0f} rows/s")
    return f"{name}: {', '.join(parts)}"


def _read_progress(path: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


@dataclass
class _Child:
    table: TableConfig
    process: subprocess.Popen[bytes]
    stdout: IO[bytes]
    stderr: IO[bytes]
    progress: Path


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
    waiting)`` is called as they run, ``running`` describing each running table's
    phase, rows and rate (a terminal's status line).
    """
    with tempfile.TemporaryDirectory(prefix="dpone-jobs-") as progress_dir:  # 0700
        return _run(
            config_path,
            tables,
            jobs,
            options,
            fail_fast,
            on_report,
            on_change,
            Path(progress_dir),
        )


def _run(
    config_path: Path,
    tables: list[TableConfig],
    jobs: int,
    options: list[str],
    fail_fast: bool,
    on_report: Callable[[dict[str, Any]], None],
    on_change: Callable[[list[str], int, int], None] | None,
    progress_dir: Path,
) -> tuple[list[dict[str, Any]], str | None]:
    waiting = deque(tables)
    running: list[_Child] = []
    reports: dict[str, dict[str, Any]] = {}
    stopped: signal.Signals | None = None
    while waiting or running:
        try:
            while waiting and len(running) < jobs and stopped is None:
                with _signals_held():  # a started child is always in `running`
                    table = waiting.popleft()
                    progress = progress_dir / f"{len(reports) + len(running)}.json"
                    running.append(_start(config_path, table, options, progress))
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


def _unblock_signals() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)


def _changed(
    on_change: Callable[[list[str], int, int], None] | None,
    running: list[_Child],
    reports: dict[str, dict[str, Any]],
    waiting: deque[TableConfig],
) -> None:
    if on_change is not None:
        described = [describe_progress(c.table.name, _read_progress(c.progress)) for c in running]
        on_change(described, len(reports), len(waiting))


def _start(config_path: Path, table: TableConfig, options: list[str], progress: Path) -> _Child:
    """``options``: the run's own options, passed on to each table's process;
    ``progress``: the file it writes its progress to."""
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
        env={**os.environ, JOB_PROGRESS_ENV: str(progress)},
        # The child inherits the signal mask, and it is started with the stopping
        # signals held (see _signals_held): it must receive them.
        preexec_fn=_unblock_signals,
    )
    return _Child(table, process, stdout, stderr, progress)


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
