"""Tables that write into (or follow the name of) a publication's tables: hidden writers.

A ``Buffer``, a ``Distributed`` or ``Remote`` table, an ``Alias`` or a ``Merge`` table
resolves the table it names by name, so after an EXCHANGE it acts on the other table.
Every table of the server whose engine can name another table and whose definition
names one of the publication's tables is a ``writer_table`` blocker naming the table and
its engine; materialized views are :mod:`.side_effects`'. See
docs/publication-catalog.md ("Tables that write into a table").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpone.ports.composition_snapshot import Blocker
from dpone.publication.catalog.reads import CatalogReads, Read, text_field
from dpone.publication.catalog.sql import definition_words, engine_arguments, string_literal
from dpone.sql import quote_literal

WRITER_REASON = "writer_table"
# Engines whose definition holds no reference to another table.
INERT_ENGINES = (
    "MaterializedView",
    "View",
    "Memory",
    "Log",
    "TinyLog",
    "StripeLog",
    "Null",
    "Set",
    "Join",
    "GenerateRandom",
    "EmbeddedRocksDB",
    "KeeperMap",
    "Dictionary",
)
_CANDIDATES_SQL = (
    "SELECT database, name, engine, engine_full, create_table_query FROM system.tables "
    "WHERE NOT endsWith(engine, 'MergeTree') AND NOT startsWith(engine, 'System') "
    "AND engine NOT IN ({inert}) ORDER BY database, name"
)
_VERBS = {
    "Buffer": "flushes its rows into",
    "Distributed": "sends inserts to",
    "Alias": "writes through to",
    "Merge": "reads by regular expression",
}


@dataclass(frozen=True)
class _Candidate:
    database: str
    name: str
    engine: str
    engine_full: str
    words: frozenset[str]


@dataclass(frozen=True)
class WriterTables:
    """Every table of the server that names one of the observed tables, read once."""

    found: Mapping[str, tuple[Blocker, ...]]  # observed table name -> its writer blockers

    @staticmethod
    def first_read() -> Read:
        """The candidates' read, the first of :meth:`read` (the second depends on it)."""
        inert = ", ".join(quote_literal(e) for e in INERT_ENGINES)
        return "writer_tables", _CANDIDATES_SQL.format(inert=inert)

    @classmethod
    def read(cls, reads: CatalogReads, database: str, names: Sequence[str]) -> WriterTables:
        """Read the candidate tables and decide which of them name ``database.<names>``."""
        candidates = [_candidate(row, reads) for row in reads.rows(*cls.first_read())]
        found: dict[str, list[Blocker]] = {name: [] for name in names}
        merges: list[tuple[_Candidate, str, tuple[str, str, str]]] = []
        for table in candidates:
            for name in names:
                if (table.database, table.name) == (database, name):
                    continue  # the observed table itself
                if table.engine == "Merge":
                    test = _merge_test(table, database, name)
                    if test is None:
                        found[name].append(_blocker(table, database, name, "(arguments unread)"))
                    else:
                        merges.append((table, name, test))
                elif _names(table, database, name):
                    found[name].append(_blocker(table, database, name))
        hits = _matches(reads, [test[:2] for _table, _name, test in merges])
        for (table, name, test), hit in zip(merges, hits, strict=True):
            if hit:
                found[name].append(_blocker(table, database, name, f"'{test[2]}'"))
        return cls({name: tuple(blockers) for name, blockers in found.items()})

    def blockers(self, name: str) -> list[Blocker]:
        """The writer-table blockers of one observed table."""
        return list(self.found.get(name, ()))


def _candidate(row: Mapping[str, Any], reads: CatalogReads) -> _Candidate:
    engine_full = text_field(row, "engine_full", reads)
    return _Candidate(
        database=text_field(row, "database", reads),
        name=text_field(row, "name", reads),
        engine=text_field(row, "engine", reads),
        engine_full=engine_full,
        words=definition_words(text_field(row, "create_table_query", reads), engine_full),
    )


def _names(table: _Candidate, database: str, name: str) -> bool:
    """Whether a definition refers to ``database.name``.

    It does when a value holds the qualified name (``Alias('db.t')``, a URL with an
    ``INSERT INTO db.t``), or when it names the table and either names the database or
    lives in it (``Buffer('db', 't', ...)``, ``Distributed(cluster, 'db', 't')``).
    """
    qualified = (f"{database}.{name}", f"`{database}`.`{name}`")
    if any(q in word for word in table.words for q in qualified):
        return True
    return name in table.words and (database in table.words or table.database == database)


def _merge_test(table: _Candidate, database: str, name: str) -> tuple[str, str, str] | None:
    """(database test, table test, table regexp) of a Merge table; None if it is unread.

    The database test is a SQL boolean over the observed database: equality with a
    named database, or ``match`` with ``REGEXP('...')``; the table regexp is matched by
    the server itself, so its dialect is exactly the one the Merge engine uses.
    """
    arguments = engine_arguments(table.engine_full)
    if arguments is None or len(arguments) != 2:
        return None
    pattern = string_literal(arguments[1])
    if pattern is None:
        return None
    first = arguments[0]
    named = string_literal(first)
    if named is not None:
        db_test = "1" if named == database else "0"
    elif len(first) == 4 and (first[0], first[1], first[3]) == ("REGEXP", "(", ")"):
        regexp = string_literal(first[2:3])
        if regexp is None:
            return None
        db_test = f"match({quote_literal(database)}, {quote_literal(regexp)})"
    else:
        return None
    return db_test, f"match({quote_literal(name)}, {quote_literal(pattern)})", pattern


def _matches(reads: CatalogReads, tests: Sequence[tuple[str, str]]) -> list[bool]:
    """The server's answer to each (database test AND table match), in one query."""
    if not tests:
        return []
    terms = ", ".join(f"({db} AND {table})" for db, table in tests)
    rows = reads.rows("merge_matches", f"SELECT [{terms}] AS hits")
    hits = rows[0].get("hits") if len(rows) == 1 else None
    if not isinstance(hits, list) or len(hits) != len(tests):
        raise reads.malformed("merge_matches", rows)
    if not all(isinstance(h, int) and not isinstance(h, bool) and h in (0, 1) for h in hits):
        raise reads.malformed("merge_matches", rows)
    return [h == 1 for h in hits]


def _blocker(table: _Candidate, database: str, name: str, how: str = "") -> Blocker:
    verb = _VERBS.get(table.engine, "names")
    tail = f" {how}" if how else ""
    return Blocker(
        WRITER_REASON,
        f"{table.engine} table {table.database}.{table.name} {verb} {database}.{name}{tail}"
        f" ({table.engine_full})",
    )
