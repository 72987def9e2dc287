"""The engine's child process: its program, how it starts and ends, and an early start.

Loading the embedded engine takes about half a second. A command that converts with
it calls :func:`start_early` first thing, so the load overlaps the command's own
imports and the verification of its source; the command's engine session then adopts
that child (:func:`take_early`) instead of starting one. This module imports little,
so the early start costs the command almost nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

# Engine worker threads: one per core, at most this many.
MAX_WORKERS = 4
# The engine's home (where the ranges and converted parts pass through) is in memory
# when this file system can take it: every range is written once and read once and
# then deleted, and on this machine's disk a gigabyte of such writes cost ~3.7 s of
# kernel time against ~0.8 s on tmpfs (dirty-page throttling). At most a few ranges
# of engine_conversion.MAX_RANGE_BYTES are there at once.
MEMORY_SCRATCH = "/dev/shm"  # noqa: S108 - only a parent for mkdtemp (0700, unique)
MEMORY_SCRATCH_MIN_FREE = 1 << 30
SCRATCH_ENV = "DPONE_ENGINE_SCRATCH"
# In each home: "<pid> <start time>" of the engine child that owns it.
OWNER_MARK = "owner"

# One engine for a whole preparation: reads jobs (JSON lines: an id and statements) on
# stdin, runs them on argv[1] worker threads and answers one JSON line per job on
# stdout. Each worker has a connection of its own: chdb runs one connection's queries
# one at a time (measured on 4.4), so a shared one kept the conversion on one core.
# The connections are opened here, one after another, before any worker starts. With
# argv[2] "own-home" its working directory is its own: if the parent dies (a parent
# alive ends the child and removes it), the child removes it on the way out.
PROGRAM = """
import json, os, queue, shutil, sys, threading
import chdb
lock = threading.Lock()
jobs = queue.Queue()

def leave(code):
    if sys.argv[2:] == ["own-home"]:
        shutil.rmtree(os.getcwd(), ignore_errors=True)
    os._exit(code)

def reply(doc):
    with lock:
        try:
            sys.stdout.write(json.dumps(doc) + "\\n")
            sys.stdout.flush()
        except OSError:
            # The parent is gone (killed): nobody reads the answers, so end at once. An
            # exception would instead leave the workers waiting on the queue forever.
            leave(1)

def work(conn):
    while (job := jobs.get()) is not None:
        try:
            out = b"".join(conn.query(sql, "TSV").bytes() for sql in job["sql"])
            reply({"id": job["id"], "out": out.decode("ascii", "replace")})
        except Exception as exc:
            reply({"id": job["id"], "error": str(exc)[-2000:]})

connections = []
for _ in range(int(sys.argv[1])):
    conn = chdb.connect(":memory:")
    conn.query("SET max_query_size = 1073741824", "TSV")
    connections.append(conn)
workers = [threading.Thread(target=work, args=(conn,)) for conn in connections]
for w in workers:
    w.start()
reply({"id": -1, "out": "ready"})
for line in sys.stdin:
    jobs.put(json.loads(line))
for w in workers:
    jobs.put(None)
for w in workers:
    w.join()
