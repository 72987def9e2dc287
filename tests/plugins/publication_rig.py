"""A publication rig on a module's own protected server: the server protecting
``faultdb`` (``managed``, one per module that uses it), a ``Rig`` on it, a ``Case`` (a
target holding A's rows with B's publication prepared), and staging as a leased
ingest user then preparing, as the drain-gate and quiescence tests do."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dpone.contracts.composition_snapshot import (
    DEFAULT_LIMITS,
    SnapshotRecord,
    SnapshotState,
)
from dpone.ports.clickhouse_request import Credentials
from dpone.ports.composition_snapshot import (
    AttemptRef,
    TargetSlot,
)
from dpone.publication.composition import (
    PublicationConfig,
    build_publication,
    staging_policy,
)
from dpone.publication.dispatch.executor import (
    ClickHouseSnapshotExecutor,
)
from dpone.publication.publisher import (
    ClickHouseAtomicSnapshotPublisher,
    PublicationReceipt,
)
from dpone.publication.store import SqliteSnapshotStore
from dpone.staging.service import StagedTable
from tests.publication_harness import Rig, Row, managed_publication_server

DB = "faultdb"


P = SnapshotState


A_ROWS: list[Row] = [(1, "a-one", 1), (2, "a-two", 2), (3, None, None)]


B_ROWS: list[Row] = [(1, "b-one", 10), (4, "b-four", 40)]


@pytest.fixture(scope="module")
def managed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int, int]]:
    """A managed server protecting ``faultdb``, as ``dpone server start --protect`` makes it."""
    yield from managed_publication_server(tmp_path_factory, "faults", DB)


class Case:
    """One target with A's rows and a prepared publication of B's rows."""

    def __init__(self, rig: Rig, target: str) -> None:
        self.rig = rig
        self.target = target
        self.a_generation = rig.stage(A_ROWS, f"{target}-a")
        self.a_uuid = rig.existing_target(self.a_generation, target, A_ROWS)
        self.b: StagedTable = rig.stage(B_ROWS, f"{target}-b")
        self.prepared = rig.prepare(self.b, target)
        self.intent = self.prepared.intent_sha256
        assert (self.prepared.target_uuid, self.prepared.generation_uuid) == (
            self.a_uuid,
            self.b.uuid,
        )

    def holds_a(self) -> bool:
        return (self.rig.uuid_of(self.target), self.rig.rows_of(self.target)) == (
            self.a_uuid,
            sorted(A_ROWS),
        )

    def holds_b(self) -> bool:
        return (self.rig.uuid_of(self.target), self.rig.rows_of(self.target)) == (
            self.b.uuid,
            sorted(B_ROWS),
        )

    def record(self) -> SnapshotRecord:
        return SnapshotRecord.from_bytes(self.store().load(self.intent).record_bytes)

    def store(self) -> SqliteSnapshotStore:
        return SqliteSnapshotStore(self.rig.store_path)

    def reconcile(self) -> PublicationReceipt:
        return self.rig.components().publisher.reconcile(self.intent)

    def last_facts(self) -> dict[str, object]:
        return dict(self.store().history(self.intent)[-1].facts)

    def publisher_with(
        self, executor: type[ClickHouseSnapshotExecutor]
    ) -> ClickHouseAtomicSnapshotPublisher:
        return self.rig.components(executor=executor).publisher


@pytest.fixture
def rig(managed: tuple[Path, int, int], tmp_path: Path) -> Rig:
    data_dir, http_port, tcp_port = managed
    return Rig(data_dir, http_port, tcp_port, DB, tmp_path)


def make_case(rig: Rig, request: pytest.FixtureRequest) -> Case:
    # One target per test: an unresolved record blocks its slot for later admissions.
    name = "t_" + "".join(c if c.isalnum() else "_" for c in request.node.name)[-40:].lower()
    return Case(rig, name)


@pytest.fixture
def case(rig: Rig, request: pytest.FixtureRequest) -> Case:
    return make_case(rig, request)


def state_of(receipt: PublicationReceipt) -> tuple[SnapshotState, int]:
    return receipt.state, receipt.revision


ROWS: list[Row] = [(1, "one", 1), (2, "two", 2)]


# A long T so that, unless the closure ends the session, it would still live when the
# held INSERT is released (prepare takes about a second): the test cannot pass by luck.
T = 5


@dataclass(frozen=True)
class Leased:
    staged: StagedTable
    credentials: Credentials
    lease_id: str


def stage(on: Rig, attempt_id: str, transport: str = "http", notes: bool = True) -> Leased:
    """Stage ``ROWS`` as a leased ingest user, noting the drain gate under its lease
    (``notes=False``: as a caller that passes no session notes)."""
    staged, ingest = on.stage_leased(
        ROWS,
        attempt_id,
        transport=transport,
        policy=staging_policy(DEFAULT_LIMITS, session_timeout_seconds=T),
        **({} if notes else {"session_notes": None}),
    )
    return Leased(staged, ingest.credentials, ingest.ref.lease_id)


def prepare(on: Rig, staged: StagedTable, target: str, accept_ungated: bool = False) -> str:
    config = PublicationConfig(
        on.data_dir,
        on.store_path,
        session_timeout_seconds=T,
        accept_ungated_ingest=accept_ungated,
    )
    publisher = build_publication(config, on.database).publisher
    receipt = publisher.prepare(
        AttemptRef(staged.journal_path, TargetSlot(on.database, target)), staged.journal_head
    )
    return receipt.state.value
