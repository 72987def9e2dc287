"""Start errors, the data-directory lock and the parent-death watchdog."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpone.localserver import (
    ChdbNotInstalled,
    DataDirNotWritable,
    LocalServer,
    PortInUse,
    ServerAlreadyRunning,
    ServerDiedDuringStart,
    ServerInfo,
    ServerStartTimeout,
    find_running,
)
from dpone.localserver.layout import DataDirLayout, lock_is_held

# The watchdog polls every 0.2 s and allows 3 s for a clean stop.
ORPHAN_BOUND_SECONDS = 6.0


def _pid_alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in status


def _wait_until(predicate: object, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_second_server_on_same_data_dir_is_refused(
    clickhouse: ServerInfo, session_data_dir: Path
) -> None:
    with pytest.raises(ServerAlreadyRunning) as caught:
        LocalServer(session_data_dir).start()
    assert caught.value.code == "server_already_running"
    assert caught.value.details["pid"] == clickhouse.pid
    assert str(clickhouse.pid) in str(caught.value)
    # The running server is untouched.
    running = find_running(session_data_dir)
    assert running is not None and running.pid == clickhouse.pid


def test_lock_held_by_another_process_is_respected(tmp_path: Path) -> None:
    layout = DataDirLayout.at(tmp_path / "d")
    layout.prepare()
    fd = os.open(layout.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert lock_is_held(layout.lock_file)
        with pytest.raises(ServerAlreadyRunning):
            LocalServer(layout.root).start()
    finally:
        os.close(fd)
    assert not lock_is_held(layout.lock_file)


def test_port_taken_is_reported(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PortInUse) as caught:
            LocalServer(tmp_path / "d", tcp_port=port).start()
    assert caught.value.details["port"] == port
    assert caught.value.details["kind"] == "tcp"
    assert f"port {port}" in str(caught.value)


def test_data_dir_under_a_file_is_not_writable(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(DataDirNotWritable) as caught:
        LocalServer(blocker / "data").start()
    assert caught.value.details["path"] == str(blocker / "data")
    assert "not writable" in str(caught.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to an unprivileged uid needs root")
def test_data_dir_without_permission_is_not_writable(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o755)
    tmp_path.chmod(0o755)
    probe = textwrap.dedent(
        f"""
        import os, sys
        # Import first: the interpreter's own files may be unreadable to nobody.
        from dpone.localserver import LocalServer, DataDirNotWritable
        os.setgid(65534); os.setuid(65534)
        try:
            LocalServer({str(locked / "data")!r}).start()
        except DataDirNotWritable as exc:
            print(exc.code, exc.details["errno"])
            sys.exit(0)
        sys.exit(1)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["data_dir_not_writable", "13"]  # EACCES


def test_chdb_missing_is_reported(tmp_path: Path) -> None:
    bare = tmp_path / "bare-venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120
    )
    with pytest.raises(ChdbNotInstalled) as caught:
        LocalServer(tmp_path / "d", python=str(bare / "bin" / "python")).start()
    assert "pip install" in str(caught.value)
    assert "cannot import chdb" in caught.value.details["log_tail"]
    assert not lock_is_held(DataDirLayout.at(tmp_path / "d").lock_file)


def test_server_dying_during_start_reports_its_log_tail(tmp_path: Path) -> None:
    with LocalServer(tmp_path / "d"):
        pass
    # A database definition the engine cannot parse makes the start fail.
    metadata = tmp_path / "d" / "store" / "metadata"
    metadata.mkdir(parents=True, exist_ok=True)
    (metadata / "broken.sql").write_text("THIS IS NOT SQL\n")
    with pytest.raises(ServerDiedDuringStart) as caught:
        LocalServer(tmp_path / "d").start()
    tail = caught.value.details["log_tail"]
    assert "broken.sql" in tail and "SYNTAX_ERROR" in tail
    assert find_running(tmp_path / "d") is None


def test_start_timeout_leaves_no_process(tmp_path: Path) -> None:
    before = _server_pids()
    with pytest.raises(ServerStartTimeout) as caught:
        LocalServer(tmp_path / "d", start_timeout=0.01).start()
    assert caught.value.code == "server_start_timeout"
    assert not lock_is_held(DataDirLayout.at(tmp_path / "d").lock_file)
    assert _server_pids() - before == set()


def _server_pids() -> set[int]:
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _pid_alive(int(entry.name)):
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"dpone.localserver.child" in cmdline:
                pids.add(int(entry.name))
    return pids


@pytest.fixture
def orphaning_parent(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    script = textwrap.dedent(
        f"""
        import time
        from dpone.localserver import LocalServer
        info = LocalServer({str(tmp_path / "d")!r}).start()
        print(info.pid, flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        yield parent, tmp_path / "d"
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.wait()
        assert parent.stdout is not None
        parent.stdout.close()


def test_server_stops_when_its_parent_is_killed(
    orphaning_parent: tuple[subprocess.Popen[str], Path],
) -> None:
    parent, data_dir = orphaning_parent
    assert parent.stdout is not None
    server_pid = int(parent.stdout.readline())
    assert _pid_alive(server_pid) and find_running(data_dir) is not None
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    killed_at = time.monotonic()
    # Gone means: the process has exited and released the data-directory lock.
    assert _wait_until(
        lambda: not _pid_alive(server_pid) and find_running(data_dir) is None,
        ORPHAN_BOUND_SECONDS,
    )
    assert time.monotonic() - killed_at < ORPHAN_BOUND_SECONDS
