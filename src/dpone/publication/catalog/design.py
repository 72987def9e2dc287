"""One table's design and content as the catalog observes them from system tables.

The design is everything that must match between the target and the generation for an
EXCHANGE to keep the target's meaning (engine, columns, keys, TTL, settings, indices,
projections, constraints); the content is the row count and digest of the stored
columns, computed by the server. See docs/publication-catalog.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpone.ports.composition_snapshot import Blocker
from dpone.publication.catalog.contents import PARTS_SQL
from dpone.publication.catalog.reads import CatalogReads, text_field
from dpone.publication.catalog.sql import column_ttls, engine_clauses
from dpone.sql import quote_literal


def table_filter(database: str, name: str) -> str:
    """The WHERE condition that picks one table's rows out of a system table."""
    return f"database = {quote_literal(database)} AND table = {quote_literal(name)}"


def table_reads(database: str, name: str) -> dict[str, str]:
    """The reads of one table's design and active parts, by purpose (SQL without FORMAT)."""
    in_table = table_filter(database, name)
    return {
        "columns": "SELECT name, type, default_kind, default_expression, compression_codec FROM "
        f"system.columns WHERE {in_table} ORDER BY position",
        "indices": "SELECT name, type_full, expr, granularity FROM system.data_skipping_indices "
        f"WHERE {in_table} ORDER BY name",
        "projections": f"SELECT name, type, query FROM system.projections WHERE {in_table} "
        "ORDER BY name",
        "constraints": "SELECT name, toString(type) AS type, expression FROM system.constraints "
        f"WHERE {in_table} ORDER BY name",
        "parts": PARTS_SQL.format(where=in_table),
    }


def read_design(
    reads: CatalogReads, database: str, name: str, row: Mapping[str, Any]
) -> dict[str, Any]:
    """The design of ``database.name`` from its system.tables ``row`` and four more reads."""
    engine = text_field(row, "engine", reads)
    create = text_field(row, "create_table_query", reads)
    sql = table_reads(database, name)
    columns = reads.rows("columns", sql["columns"])
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
        "skipping_indices": reads.rows("indices", sql["indices"]),
        "projections": reads.rows("projections", sql["projections"]),
        "constraints": reads.rows("constraints", sql["constraints"]),
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
