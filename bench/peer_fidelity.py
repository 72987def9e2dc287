"""Whether each value of the bench's ``items`` table survived a tool, exactly.

Method: every row of each target is read back over HTTP (as the administrator),
``ORDER BY id``, with each value rendered by the server so that no text escaping is
involved: text and bytes as ``hex()``, timestamps as ``toString(x, 'UTC')``, numbers
and GUIDs as ``toString()``. The SQLite source is read in the same order and the two
are merged by ``id``; each value is classed (exact, truncated, base64 text, NULL lost,
...) in Python against the source value. The ClickHouse types come from
``system.columns``.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import sqlite3
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

from dpone.ports.clickhouse_request import Credentials

ColumnResult = dict[str, Any]
METHOD = (
    "every row of each target read back over HTTP ORDER BY id, values rendered by the "
    "server (text and bytes as hex(), timestamps as toString(x, 'UTC'), numbers and GUIDs "
    "as toString()), merged by id with the SQLite rows and classed in Python (a decimal "
    "against the shortest decimal of the REAL SQLite's NUMERIC affinity stored); types "
    "from system.columns"
)


def _select(port: int, credentials: Credentials, query: str) -> Iterator[list[str | None]]:
    """The rows of ``query`` as TabSeparated fields (``None`` for NULL), streamed."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    headers = {"X-ClickHouse-User": credentials.user, "X-ClickHouse-Key": credentials.password}
    params = urllib.parse.urlencode({"query": query + " FORMAT TabSeparated"})
    conn.request("GET", "/?" + params, headers=headers)
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"{query[:80]}: {response.read().decode(errors='replace')[:300]}")
    # Every field is hex, digits, a timestamp or \N: nothing TabSeparated escapes.
    for line in response:
        yield [None if f == "\\N" else f for f in line.decode().rstrip("\n").split("\t")]
    conn.close()


def column_types(port: int, credentials: Credentials, table: str) -> dict[str, str]:
    """Each column's ClickHouse type, as ``system.columns`` shows it."""
    database, name = table.split(".")
    query = (
        f"SELECT hex(name), hex(type) FROM system.columns WHERE database = '{database}' "
        f"AND table = '{name}' ORDER BY position"
    )
    rows = _select(port, credentials, query)
    return {bytes.fromhex(str(n)).decode(): bytes.fromhex(str(t)).decode() for n, t in rows}


def _rendered(column: str, clickhouse_type: str) -> str:
    # String (text or bytes) as hex: the exact bytes, with nothing for TSV to escape.
    if "String" in clickhouse_type:
        return f"hex(`{column}`)"
    if "DateTime" in clickhouse_type:
        return f"toString(`{column}`, 'UTC')"
    return f"toString(`{column}`)"


def _timestamp(got: bytes, want: Any) -> str:
    text = got.decode()
    fraction = text.partition(".")[2]
    padded = text + ("." if not fraction else "") + "0" * (7 - len(fraction))
    if padded == want:
        return "exact"
    if want.startswith(text) and len(fraction) < 7:
        return f"fraction truncated to {len(fraction)} digits"
    return "differs"


def _guid(got: bytes, want: Any) -> str:
    text = got.decode(errors="replace")
    if text == want:
        return "exact (text)"
    try:
        same = uuid.UUID(text) == uuid.UUID(want)
    except ValueError:
        same = False
    return "same GUID, text case not kept" if same else "differs"


def _binary(got: bytes, want: Any) -> str:
    if got == want:
        return "bytes exact"
    try:
        if base64.b64decode(got, validate=True) == want:
            return "base64 text of the bytes"
    except (binascii.Error, ValueError):
        pass
    if got.decode("ascii", errors="replace").lower() == want.hex():
        return "hex text of the bytes"
    return "differs"


def _decimal(got: bytes, want: Any) -> str:
    # SQLite's NUMERIC affinity stores these values as REAL (or INTEGER): the source's
    # value is the shortest decimal that reads back as that double.
    expected = Decimal(repr(want)) if isinstance(want, float) else Decimal(want)
    return "exact" if Decimal(got.decode()) == expected else "differs"


def _classer(source_type: str) -> Callable[[bytes, Any], str]:
    kind = source_type.lower().split("(")[0]
    if kind in ("bigint", "int"):
        return lambda got, want: "exact" if int(got) == want else "differs"
    if kind == "decimal":
        return _decimal
    if kind == "datetime2":
        return _timestamp
    if kind == "uniqueidentifier":
        return _guid
    if kind == "varbinary":
        return _binary
    return lambda got, want: "exact" if got == want.encode() else "differs"


