"""File durability: a file appears under its final name only complete and synced.

Every writer uses one temporary-file discipline (a hidden sibling created with
``O_EXCL`` and held by ``flock`` until its rename, fsynced, renamed, the directory
fsynced): :func:`atomic_output` and :func:`atomic_write_bytes` replace one file of
dpone's own; :func:`atomic_outputs` writes a user's outputs (an export and its receipt),
checked against every input and each other first, refused if they exist unless
``force``, and renamed together at the end, so all appear or none. Files are created
0600, the directories :func:`private_directories` makes 0700, and
:func:`remove_stale_partials` removes the temporary siblings no living writer holds.
See docs/bulk-text-format.md and docs/operations.md.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from dpone.errors import ConfigurationError, DponeError


class OutputError(DponeError):
    """An output file could not be written or put in place (the outputs were not)."""

    code = "output_write_failed"


class OutputRefused(ConfigurationError):
    """An output that would destroy an input or another output, or an existing file."""

    code = "output_refused"


def fsync_directory(path: Path) -> None:
    """fsync a directory so a rename or create inside it is durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_TOKEN_BYTES = 6


def _temporary_sibling(final: Path) -> Path:
    return final.with_name(f".{final.name}.{secrets.token_hex(_TOKEN_BYTES)}.partial")


def temporary_siblings(final: Path) -> list[Path]:
    """The temporary siblings of ``final`` that exist now (a writer killed mid-write left them).

    Some may belong to a live writer: :func:`remove_stale_partials` removes only the
    others; removing one a live writer still uses would make its rename fail.
    """
    pattern = re.compile(rf"\.{re.escape(final.name)}\.[0-9a-f]{{{2 * _TOKEN_BYTES}}}\.partial")
    try:
        names = os.listdir(final.parent)
    except FileNotFoundError:
        return []
    return [final.parent / n for n in names if pattern.fullmatch(n)]


# Every file dpone writes is its owner's alone.
PRIVATE_FILE_MODE = 0o600
PRIVATE_DIRECTORY_MODE = 0o700
# How long a writer or a reaper waits for the directory's lock (held for microseconds
# by a writer, milliseconds by a reaper) before going on without it (a writer) or
# removing nothing (a reaper): a stopped process never blocks another.
DIRECTORY_LOCK_SECONDS = 5.0
_LOCK_POLL_SECONDS = 0.005


def _lock_directory(directory: Path, *, exclusive: bool) -> int | None:
    """A descriptor of ``directory`` holding its ``flock``; None when it cannot be had.

    Writers take it shared while they create and lock a temporary file, a reaper
    exclusive while it looks: so a reaper never meets a temporary file that exists
    but is not locked yet.
    """
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    deadline = time.monotonic() + DIRECTORY_LOCK_SECONDS
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(_LOCK_POLL_SECONDS)
                continue
        except OSError:
            pass  # a file system without flock on directories
        os.close(fd)
        return None


def _create_partial(tmp: Path, mode: int) -> tuple[int, int | None]:
    """Create the temporary file ``tmp`` exclusively; its descriptor and a lock holder.

    The holder is a duplicate of the descriptor, kept open until the file is renamed
    (or removed): the ``flock`` it holds says a live writer owns the file, also after
    the writing stream was closed. None where the file system cannot lock it. The
    caller names ``tmp`` before calling, so a signal arriving at any point here leaves
    a name it can remove (unless the name was another's: ``FileExistsError``).
    """
    guard = _lock_directory(tmp.parent, exclusive=False)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: never waits
            holder: int | None = os.dup(fd)
        except OSError:
            holder = None
    finally:
        if guard is not None:
            os.close(guard)
    return fd, holder


def _release(holder: int | None) -> None:
    if holder is not None:
        with contextlib.suppress(OSError):
            os.close(holder)


