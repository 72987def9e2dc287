"""The ClickHouse snapshot catalog: a fresh, complete observation of a publication's names.

Implements :class:`dpone.ports.composition_snapshot.ClickHouseSnapshotCatalog` over one
:class:`~dpone.ports.clickhouse.QueryPort` that carries the catalog principal's
credentials. Every call reads the server again (nothing is cached), every query has
its own read query id, and any failed, partial or malformed answer raises
:class:`CatalogUnobservable` instead of turning into an empty list or a zero. The
rules (what is part of the design, which side effects block, which grants count as
writers) are documented in docs/publication-catalog.md.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dpone.contracts import canonical_json
from dpone.contracts.preparation import rows_digest_sql
from dpone.errors import DeadlineError, StateError, TransportError
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_request import read
from dpone.ports.composition_snapshot import (
    Blocker,
    CatalogObservation,
    ExchangeEvent,
    TableObservation,
    TargetSlot,
)
from dpone.sql import quote_identifier, quote_literal

# Staging's private tables are named ``dpone_stage_<attempt>`` and carry the ownership
# comment ``dpone-owned attempt=... semantic=...`` on their first column (see
# dpone.staging.service); retained generations are recognised by both.
STAGE_PREFIX = "dpone_stage_"
OWNERSHIP_MARK = "dpone-owned "
DEFAULT_TIMEOUT_SECONDS = 60.0
# Privileges that let a holder change a table's rows, design or existence, and every
# group above them (ALL, ALTER, CREATE, DROP) through system.privileges.
WRITER_ROOTS = frozenset(
    {
        "INSERT",
        "ALTER TABLE",
        "CREATE TABLE",
        "DROP TABLE",
        "DROP DATABASE",
        "TRUNCATE",
        "OPTIMIZE",
        "UNDROP TABLE",
    }
)
STORED_KINDS = ("", "DEFAULT")  # the columns RowBinary carries, hence the content digest's
EVENT_TYPES = ("QueryStart", "QueryFinish", "ExceptionBeforeStart", "ExceptionWhileProcessing")
NIL_UUID = "00000000-0000-0000-0000-000000000000"
_PURPOSE = re.compile(r"[a-z0-9_]{1,32}")
_UNKNOWN_TABLE = 60


class CatalogUnobservable(StateError):
    """The catalog could not observe something completely; nothing was assumed instead."""

    code = "catalog_unobservable"


class ByteObservationMissing(CatalogUnobservable):
    """A table's byte counter is missing (NULL); a missing counter is never zero."""

    code = "byte_observation_missing"


def catalog_query_id(observation: str, purpose: str, sequence: int) -> str:
    """``dpone-s00-catalog-<observation>-<purpose>-<n>``: one id per catalog read."""
    if not re.fullmatch(r"[0-9a-f]{16}", observation) or not _PURPOSE.fullmatch(purpose):
        raise ValueError(f"catalog query id parts {observation!r}, {purpose!r} are not plain")
    return f"dpone-s00-catalog-{observation}-{purpose}-{sequence}"


# ---------------------------------------------------------------------- SQL text


_TOKEN = re.compile(
    r"""'(?:[^'\\]|\\.)*'|`(?:[^`\\]|\\.)*`|"(?:[^"\\]|\\.)*"|[A-Za-z_][A-Za-z0-9_]*|\s+|.""",
    re.S,
)


def _tokens(text: str) -> list[str]:
    tokens: list[str] = _TOKEN.findall(text)
    if "".join(tokens) != text:
        raise CatalogUnobservable(
            "SQL text the server showed cannot be tokenized", code="catalog_unobservable"
        )
    return tokens


