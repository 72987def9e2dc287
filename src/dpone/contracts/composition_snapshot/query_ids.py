"""The query and session ids a publication's statements run under, derived from what
they belong to so that a retry or a reconcile can find them again."""

from __future__ import annotations

QUERY_ID_PREFIX = "dpone-s00"


def exchange_query_id(intent_sha256: str) -> str:
    """The one query id of an intent's EXCHANGE: ``dpone-s00-<intent[:32]>-exchange``."""
    return f"{QUERY_ID_PREFIX}-{intent_sha256[:32]}-exchange"


def exchange_session_id(intent_sha256: str) -> str:
    """The HTTP session that serves as the drain gate of an intent's EXCHANGE."""
    return f"{QUERY_ID_PREFIX}-{intent_sha256[:32]}-session"


def create_target_query_id(generation_ref: str) -> str:
    """First publication: the query id of the empty target's CREATE (one per generation)."""
    return f"{QUERY_ID_PREFIX}-{generation_ref[:32]}-create-target"


def drop_created_target_query_id(generation_ref: str) -> str:
    """A refused first prepare: the query id of the DROP of the empty target it created."""
    return f"{QUERY_ID_PREFIX}-{generation_ref[:32]}-drop-created-target"
