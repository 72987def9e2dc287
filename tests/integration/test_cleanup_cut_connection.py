"""A cleanup DROP whose HTTP connection is cut (issue 26, item 4), on the real server.

The DROP goes out through the real HTTP transport to the real server; a TCP proxy
in between cuts that one connection without an answer (a real server does not do it
on request). The transport's failure is an unknown outcome (``OutcomeUnknown``), and
``drop_owned_table`` (``dpone.staging.cleanup``) keeps it unknown: the sending call's
return is journaled, the DROP's termination is looked for, and only a proof lets the
attempt end ``failed_cleaned``. Without one it ends ``retained_unknown`` with the table
listed, in ``attempts cleanup`` as in the service's own cleanup; when the server
cannot even be asked any more, the probe's transport failure ends it the same way.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.errors import DponeError, TransportError
from dpone.localserver import ServerInfo, admin_credentials
from dpone.ports.clickhouse_request import Endpoint
from dpone.preparation.validated_file_artifact import ContractValidatedFileArtifact
from dpone.staging.composition import StagingConfig, build_clickhouse_staging_components
from dpone.staging.recovery import cleanup_attempt
from tests.plugins.raw_http import read_all, read_request
from tests.plugins.staging import DB, crash, documents, export_hostile, table_exists

pytestmark = pytest.mark.usefixtures("staging_database")  # the databases, for every test here

# The COUNT answered by the proxy itself: a wrong count a real server never gives,
# the service's primary failure after its INSERT (so that its own cleanup drops).
WRONG_COUNT = b'HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\n{"n":1}\n'


class CuttingProxy:
    """A TCP proxy to the server that cuts the connection of one request.

    Every request is forwarded as it is, except the one whose URL names ``cut``: with
    ``forward`` the server receives it (and runs it) first, then the client's
    connection is closed without an answer; with ``refuse_after`` the listener closes
    at that moment, so every later request finds nothing listening. A request whose
    URL holds one of ``count_markers`` is answered by the proxy with :data:`WRONG_COUNT`.
    """

    def __init__(
        self,
        upstream: int,
        cut: str,
        *,
        forward: bool,
        refuse_after: bool,
        count_markers: tuple[bytes, ...] = (),
    ) -> None:
        self.upstream, self.forward, self.refuse_after = upstream, forward, refuse_after
        self.cut = f"query_id={cut}&".encode()
        self.count_markers = count_markers
        self.cuts = 0
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> CuttingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self._serve(client)  # one at a time: the transport sends one request at once

    def _serve(self, client: socket.socket) -> None:
        with client:
            request = read_request(client)
            head = request.split(b"\r\n", 1)[0]
            if any(marker in head for marker in self.count_markers):
                client.sendall(WRONG_COUNT)
                return
            if self.cut not in head or self.forward:
                with socket.create_connection(("127.0.0.1", self.upstream)) as upstream:
                    upstream.sendall(request)
                    answer = read_all(upstream)
            if self.cut in head:
                self.cuts += 1
                if self.refuse_after:
                    self._server.close()
                with contextlib.suppress(OSError):
                    client.shutdown(socket.SHUT_RDWR)
                return
            client.sendall(answer)


def through(proxy: CuttingProxy, info: ServerInfo) -> HttpTransport:
    """The real HTTP transport, as the administrator, to the server behind ``proxy``."""
    endpoint = Endpoint("127.0.0.1", proxy.port, info.tcp_port, DB)
    return HttpTransport(endpoint, admin_credentials(info.data_dir))


def drop_remote(docs: list[dict[str, Any]], drop_id: str) -> list[dict[str, Any]]:
    return [
        d["remote"]
        for d in docs
        if d["outcome"] == "termination_observed" and d["remote"]["query_id"] == drop_id
    ]


CASES = [
    # The server never got the DROP: nothing proves it ran or not; the table stays.
    pytest.param(False, False, "retained_unknown", "unknown", id="drop_never_ran"),
    # The server ran the DROP, its answer was lost: the query log proves it.
    pytest.param(True, False, "failed_cleaned", "finished_ok", id="drop_ran_answer_lost"),
    # The DROP's connection cut, then the server cannot be asked at all.
    pytest.param(False, True, "retained_unknown", None, id="server_gone_after_the_cut"),
]


@pytest.mark.parametrize(("forward", "refuse_after", "ending", "termination"), CASES)
def test_attempts_cleanup_keeps_a_cut_drop_unknown(
    clickhouse: ServerInfo,
    tmp_path: Path,
    forward: bool,
    refuse_after: bool,
    ending: str,
    termination: str | None,
) -> None:
    work = tmp_path / "work"
    path, receipt, _ = export_hostile(tmp_path)
    attempt = f"cut-{int(forward)}{int(refuse_after)}"
    drop_id = f"dpone-b02-{attempt}-drop"
    table = f"dpone_stage_cut_h{int(forward)}{int(refuse_after)}"
    # The stage died after its INSERT was acknowledged: cleanup needs no proof, only the DROP.
    before = crash(clickhouse, work, (path, receipt), attempt, "acked", 600.0)
    uuid = next(d["observed_ownership"]["table_uuid"] for d in before if "observed_ownership" in d)
    with CuttingProxy(
        clickhouse.http_port, drop_id, forward=forward, refuse_after=refuse_after
    ) as proxy:
        if refuse_after:
            with pytest.raises(DponeError) as caught:
                cleanup_attempt(through(proxy, clickhouse), work, attempt, database=DB)
            assert isinstance(caught.value, TransportError)  # the probe could not connect
            state = None
        else:
            state = cleanup_attempt(through(proxy, clickhouse), work, attempt, database=DB).state
        assert proxy.cuts == 1
    docs = documents(work / attempt)
    intent = next(d for d in docs if d["outcome"] == "drop_intent")
    assert intent["query"] == {"kind": "drop", "query_id": drop_id}
    # The sending call returned without an answer: journaled, never read as success.
    [returned] = [d["returned"] for d in docs if "returned" in d]
    assert returned["query_id"] == drop_id
    last = docs[-1]
    assert last["state"] == ending and state in (None, ending)
    assert table_exists(clickhouse, table) is (ending == "retained_unknown")
    if termination is not None:
        [remote] = drop_remote(docs, drop_id)
        assert remote["termination"] == termination
    if ending == "retained_unknown":
        assert last["cleanup_inventory"]["table"] == {"database": DB, "table": table, "uuid": uuid}
    if refuse_after:
        assert (last["outcome"], last["error_code"]) == ("terminal", caught.value.code)
        assert drop_remote(docs, drop_id) == []  # nothing could be observed at all


@pytest.mark.parametrize(("forward", "refuse_after", "ending", "termination"), CASES[:2])
def test_the_services_own_cleanup_keeps_a_cut_drop_unknown(
    clickhouse: ServerInfo,
    tmp_path: Path,
    forward: bool,
    refuse_after: bool,
    ending: str,
    termination: str,
) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    work = tmp_path / "work"
    attempt = f"svc-cut-{int(forward)}"
    drop_id = f"dpone-b02-{attempt}-drop"
    with CuttingProxy(
        clickhouse.http_port,
        drop_id,
        forward=forward,
        refuse_after=refuse_after,
        # The batch read after the INSERT, answered in another shape, is then asked
        # read by read: its COUNT answers the wrong count.
        count_markers=(b"-read-verify-", b"-read-count-"),
    ) as proxy:
        endpoint = Endpoint("127.0.0.1", proxy.port, clickhouse.tcp_port, DB)
        cfg = StagingConfig(endpoint, admin_credentials(clickhouse.data_dir), work)
        with pytest.raises(DponeError) as caught:
            build_clickhouse_staging_components(cfg).validated_file.stage(
                ContractValidatedFileArtifact(path, receipt), attempt
            )
        assert proxy.cuts == 1
    assert caught.value.code == "count_mismatch"
    docs = documents(work / attempt)
    [returned] = [d["returned"] for d in docs if "returned" in d]
    assert returned["query_id"] == drop_id
    [remote] = drop_remote(docs, drop_id)
    assert remote["termination"] == termination
    assert docs[-1]["state"] == ending
    table = f"dpone_stage_svc_hcut_h{int(forward)}"
    assert table_exists(clickhouse, table) is (ending == "retained_unknown")
    if ending == "retained_unknown":
        assert docs[-1]["cleanup_inventory"]["table"]["table"] == table
