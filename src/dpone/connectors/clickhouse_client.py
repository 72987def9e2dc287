"""The controlled native-protocol transport: a configured ``clickhouse-client`` child.

The spool goes to the child's stdin, its output is read without blocking and with caps,
and the absolute deadline is checked on every turn; credentials travel in an anonymous
in-memory configuration file passed as ``/dev/fd/N`` (:func:`client_config`), never on
disk, in argv or in the environment; on any BaseException the child is killed and
reaped first. A client too old to send every pinned setting sends a mutation only after
a read proved the server's profile pins them (``pinned_settings_not_sent`` otherwise).
See docs/transports.md ("Client transport").
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO, NoReturn

from dpone.connectors.clickhouse_client_config import client_config
from dpone.errors import ConfigurationError, DeadlineError, DponeError, stop_point
from dpone.ports.clickhouse_errors import (
    ClickHouseServerError,
    DeadlineBeforeSend,
    NotSubmitted,
    OutcomeUnknown,
    TransportDeadline,
)
from dpone.ports.clickhouse_request import (
    ClickHouseRequest,
    Credentials,
    Endpoint,
    RequestKind,
    read,
)
from dpone.ports.clickhouse_result import QueryResult
from dpone.sql import quote_literal

OUTPUT_CAP = 64 * 1024
ERROR_CAP = 64 * 1024
PIPE_CHUNK = 64 * 1024
_CODE = re.compile(r"Code: (\d+)\. ")
NETWORK_ERROR = 210
ATTEMPT_TO_READ_AFTER_EOF = 32
UNEXPECTED_PACKET_FROM_SERVER = 102
# A failed name lookup: 198 DNS_ERROR (recent clients), Poco's "Host not found" (18.16).
_HOST_NOT_FOUND = re.compile(r"Not found address of host|Host not found")
_VERSION = re.compile(rb"version (\d+)\.(\d+)")


class ClientUnusable(NotSubmitted):
    """The configured ``clickhouse-client`` cannot be run or asked what it is; nothing was sent."""

    code = "client_unusable"


class ClientProbeDeadline(TransportDeadline, NotSubmitted):
    """``clickhouse-client ... --version`` outlived the caller's deadline; nothing was sent."""

    code = "client_probe_deadline"


