"""A bounded HTTP/1.1 response for ``http.client``, installed via ``response_class``.

Standard library only. One metadata budget covers the status line, header lines,
chunk-size lines, chunk data terminators and trailers; the body has its own budget.
Every raw receive checks the absolute deadline before and after. Chunked framing is
checked exactly (unsigned hex sizes, CRLF after each chunk's data, the zero chunk,
the complete trailer); a fixed-length body must arrive in full. A budget is a cap
that raises, never truncates.
"""

from __future__ import annotations

import enum
import re
import socket
from collections.abc import Callable
from typing import Any

METADATA_BUDGET = 64 * 1024
BODY_BUDGET = 64 * 1024
RECV_BYTES = 16 * 1024
_STATUS = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?: ([^\r\n]*))?\r\n")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})\r\n")


class FramingError(Exception):
    """The response does not follow HTTP/1.1 framing or exceeds a budget."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class ResponseDeadline(Exception):
    """The absolute deadline expired while receiving the response."""


class _State(enum.IntEnum):
    STATUS = 0
    HEADERS = 1
    BODY = 2
    DONE = 3
    CLOSED = 4


class BoundedResponse:
    """Reads one response with byte budgets and an absolute deadline.

    ``remaining`` returns the seconds left until the caller's deadline (<= 0 means
    expired). The response reads from its own socket file, so closing the
    connection (``Connection: close``) does not detach reads from the deadline.
    """

    def __init__(
        self,
        sock: socket.socket,
        debuglevel: int = 0,
        method: str | None = None,
        url: str | None = None,
        *,
        remaining: Callable[[], float],
        metadata_budget: int = METADATA_BUDGET,
        body_budget: int = BODY_BUDGET,
    ) -> None:
        self._sock = sock
        self._file = sock.makefile("rb", buffering=0)  # owns a reference to the socket
        self._remaining = remaining
        self._metadata_left = metadata_budget
        self._body_budget = body_budget
        self._buffer = bytearray()
        self._state = _State.STATUS
        self.method = method
        self.version = 0  # 10 or 11 once the status line is read (http.client's spelling)
        self.status = 0
        self.reason = ""
        self.headers: list[tuple[str, str]] = []
        self.will_close = True
        self.body = b""
        self.complete = False
        self.raw_body = bytearray()

    # --- http.client's side of the contract

    def begin(self) -> None:
        """Read the status line and headers (called by ``HTTPConnection.getresponse``)."""
        line = self._line(metadata=True)
        match = _STATUS.fullmatch(line)
        if match is None:
            raise FramingError(f"malformed status line {line[:80]!r}", "bad_status_line")
        self.version = 10 + int(match.group(1))
        self.status = int(match.group(2))
        self.reason = (match.group(3) or b"").decode("latin-1")
        self._state = _State.HEADERS
        while True:
            line = self._line(metadata=True)
            if line == b"\r\n":
                break
            name, sep, value = line[:-2].partition(b":")
            if not sep or not name or name != name.strip():
                raise FramingError(f"malformed header line {line[:80]!r}", "bad_header")
            self.headers.append((name.decode("latin-1"), value.strip().decode("latin-1")))
        connection = (self.getheader("Connection") or "").lower()
        self.will_close = connection == "close"
        self._state = _State.BODY

    def getheader(self, name: str, default: str | None = None) -> str | None:
        wanted = name.lower()
        for key, value in self.headers:
            if key.lower() == wanted:
                return value
        return default

    def framed_exactly(self) -> bool:
        """The whole response was read and framed, and no byte arrived after it."""
        return self.complete and not self._buffer

    def isclosed(self) -> bool:
        return self._state is _State.CLOSED

    def close(self) -> None:
        if self._state is not _State.CLOSED:
            self._state = _State.CLOSED
            self._file.close()

    def read(self, amt: Any = None) -> bytes:  # pragma: no cover - not used by dpone
        raise NotImplementedError("use read_body()")

    # --- the body

    def read_body(self) -> bytes:
        """Read the whole body under its framing and budgets; sets ``complete``."""
        if self.method == "HEAD" or self.status in (204, 304) or 100 <= self.status < 200:
            self.complete = True
            return b""
        encoding = (self.getheader("Transfer-Encoding") or "").lower()
        length = self.getheader("Content-Length")
        if encoding and encoding != "chunked":
            raise FramingError(f"unsupported transfer encoding {encoding!r}", "bad_framing")
        if encoding == "chunked":
            if length is not None:
                raise FramingError("both Content-Length and chunked", "bad_framing")
            self._read_chunked()
        elif length is not None:
            if not length.isdigit():
                raise FramingError(f"invalid Content-Length {length!r}", "bad_framing")
            self._read_exact_body(int(length))
        else:
            raise FramingError(
                "response has neither Content-Length nor chunked framing", "bad_framing"
            )
        self.complete = True
        self._state = _State.DONE
        self.body = bytes(self.raw_body)
        return self.body

    def read_to_close(self) -> bytes:
        """Diagnosis only: what arrives until the peer closes, within the body budget.

        Never an acknowledgment (a body framed by the close cannot prove it is whole);
        used to recognise who answered when the framing is not HTTP/1.1's.
        """
        while len(self._buffer) <= self._body_budget:
            try:
                self._fill()
            except (FramingError, OSError):
                # The close, a reset or anything else ends the diagnosis: what arrived
                # before it is all there is to recognise.
                break
        return bytes(self._buffer[: self._body_budget])

    def _read_chunked(self) -> None:
        while True:
            line = self._line(metadata=True)
            match = _CHUNK_SIZE.fullmatch(line)
            if match is None:
                raise FramingError(f"malformed chunk size line {line[:40]!r}", "bad_chunk_size")
            size = int(match.group(1), 16)
            if size == 0:
                break
            self._body_bytes(size)
            terminator = self._take(2, metadata=True)
            if terminator != b"\r\n":
                raise FramingError("chunk data is not followed by CRLF", "bad_chunk_terminator")
        while self._line(metadata=True) != b"\r\n":  # trailers, up to the empty line
            pass

    def _read_exact_body(self, length: int) -> None:
        self._body_bytes(length)

    def _body_bytes(self, count: int) -> None:
        if len(self.raw_body) + count > self._body_budget:
            raise FramingError(
                f"response body exceeds its budget of {self._body_budget} bytes",
                "body_budget_exceeded",
            )
        self.raw_body += self._take(count, metadata=False)

    # --- raw reading

    def _fill(self) -> None:
        left = self._remaining()
        if left <= 0:
            raise ResponseDeadline("deadline expired before a receive")
        self._sock.settimeout(left)
        try:
            chunk = self._file.read(RECV_BYTES)
        except TimeoutError as exc:
            raise ResponseDeadline("deadline expired during a receive") from exc
        if self._remaining() <= 0:
            raise ResponseDeadline("deadline expired after a receive")
        if not chunk:
            raise FramingError("connection closed before the response was complete", "truncated")
        self._buffer += chunk

    def _line(self, *, metadata: bool) -> bytes:
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[: end + 1])
                self._spend(len(line), metadata)
                del self._buffer[: end + 1]
                if not line.endswith(b"\r\n"):
                    raise FramingError("line not terminated by CRLF", "bad_line_terminator")
                return line
            if metadata and len(self._buffer) > self._metadata_left:
                raise FramingError(
                    "response metadata exceeds its budget", "metadata_budget_exceeded"
                )
            self._fill()

    def _take(self, count: int, *, metadata: bool) -> bytes:
        while len(self._buffer) < count:
            if metadata and len(self._buffer) > self._metadata_left:
                raise FramingError(
                    "response metadata exceeds its budget", "metadata_budget_exceeded"
                )
            self._fill()
        data = bytes(self._buffer[:count])
        del self._buffer[:count]
        self._spend(count, metadata)
        return data

    def _spend(self, count: int, metadata: bool) -> None:
        if metadata:
            self._metadata_left -= count
            if self._metadata_left < 0:
                raise FramingError(
                    "response metadata exceeds its budget", "metadata_budget_exceeded"
                )
