"""File durability: a file appears under its final name only complete and synced.

Two mechanisms share one temporary-file discipline (a hidden sibling created with
``O_EXCL``, fsynced, renamed, the directory fsynced):

- :func:`atomic_output` / :func:`atomic_write_bytes` replace one file of dpone's own
  (server state, configuration);
- :func:`atomic_outputs` writes a user's outputs (an exported file and its receipt):
  every output is checked against every input and against the other outputs before
  anything is written, an existing output is refused unless ``force``, and the outputs
  are renamed together at the end, in order, so either all of them appear or none.

Both create their files 0600: an export is a whole table in plain text, and a receipt
describes it. :func:`private_directories` creates the directories dpone makes for them
0700 (an existing directory keeps the mode its owner gave it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
from collections.abc import Iterator, Sequence
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

    Only the caller knows whether the writer is gone; removing one a live writer still
    uses would make its rename fail.
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
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
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
    """One output being written: its final name, temporary sibling and stream."""

    def __init__(self, final: Path) -> None:
        self.final = final
        self.tmp = _temporary_sibling(final)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            fd = os.open(self.tmp, flags, PRIVATE_FILE_MODE)
        except OSError as exc:
            raise _write_failed(final, exc) from exc
        self.stream: BinaryIO = os.fdopen(fd, "wb")
        self.inode = os.fstat(fd).st_ino
        self.placed = False

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

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self.stream.close()
        self.tmp.unlink(missing_ok=True)
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
) -> Iterator[list[BinaryIO]]:
    """Streams for ``outputs``, which appear together when the block ends normally.

    :func:`check_outputs` runs first. Each output is written to a temporary sibling;
    at the end every one is fsynced, then they are renamed in the given order (data
    before its receipt) and their directories fsynced. On any exception (a signal
    handler that raises included) the temporary files are removed and an output
    already renamed is removed again: all outputs or none.
    """
    check_outputs(outputs, inputs, force=force)
    pending: list[_Pending] = []
    with ExitStack() as cleanup:
        cleanup.callback(_discard_all, pending)
        for path in outputs:
            pending.append(_Pending(Path(path)))
        yield [p.stream for p in pending]
        for p in pending:
            p.sync()
        for p in pending:
            p.place(force)
        placed, pending[:] = list(pending), []  # all in place: nothing to roll back
        for directory in dict.fromkeys(p.final.parent for p in placed):
            fsync_directory(directory)