def _split_top(tokens: Sequence[str], separator: str = ",") -> list[list[str]]:
    """Split at ``separator`` tokens outside any brackets."""
    parts: list[list[str]] = [[]]
    depth = 0
    for lexeme in tokens:
        if lexeme in "([{" and len(lexeme) == 1:
            depth += 1
        elif lexeme in ")]}" and len(lexeme) == 1:
            depth -= 1
        if lexeme == separator and depth == 0:
            parts.append([])
        else:
            parts[-1].append(lexeme)
    return parts


def _clause(tokens: Sequence[str], keyword: str, stops: Iterable[str]) -> str | None:
    """The text after the top-level word ``keyword`` up to the next top-level stop word."""
    stop = set(stops)
    depth, start = 0, None
    for index, lexeme in enumerate(tokens):
        if lexeme in "([{" and len(lexeme) == 1:
            depth += 1
        elif lexeme in ")]}" and len(lexeme) == 1:
            depth -= 1
        elif depth == 0 and start is None and lexeme == keyword:
            start = index + 1
        elif depth == 0 and start is not None and lexeme in stop:
            return "".join(tokens[start:index]).strip()
    return None if start is None else "".join(tokens[start:]).strip()


def column_elements(create_table_query: str) -> list[list[str]]:
    """The top-level elements of a CREATE TABLE's column list (columns, indices, ...)."""
    tokens = _tokens(create_table_query)
    try:
        opening = tokens.index("(")
    except ValueError as exc:
        raise CatalogUnobservable(
            "create_table_query has no column list", code="catalog_unobservable"
        ) from exc
    depth = 0
    for index in range(opening, len(tokens)):
        depth += {"(": 1, ")": -1}.get(tokens[index], 0)
        if depth == 0:
            return [e for e in _split_top(tokens[opening + 1 : index]) if "".join(e).strip()]
    raise CatalogUnobservable(
        "create_table_query's column list is not closed", code="catalog_unobservable"
    )


def column_ttls(create_table_query: str) -> dict[str, str]:
    """Column name -> its TTL expression, for every column that declares one.

    system.columns has no TTL; the formatted CREATE statement is the only source. A
    column element starts with its backquoted name; its TTL runs to a column-level
    SETTINGS clause or the end of the element (comments are single string tokens, so
    a comment mentioning TTL is never mistaken for one).
    """
    ttls: dict[str, str] = {}
    for element in column_elements(create_table_query):
        words = [t for t in element if not t.isspace()]
        if not words or not words[0].startswith("`"):
            continue  # INDEX, PROJECTION, CONSTRAINT, PRIMARY KEY elements
        ttl = _clause(element, "TTL", ("SETTINGS",))
        if ttl is not None:
            ttls[_unquote_identifier(words[0])] = ttl
    return ttls


def engine_clauses(engine_full: str) -> tuple[str, str | None, str | None]:
    """(engine_full without a COMMENT clause, table TTL, SETTINGS) from ``engine_full``."""
    tokens = _tokens(engine_full)
    depth, cut = 0, len(tokens)
    for index, lexeme in enumerate(tokens):
        depth += {"(": 1, ")": -1}.get(lexeme, 0)
        if depth == 0 and lexeme == "COMMENT":
            cut = index
            break
    kept = tokens[:cut]
    keys = ("PARTITION", "PRIMARY", "ORDER", "SAMPLE", "SETTINGS", "COMMENT")
    return "".join(kept).strip(), _clause(kept, "TTL", keys), _clause(kept, "SETTINGS", ())


def _unquote_identifier(lexeme: str) -> str:
    return re.sub(r"\\(.)", r"\1", lexeme[1:-1])


# ---------------------------------------------------------------------- grants


@dataclass(frozen=True)
class GrantRow:
    """One row of system.grants (for a user or a role)."""

    user_name: str | None
    role_name: str | None
    access_type: str
    database: str | None
    table: str | None
    is_partial_revoke: bool
    is_wildcard: bool

    def covers(self, database: str, table: str) -> bool:
        """Whether this grant's object includes ``database.table``."""
        if self.database is None:
            return True  # ON *.*
        if self.table is None:
            return (
                database.startswith(self.database)
                if self.is_wildcard
                else database == self.database
            )
        if database != self.database:
            return False
        return table.startswith(self.table) if self.is_wildcard else table == self.table