leave(0)  # stdin closed: the parent is gone
"""


def default_workers() -> int:
    """One worker per core, at most :data:`MAX_WORKERS`."""
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


@dataclass(frozen=True)
class EngineChild:
    """A running engine child: its process, its stderr log and its working directory."""

    process: subprocess.Popen[bytes]
    log: BinaryIO
    workers: int
    python: str
    home: Path | None  # a directory of its own, removed when the child ends

    def log_tail(self) -> str:
        """The end of what the child wrote to stderr (why it stopped, if it said)."""
        self.log.flush()
        return Path(self.log.name).read_bytes()[-500:].decode("utf-8", "replace")

    def end(self) -> None:
        """Kill the child (a finished job leaves it nothing to do) and release it all."""
        try:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
            for stream in (self.process.stdin, self.process.stdout):
                # A child that died with a job unsent leaves stdin's buffer unflushable:
                # closing it raises BrokenPipeError, which must not replace the caller's
                # error (nor leave stdout open).
                with contextlib.suppress(OSError):
                    if stream is not None:
                        stream.close()
        finally:
            self.log.close()
            if self.home is not None:
                shutil.rmtree(self.home, ignore_errors=True)


def start(workers: int, cwd: Path, *, python: str | None = None, home: bool = False) -> EngineChild:
    """Start an engine child in the empty directory ``cwd`` (the engine reads config.xml
    from its working directory); its stderr goes to ``cwd/engine.log``. With ``home``,
    ``cwd`` belongs to the child and is removed when it ends. Raises ``OSError``."""
    interpreter = python or sys.executable
    log = open(cwd / "engine.log", "wb")  # noqa: SIM115 - closed by EngineChild.end
    try:
        process = subprocess.Popen(
            [interpreter, "-c", PROGRAM, str(workers), *(["own-home"] if home else [])],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            # TMPDIR: the embedded engine makes a directory of its own there at every
            # start and leaves it behind; in cwd it goes with the child's home.
            env={k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"}
            | {"TMPDIR": str(cwd)},
        )
    except OSError:
        log.close()
        raise
    return EngineChild(process, log, workers, interpreter, cwd if home else None)


def scratch_root() -> str | None:
    """Where engine homes are made: ``$DPONE_ENGINE_SCRATCH`` if set (as given: if it
    is unusable the engine does not start, and says so), else :data:`MEMORY_SCRATCH`
    if it is a writable directory with :data:`MEMORY_SCRATCH_MIN_FREE` bytes free,
    else None (the temporary directory)."""
    chosen = os.environ.get(SCRATCH_ENV)
    if chosen:
        return os.path.abspath(chosen)
    try:
        free = os.statvfs(MEMORY_SCRATCH)
    except OSError:
        return None
    roomy = free.f_bavail * free.f_frsize >= MEMORY_SCRATCH_MIN_FREE
    return MEMORY_SCRATCH if roomy and os.access(MEMORY_SCRATCH, os.W_OK | os.X_OK) else None


def _started(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot), or None if none runs."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def sweep_stale_homes(root: str | None) -> list[Path]:
    """Remove the homes under ``root`` whose engine is gone (killed with its parent, so
    nobody removed them): they hold copies of source data. Only this user's homes
    with an owner mark are touched, and only when that exact process (pid and start
    time) no longer runs. The homes removed."""
    base = Path(root or tempfile.gettempdir())
    removed = []
    for home in base.glob("dpone-engine-*"):
        try:
            if home.stat().st_uid != os.getuid():
                continue
            pid, started = (home / OWNER_MARK).read_text().split()
        except (OSError, ValueError):
            continue  # no mark (yet): not ours to judge
        if _started(int(pid)) != started:
            shutil.rmtree(home, ignore_errors=True)
            removed.append(home)
    return removed


def start_at_home(workers: int, *, python: str | None = None) -> EngineChild:
    """Start an engine child in a new private directory of its own (0700, under
    :func:`scratch_root`), removed when it ends, or by the child if its parent dies
    first, or by a later engine's sweep if both were killed. Raises ``OSError``."""
    root = scratch_root()
    sweep_stale_homes(root)
    try:
        home = Path(tempfile.mkdtemp(prefix="dpone-engine-", dir=root)).absolute()
    except OSError as exc:
        directory = root or tempfile.gettempdir()
        where = f"{directory} (from {SCRATCH_ENV})" if os.environ.get(SCRATCH_ENV) else directory
        raise ScratchUnusable(
            exc.errno, f"no private directory can be made in {where}: {exc.strerror}", directory
        ) from exc
    try:
        child = start(workers, home, python=python, home=True)
    except BaseException:
        shutil.rmtree(home, ignore_errors=True)
        raise
    try:
        # Which process owns the home, for the sweep above: written after the start,
        # so a home without it is one being made (the sweep leaves it alone).
        started = _started(child.process.pid)
        mark = home / f"{OWNER_MARK}.new"
        mark.write_text(f"{child.process.pid} {started}")
        mark.replace(home / OWNER_MARK)
    except BaseException:
        child.end()
        raise
    return child


class ScratchUnusable(OSError):
    """The engine's scratch root cannot hold a private directory (see :func:`scratch_root`)."""


_early: EngineChild | None = None


def start_early() -> None:
    """Start an engine child now, for this process's next engine session to adopt.

    Best effort: if it cannot start, the session starts its own and reports why. A
    child nobody adopts is ended when this process exits.
    """
    global _early
    if _early is not None:
        return
    atexit.register(_end_early)  # first: an interrupt below leaves nothing behind
    with contextlib.suppress(OSError):
        _early = start_at_home(default_workers())


def take_early(workers: int, python: str | None) -> EngineChild | None:
    """The early child, if one runs with ``workers`` workers under ``python``; else None.

    It is handed out once; a child that does not fit is ended.
    """
    global _early
    child, _early = _early, None
    if child is None:
        return None
    if child.workers == workers and python in (None, child.python) and child.process.poll() is None:
        return child
    child.end()
    return None


def _end_early() -> None:
    global _early
    child, _early = _early, None
    if child is not None:
        child.end()