def remove_stale_partials(final: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary siblings of ``final`` whose writer is gone; the removed ones.

    A sibling is removed only when all of these hold: its name is exactly the pattern
    of :func:`temporary_siblings`, it is a regular file (not a link) owned by this
    user, and its ``flock`` can be taken while the directory's lock is held
    exclusively, so no live writer holds it (a killed one holds nothing). Where the
    directory or a file cannot be locked, nothing is removed.
    """
    target = Path(final)
    guard = _lock_directory(target.parent, exclusive=True)
    if guard is None:
        return []
    try:
        return [path for path in temporary_siblings(target) if _remove_if_unheld(path)]
    finally:
        os.close(guard)


def _remove_if_unheld(path: Path) -> bool:
    try:
        # O_NONBLOCK: a FIFO under that name never blocks the open.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False  # a link, or gone meanwhile
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # a live writer holds it (or it cannot be locked here)
        now = os.stat(path, follow_symlinks=False)
        if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
            return False  # replaced since it was opened: not the file checked
        os.unlink(path)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def private_directories(path: str | os.PathLike[str]) -> None:
    """Create ``path`` and each missing parent 0700; an existing directory is left as it is.

    Raises :class:`OutputError` naming the directory that could not be made.
    """
    missing: list[Path] = []
    current = Path(path)
    while not os.path.lexists(current) and current != current.parent:
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, PRIVATE_DIRECTORY_MODE)
        except FileExistsError:
            continue  # made meanwhile by another process: its mode is its maker's
        except OSError as exc:
            raise _write_failed(directory, exc) from exc


@contextlib.contextmanager
def atomic_output(
    path: str | os.PathLike[str], *, mode: int = PRIVATE_FILE_MODE
) -> Iterator[BinaryIO]:
    """Write to a temporary sibling; on success fsync, rename over ``path``, fsync the dir.

    On any exception the temporary file is removed and ``path`` is untouched, so an
    interrupted writer never leaves a file that looks finished.
    """
    final = Path(path)
    tmp = _temporary_sibling(final)
    holder: int | None = None
    try:
        fd, holder = _create_partial(tmp, mode)
        with os.fdopen(fd, "wb") as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, final)
    except FileExistsError:
        raise  # the temporary name was taken: that file is not ours to remove
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        _release(holder)
    fsync_directory(final.parent)


def atomic_write_bytes(
    path: str | os.PathLike[str], data: bytes, *, mode: int = PRIVATE_FILE_MODE
) -> None:
    """Write ``data`` to ``path`` atomically and durably."""
    with atomic_output(path, mode=mode) as stream:
        stream.write(data)


@dataclass(frozen=True)
class _Identity:
    """A path as the file system sees it: resolved, and its inode when it exists."""

    given: Path
    resolved: Path
    inode: tuple[int, int] | None

    @classmethod
    def of(cls, path: Path) -> _Identity:
        resolved = Path(os.path.realpath(path))
        try:
            info = os.stat(resolved)
        except FileNotFoundError:
            return cls(path, resolved, None)
        except OSError as exc:
            raise OutputRefused(
                f"cannot inspect {path}: {exc.strerror}",
                code="output_not_accessible",
                path=str(path),
            ) from exc
        return cls(path, resolved, (info.st_dev, info.st_ino))

    def same_file(self, other: _Identity) -> bool:
        if self.resolved == other.resolved:
            return True
        return self.inode is not None and self.inode == other.inode


def check_outputs(
    outputs: Sequence[str | os.PathLike[str]],
    inputs: Sequence[str | os.PathLike[str]] = (),
    *,
    force: bool = False,
) -> None:
    """Refuse outputs that cannot be written safely, before anything is written.

    An output may not be an input or another output (by resolved path, and by device
    and inode when both exist, so hard links and symbolic links count); its directory
    must exist; it must not exist unless ``force`` (and never as a directory).
    """
    ins = [_Identity.of(Path(p)) for p in inputs]
    outs = [_Identity.of(Path(p)) for p in outputs]
    for i, out in enumerate(outs):
        for source in ins:
            if out.same_file(source):
                raise OutputRefused(
                    f"output {out.given} is the input {source.given}; refusing to overwrite it",
                    code="output_is_input",
                    path=str(out.given),
                    input=str(source.given),
                )
        for other in outs[:i]:
            if out.same_file(other):
                raise OutputRefused(
                    f"outputs {other.given} and {out.given} are the same file",
                    code="outputs_collide",
                    path=str(out.given),
                    other=str(other.given),
                )
        if not out.resolved.parent.is_dir():
            raise OutputRefused(
                f"directory {out.given.parent} of output {out.given} does not exist",
                code="output_directory_missing",
                path=str(out.given),
            )
        if out.inode is not None:
            if stat.S_ISDIR(os.stat(out.resolved).st_mode):
                raise OutputRefused(
                    f"output {out.given} is a directory",
                    code="output_is_directory",
                    path=str(out.given),
                )
            if not force:
                raise OutputRefused(
                    f"output {out.given} exists; pass --force to replace it",
                    code="output_exists",
                    path=str(out.given),
                )


class _Pending:
    """One output being written: its final name, temporary sibling and stream.

    Made in two steps, so that the caller lists it before its file exists: a signal
    arriving while the file is created still finds it in the list to discard.
    """

    def __init__(self, final: Path) -> None:
        self.final = final
        self.tmp = _temporary_sibling(final)
        self._stream: BinaryIO | None = None
        self._holder: int | None = None
        self._created = False
        self.inode: int | None = None
        self.placed = False

    def open(self) -> BinaryIO:
        """Create the temporary file (exclusively, locked); its stream."""
        self._created = True  # from here on, a file under the name is ours
        try:
            fd, self._holder = _create_partial(self.tmp, PRIVATE_FILE_MODE)
        except OSError as exc:
            self._created = not isinstance(exc, FileExistsError)
            raise _write_failed(self.final, exc) from exc
        self._stream = os.fdopen(fd, "wb")
        self.inode = os.fstat(fd).st_ino
        return self._stream

    @property
    def stream(self) -> BinaryIO:
        assert self._stream is not None, "open() first"
        return self._stream

    def sync(self) -> None:
        try:
            self.stream.flush()
            os.fsync(self.stream.fileno())
        except OSError as exc:
            raise _write_failed(self.final, exc) from exc
        self.stream.close()

    def place(self, force: bool) -> None:
        try:
            if force:
                os.replace(self.tmp, self.final)
            else:
                # link() refuses an existing name atomically: a file that appeared since
                # the check is never replaced.
                os.link(self.tmp, self.final)
                self.tmp.unlink()
        except FileExistsError as exc:
            raise OutputRefused(
                f"output {self.final} appeared while it was written; pass --force to replace it",
                code="output_exists",
                path=str(self.final),
            ) from exc
        except OSError as exc:
            raise _write_failed(self.final, exc) from exc
        self.placed = True
        _release(self._holder)
        self._holder = None

    def discard(self) -> None:
        if self._stream is not None:
            with contextlib.suppress(OSError):
                self._stream.close()
        if self._created:
            self.tmp.unlink(missing_ok=True)
        _release(self._holder)
        self._holder = None
        if self.placed:
            # Roll back an output already renamed when a later one failed, but only if
            # the name still holds our file.
            with contextlib.suppress(OSError):
                if os.stat(self.final).st_ino == self.inode:
                    self.final.unlink()


def _write_failed(final: Path, exc: OSError) -> OutputError:
    # Name the output the user asked for, never the temporary sibling.
    return OutputError(
        f"cannot write {final}: {exc.strerror or exc}",
        path=str(final),
        errno=errno.errorcode.get(exc.errno or 0, exc.errno),
    )


def _discard_all(pending: list[_Pending]) -> None:
    for p in pending:
        p.discard()


@contextlib.contextmanager
def atomic_outputs(
    outputs: Sequence[str | os.PathLike[str]],
    inputs: Sequence[str | os.PathLike[str]] = (),
    *,
    force: bool = False,
    warn: Callable[[str], None] | None = None,
) -> Iterator[list[BinaryIO]]:
    """Streams for ``outputs``, which appear together when the block ends normally.

    :func:`check_outputs` runs first; then the temporary siblings an earlier writer
    killed with SIGKILL left for these outputs are removed (:func:`remove_stale_partials`),
    each named to ``warn``. Each output is written to a temporary sibling;
    at the end every one is fsynced, then they are renamed in the given order (data
    before its receipt) and their directories fsynced. On any exception (a signal
    handler that raises included) the temporary files are removed and an output
    already renamed is removed again: all outputs or none.
    """
    check_outputs(outputs, inputs, force=force)
    for output in outputs:
        for stale in remove_stale_partials(output):
            if warn is not None:
                warn(
                    f"removed {stale}: the temporary file of an earlier write of {output} "
                    "whose process was killed before it finished (no process held it)"
                )
    pending: list[_Pending] = []
    with ExitStack() as cleanup:
        cleanup.callback(_discard_all, pending)
        streams = []
        for path in outputs:
            pending.append(entry := _Pending(Path(path)))
            streams.append(entry.open())
        yield streams
        for p in pending:
            p.sync()
        for p in pending:
            p.place(force)
        placed, pending[:] = list(pending), []  # all in place: nothing to roll back
        for directory in dict.fromkeys(p.final.parent for p in placed):
            fsync_directory(directory)
