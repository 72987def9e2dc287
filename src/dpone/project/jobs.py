"""``dpone refresh --jobs N``: N tables at once, in N worker processes (the scheduler).

Each worker is one ``dpone refresh --worker`` process that refreshes the tables this
process names on its standard input, one at a time, and prints one report line per
table; it pays start-up and the pool's credentials once for all of them. A signal here
stops handing out tables and is forwarded once to every worker running one (they run in
sessions of their own), whose reports are awaited; an idle worker's input is closed.
See docs/cli.md (``dpone refresh``).
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from dpone.errors import STOPPING_SIGNALS, interruption_signal, stopping_signals_held
from dpone.project.config import TableConfig
from dpone.project.refresh import TableReport

POLL_SECONDS = 0.05
# A running table's name and the progress its process last wrote (None: none yet).
Running = tuple[str, dict[str, Any] | None]
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


def read_progress(path: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


@dataclass
class _Worker:
    """One worker process, the table it runs now (None: idle) and what it printed."""

    process: subprocess.Popen[bytes]
    stderr: IO[bytes]
    progress: Path
    table: TableConfig | None = None
    pending: bytearray = field(default_factory=bytearray)
    refusal: dict[str, Any] | None = None  # an error it printed instead of a report

    def hand(self, table: TableConfig) -> None:
        """Name the next table on the worker's input (a worker already gone says so
        when it is reaped: the table is then reported failed with what it printed)."""
        self.table = table
        with contextlib.suppress(FileNotFoundError):
            self.progress.unlink()  # the last table's phase is not this one's
        assert self.process.stdin is not None
        with contextlib.suppress(OSError):
            self.process.stdin.write(table.name.encode("utf-8") + b"\n")
            self.process.stdin.flush()

    def close_input(self) -> None:
        """No more tables: the worker ends once its table (if any) is reported."""
        assert self.process.stdin is not None
        with contextlib.suppress(OSError):
            self.process.stdin.close()

    def lines(self) -> list[dict[str, Any]]:
        """The complete lines the worker printed since the last call, parsed."""
        assert self.process.stdout is not None
        with contextlib.suppress(BlockingIOError):
            while chunk := self.process.stdout.read(65536):
                self.pending += chunk
        *complete, rest = bytes(self.pending).split(b"\n")
        self.pending = bytearray(rest)
        parsed = []
        for line in complete:
            with contextlib.suppress(ValueError):
                document = json.loads(line)
                if isinstance(document, dict):
                    parsed.append(document)
        return parsed


def run_jobs(
    config_path: Path,
    tables: list[TableConfig],
    jobs: int,
    *,
    options: list[str],
    fail_fast: bool,
    on_report: Callable[[dict[str, Any]], None],
    on_change: Callable[[list[Running], int, int], None] | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """Refresh ``tables``, ``jobs`` at a time; one report per table, in the given order,
    and the signal that stopped the run (None when none did).

    ``on_report`` sees each report as its table ends; ``on_change(running, done,
    waiting)`` is called as they run, ``running`` naming each running table with the
    progress its process last wrote (:class:`JobProgress`; None before the first).
    """
    with tempfile.TemporaryDirectory(prefix="dpone-jobs-") as progress_dir:  # 0700
        run = _Run(config_path, options, Path(progress_dir), on_report)
        stopped = run.drive(deque(tables), jobs, fail_fast, on_change)
    done = [run.reports.get(t.name) or _skipped(config_path, t, stopped) for t in tables]
    return done, stopped.name if stopped is not None else None


class _Run:
    """The workers of one ``--jobs`` run and the reports they gave."""

    def __init__(
        self,
        config_path: Path,
        options: list[str],
        progress_dir: Path,
        on_report: Callable[[dict[str, Any]], None],
    ) -> None:
        self.config_path, self.options = config_path, options
        self.progress_dir, self.on_report = progress_dir, on_report
        self.workers: list[_Worker] = []
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
        while waiting or self.workers:
            try:
                self._hand_out(waiting, jobs)
                for worker in list(self.workers):
                    with stopping_signals_held():  # a report read is never lost
                        self._collect(worker, fail_fast, waiting)
                if not waiting and not self.closed:
                    self._close(waiting)
                _changed(on_change, self.workers, self.reports, waiting)
                time.sleep(POLL_SECONDS)
            except BaseException as exc:
                signum = interruption_signal(exc)
                if signum is None:
                    for worker in self.workers:  # a bug here: the workers end as theirs do
                        worker.process.send_signal(signal.SIGTERM)
                    raise
                self.stopped = self.stopped or signum
                self._close(waiting)
                for worker in self.workers:
                    if worker.table is not None and worker.process.poll() is None:
                        worker.process.send_signal(signum)
        return self.stopped

    def _hand_out(self, waiting: deque[TableConfig], jobs: int) -> None:
        while waiting and not self.closed:
            # A worker that already ended is reaped by _collect, never handed a table.
            idle = next(
                (w for w in self.workers if w.table is None and w.process.poll() is None), None
            )
            if idle is None and len(self.workers) >= jobs:
                return
            with stopping_signals_held():  # a handed-out table always has its worker listed
                if idle is None:
                    idle = self._start()
                    self.workers.append(idle)
                idle.hand(waiting.popleft())

    def _collect(self, worker: _Worker, fail_fast: bool, waiting: deque[TableConfig]) -> None:
        """Take the reports ``worker`` printed; reap it once it ended."""
        ended = worker.process.poll() is not None
        for document in worker.lines():
            report = document.get("report")
            if isinstance(report, dict) and worker.table is not None:
                self._reported(worker, dict(report), fail_fast, waiting)
            elif isinstance(document.get("error"), dict):  # refused before a table ran
                worker.refusal = dict(document["error"])
        if not ended:
            return
        self.workers.remove(worker)
        worker.stderr.seek(0)
        err = worker.stderr.read().decode("utf-8", "replace")
        worker.stderr.close()
        if worker.table is not None:
            error = worker.refusal or _no_report(worker, err)
            self._reported(worker, _failed(worker.table, error), fail_fast, waiting)

    def _reported(
        self,
        worker: _Worker,
        report: dict[str, Any],
        fail_fast: bool,
        waiting: deque[TableConfig],
    ) -> None:
        assert worker.table is not None
        self.reports[worker.table.name] = report
        worker.table = None
        self.on_report(report)
        if report.get("interrupted") and self.stopped is None:
            self.stopped = signal.Signals[str(report["interrupted"])]
            self._close(waiting)
        if fail_fast and not report.get("ok"):
            self._close(waiting)

    def _close(self, waiting: deque[TableConfig]) -> None:
        """Hand out no more tables (those not started are reported skipped): every
        worker ends once its table is reported."""
        waiting.clear()
        self.closed = True
        for worker in self.workers:
            worker.close_input()

    def _start(self) -> _Worker:
        """A new worker, with the run's own options passed on and its progress file."""
        argv = [sys.executable, "-m", "dpone", "refresh", "--worker"]
        argv += ["--config", str(self.config_path), "--json", *self.options]
        progress = self.progress_dir / f"{len(self.reports) + len(self.workers)}.json"
        # What it prints on standard error goes to a private file (a pipe could fill
        # while others run); its reports come through a pipe read at every poll.
        stderr = tempfile.TemporaryFile()  # noqa: SIM115
        process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            start_new_session=True,  # a terminal's Ctrl-C is forwarded once, by the parent
            env={**os.environ, JOB_PROGRESS_ENV: str(progress)},
            # The worker inherits the signal mask, and it is started with the stopping
            # signals held (see stopping_signals_held): it must receive them.
            preexec_fn=_unblock_signals,
        )
        assert process.stdout is not None
        os.set_blocking(process.stdout.fileno(), False)
        return _Worker(process, stderr, progress)


def _unblock_signals() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPPING_SIGNALS)


def _changed(
    on_change: Callable[[list[Running], int, int], None] | None,
    workers: list[_Worker],
    reports: dict[str, dict[str, Any]],
    waiting: deque[TableConfig],
) -> None:
    if on_change is not None:
        running = [(w.table.name, read_progress(w.progress)) for w in workers if w.table]
        on_change(running, len(reports), len(waiting))


def _no_report(worker: _Worker, err: str) -> dict[str, Any]:
    """The error of a table whose worker ended without reporting it."""
    assert worker.table is not None
    code = worker.process.returncode
    return {
        "code": "job_failed",
        "message": f"the worker refreshing {worker.table.name} ended with exit code "
        f"{code} and no report",
        # The last line only: what a crash printed before dpone's own error boundary
        # ran is never passed on whole.
        "details": {"exit_code": code, "stderr_last_line": _last_line(err)},
    }


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
