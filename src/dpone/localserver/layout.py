"""Where the managed server keeps its files inside one data directory.

``server.lock`` (held by the running server, with its pid), ``start.lock``,
``state.json``, ``protected.json``, ``store/`` (the ClickHouse data), ``run/`` (the
configuration, users, credentials, control FIFO, listen and ports files) and ``log/``
(the server's logs and the query log kept across a clean restart); directories 0700,
files 0600. See docs/local-server.md ("Data directory").
"""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dpone.durable_files import atomic_write_bytes
from dpone.localserver.errors import DataDirNotWritable

DEFAULT_DATA_DIR = Path(".dpone") / "clickhouse"


@dataclass(frozen=True)
class DataDirLayout:
    """The paths of one data directory; creating them is :meth:`prepare`'s job."""

    root: Path

    @classmethod
    def at(cls, data_dir: str | os.PathLike[str] | None) -> DataDirLayout:
        """Layout for ``data_dir`` (default ``./.dpone/clickhouse``), made absolute."""
        return cls(Path(data_dir if data_dir is not None else DEFAULT_DATA_DIR).absolute())

    @property
    def lock_file(self) -> Path:
        return self.root / "server.lock"

    @property
    def start_lock_file(self) -> Path:
        return self.root / "start.lock"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def protected_file(self) -> Path:
        """The databases the last start protected (see :mod:`dpone.localserver.protected`)."""
        return self.root / "protected.json"

    @property
    def store_dir(self) -> Path:
        return self.root / "store"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def config_file(self) -> Path:
        return self.run_dir / "config.xml"

    @property
    def users_file(self) -> Path:
        return self.run_dir / "users.xml"

    @property
    def credentials_file(self) -> Path:
        return self.run_dir / "credentials.json"

    @property
    def pending_credentials_file(self) -> Path:
        return self.run_dir / "credentials.next.json"

    @property
    def control_fifo(self) -> Path:
        return self.run_dir / "control.fifo"

    @property
    def listen_file(self) -> Path:
        """Written by the engine once it listens: its ports, not yet ready."""
        return self.run_dir / "listen.tsv"

    @property
    def ports_file(self) -> Path:
        """Written by the server process when it is ready: ports and version."""
        return self.run_dir / "ports.tsv"

    @property
    def child_log(self) -> Path:
        return self.log_dir / "child.log"

    @property
    def error_log(self) -> Path:
        return self.log_dir / "server.err.log"

    def prepare(self) -> list[str]:
        """Create the directories (0700) and prove the data directory is writable.

        Returns one warning naming the existing directories that other users can
        enter or read, with the ``chmod`` that fixes them: the owner's data is not
        re-permissioned behind their back (only ``run/``, which holds secrets).
        """
        wide = []
        try:
            for d in (self.root, self.store_dir, self.run_dir, self.log_dir):
                d.mkdir(mode=0o700, parents=True, exist_ok=True)
                mode = d.stat().st_mode & 0o777
                if mode & 0o077 and d != self.run_dir:
                    wide.append(f"{d} (mode {mode:04o})")
            # Configuration and credentials: never open to anyone else, whatever was there.
            os.chmod(self.run_dir, 0o700)
            # A real write, not os.access: access() answers for the real uid and
            # says nothing about read-only mounts or full disks.
            with tempfile.NamedTemporaryFile(dir=self.root, prefix=".probe-") as probe:
                probe.write(b"x")
                probe.flush()
                os.fsync(probe.fileno())
        except OSError as exc:
            raise DataDirNotWritable(
                f"data directory {self.root} is not writable: {exc.strerror or exc}",
                path=str(self.root),
                errno=exc.errno,
            ) from exc
        if not wide:
            return []
        return [
            f"open to other users: {', '.join(wide)}; "
            f"make the data directory private with: chmod -R go-rwx {self.root}"
        ]


def write_private_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600, replacing it atomically."""
    atomic_write_bytes(path, text.encode("utf-8"), mode=0o600)


def lock_holder(lock_file: Path) -> int | None:
    """The pid the server wrote into its lock file, None when unreadable."""
    try:
        text = lock_file.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def lock_is_held(lock_file: Path) -> bool:
    """True when some process holds the server lock on ``lock_file``.

    The lock is an advisory ``flock`` that the server process takes before it starts
    and that the kernel releases when it exits, however it exits.
    """
    try:
        fd = os.open(lock_file, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