def probe_client(
    client_path: str,
    options: Sequence[str] = (),
    *,
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
    query_id: str | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``client_path OPTIONS --version`` within ``deadline``; it talks to no server.

    ``--version`` parses the options and exits (``--help`` cannot serve: some builds
    print it without end). A client that cannot be started, or that outlives the
    deadline (it is killed), raises a typed error naming the path (and ``query_id``,
    the request it was asked for).
    """
    argv = [client_path, *options, "--version"]
    left = deadline - clock()
    try:
        if left <= 0:  # already spent: start nothing
            raise subprocess.TimeoutExpired(argv, 0)
        return subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=left, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise ClientProbeDeadline(
            f"clickhouse-client at {client_path!r} did not answer --version within the "
            f"caller's deadline ({max(left, 0):.3g} s left); nothing was sent",
            submitted=False,
            client_path=client_path,
            **({"query_id": query_id} if query_id else {}),
        ) from exc
    except OSError as exc:
        raise cannot_start(client_path, exc, query_id) from exc


def cannot_start(client_path: str, exc: OSError, query_id: str | None) -> ClientUnusable:
    """The typed error for a client that could not be started (``exc`` is the cause)."""
    code, why = (
        ("client_missing", "was not found")
        if isinstance(exc, FileNotFoundError)
        else ("client_not_executable", "is not executable by this user")
        if isinstance(exc, PermissionError)
        else ("client_cannot_run", f"cannot be started ({exc.strerror or exc})")
    )
    sent = f"; query {query_id} was not sent" if query_id else ""
    return ClientUnusable(
        f"clickhouse-client at {client_path!r} {why}{sent}",
        code=code,
        client_path=client_path,
        errno=exc.errno,
        **({"query_id": query_id} if query_id else {}),
    )


def client_version(
    client_path: str, *, deadline: float, clock: Callable[[], float] = time.monotonic
) -> tuple[int, int]:
    """``clickhouse-client --version`` as (major, minor), asked within ``deadline``."""
    done = probe_client(client_path, deadline=deadline, clock=clock)
    found = _VERSION.search(done.stdout)
    if done.returncode != 0 or found is None:
        raise ClientUnusable(
            f"clickhouse-client at {client_path!r} does not say its version (exit "
            f"{done.returncode}: {done.stdout[:200]!r})",
            code="client_version_unknown",
            client_path=client_path,
            exit_code=done.returncode,
        )
    return int(found[1]), int(found[2])


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
        self._version: tuple[int, int] | None = None

    def supports_setting(
        self, name: str, value: str, *, deadline: float, query_id: str | None = None
    ) -> bool:
        """Whether this client accepts ``--name=value`` (old clients know fewer settings).

        Probed once per setting (:func:`probe_client`), within the caller's deadline.
        """
        if name not in self._options:
            option = [f"--{name}={value}"]
            done = probe_client(
                self.client_path, option, deadline=deadline, clock=self._clock, query_id=query_id
            )
            self._options[name] = done.returncode == 0
        return self._options[name]

    def version(self, *, deadline: float) -> tuple[int, int]:
        """This client's (major, minor) version, asked once (:func:`client_version`)."""
        if self._version is None:
            self._version = client_version(self.client_path, deadline=deadline, clock=self._clock)
        return self._version

    def passed_settings(
        self, request: ClickHouseRequest, *, deadline: float
    ) -> tuple[dict[str, str], list[str]]:
        """Settings sent on the command line, and those this client cannot carry."""
        wanted = request.all_settings(http=False)
        passed = {
            k: v
            for k, v in wanted.items()
            if self.supports_setting(k, v, deadline=deadline, query_id=request.query_id)
        }
        return passed, sorted(set(wanted) - set(passed))

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        """Run ``request`` once; return its complete acknowledgment or raise a typed outcome.

        ``settings_not_sent`` on the result names the pinned settings this client could
        not send; on a mutation each was proven to hold on the server before sending.
        """
        stop_point()  # a table run in a thread stops here when its run was signalled
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
        settings, unpassed = self.passed_settings(request, deadline=deadline)
        if unpassed and request.kind is RequestKind.MUTATION:
            self._prove_held(request, unpassed, deadline)
        with client_config(
            self._credentials, secure=self.endpoint.secure, ca_file=self.endpoint.ca_file
        ) as (config, config_fd):
            argv = [
                self.client_path,
                "--config-file",
                config,
                *(["--secure"] if self.endpoint.secure else []),
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

    def _prove_held(self, request: ClickHouseRequest, unpassed: list[str], deadline: float) -> None:
        """Refuse (nothing sent) a mutation unless the server gives every setting the
        client cannot send its pinned value: a pinned setting is never dropped silently.

        The proof is a read through this client as this user (``<query id>-settings``):
        ``system.settings`` shows what the user's profile makes of each setting, which
        is what the mutation will run with since the client cannot change it.
        """
        wanted = request.all_settings(http=False)
        names = ", ".join(quote_literal(name) for name in unpassed)
        probe = read(
            f"SELECT name, value FROM system.settings WHERE name IN ({names}) FORMAT JSONEachRow",
            f"{request.query_id}-settings",
        )
        try:
            rows = self.execute(probe, deadline=deadline).json_rows()
            version = self.version(deadline=deadline)
        except DeadlineError as exc:
            raise DeadlineBeforeSend(
                f"deadline expired while proving the pinned settings of query "
                f"{request.query_id} (probe {probe.query_id}); it was not sent",
                query_id=request.query_id,
            ) from exc
        except DponeError as exc:
            raise NotSubmitted(
                f"the pinned settings {', '.join(unpassed)} of query {request.query_id} could "
                f"not be proven on the server (probe {probe.query_id}: {exc}); it was not sent",
                code="pinned_settings_unproven",
                query_id=request.query_id,
                probe_query_id=probe.query_id,
                settings=unpassed,
            ) from exc
        observed = {str(row.get("name")): row.get("value") for row in rows}
        differ = {n: observed.get(n) for n in unpassed if observed.get(n) != wanted[n]}
        if differ:
            raise NotSubmitted(
                f"clickhouse-client {version[0]}.{version[1]} at {self.client_path!r} cannot "
                f"send the pinned settings {', '.join(f'{n}={wanted[n]}' for n in differ)} of "
                f"query {request.query_id}, and the server gives them "
                f"{', '.join(f'{n}={v}' for n, v in differ.items())} (None: unknown to it); "
                "nothing was sent: pin them in the user's settings profile, use a newer "
                "clickhouse-client, or --transport http",
                code="pinned_settings_not_sent",
                query_id=request.query_id,
                probe_query_id=probe.query_id,
                settings={n: wanted[n] for n in differ},
                observed=differ,
                client_version=f"{version[0]}.{version[1]}",
                client_path=self.client_path,
            )

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
        except OSError as exc:
            raise cannot_start(self.client_path, exc, request.query_id) from exc
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
        out, err = (bytes(outputs[stream.fileno()]) for stream in (child.stdout, child.stderr))
        if request.body is None:
            return None, None, out, err
        return sent, digest.hexdigest(), out, err

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