def _class_one(
    classer: Callable[[bytes, Any], str], is_string: bool, got: str | None, want: Any
) -> str:
    if got is None or want is None:
        if got is None and want is None:
            return "NULL kept"
        return "NULL lost" if got is not None else "NULL invented"
    return classer(bytes.fromhex(got) if is_string else got.encode(), want)


def _merged(
    rows: Iterator[tuple[Any, ...]], target: Iterator[list[str | None]]
) -> Iterator[tuple[tuple[Any, ...], list[str | None] | None]]:
    """Each source row with the target's row of the same ``id`` (``None``: none)."""
    pending = next(target, None)
    for row in rows:
        while pending is not None and int(str(pending[0])) < row[0]:
            pending = next(target, None)  # a row the source lacks: the counts show it
        if pending is not None and int(str(pending[0])) == row[0]:
            yield row, pending
            pending = next(target, None)
        else:
            yield row, None


def compare_table(
    source: Path, port: int, credentials: Credentials, table: str
) -> dict[str, ColumnResult]:
    """Each column's ClickHouse type and the classes of its values against the source."""
    types = column_types(port, credentials, table)
    conn = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        declared = [(str(r[1]), str(r[2])) for r in conn.execute("PRAGMA table_info(items)")]
        kept = [name for name, _ in declared if name in types]
        rendered = ", ".join(_rendered(name, types[name]) for name in kept)
        target = _select(port, credentials, f"SELECT {rendered} FROM {table} ORDER BY id")
        classers = [_classer(kind) for _, kind in declared]
        counts: list[Counter[str]] = [Counter() for _ in declared]
        present = [name in types for name, _ in declared]
        strings = ["String" in types.get(name, "") for name, _ in declared]
        for row, got in _merged(conn.execute("SELECT * FROM items ORDER BY id"), target):
            fields = iter(got or [])
            for i, want in enumerate(row):
                if not present[i]:
                    counts[i]["column missing"] += 1
                elif got is None:
                    counts[i]["row missing"] += 1
                else:
                    got_i = next(fields)
                    counts[i][_class_one(classers[i], strings[i], got_i, want)] += 1
    finally:
        conn.close()
    return {
        name: {"source": kind, "type": types.get(name, "-"), "classes": counts[i]}
        for i, (name, kind) in enumerate(declared)
    }


def row_count(port: int, credentials: Credentials, table: str) -> int:
    """The target's rows (a row the source lacks is counted here, not in the classes)."""
    return int(str(next(_select(port, credentials, f"SELECT count() FROM {table}"))[0]))


def compare(
    source: Path, port: int, credentials: Credentials, tables: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """Each tool's target (by tool name): its rows and :func:`compare_table`'s columns."""
    return {
        tool: {
            "rows": row_count(port, credentials, table),
            "columns": compare_table(source, port, credentials, table),
        }
        for tool, table in tables.items()
    }


def _summary(classes: Counter[str]) -> str:
    total = sum(classes.values())
    if set(classes) <= {"exact", "exact (text)", "bytes exact", "NULL kept"}:
        nulls = classes["NULL kept"]
        return f"all {total:,} exact" + (f" ({nulls:,} NULL kept)" if nulls else "")
    return ", ".join(f"{n:,} {name}" for name, n in classes.most_common())


def print_fidelity(results: dict[str, dict[str, Any]], source_rows: int) -> None:
    """The fidelity table: per column, each tool's ClickHouse type and its values."""
    tools = list(results)
    print(f"\nfidelity against the SQLite source. Method: {METHOD}.")
    print(
        f"rows: source {source_rows:,}, "
        + ", ".join(f"{tool} {results[tool]['rows']:,}" for tool in tools)
    )
    print("| column | source type | " + " | ".join(f"{t} type | {t} values" for t in tools) + " |")
    print("|---|---|" + "---|---|" * len(tools))
    first: dict[str, ColumnResult] = results[tools[0]]["columns"]
    for column, facts in first.items():
        cells = [f"`{column}`", facts["source"]]
        for tool in tools:
            result = results[tool]["columns"][column]
            cells += [f"`{result['type']}`", _summary(result["classes"])]
        print("| " + " | ".join(cells) + " |")
