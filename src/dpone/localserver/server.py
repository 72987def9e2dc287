"""Start, find and stop the managed local ClickHouse server.

The server runs in a child process (:mod:`dpone.localserver.child`), reported ready only
once its ports are known, both accept connections and HTTP answers ``/ping``. A running
server is found again through its data directory's lock, which decides whether it is
alive, and ``state.json``, rebuilt from the lock's pid and the ports file when missing.
Besides the caller's users, dpone declares the engine's ``default`` and the
administrator ``dpone_admin``; declared users without a password get a generated one
(:mod:`dpone.localserver.credentials`). See docs/local-server.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import dpone
from dpone.connectors.http_connections import POOL
from dpone.errors import ConfigurationError
from dpone.localserver import protocol
from dpone.localserver.config import (
    ADMIN_USER,
    DEFAULT_USERS,
    ServerUser,
    managed_users,
    render_config_xml,
    render_users_xml,
)
from dpone.localserver.credentials import resolve_users
from dpone.localserver.engine import INSTALL_EMBEDDED, check_engine
from dpone.localserver.errors import (
    ChdbNotInstalled,
    PortInUse,
    ServerAlreadyRunning,
    ServerDiedDuringStart,
    ServerNotRunning,
    ServerStartTimeout,
    ServerStateUnknown,
    ServerStopTimeout,
)
from dpone.localserver.layout import (
    DataDirLayout,
    lock_holder,
    lock_is_held,
    write_private_file,
)
from dpone.localserver.probe import LOOPBACK, accepts_connections, http_ping, port_is_free
from dpone.ports.clickhouse_request import Credentials

# A cold first start was seen to take over 4 s on these machines.
DEFAULT_START_TIMEOUT = 60.0
DEFAULT_STOP_TIMEOUT = 15.0
# After a clean stop request is ignored, how long SIGTERM may take before SIGKILL.
TERM_GRACE_SECONDS = 3.0
POLL_SECONDS = 0.05
LOG_TAIL_LINES = 20


@dataclass(frozen=True)
class ServerInfo:
    """What is known about a running managed server."""

    pid: int
    http_port: int
    tcp_port: int
    data_dir: str
    version: str
    started_at: str

    @property
    def http_url(self) -> str:
        """Base URL of the HTTP interface (no credentials, ever)."""
        return f"http://{LOOPBACK}:{self.http_port}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, including the HTTP URL."""
        return {**asdict(self), "http_url": self.http_url}


@dataclass(frozen=True)
class StopReport:
    """How a stop went: ``forced`` is true when signals were needed."""

    pid: int
    forced: bool
    seconds: float


