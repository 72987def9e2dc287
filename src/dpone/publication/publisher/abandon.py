"""``abandon``: end what a claim blocks once its database is proven gone.

A claimed record whose database was dropped (and maybe created again) on the same server
can never be proven PUBLISHED or NOT_PUBLISHED, so it stays COMMIT_UNKNOWN and blocks its
slot. :class:`Abandon` is the operator's way out: it reconciles a still open claim,
proves again, fresh, that the database and both tables are gone from this server and
the publisher closed, and notes the abandonment in the store; the record keeps its state
and history, and the note only stops it from holding the slot. See docs/publication.md
("A dropped database").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpone.contracts.composition_snapshot import SnapshotIntent, SnapshotState, exchange_query_id
from dpone.ports.composition_snapshot import StepNote
from dpone.publication.authority.login_account import LOGINS_UNOBSERVABLE
from dpone.publication.publisher.ports import PublisherPorts
from dpone.publication.publisher.receipts import SnapshotPublicationError
from dpone.publication.publisher.reconcile import PUBLISHER_LOGINS_UNOBSERVABLE, Reconcile
from dpone.publication.publisher.records import closure_document
from dpone.publication.store.admission import abandoned_key

P = SnapshotState


@dataclass(frozen=True)
class Abandonment:
    """An abandoned intent: its record (state, revision) and the note that frees its slot."""

    intent_sha256: str
    state: SnapshotState
    revision: int
    note: StepNote
    historical: bool  # abandoned before this call: the note is the earlier one

    def to_document(self) -> dict[str, Any]:
        """A JSON-ready description."""
        return {
            "intent_sha256": self.intent_sha256,
            "state": self.state.value,
            "revision": self.revision,
            "abandoned_at": self.note.at,
            "database_replaced": self.note.facts.get("database_replaced"),
            "historical": self.historical,
        }


class Abandon:
    """``abandon``: see the module doc."""

    def __init__(self, ports: PublisherPorts, reconciler: Reconcile) -> None:
        """Over the publisher's ports; ``reconciler`` resolves a still open claim first."""
        self.ports = ports
        self.reconciler = reconciler

    def abandon(self, intent_sha256: str) -> Abandonment:
        """Free the slot of a claim whose database was dropped on this server.

        Refuses (nothing noted) unless the record is, or reconciles to, COMMIT_UNKNOWN;
        the database and A and B are proven gone from the server the intent recorded
        (``database_not_replaced`` otherwise: reconcile or restore instead); and the
        publisher's closure is proven (``closure_unproven``).
        """
        key = abandoned_key(intent_sha256)
        earlier = self.ports.store.step_notes(key)
        loaded = self.ports.load(intent_sha256)
        if earlier:
            record = loaded.record
            return Abandonment(intent_sha256, record.state, record.revision, earlier[0], True)
        self.reconciler.require_retained(loaded.intent)
        intent = loaded.intent
        if loaded.record.state not in (P.EXCHANGE_INTENT, P.COMMIT_UNKNOWN):
            raise _not_abandonable(intent_sha256, loaded.record.state, loaded.record.revision)
        # Proven before anything is closed or moved: a claim whose database is not
        # proven dropped is left exactly as it was (reconcile is its way).
        replaced = self.ports.replaced_database(intent)
        if replaced is None:
            raise _not_replaced(intent)
        if loaded.record.state is P.EXCHANGE_INTENT:
            self.reconciler.reconcile(
                intent_sha256
            )  # closes the publisher: COMMIT_UNKNOWN, read below
        record = self.ports.load(intent_sha256).record
        if record.state is not P.COMMIT_UNKNOWN:
            raise _not_abandonable(intent_sha256, record.state, record.revision)
        closure = self.ports.close_publisher(intent)
        if closure is not None and LOGINS_UNOBSERVABLE in closure.facts.get("unproven", ()):
            raise _logins_unobservable(intent)
        if closure is None or not closure.proven:
            raise SnapshotPublicationError(
                f"the publisher of {intent_sha256} could not be proven closed; nothing was "
                "noted. Run the command again once the server answers",
                code="closure_unproven",
                intent_sha256=intent_sha256,
            )
        facts = {
            "step": "abandon",
            "database_replaced": replaced,
            "closure": closure_document(closure),
            "state": record.state.value,
            "revision": record.revision,
        }
        self.ports.store.observe(intent_sha256, facts)  # the record's own history says it too
        note = self.ports.store.note_step(key, {**facts, "intent_sha256": intent_sha256})
        return Abandonment(intent_sha256, record.state, record.revision, note, False)


def _logins_unobservable(intent: SnapshotIntent) -> Exception:
    user = intent.publisher.user
    return SnapshotPublicationError(
        f"the closer cannot read the server's session log, so a request of {user} (the "
        f"publisher of {intent.sha256}, whose EXCHANGE ran as query "
        f"{exchange_query_id(intent.sha256)}) held open outside its session cannot be "
        "seen; nothing was noted. Add the <session_log> section to the server's "
        "configuration, give the closer its SELECT on system.session_log (render the pool "
        "again), or accept the closure on process samples and the query log alone "
        "([publication] accept_ungated_ingest = true), then run the command again",
        code=PUBLISHER_LOGINS_UNOBSERVABLE,
        intent_sha256=intent.sha256,
        user=user,
        query_id=exchange_query_id(intent.sha256),
    )


def _not_replaced(intent: SnapshotIntent) -> Exception:
    return SnapshotPublicationError(
        f"the database {intent.database} of {intent.sha256} (UUID {intent.database_uuid}) "
        "is not proven dropped on the server it was staged on: the server reached is "
        "another one, a database of that UUID still exists (renamed), one of its tables "
        "exists somewhere, or this could not be read. Nothing was changed; restore what "
        "is missing and run `dpone snapshot reconcile`",
        code="database_not_replaced",
        intent_sha256=intent.sha256,
        database=intent.database,
        recorded_uuid=intent.database_uuid,
    )


def _not_abandonable(intent_sha256: str, state: SnapshotState, revision: int) -> Exception:
    return SnapshotPublicationError(
        f"{intent_sha256} is {state.value}@{revision}: only an unresolved claim "
        "(exchange_intent, commit_unknown) whose database was dropped is abandoned",
        code="not_abandonable",
        intent_sha256=intent_sha256,
        state=state.value,
    )