def writer_privileges(tree: Mapping[str, str | None]) -> frozenset[str]:
    """Every privilege that lets a holder write: the roots, their groups and subtypes.

    ``tree`` maps each privilege to its parent group (system.privileges).
    """

    def ancestors(name: str) -> list[str]:
        chain, seen = [], set()
        parent = tree.get(name)
        while parent is not None and parent not in seen:
            seen.add(parent)
            chain.append(parent)
            parent = tree.get(parent)
        return chain

    writers = set(WRITER_ROOTS)
    for name in tree:
        above = ancestors(name)
        if name in WRITER_ROOTS:
            writers.update(above)
        elif any(a in WRITER_ROOTS for a in above):
            writers.add(name)
    return frozenset(writers)


def writer_grant_blockers(
    grants: Iterable[GrantRow],
    role_grants: Iterable[tuple[str | None, str | None, str]],
    writers: frozenset[str],
    trusted_users: frozenset[str],
    database: str,
    table: str,
) -> list[Blocker]:
    """One ``writer_grant`` blocker per untrusted user that can write ``database.table``.

    ``role_grants`` are (user_name, role_name, granted_role_name) rows; roles granted to
    roles are followed. Partial revokes are not subtracted: a revoke that narrows a
    broader grant still leaves the broader grant reported (conservative, never silent).
    """
    holders: dict[str, set[str]] = {}  # role -> users holding it, directly or through roles
    members: dict[str, set[str]] = {}  # role -> roles that hold it
    for user, role, granted in role_grants:
        if user is not None:
            holders.setdefault(granted, set()).add(user)
        elif role is not None:
            members.setdefault(granted, set()).add(role)

    def users_of(role: str) -> set[str]:
        found, todo, seen = set(), [role], set()
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            found |= holders.get(current, set())
            todo.extend(members.get(current, set()))
        return found

    reported: dict[str, list[str]] = {}
    for grant in grants:
        if grant.is_partial_revoke or grant.access_type not in writers:
            continue
        if not grant.covers(database, table):
            continue
        via = f"{grant.access_type} ON {_grant_object(grant)}"
        if grant.user_name is not None:
            users = {grant.user_name}
        elif grant.role_name is not None:
            users = users_of(grant.role_name)
            via += f" through role {grant.role_name}"
        else:
            users = set()
        for user in sorted(users - trusted_users):
            reported.setdefault(user, []).append(via)
    return [
        Blocker(
            "writer_grant", f"user {user} can write {database}.{table}: {'; '.join(sorted(vias))}"
        )
        for user, vias in sorted(reported.items())
    ]


def _grant_object(grant: GrantRow) -> str:
    star = "*" if grant.is_wildcard else ""
    if grant.database is None:
        return "*.*"
    if grant.table is None:
        return f"{grant.database}{star}.*"
    return f"{grant.database}.{grant.table}{star}"


# ---------------------------------------------------------------------- the adapter


