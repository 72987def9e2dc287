"""Which process holds something, recorded durably, and whether it still exists.

A lease of the principal pool is taken by one process, which cannot end it when killed
with SIGKILL, so the store records who took it (:class:`HolderProcess`: pid, the
kernel's start time of that pid, the boot, the pid namespace and the host) and
:func:`holder_liveness` answers ``gone``, ``alive`` or ``unknown`` for that exact
process from the kernel's own facts, never from a timeout (Linux's ``/proc``; elsewhere
every answer is ``unknown``). See docs/operations.md (``lease_abandoned``).
"""

from __future__ import annotations

import contextlib
import enum
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_PROC = Path("/proc")
_BOOT_ID = _PROC / "sys/kernel/random/boot_id"
_MACHINE_ID = Path("/etc/machine-id")


class Liveness(enum.Enum):
    """Whether a recorded holder process still exists."""

    ALIVE = "alive"
    GONE = "gone"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class HolderProcess:
    """One process, identified so that a recycled pid is never taken for it."""

    pid: int
    start_ticks: int | None
    boot_id: str
    pid_namespace: int | None
    host: str
    machine_id: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "start_ticks": self.start_ticks,
            "boot_id": self.boot_id,
            "pid_namespace": self.pid_namespace,
            "host": self.host,
            "machine_id": self.machine_id,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HolderProcess | None:
        """The recorded holder, or None when the record is not one (then: unknown)."""
        try:
            pid, start, ns = data["pid"], data["start_ticks"], data["pid_namespace"]
            boot, host, machine = data["boot_id"], data["host"], data["machine_id"]
        except (KeyError, TypeError):
            return None
        if not isinstance(pid, int) or not all(isinstance(v, str) for v in (boot, host, machine)):
            return None
        if not all(v is None or isinstance(v, int) for v in (start, ns)):
            return None
        return cls(pid, start, boot, ns, host, machine)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _stat(pid: int) -> tuple[str, int] | None:
    """The state letter and start time (clock ticks after boot) of ``pid``; None if absent."""
    try:
        text = (_PROC / str(pid) / "stat").read_text(encoding="ascii", errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = text.rpartition(")")[2].split()
    return fields[0], int(fields[19])  # field 3 (state) and field 22 (starttime)


def _pid_namespace() -> int | None:
    try:
        return os.stat(_PROC / "self/ns/pid").st_ino
    except OSError:
        return None


def current_process() -> HolderProcess:
    """This process, as :func:`holder_liveness` will recognise it later."""
    pid = os.getpid()
    try:
        stat = _stat(pid)
    except (OSError, ValueError, IndexError):
        stat = None
    return HolderProcess(
        pid=pid,
        start_ticks=None if stat is None else stat[1],
        boot_id=_read(_BOOT_ID),
        pid_namespace=_pid_namespace(),
        host=socket.gethostname(),
        machine_id=_read(_MACHINE_ID),
    )


def holder_liveness(holder: HolderProcess | None) -> tuple[Liveness, str]:
    """Whether ``holder`` still exists, and the fact that decided it (see the module doc)."""
    if holder is None:
        return Liveness.UNKNOWN, "no holder process was recorded"
    here = current_process()
    if holder.host != here.host or holder.machine_id != here.machine_id:
        return Liveness.UNKNOWN, f"the holder ran on another host ({holder.host})"
    if not holder.boot_id or holder.boot_id != here.boot_id:
        if holder.boot_id and holder.machine_id and holder.machine_id == here.machine_id:
            return Liveness.GONE, "the host has booted since the holder started"
        return Liveness.UNKNOWN, "the holder's boot cannot be compared with this one"
    if holder.pid_namespace is None or holder.pid_namespace != here.pid_namespace:
        return Liveness.UNKNOWN, "the holder ran in another pid namespace"
    if holder.start_ticks is None:
        return Liveness.UNKNOWN, "the holder's start time was not recorded"
    try:
        stat = _stat(holder.pid)
    except (OSError, ValueError, IndexError):
        return Liveness.UNKNOWN, f"/proc/{holder.pid}/stat cannot be read"
    if stat is None:
        return Liveness.GONE, f"process {holder.pid} no longer exists"
    state, start = stat
    if start != holder.start_ticks:
        return Liveness.GONE, f"pid {holder.pid} now belongs to another process"
    if state in ("Z", "X"):
        return Liveness.GONE, f"process {holder.pid} has exited (not yet reaped)"
    return Liveness.ALIVE, f"process {holder.pid} still runs"


# The leases some thread of this process is closing now (ended, the proof not yet
# stored): another thread of the same process sees them as another process's.
_CLOSING: dict[str, int] = {}
_CLOSING_LOCK = threading.Condition()


@contextlib.contextmanager
def closing_here(lease_ids: Sequence[str]) -> Iterator[None]:
    """Mark ``lease_ids`` as being closed by this process while the block runs (from
    before their end until their proofs are stored)."""
    with _CLOSING_LOCK:
        for lease_id in lease_ids:
            _CLOSING[lease_id] = _CLOSING.get(lease_id, 0) + 1
    try:
        yield
    finally:
        with _CLOSING_LOCK:
            for lease_id in lease_ids:
                _CLOSING[lease_id] -= 1
                if not _CLOSING[lease_id]:
                    del _CLOSING[lease_id]
            _CLOSING_LOCK.notify_all()


def closed_here_now(lease_id: str) -> bool:
    """Whether a thread of this process is closing ``lease_id`` now."""
    with _CLOSING_LOCK:
        return lease_id in _CLOSING


def wait_closures_here(seconds: float) -> bool:
    """Wait until a closure this process runs ends, at most ``seconds``; False at once
    when it runs none (the caller then waits as it would for another process)."""
    with _CLOSING_LOCK:
        if not _CLOSING:
            return False
        _CLOSING_LOCK.wait(seconds)
        return True


def wait_closures_begun_here(seconds: float) -> None:
    """Wait until every closure this process runs now has ended (at most ``seconds``);
    closures begun meanwhile are not waited for."""
    deadline = time.monotonic() + seconds
    with _CLOSING_LOCK:
        begun = set(_CLOSING)
        while begun & set(_CLOSING) and time.monotonic() < deadline:
            _CLOSING_LOCK.wait(max(0.0, deadline - time.monotonic()))
