"""The publication principal pool on the session's server: its registry and issuer
(``Pool``), intents and authorities built over it, and a slow query held running."""

from __future__ import annotations

import hashlib
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.contracts.composition_snapshot import (
    IntentPrincipal,
    SnapshotIntent,
    SnapshotLimits,
)
from dpone.localserver import ServerInfo
from dpone.localserver.principal_pool import (
    CLOSER_USER,
    pool_names,
)
from dpone.ports.clickhouse_request import Credentials, Endpoint
from dpone.ports.composition_snapshot import (
    PrincipalRef,
)
from dpone.publication.authority.lease_scope import LeaseScope
from dpone.publication.authority.snapshot_authority import ClosurePolicy, SnapshotAuthority
from dpone.publication.dispatch.dispatch_gate import DispatchGate
from dpone.publication.dispatch.dispatch_notes import SessionUse
from dpone.publication.principals.principal_issuers import (
    LocalPoolIssuer,
)
from tests import chhttp
from tests.fakes.registry import MemoryRunRegistry
from tests.plugins.managed_server import POOL_DATABASE

DB = POOL_DATABASE


@dataclass
class Pool:
    """The pool on the session's server: registry, issuer, credentials, endpoint."""

    info: ServerInfo
    registry: MemoryRunRegistry
    issuer: LocalPoolIssuer
    credentials: dict[str, Credentials]
    user_ids: dict[str, str]

    @property
    def port(self) -> int:
        return self.info.http_port

    def endpoint(self, port: int | None = None) -> Endpoint:
        return Endpoint("127.0.0.1", port or self.info.http_port, self.info.tcp_port, DB)


def make_pool(clickhouse: ServerInfo, pool_credentials: dict[str, Credentials]) -> Pool:
    """A fresh registry and pool issuer over the session server's declared pool."""
    chhttp.query(clickhouse.http_port, f"CREATE DATABASE IF NOT EXISTS {DB} ENGINE = Atomic")
    ids = {
        r["name"]: r["id"]
        for r in chhttp.rows(
            clickhouse.http_port, "SELECT name, toString(id) AS id FROM system.users"
        )
    }
    user_ids = {name: ids[name] for name in pool_names()}
    registry = MemoryRunRegistry()
    return Pool(
        clickhouse,
        registry,
        LocalPoolIssuer(registry, pool_credentials, user_ids),
        dict(pool_credentials),
        user_ids,
    )


def make_intent(
    publisher: PrincipalRef,
    ingest: PrincipalRef,
    generation: str,
    target: str,
    *,
    attempt_id: str = "a1",
) -> SnapshotIntent:
    """An intent as prepare would bind it (only what the executor and authority read)."""
    sha = hashlib.sha256(uuid.uuid4().bytes).hexdigest()
    limits = SnapshotLimits(10**6, 10**9, 10**9, 10**9, 10**10, 10**10)
    return SnapshotIntent(
        request_id=f"request-{attempt_id}",
        attempt_id=attempt_id,
        slot_epoch=1,
        attempt_epoch=1,
        server_id=str(uuid.uuid4()),
        server_id_source="dpone_identity_table",
        database=DB,
        database_uuid=str(uuid.uuid4()),
        target_table=target,
        target_uuid=str(uuid.uuid4()),
        generation_table=generation,
        generation_uuid=str(uuid.uuid4()),
        staged_event_sha256="e" * 64,
        semantic_id="f" * 64,
        design_sha256="d" * 64,
        receipt_sha256="c" * 64,
        source_rows=2,
        source_bytes=10,
        wire_bytes=20,
        content_digest="0" * 32,
        ingest=IntentPrincipal(ingest.user, ingest.user_uuid, ingest.lease_id),
        publisher=IntentPrincipal(publisher.user, publisher.user_uuid, publisher.lease_id),
        limits=limits,
        prepared_at="2026-01-01T00:00:00.000000Z",
        raw=b"",
        sha256=sha,
    )


def new_gate() -> DispatchGate:
    """A dispatch gate of its own (a lock file in a fresh temporary directory)."""
    return DispatchGate(Path(tempfile.mkdtemp(prefix="dpone-gate-")) / "gate.lock")


def scope_with(lease_id: str, sessions: list[str]) -> LeaseScope:
    """A lease's scope whose sessions were opened with no recorded answer (full wait)."""
    return LeaseScope(
        lease_id, 0, None, (), tuple(SessionUse(s, True, None) for s in sessions), False
    )


def make_authority(
    pool: Pool,
    gate: DispatchGate,
    sessions: dict[str, list[str]],
    *,
    policy: ClosurePolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
    endpoint: Endpoint | None = None,
) -> SnapshotAuthority:
    """An authority over ``pool``; ``endpoint``: where its closes and probes go."""
    return SnapshotAuthority(
        registry=pool.registry,
        issuer=pool.issuer,
        closer=HttpTransport(pool.endpoint(), pool.credentials[CLOSER_USER]),
        endpoint=endpoint or pool.endpoint(),
        probe_credentials=pool.issuer.role_credentials,
        scope_of=lambda ref: scope_with(ref.lease_id, sessions.get(ref.lease_id, [])),
        dispatch_gate=gate,
        policy=policy or ClosurePolicy(samples=3, sample_spacing_seconds=0.2),
        sleep=sleep,
    )


SLOW_TABLE = f"{POOL_DATABASE}.dpone_stage_slow_source"


class RunningQuery:
    """A slow query of ``user`` with a known id, running in a thread until killed."""

    def __init__(self, port: int, user: str, password: str, query_id: str) -> None:
        self.port, self.query_id = port, query_id
        self.answer: chhttp.Answer | None = None
        # A table every pool user that runs queries can read (ingest: dpone_stage_*).
        chhttp.query(
            port,
            f"CREATE TABLE IF NOT EXISTS {SLOW_TABLE} ENGINE = MergeTree ORDER BY n "
            "AS SELECT number AS n FROM numbers(240)",
        )
        sql = (
            f"SELECT sleepEachRow(0.5) FROM {SLOW_TABLE} SETTINGS max_block_size = 1, "
            "function_sleep_max_microseconds_per_block = 200000000"
        )
        url = f"http://127.0.0.1:{port}/?" + urllib.parse.urlencode({"query_id": query_id})
        self._request = urllib.request.Request(url, data=sql.encode(), method="POST")
        self._request.add_header("X-ClickHouse-User", user)
        self._request.add_header("X-ClickHouse-Key", password)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with urllib.request.urlopen(self._request, timeout=180) as response:
                self.answer = chhttp.Answer(response.status, response.read(), None)
        except urllib.error.HTTPError as exc:
            code = exc.headers.get("X-ClickHouse-Exception-Code")
            self.answer = chhttp.Answer(exc.code, exc.read(), code)

    def __enter__(self) -> RunningQuery:
        self.thread.start()
        give_up = time.monotonic() + 60
        while not chhttp.rows(
            self.port, f"SELECT 1 FROM system.processes WHERE query_id = '{self.query_id}'"
        ):
            assert self.thread.is_alive(), self.answer
            assert time.monotonic() < give_up, "the slow query never appeared"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        chhttp.query(self.port, f"KILL QUERY WHERE query_id = '{self.query_id}' SYNC")
        self.thread.join(timeout=60)