class ClickHouseSnapshotCatalog:
    """Observes a publication's target slot and generation table, fresh on every call.

    ``transport`` carries the catalog principal (read-only on the protected databases
    and the system tables, plus ``SYSTEM FLUSH LOGS``). ``trusted_users`` are the users
    whose write grants are controlled elsewhere (the administrator, the catalog, the
    closer and the leased pool); any other user able to write either table blocks.
    """

    def __init__(
        self,
        transport: QueryPort,
        *,
        trusted_users: frozenset[str],
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._transport = transport
        self.trusted_users = frozenset(trusted_users)
        self._timeout = timeout_seconds
        self._clock = clock

    def observe(self, slot: TargetSlot, generation_table: str) -> CatalogObservation:
        """Names, UUIDs, design, side effects, content and byte counters of both tables."""
        reads = _Reads(self._transport, self._clock() + self._timeout, self._clock)
        names = (slot.table, generation_table)
        if slot.table == generation_table:
            raise CatalogUnobservable(
                "the target and the generation are the same name",
                code="catalog_unobservable",
                table=slot.table,
            )
        databases = reads.rows(
            "database",
            f"SELECT engine FROM system.databases WHERE name = {quote_literal(slot.database)}",
        )
        if not databases:
            return CatalogObservation(None, None, 0, _now())
        db_engine = _text(databases[0], "engine", reads)
        tables = {
            _text(r, "name", reads): r
            for r in reads.rows(
                "tables", _TABLES_SQL.format(db=quote_literal(slot.database), names=_in(names))
            )
        }
        side = _SideEffects.read(reads, slot.database, names, self.trusted_users)
        observed = {
            name: self._table(reads, slot.database, name, tables[name], db_engine, side)
            for name in names
            if name in tables
        }
        retained = self._retained_bytes(reads, slot.database, generation_table)
        target_bytes = observed[slot.table].total_bytes if slot.table in observed else 0
        # The observation spans several queries: both names must still be what they were.
        again = {
            _text(r, "name", reads): _text(r, "uuid", reads)
            for r in reads.rows(
                "recheck",
                f"SELECT name, toString(uuid) AS uuid FROM system.tables WHERE database = "
                f"{quote_literal(slot.database)} AND name IN {_in(names)}",
            )
        }
        if again != {name: t.uuid for name, t in observed.items()}:
            raise CatalogUnobservable(
                f"{slot.database}.{slot.table} or {generation_table} changed during the observation",
                code="catalog_unobservable",
                database=slot.database,
            )
        return CatalogObservation(
            target=observed.get(slot.table),
            generation=observed.get(generation_table),
            retained_bytes=target_bytes + retained,
            observed_at=_now(),
        )

    def exchange_events(self, query_id: str) -> list[ExchangeEvent]:
        """Every query-log row of ``query_id`` after ``SYSTEM FLUSH LOGS``, in order."""
        reads = _Reads(self._transport, self._clock() + self._timeout, self._clock)
        reads.rows("flush", "SYSTEM FLUSH LOGS", output=False)
        rows = reads.rows(
            "query_log",
            "SELECT toString(type) AS type, exception_code, user, "
            "toString(event_time_microseconds, 'UTC') AS event_time FROM system.query_log "
            f"WHERE query_id = {quote_literal(query_id)} ORDER BY event_time_microseconds, type",
        )
        events = []
        for row in rows:
            kind, code = row.get("type"), row.get("exception_code")
            if kind not in EVENT_TYPES or not isinstance(code, int) or isinstance(code, bool):
                raise reads.malformed("query_log", row)
            events.append(
                ExchangeEvent(
                    kind, code, _text(row, "user", reads), _text(row, "event_time", reads)
                )
            )
        return events

    # ------------------------------------------------------------------ internals

    def _table(
        self,
        reads: _Reads,
        database: str,
        name: str,
        row: Mapping[str, Any],
        db_engine: str,
        side: _SideEffects,
    ) -> TableObservation:
        where = f"{quote_identifier(database)}.{quote_identifier(name)}"
        engine = _text(row, "engine", reads)
        create = _text(row, "create_table_query", reads)
        columns = reads.rows(
            "columns",
            "SELECT name, type, default_kind, default_expression, compression_codec FROM "
            f"system.columns WHERE database = {quote_literal(database)} AND table = "
            f"{quote_literal(name)} ORDER BY position",
        )
        if not columns:
            raise reads.malformed("columns", {"table": name})
        ttls = column_ttls(create)
        engine_full, table_ttl, settings = engine_clauses(_text(row, "engine_full", reads))
        in_table = f"database = {quote_literal(database)} AND table = {quote_literal(name)}"
        design: dict[str, Any] = {
            "engine": engine,
            "engine_full": engine_full,
            "columns": [
                {
                    "name": _text(c, "name", reads),
                    "type": _text(c, "type", reads),
                    "default_kind": _text(c, "default_kind", reads),
                    "default_expression": _text(c, "default_expression", reads),
                    "codec": _text(c, "compression_codec", reads),
                    "ttl": ttls.get(_text(c, "name", reads)),
                }
                for c in columns
            ],
            "partition_key": _text(row, "partition_key", reads),
            "sorting_key": _text(row, "sorting_key", reads),
            "primary_key": _text(row, "primary_key", reads),
            "sampling_key": _text(row, "sampling_key", reads),
            "ttl": table_ttl,
            "settings": settings,
            "skipping_indices": reads.rows(
                "indices",
                f"SELECT name, type_full, expr, granularity FROM system.data_skipping_indices "
                f"WHERE {in_table} ORDER BY name",
            ),
            "projections": reads.rows(
                "projections",
                f"SELECT name, type, query FROM system.projections WHERE {in_table} ORDER BY name",
            ),
            "constraints": reads.rows(
                "constraints",
                f"SELECT name, toString(type) AS type, expression FROM system.constraints "
                f"WHERE {in_table} ORDER BY name",
            ),
        }
        stored = [
            quote_identifier(c["name"])
            for c in design["columns"]
            if c["default_kind"] in STORED_KINDS
        ]
        if not stored:
            raise reads.malformed("columns", {"table": name, "stored_columns": 0})
        content = reads.rows(
            "content", f"SELECT count() AS rows, {rows_digest_sql(stored)} AS digest FROM {where}"
        )
        if len(content) != 1 or not re.fullmatch(r"[0-9a-f]{32}", str(content[0].get("digest"))):
            raise reads.malformed("content", content)
        parts = reads.rows(
            "parts", f"SELECT count() AS parts FROM system.parts WHERE {in_table} AND active"
        )
        total_bytes = row.get("total_bytes")
        if total_bytes is None:
            raise ByteObservationMissing(
                f"total_bytes of {database}.{name} is NULL: the byte observation is missing",
                database=database,
                table=name,
                query_id=reads.last_query_id,
            )
        blockers = [
            *_design_blockers(design, db_engine),
            *side.blockers(database, name, row, reads),
        ]
        return TableObservation(
            database=database,
            name=name,
            uuid=_text(row, "uuid", reads),
            engine=engine,
            design=design,
            design_sha256=canonical_json.sha256_hex(design),
            rows=_count(content[0], "rows", reads),
            content_digest=str(content[0]["digest"]),
            total_bytes=_count(row, "total_bytes", reads),
            parts=_count(parts[0] if len(parts) == 1 else {}, "parts", reads),
            blockers=tuple(blockers),
        )

    def _retained_bytes(self, reads: _Reads, database: str, generation_table: str) -> int:
        """Bytes of the dpone-owned staging tables in the database, except the generation."""
        db = quote_literal(database)
        prefix = quote_literal(STAGE_PREFIX)
        tables = reads.rows(
            "retained",
            f"SELECT name, total_bytes FROM system.tables WHERE database = {db} AND "
            f"startsWith(name, {prefix}) AND name != {quote_literal(generation_table)}",
        )
        marks = {
            _text(r, "table", reads): _text(r, "comment", reads)
            for r in reads.rows(
                "retained_marks",
                f"SELECT table, comment FROM system.columns WHERE database = {db} AND "
                f"startsWith(table, {prefix}) AND position = 1",
            )
        }
        total = 0
        for row in tables:
            name = _text(row, "name", reads)
            if not marks.get(name, "").startswith(OWNERSHIP_MARK):
                continue  # not dpone's: not a retained generation
            if row.get("total_bytes") is None:
                raise ByteObservationMissing(
                    f"total_bytes of retained generation {database}.{name} is NULL",
                    database=database,
                    table=name,
                    query_id=reads.last_query_id,
                )
            total += _count(row, "total_bytes", reads)
        return total


_TABLES_SQL = (
    "SELECT name, toString(uuid) AS uuid, engine, engine_full, create_table_query, "
    "partition_key, sorting_key, primary_key, sampling_key, total_bytes, "
    "dependencies_database, dependencies_table, loading_dependent_database, "
    "loading_dependent_table FROM system.tables WHERE database = {db} AND name IN {names}"
)


def _design_blockers(design: Mapping[str, Any], db_engine: str) -> list[Blocker]:
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


@dataclass(frozen=True)
class _SideEffects:
    """Server-wide facts read once per observation: views, refreshes, mutations, access."""

    incoming: list[dict[str, Any]]
    refreshable: frozenset[tuple[str, str]]
    mutations: list[dict[str, Any]]
    policies: list[dict[str, Any]]
    grants: list[GrantRow]
    role_grants: list[tuple[str | None, str | None, str]]
    writers: frozenset[str]
    trusted: frozenset[str]

    @classmethod
    def read(
        cls, reads: _Reads, database: str, names: tuple[str, str], trusted: frozenset[str]
    ) -> _SideEffects:
        db = quote_literal(database)
        incoming = reads.rows(
            "incoming_views",
            "SELECT database, name, target_table FROM system.tables WHERE engine = "
            f"'MaterializedView' AND target_database = {db} AND target_table IN {_in(names)}",
        )
        refreshable = frozenset(
            (_text(r, "database", reads), _text(r, "view", reads))
            for r in reads.rows("refreshes", "SELECT database, view FROM system.view_refreshes")
        )
        mutations = reads.rows(
            "mutations",
            f"SELECT table, mutation_id, command FROM system.mutations WHERE database = {db} "
            f"AND table IN {_in(names)} AND is_done = 0",
        )
        policies = reads.rows(
            "row_policies",
            "SELECT name, database, table FROM system.row_policies WHERE "
            f"database IN ({db}, '') AND table IN ({_in(names)[1:-1]}, '')",
        )
        grants = [
            GrantRow(
                user_name=_optional_text(r, "user_name", reads),
                role_name=_optional_text(r, "role_name", reads),
                access_type=_text(r, "access_type", reads),
                database=_optional_text(r, "database", reads),
                table=_optional_text(r, "table", reads),
                is_partial_revoke=bool(_count(r, "is_partial_revoke", reads)),
                is_wildcard=bool(_count(r, "is_wildcard", reads)),
            )
            for r in reads.rows(
                "grants",
                "SELECT user_name, role_name, access_type, database, table, is_partial_revoke, "
                "is_wildcard FROM system.grants",
            )
        ]
        role_grants = [
            (
                _optional_text(r, "user_name", reads),
                _optional_text(r, "role_name", reads),
                _text(r, "granted_role_name", reads),
            )
            for r in reads.rows(
                "role_grants",
                "SELECT user_name, role_name, granted_role_name FROM system.role_grants",
            )
        ]
        tree = {
            _text(r, "privilege", reads): _optional_text(r, "parent_group", reads)
            for r in reads.rows(
                "privileges",
                "SELECT toString(privilege) AS privilege, toString(parent_group) AS parent_group "
                "FROM system.privileges",
            )
        }
        if not tree:
            raise reads.malformed("privileges", [])
        return cls(
            incoming,
            refreshable,
            mutations,
            policies,
            grants,
            role_grants,
            writer_privileges(tree),
            trusted,
        )

    def blockers(
        self, database: str, name: str, row: Mapping[str, Any], reads: _Reads
    ) -> list[Blocker]:
        found: list[Blocker] = []
        for view in self.incoming:
            if _text(view, "target_table", reads) != name:
                continue
            key = (_text(view, "database", reads), _text(view, "name", reads))
            if key in self.refreshable:
                found.append(
                    Blocker(
                        "refreshable_mv", f"refreshable view {key[0]}.{key[1]} writes to {name}"
                    )
                )
            else:
                found.append(
                    Blocker("incoming_mv", f"materialized view {key[0]}.{key[1]} writes to {name}")
                )
        for kind, reason, what in (
            ("dependencies", "outgoing_mv", "materialized view {} reads from {}"),
            ("loading_dependent", "dictionary", "{} loads from {}"),
        ):
            dbs, objects = row.get(f"{kind}_database"), row.get(f"{kind}_table")
            if (
                not isinstance(dbs, list)
                or not isinstance(objects, list)
                or len(dbs) != len(objects)
            ):
                raise reads.malformed("tables", {"table": name, kind: [dbs, objects]})
            for db, obj in sorted(zip(dbs, objects, strict=True)):
                found.append(Blocker(reason, what.format(f"{db}.{obj}", name)))
        for mutation in self.mutations:
            if _text(mutation, "table", reads) == name:
                found.append(
                    Blocker(
                        "mutation_in_flight",
                        f"mutation {_text(mutation, 'mutation_id', reads)}: {_text(mutation, 'command', reads)}",
                    )
                )
        for policy in self.policies:
            if _text(policy, "table", reads) in (name, ""):
                found.append(Blocker("row_policy", f"row policy {_text(policy, 'name', reads)}"))
        found.extend(
            writer_grant_blockers(
                self.grants, self.role_grants, self.writers, self.trusted, database, name
            )
        )
        return found


class _Reads:
    """One observation's reads: one deadline, one id per query, typed failures."""

    def __init__(self, transport: QueryPort, deadline: float, clock: Callable[[], float]) -> None:
        self._transport = transport
        self._deadline = deadline
        self._clock = clock
        self._observation = uuid.uuid4().hex[:16]
        self._sequence = 0
        self.last_query_id = ""

    def rows(self, purpose: str, sql: str, *, output: bool = True) -> list[dict[str, Any]]:
        self._sequence += 1
        query_id = catalog_query_id(self._observation, purpose, self._sequence)
        self.last_query_id = query_id
        statement = f"{sql} FORMAT JSONEachRow" if output else sql
        try:
            result = self._transport.execute(read(statement, query_id), deadline=self._deadline)
            rows = result.json_rows()
        except (TransportError, DeadlineError) as exc:
            clickhouse_code = exc.details.get("clickhouse_code")
            raise CatalogUnobservable(
                f"catalog read {purpose} failed: {exc.message}",
                query_id=query_id,
                purpose=purpose,
                cause=exc.code,
                clickhouse_code=clickhouse_code,
                unknown_table=clickhouse_code == _UNKNOWN_TABLE,
            ) from exc
        if not output and rows:
            raise self.malformed(purpose, rows)
        return rows

    def malformed(self, purpose: str, value: object) -> CatalogUnobservable:
        return CatalogUnobservable(
            f"catalog read {purpose} answered something malformed: {value!r:.300}",
            query_id=self.last_query_id,
            purpose=purpose,
        )


def _text(row: Mapping[str, Any], key: str, reads: _Reads) -> str:
    value = row.get(key)
    if not isinstance(value, str):
        raise reads.malformed(key, row)
    return value


def _optional_text(row: Mapping[str, Any], key: str, reads: _Reads) -> str | None:
    if key not in row:
        raise reads.malformed(key, row)
    return None if row[key] is None else _text(row, key, reads)


def _count(row: Mapping[str, Any], key: str, reads: _Reads) -> int:
    value = row.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise reads.malformed(key, row)
    return value


def _in(names: Sequence[str]) -> str:
    return "(" + ", ".join(quote_literal(n) for n in names) + ")"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")
