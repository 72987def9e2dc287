"""The controlled native-protocol transport: a configured ``clickhouse-client`` child.

The spool goes to the child's stdin; stdout and stderr are read without blocking and
with caps; the absolute deadline is checked on every turn and before and after the
final wait. Credentials travel in an anonymous in-memory configuration file passed
as ``/dev/fd/N`` (:func:`client_config`): no file holding them is ever left on disk,
and they are never in argv or the environment of other processes. On any
BaseException (KeyboardInterrupt included) the child is killed and reaped first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import os
import re
import selectors
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, NoReturn
from xml.sax.saxutils import escape

from dpone.errors import ConfigurationError
from dpone.ports.clickhouse_errors import (
    ClickHouseServerError,
    DeadlineBeforeSend,
    NotSubmitted,
    OutcomeUnknown,
    TransportDeadline,
)
from dpone.ports.clickhouse_request import ClickHouseRequest, Credentials, Endpoint
from dpone.ports.clickhouse_result import QueryResult

OUTPUT_CAP = 64 * 1024
ERROR_CAP = 64 * 1024
PIPE_CHUNK = 64 * 1024
_CODE = re.compile(r"Code: (\d+)\. ")
NETWORK_ERROR = 210
ATTEMPT_TO_READ_AFTER_EOF = 32
UNEXPECTED_PACKET_FROM_SERVER = 102
# A failed name lookup: 198 DNS_ERROR (recent clients), Poco's "Host not found" (18.16).
_HOST_NOT_FOUND = re.compile(r"Not found address of host|Host not found")


class ClientTransport:
    """Executes :class:`ClickHouseRequest` objects through ``clickhouse-client``."""

    name = "client"

    def __init__(
        self,
        endpoint: Endpoint,
        credentials: Credentials,
        *,
        client_path: str = "clickhouse-client",
        clock: Callable[[], float] = time.monotonic,
        output_cap: int = OUTPUT_CAP,
        error_cap: int = ERROR_CAP,
    ) -> None:
        self.endpoint = endpoint
        self._credentials = credentials
        self.client_path = client_path
        self._clock = clock
        self._output_cap = output_cap
        self._error_cap = error_cap
        self._options: dict[str, bool] = {}

    def supports_setting(self, name: str, value: str) -> bool:
        """Whether this client accepts ``--name=value`` (old clients know fewer settings).

        Probed once per setting with ``--version``, which parses options and exits;
        ``--help`` cannot be used (some builds print it without end).
        """
        if name not in self._options:
            try:
                done = subprocess.run(
                    [self.client_path, f"--{name}={value}", "--version"],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=30,
                    check=False,
                )
            except FileNotFoundError as exc:
                raise NotSubmitted(
                    f"clickhouse-client not found at {self.client_path!r}", code="client_missing"
                ) from exc
            self._options[name] = done.returncode == 0
        return self._options[name]

    def passed_settings(self, request: ClickHouseRequest) -> tuple[dict[str, str], list[str]]:
        """Settings sent on the command line, and those this client cannot carry.

        A setting the client does not know cannot be sent by it; such settings must be
        pinned by the server's user profile (the managed server pins async_insert=0).
        """
        wanted = request.all_settings(http=False)
        passed = {k: v for k, v in wanted.items() if self.supports_setting(k, v)}
        return passed, sorted(set(wanted) - set(passed))

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        """Run ``request`` once; return its complete acknowledgment or raise a typed outcome."""
        if request.session_id is not None:
            # HTTP sessions do not exist in the native protocol: sending without one
            # would silently drop the guarantee the caller asked for.
            raise ConfigurationError(
                f"query {request.query_id} needs HTTP session {request.session_id!r}; "
                "the client transport cannot carry sessions (use the HTTP transport)",
                code="session_unsupported",
                query_id=request.query_id,
            )
        if self._clock() >= deadline:
            raise DeadlineBeforeSend(
                "deadline expired before starting the client", query_id=request.query_id
            )
        settings, unpassed = self.passed_settings(request)
        with client_config(self._credentials) as (config, config_fd):
            argv = [
                self.client_path,
                "--config-file",
                config,
                "--host",
                self.endpoint.host,
                "--port",
                str(self.endpoint.tcp_port),
                "--database",
                self.endpoint.database,
                "--query_id",
                request.query_id,
                *[f"--{name}={value}" for name, value in settings.items()],
                "--query",
                request.statement,
            ]
            result = self._run(argv, request, deadline, config_fd)
        return dataclasses.replace(result, settings_not_sent=tuple(unpassed))

    def _run(
        self, argv: list[str], request: ClickHouseRequest, deadline: float, config_fd: int
    ) -> QueryResult:
        # Opened before the child starts: an unreadable spool means nothing was sent.
        spool = _open_spool(request)
        try:
            return self._run_child(argv, request, deadline, spool, config_fd)
        finally:
            if spool is not None:
                spool.close()

    def _run_child(
        self,
        argv: list[str],
        request: ClickHouseRequest,
        deadline: float,
        spool: BinaryIO | None,
        config_fd: int,
    ) -> QueryResult:
        try:
            child = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if request.body is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(config_fd,),
            )
        except FileNotFoundError as exc:
            raise NotSubmitted(
                f"clickhouse-client not found at {self.client_path!r}",
                code="client_missing",
                query_id=request.query_id,
            ) from exc
        try:
            sent, digest, stdout, stderr = self._pump(child, request, deadline, spool)
            self._check_deadline(deadline, request, "before the final wait")
            try:
                code = child.wait(timeout=max(deadline - self._clock(), 0.001))
            except subprocess.TimeoutExpired as exc:
                raise TransportDeadline(
                    f"client for query {request.query_id} did not exit before the deadline",
                    submitted=True,
                    query_id=request.query_id,
                ) from exc
            # An already-exited process cannot authorize a late acknowledgment.
            self._check_deadline(deadline, request, "after the final wait")
        except BaseException:
            _kill_and_reap(child)
            raise
        _close_pipes(child)
        return self._acknowledge(request, code, stdout, stderr, sent, digest)

    def _pump(
        self,
        child: subprocess.Popen[bytes],
        request: ClickHouseRequest,
        deadline: float,
        spool: BinaryIO | None,
    ) -> tuple[int | None, str | None, bytes, bytes]:
        selector = selectors.DefaultSelector()
        assert child.stdout is not None and child.stderr is not None
        outputs = {child.stdout.fileno(): bytearray(), child.stderr.fileno(): bytearray()}
        caps = {child.stdout.fileno(): self._output_cap, child.stderr.fileno(): self._error_cap}
        for stream in (child.stdout, child.stderr):
            os.set_blocking(stream.fileno(), False)
            selector.register(stream.fileno(), selectors.EVENT_READ)
        pending = b""
        sent = 0
        digest = hashlib.sha256()
        if request.body is not None:
            assert child.stdin is not None
            os.set_blocking(child.stdin.fileno(), False)
            selector.register(child.stdin.fileno(), selectors.EVENT_WRITE)
        try:
            while selector.get_map():
                left = self._check_deadline(deadline, request, "while exchanging data")
                for key, _ in selector.select(timeout=left):
                    fd = int(key.fd)
                    if fd in outputs:
                        chunk = os.read(fd, PIPE_CHUNK)
                        if not chunk:
                            selector.unregister(fd)
                            continue
                        outputs[fd] += chunk
                        if len(outputs[fd]) > caps[fd]:
                            raise OutcomeUnknown(
                                f"client output for query {request.query_id} exceeds its cap of {caps[fd]} bytes",
                                code="output_budget_exceeded",
                                query_id=request.query_id,
                            )
                        continue
                    assert spool is not None and child.stdin is not None
                    if not pending:
                        pending = spool.read(PIPE_CHUNK)
                        if not pending:
                            selector.unregister(fd)
                            child.stdin.close()
                            continue
                        _check_streamed(request, sent, len(pending))
                        digest.update(pending)
                    try:
                        written = os.write(fd, pending)
                    except BrokenPipeError:
                        # The client stopped reading (it failed); its stderr says why.
                        selector.unregister(fd)
                        with contextlib.suppress(OSError):
                            child.stdin.close()
                        pending = b""
                        continue
                    except OSError as exc:
                        if exc.errno == errno.EAGAIN:
                            continue
                        raise
                    sent += written
                    pending = pending[written:]
        finally:
            selector.close()
        if request.body is None:
            return (
                None,
                None,
                bytes(outputs[child.stdout.fileno()]),
                bytes(outputs[child.stderr.fileno()]),
            )
        return (
            sent,
            digest.hexdigest(),
            bytes(outputs[child.stdout.fileno()]),
            bytes(outputs[child.stderr.fileno()]),
        )

    def _check_deadline(self, deadline: float, request: ClickHouseRequest, when: str) -> float:
        left = deadline - self._clock()
        if left <= 0:
            raise TransportDeadline(
                f"deadline expired {when} for query {request.query_id}",
                submitted=True,
                query_id=request.query_id,
            )
        return left

    def _acknowledge(
        self,
        request: ClickHouseRequest,
        code: int,
        stdout: bytes,
        stderr: bytes,
        sent: int | None,
        digest: str | None,
    ) -> QueryResult:
        text = stderr.decode("utf-8", errors="replace").strip()
        if code < 0:
            raise OutcomeUnknown(
                f"client for query {request.query_id} was killed by signal {-code}",
                code="client_killed",
                query_id=request.query_id,
                signal=-code,
            )
        if code != 0 or text:
            self._raise_failure(request, code, text)
        if request.body is not None and sent != Path(request.body).stat().st_size:
            raise OutcomeUnknown(
                f"only {sent} bytes of the spool reached the client",
                code="short_send",
                query_id=request.query_id,
            )
        return QueryResult(
            query_id=request.query_id,
            output=stdout,
            sent_bytes=sent,
            sent_sha256=digest,
            transport=self.name,
        )

    def _raise_failure(self, request: ClickHouseRequest, code: int, text: str) -> NoReturn:
        """The client exited non-zero or wrote to stderr: say what is known of the query."""
        match = _CODE.search(text)
        ch_code = int(match.group(1)) if match else None
        first = text.splitlines()[0][:400] if text else ""
        self._raise_if_not_sent(request, ch_code, text, first)
        where = self._where()
        from_server = "Received exception from server" in text or "Exception: Received from" in text
        hint = ""
        if ch_code == ATTEMPT_TO_READ_AFTER_EOF and not from_server:
            # What the Debian client says when an HTTP port closes on its Hello; the
            # same text can end a lost connection, so the outcome stays unknown.
            hint = (
                f" ({where} closed the connection without answering: if it is the HTTP "
                "port, give the native port (often 9000) as --tcp-port)"
            )
        if ch_code is None or not from_server:
            # The client's own failure (a lost connection, a reset): the server may
            # have run the query, so nothing is known until it is proven.
            raise OutcomeUnknown(
                f"client for query {request.query_id} exited {code}: {first}{hint}",
                code="client_failed",
                query_id=request.query_id,
                exit_code=code,
                client_code=ch_code,
            )
        raise ClickHouseServerError(
            f"query {request.query_id} failed with ClickHouse code {ch_code}: {first}",
            query_id=request.query_id,
            clickhouse_code=ch_code,
            exit_code=code,
        )

    def _raise_if_not_sent(
        self, request: ClickHouseRequest, ch_code: int | None, text: str, first: str
    ) -> None:
        """The failures that prove the query never reached a server: no connection,
        no such host, or a peer that does not speak the native protocol."""
        if ch_code == NETWORK_ERROR and "Connection refused" in text:
            raise NotSubmitted(
                f"client could not connect for query {request.query_id}: {first}",
                code="connect_failed",
                query_id=request.query_id,
            )
        if _HOST_NOT_FOUND.search(text):
            raise NotSubmitted(
                f"cannot resolve ClickHouse host {self.endpoint.host!r} for query "
                f"{request.query_id}: {first}",
                code="host_not_found",
                host=self.endpoint.host,
                query_id=request.query_id,
            )
        if ch_code == UNEXPECTED_PACKET_FROM_SERVER and "expected Hello" in text:
            # The native handshake failed: the query is sent only after the server's
            # Hello, so nothing was sent. Another protocol answered on that port.
            raise NotSubmitted(
                f"{self._where()} does not speak ClickHouse's native protocol (query "
                f"{request.query_id} was not sent): is --tcp-port the HTTP port? Give the "
                f"native port (often 9000) as --tcp-port and the HTTP port as --http-port",
                code="not_native_port",
                query_id=request.query_id,
                port=self.endpoint.tcp_port,
            )

    def _where(self) -> str:
        return f"{self.endpoint.host}:{self.endpoint.tcp_port}"


@contextmanager
def client_config(credentials: Credentials) -> Iterator[tuple[str, int]]:
    """clickhouse-client's configuration holding ``credentials``: ``(path, fd)``.

    The configuration lives in an anonymous memory file (``memfd_create``): it has no
    name in any file system, so nothing holding the password is left behind whatever
    ends dpone (SIGKILL included); it is gone once the last process holding it exits.
    The child reads it as ``/dev/fd/N`` (pass ``fd`` with ``pass_fds``): the Debian
    clickhouse-client 18.16 accepts that path, any extension is not needed.
    """
    fd = os.memfd_create("dpone-client-config", os.MFD_CLOEXEC)
    try:
        os.fchmod(fd, 0o600)  # reachable only through /proc by this user anyway; say so
        data = memoryview(
            (
                f"<config><user>{escape(credentials.user)}</user>"
                f"<password>{escape(credentials.password)}</password></config>\n"
            ).encode()
        )
        while data:
            data = data[os.write(fd, data) :]
        os.lseek(fd, 0, os.SEEK_SET)
        yield f"/dev/fd/{fd}", fd
    finally:
        os.close(fd)


def _open_spool(request: ClickHouseRequest) -> BinaryIO | None:
    """The request's spool, open, checked against its ceiling; refusals send nothing."""
    if request.body is None:
        request.check_body_size(len(request.statement.encode("utf-8")))
        return None
    try:
        spool = open(request.body, "rb")  # noqa: SIM115 - closed by the caller
    except OSError as exc:
        raise NotSubmitted(
            f"cannot open the body of query {request.query_id}: {exc.strerror or exc}",
            code="spool_unreadable",
            query_id=request.query_id,
            path=str(request.body),
        ) from exc
    try:
        request.check_body_size(os.fstat(spool.fileno()).st_size)
    except BaseException:
        spool.close()
        raise
    return spool


def _check_streamed(request: ClickHouseRequest, sent: int, more: int) -> None:
    """Refuse the next chunk before it leaves if it would pass the ceiling."""
    if request.max_body_bytes is not None and sent + more > request.max_body_bytes:
        raise OutcomeUnknown(
            f"the body of query {request.query_id} exceeded its ceiling of "
            f"{request.max_body_bytes} bytes while it was sent; part of it left",
            code="body_limit_exceeded",
            query_id=request.query_id,
            limit=request.max_body_bytes,
            sent=sent,
        )


def _kill_and_reap(child: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.kill()
    child.wait()
    _close_pipes(child)


def _close_pipes(child: subprocess.Popen[bytes]) -> None:
    for stream in (child.stdin, child.stdout, child.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
