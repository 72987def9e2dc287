"""One table's design and content as the catalog observes them from system tables.

The design is everything that must match between the target and the generation for an
EXCHANGE to keep the target's meaning (engine, columns, keys, TTL, settings, indices,
projections, constraints); the content is the row count and digest of the stored
columns, computed by the server. See docs/publication-catalog.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dpone.contracts import canonical_json
from dpone.ports.composition_snapshot import Blocker
from dpone.publication.catalog.contents import PARTS_SQL
from dpone.publication.catalog.reads import CatalogReads, Read, text_field
from dpone.publication.catalog.sql import column_ttls, engine_clauses
from dpone.sql import in_list, quote_literal


def tables_filter(database: str, names: Sequence[str]) -> str:
    """The WHERE condition that picks the rows of ``names`` out of a system table."""
    return f"database = {quote_literal(database)} AND table IN {in_list(names)}"


# The names' system.tables rows: the design, the outgoing dependents, the byte counter
# and the metadata's last change (a generation's: the pool queries' window, :mod:`.pool_queries`).
_TABLES_SQL = (
    "SELECT name, toString(uuid) AS uuid, engine, engine_full, create_table_query, "
    "partition_key, sorting_key, primary_key, sampling_key, total_bytes, "
    "toUnixTimestamp(metadata_modification_time) AS made_s, "
    "dependencies_database, dependencies_table, loading_dependent_database, "
    "loading_dependent_table FROM system.tables WHERE database = {db} AND name IN {names}"
)


def database_read(database: str) -> Read:
    """The read of ``database``'s engine and UUID (no row: there is no such database)."""
    return (
        "database",
        "SELECT engine, toString(uuid) AS uuid FROM system.databases "
        f"WHERE name = {quote_literal(database)}",
    )


def tables_read(database: str, names: Sequence[str]) -> Read:
    """The read of the ``system.tables`` rows of ``names`` (each row naming its table)."""
    return "tables", _TABLES_SQL.format(db=quote_literal(database), names=in_list(names))


def table_reads(database: str, names: Sequence[str]) -> dict[str, str]:
    """The reads of the designs and active parts of ``names``, by purpose (SQL without
    FORMAT): one read of each system table for every name (a subquery costs the server
    1 to 3 ms of CPU however little it reads), each row naming its table."""
    in_tables = tables_filter(database, names)
    return {
        "columns": "SELECT table, name, type, default_kind, default_expression, "
        f"compression_codec FROM system.columns WHERE {in_tables} ORDER BY table, position",
        "indices": "SELECT table, name, type_full, expr, granularity FROM "
        f"system.data_skipping_indices WHERE {in_tables} ORDER BY table, name",
        "projections": f"SELECT table, name, type, query FROM system.projections WHERE {in_tables} "
        "ORDER BY table, name",
        "constraints": "SELECT table, name, toString(type) AS type, expression FROM "
        f"system.constraints WHERE {in_tables} ORDER BY table, name",
        "parts": PARTS_SQL.format(where=in_tables),
    }


def read_designs(
    reads: CatalogReads, sql: Mapping[str, str], rows: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """The design of each table of ``rows`` (its name to its system.tables row), from
    those rows and the four design reads of ``sql`` (:func:`table_reads`)."""
    found = {
        kind: _by_table(reads, reads.rows(kind, sql[kind]))
        for kind in ("columns", "indices", "projections", "constraints")
    }
    return {
        name: _design(reads, name, row, {kind: per.get(name, []) for kind, per in found.items()})
        for name, row in rows.items()
    }


def _by_table(
    reads: CatalogReads, rows: Sequence[Mapping[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """``rows`` grouped by their ``table`` field, which each loses (the order kept)."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        rest = {k: v for k, v in row.items() if k != "table"}
        grouped.setdefault(text_field(row, "table", reads), []).append(rest)
    return grouped


def _design(
    reads: CatalogReads,
    name: str,
    row: Mapping[str, Any],
    found: Mapping[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    """One table's design from its system.tables ``row`` and its rows of the four reads."""
    engine = text_field(row, "engine", reads)
    create = text_field(row, "create_table_query", reads)
    columns = found["columns"]
    if not columns:
        raise reads.malformed("columns", {"table": name})
    ttls = column_ttls(create)
    engine_full, table_ttl, settings = engine_clauses(text_field(row, "engine_full", reads))
    return {
        "engine": engine,
        "engine_full": engine_full,
        "columns": [_column_design(c, ttls, reads) for c in columns],
        "partition_key": text_field(row, "partition_key", reads),
        "sorting_key": text_field(row, "sorting_key", reads),
        "primary_key": text_field(row, "primary_key", reads),
        "sampling_key": text_field(row, "sampling_key", reads),
        "ttl": table_ttl,
        "settings": settings,
        "skipping_indices": found["indices"],
        "projections": found["projections"],
        "constraints": found["constraints"],
    }


def _column_design(
    column: Mapping[str, Any], ttls: Mapping[str, str], reads: CatalogReads
) -> dict[str, Any]:
    return {
        "name": text_field(column, "name", reads),
        "type": text_field(column, "type", reads),
        "default_kind": text_field(column, "default_kind", reads),
        "default_expression": text_field(column, "default_expression", reads),
        "codec": text_field(column, "compression_codec", reads),
        "ttl": ttls.get(text_field(column, "name", reads)),
    }


def design_sha256(design: Mapping[str, Any]) -> str:
    """SHA-256 of a design's canonical JSON: the digest an intent binds at prepare."""
    return canonical_json.sha256_hex(design)


def design_blockers(design: Mapping[str, Any], db_engine: str) -> list[Blocker]:
    """What in a design the publisher does not handle: one blocker each."""
    blockers = []
    if db_engine != "Atomic":
        blockers.append(Blocker("not_atomic", f"database engine is {db_engine}, not Atomic"))
    if design["engine"] != "MergeTree":
        blockers.append(
            Blocker("non_mergetree", f"table engine is {design['engine']}, not MergeTree")
        )
    for column in design["columns"]:
        if column["default_kind"]:
            blockers.append(
                Blocker(
                    "computed_column",
                    f"column {column['name']} is {column['default_kind']} {column['default_expression']}",
                )
            )
        if column["ttl"] is not None:
            blockers.append(Blocker("ttl", f"column {column['name']} has TTL {column['ttl']}"))
    if design["ttl"] is not None:
        blockers.append(Blocker("ttl", f"table TTL {design['ttl']}"))
    for projection in design["projections"]:
        blockers.append(Blocker("projection", f"projection {projection.get('name')}"))
    return blockers