class LocalServer:
    """A managed local ClickHouse server on one data directory.

    Used as a context manager it starts on entry and stops on exit. With
    ``watch_parent`` (the default for library callers) the server stops by itself
    within a few seconds after the process that started it dies.

    ``users`` declares the caller's users; dpone adds the engine's ``default`` and
    the administrator ``dpone_admin`` itself (declaring either is refused). A user
    without a password gets a generated one at its first start, kept in the data
    directory's credentials file for later starts.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        http_port: int = 0,
        tcp_port: int = 0,
        users: Sequence[ServerUser] = DEFAULT_USERS,
        watch_parent: bool = True,
        python: str | None = None,
        start_timeout: float = DEFAULT_START_TIMEOUT,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
    ) -> None:
        if http_port == tcp_port != 0:
            raise ConfigurationError(
                f"the HTTP and TCP ports must differ (both are {http_port}); "
                "choose two ports or 0 to let the system choose",
                code="ports_must_differ",
                port=http_port,
            )
        self.users = managed_users(users)
        self.layout = DataDirLayout.at(data_dir)
        self.http_port = http_port
        self.tcp_port = tcp_port
        self.watch_parent = watch_parent
        self.python = python or sys.executable
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._info: ServerInfo | None = None
        self._log_offsets: dict[Path, int] = {}
        self._resolved: tuple[ServerUser, ...] = ()
        self.warnings: tuple[str, ...] = ()

    @property
    def info(self) -> ServerInfo:
        """The running server's facts; raises if it was not started here."""
        if self._info is None:
            raise ServerNotRunning("this LocalServer has not been started")
        return self._info

    def credentials(self, user: str = ADMIN_USER) -> Credentials:
        """The credentials of a declared ``user`` of this started server."""
        for declared in self._resolved:
            if declared.name == user:
                return Credentials(user, declared.password or "")
        raise ServerNotRunning(f"no started server of this LocalServer declares {user!r}")

    def start(self) -> ServerInfo:
        """Start the server and wait until it is ready; returns its facts.

        Data-directory permission warnings are left in :attr:`warnings`.
        """
        check_engine()  # before anything is written: a missing or untested engine
        layout = self.layout
        self.warnings = tuple(layout.prepare())
        with _start_lock(layout):
            if lock_is_held(layout.lock_file):
                raise _already_running(layout)
            for name, port in (("http", self.http_port), ("tcp", self.tcp_port)):
                if not port_is_free(port):
                    raise PortInUse(f"{name} port {port} is already in use", port=port, kind=name)
            self._resolved = resolve_users(layout, self.users)
            self._write_run_files(render_users_xml(self._resolved))
            started = time.monotonic()
            # Start-failure reports quote only what this start wrote to the logs.
            self._log_offsets = _log_sizes(layout)
            self._process = self._spawn()
            try:
                self._info = self._wait_ready(started + self.start_timeout)
            except BaseException:
                _terminate(self._process)
                self._process = None
                raise
            _write_state(layout, self._info)
        return self._info

    def stop(self) -> StopReport:
        """Stop the server started by this object (clean first, signals if needed)."""
        if self._process is None or self._info is None:
            raise ServerNotRunning("this LocalServer is not running")
        try:
            return _stop(self.layout, self._info.pid, self.stop_timeout, self._process)
        finally:
            self._process = None
            self._info = None

    def wait(self) -> int:
        """Block until the server process exits; returns its exit code."""
        if self._process is None:
            raise ServerNotRunning("this LocalServer is not running")
        return self._process.wait()

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._process is not None:
            self.stop()

    def _write_run_files(self, users_xml: str) -> None:
        layout = self.layout
        write_private_file(layout.users_file, users_xml)
        config = render_config_xml(
            http_port=self.http_port,
            tcp_port=self.tcp_port,
            log_dir=str(layout.log_dir),
            users_file=str(layout.users_file),
        )
        write_private_file(layout.config_file, config)
        for stale in (
            layout.control_fifo,
            layout.listen_file,
            layout.ports_file,
            layout.state_file,
        ):
            stale.unlink(missing_ok=True)
        os.mkfifo(layout.control_fifo, 0o600)

    def _spawn(self) -> subprocess.Popen[bytes]:
        layout = self.layout
        argv = [
            self.python,
            "-m",
            protocol.CHILD_MODULE,
            "--data-dir",
            str(layout.root),
        ]
        if self.watch_parent:
            argv += ["--watch-parent", str(os.getpid())]
        env = dict(os.environ)
        # The child must import this very dpone, also under another interpreter.
        package_root = str(Path(dpone.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        fd = os.open(layout.child_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "ab") as log:
            return subprocess.Popen(
                argv,
                # Not a file: the engine would load a file on its stdin into a table.
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                # Own session: a terminal's Ctrl-C goes to the parent, which stops us.
                start_new_session=True,
                # Parts, metadata and logs the server writes are the owner's alone.
                umask=0o077,
            )

    def _wait_ready(self, deadline: float) -> ServerInfo:
        assert self._process is not None
        layout = self.layout
        while True:
            code = self._process.poll()
            if code is not None:
                raise _start_failure(layout, code, log_tail(layout, since=self._log_offsets))
            ports = _read_ports(layout.ports_file)
            if (
                ports is not None
                and accepts_connections(ports[1])
                and accepts_connections(ports[0])
                and http_ping(ports[0])
            ):
                return ServerInfo(
                    pid=self._process.pid,
                    http_port=ports[0],
                    tcp_port=ports[1],
                    data_dir=str(layout.root),
                    version=ports[2],
                    started_at=datetime.now(UTC).isoformat(timespec="seconds"),
                )
            if time.monotonic() >= deadline:
                raise ServerStartTimeout(
                    f"server on {layout.root} was not ready within {self.start_timeout:g} s",
                    data_dir=str(layout.root),
                    log_tail=log_tail(layout, since=self._log_offsets),
                )
            time.sleep(POLL_SECONDS)


def find_running(data_dir: str | os.PathLike[str] | None = None) -> ServerInfo | None:
    """The server running on ``data_dir``, or None when none holds its lock.

    Without a readable ``state.json`` the facts come from the lock file (pid) and the
    ports file; raises :class:`ServerStateUnknown` when a server holds the lock but
    has not told its ports yet (still starting, or stuck).
    """
    layout = DataDirLayout.at(data_dir)
    if not lock_is_held(layout.lock_file):
        return None
    info = _read_state(layout)
    if info is not None and info.pid == lock_holder(layout.lock_file):
        return info
    return _rebuild_state(layout)


def stop_running(
    data_dir: str | os.PathLike[str] | None = None, *, timeout: float = DEFAULT_STOP_TIMEOUT
) -> StopReport:
    """Stop the server running on ``data_dir`` (started by any process)."""
    layout = DataDirLayout.at(data_dir)
    if not lock_is_held(layout.lock_file):
        layout.state_file.unlink(missing_ok=True)  # stale: no process holds the lock
        raise ServerNotRunning(f"no server is running on {layout.root}", data_dir=str(layout.root))
    # The lock's holder is the server, whatever state.json says or lacks.
    pid = lock_holder(layout.lock_file)
    if pid is None:
        raise ServerStateUnknown(
            f"a process holds the server lock on {layout.root} but its pid is unreadable",
            data_dir=str(layout.root),
        )
    return _stop(layout, pid, timeout, None)


def log_tail(
    layout: DataDirLayout, lines: int = LOG_TAIL_LINES, since: Mapping[Path, int] | None = None
) -> str:
    """The last lines of the server's error log and of the child's own output.

    ``since`` maps a log file to the byte offset where the interesting part starts.
    """
    parts = []
    for path in (layout.error_log, layout.child_log):
        try:
            with open(path, "rb") as log:
                log.seek((since or {}).get(path, 0))
                text = log.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            continue
        tail = text.splitlines()[-lines:]
        if tail:
            parts.append(f"--- {path.name} ---\n" + "\n".join(tail))
    return "\n".join(parts)


def _stop(
    layout: DataDirLayout, pid: int, timeout: float, process: subprocess.Popen[bytes] | None
) -> StopReport:
    started = time.monotonic()
    # A connection this process keeps open would hold the server's stop up (and can make
    # the engine exit abruptly): none is kept past this point.
    POOL.close_idle()
    protocol.request_stop(str(layout.control_fifo))
    forced = False
    if not _wait_released(layout, process, started + timeout):
        forced = True
        _signal_server(pid, signal.SIGTERM)
        if not _wait_released(layout, process, time.monotonic() + TERM_GRACE_SECONDS):
            _signal_server(pid, signal.SIGKILL)
            if not _wait_released(layout, process, time.monotonic() + TERM_GRACE_SECONDS):
                raise ServerStopTimeout(f"server pid {pid} on {layout.root} did not stop", pid=pid)
    if process is not None:
        # The lock goes with the process's descriptors, a moment before it can be
        # reaped: reap it here, so a stopped child is never left unwaited (CI once saw
        # its Popen collected as "still running").
        try:
            process.wait(timeout=TERM_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            _terminate(process)
    layout.state_file.unlink(missing_ok=True)
    return StopReport(pid=pid, forced=forced, seconds=time.monotonic() - started)


def _wait_released(
    layout: DataDirLayout, process: subprocess.Popen[bytes] | None, deadline: float
) -> bool:
    # The kernel drops the flock when the process is gone, zombie or not.
    while True:
        if process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=POLL_SECONDS)
        if not lock_is_held(layout.lock_file):
            return True
        if time.monotonic() >= deadline:
            return False
        if process is None:
            time.sleep(POLL_SECONDS)


def _signal_server(pid: int, sig: signal.Signals) -> None:
    # Only signal a process that is our server child, never a recycled pid.
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return
    if protocol.CHILD_MODULE.encode() in cmdline:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _terminate(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()


def _read_ports(path: Path) -> tuple[int, int, str] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    if not text.endswith("\n"):
        return None  # still being written
    fields = text.rstrip("\n").split("\t")
    if len(fields) != 3 or not (fields[0].isdigit() and fields[1].isdigit()):
        return None
    return int(fields[0]), int(fields[1]), fields[2]


def _write_state(layout: DataDirLayout, info: ServerInfo) -> None:
    body = {**asdict(info), "dpone_version": dpone.__version__}
    write_private_file(layout.state_file, json.dumps(body, sort_keys=True, indent=2) + "\n")


def _read_state(layout: DataDirLayout) -> ServerInfo | None:
    # None: started but not yet recorded, recorded by a crashed starter, or damaged.
    try:
        raw = json.loads(layout.state_file.read_text(encoding="utf-8"))
        return ServerInfo(
            pid=int(raw["pid"]),
            http_port=int(raw["http_port"]),
            tcp_port=int(raw["tcp_port"]),
            data_dir=str(raw["data_dir"]),
            version=str(raw["version"]),
            started_at=str(raw["started_at"]),
        )
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None


def _rebuild_state(layout: DataDirLayout) -> ServerInfo:
    pid = lock_holder(layout.lock_file)
    ports = _read_ports(layout.ports_file)
    if pid is None or ports is None:
        raise ServerStateUnknown(
            f"a server holds the lock on {layout.root}"
            + (f" (pid {pid})" if pid else "")
            + " but has not reported its ports; it may still be starting. "
            "`dpone server stop` stops it",
            data_dir=str(layout.root),
            pid=pid,
        )
    # The child writes the ports file once it listens: close to its start time.
    started = datetime.fromtimestamp(layout.ports_file.stat().st_mtime, UTC)
    return ServerInfo(
        pid=pid,
        http_port=ports[0],
        tcp_port=ports[1],
        data_dir=str(layout.root),
        version=ports[2],
        started_at=started.isoformat(timespec="seconds"),
    )


@contextlib.contextmanager
def _start_lock(layout: DataDirLayout) -> Iterator[None]:
    """Held while this process starts a server, so two starts never interleave."""
    fd = os.open(layout.start_lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ServerAlreadyRunning(
                f"another process is starting a server on {layout.root}",
                data_dir=str(layout.root),
            ) from None
        yield
    finally:
        os.close(fd)


def _already_running(layout: DataDirLayout) -> ServerAlreadyRunning:
    pid = lock_holder(layout.lock_file)
    return ServerAlreadyRunning(
        f"a server is already running on {layout.root}"
        + (f" (pid {pid}); stop it first" if pid else "; stop it first"),
        data_dir=str(layout.root),
        pid=pid,
    )


def _log_sizes(layout: DataDirLayout) -> dict[Path, int]:
    sizes = {}
    for path in (layout.error_log, layout.child_log):
        with contextlib.suppress(FileNotFoundError):
            sizes[path] = path.stat().st_size
    return sizes


def _start_failure(layout: DataDirLayout, code: int, tail: str) -> Exception:
    if code == protocol.EXIT_LOCKED:
        return _already_running(layout)
    if code == protocol.EXIT_NO_CHDB:
        return ChdbNotInstalled(
            "the chdb package is not installed for the server's interpreter; "
            f"install it with: {INSTALL_EMBEDDED}",
            log_tail=tail,
        )
    if "Address already in use" in tail:
        return PortInUse(
            "a server port is already in use", data_dir=str(layout.root), log_tail=tail
        )
    return ServerDiedDuringStart(
        f"server on {layout.root} exited with code {code} before it was ready",
        data_dir=str(layout.root),
        exit_code=code,
        log_tail=tail,
    )
