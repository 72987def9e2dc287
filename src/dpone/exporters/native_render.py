"""The compiled renderer (``native/render.c``): driver rows to bulk text records, in C.

Held to the Python renderer's bytes (``render.py``, which stays the specification): it
takes a row only when it gives exactly the record the Python path gives, and otherwise
*declines* it, for the Python path to render or refuse; it never decides a refusal.
Built by ``scripts/build_native.sh`` next to its source, one per Python version; where
it is missing, cannot be imported, or ``DPONE_NATIVE=0`` is set, the Python path renders
alone, with the same bytes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from dpone.connectors.bulk_text_codec import CodecColumn, ColumnKind
from dpone.exporters.render import FAMILIES, renderer_for
from dpone.preparation.native.rowbinary import ENV_SWITCH
from dpone.typepolicy import registry
from dpone.typepolicy.source_types import SourceType

if TYPE_CHECKING:
    from dpone.exporters.native import _render as _typed

__all__ = [
    "Declined",
    "SqliteRows",
    "available",
    "ops_for",
    "render_rows",
    "sqlite_rows",
    "unavailable_reason",
]

# The operation of each renderer family, as native/render.c numbers them, and the
# column kind each family's field has (the policy pairs them so): the registry's.
_OPS = {r.name: r.op for r in registry.RENDERINGS if r.op is not None}
_KINDS = {r.name: r.kind for r in registry.RENDERINGS if r.kind is not ColumnKind.RAW}


def _load() -> tuple[ModuleType | None, str | None]:
    """The extension module, or None and why not."""
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return None, f"is switched off ({ENV_SWITCH}={os.environ[ENV_SWITCH]})"
    try:
        from dpone.exporters.native import _render
    except ImportError as exc:
        # Not built (for this Python), or built but unloadable: the Python path renders.
        if isinstance(exc, ModuleNotFoundError) and exc.name == "dpone.exporters.native._render":
            return None, "is not built (scripts/build_native.sh builds it)"
        return None, f"cannot be loaded ({exc})"
    return _render, None


_MODULE, _UNAVAILABLE = _load()


def available() -> bool:
    """Whether the compiled renderer is built and loads in this Python."""
    return _MODULE is not None


def unavailable_reason() -> str | None:
    """Why the compiled renderer is not used ("is switched off (...)"), or None."""
    return None if _MODULE is not None else _UNAVAILABLE or "is not available"


def ops_for(types: Sequence[SourceType], columns: Sequence[CodecColumn]) -> bytes | None:
    """The compiled renderer's description of these columns, or None when it takes none
    of their rows (not available, no columns, a pairing the policy does not make, a
    family it has no operation for: the Python renderer writes them, never an error)."""
    if _MODULE is None or not types or len(types) != len(columns):
        return None
    ops = bytearray()
    for st, column in zip(types, columns, strict=True):
        family = FAMILIES.get(renderer_for(st))
        if family is None or _KINDS.get(family, ColumnKind.RAW) is not column.kind:
            return None
        op = _OPS.get(family)
        if op is None:
            return None
        ops.append(op)
    return bytes(ops)


class Declined(Exception):
    """The compiled SQLite reader met what sqlite3 itself would refuse: read through sqlite3."""


class SqliteRows:
    """A SELECT's rows read and rendered by the compiled reader (``native/sqlite_rows.c``).

    Each :meth:`read` gives the records of the next rows, up to a row the renderer
    declines, which comes back as the tuple sqlite3 would return, for the Python
    renderer. Where sqlite3 itself would raise (text that is not UTF-8, a fault while
    reading), it raises :class:`Declined`: the table is then read through sqlite3,
    which names the error.
    """

    def __init__(self, uri: str, sql: str, ops: bytes) -> None:
        if _MODULE is None:
            raise Declined("the compiled renderer is not available")
        try:
            self._rows: _typed.SqliteRows = _MODULE.SqliteRows(uri, sql, ops)
        except _MODULE.Declined as exc:
            raise Declined(str(exc)) from exc

    def read(self, max_rows: int) -> tuple[bytes, int, tuple[Any, ...] | None]:
        """(records, how many, the declined row or None); no records and no row: the end."""
        assert _MODULE is not None
        try:
            data, taken, declined = self._rows.read(max_rows)
        except _MODULE.Declined as exc:
            raise Declined(str(exc)) from exc
        return data, taken, declined

    def close(self) -> None:
        """Finish the statement and close the connection."""
        self._rows.close()


def sqlite_rows(uri: str, sql: str, ops: bytes) -> SqliteRows | None:
    """The compiled reader of ``sql`` on the SQLite database ``uri``, or None where the
    compiled renderer is not available; raises :class:`Declined` as :class:`SqliteRows`."""
    return SqliteRows(uri, sql, ops) if _MODULE is not None else None


def render_rows(ops: bytes, rows: list[Any], start: int, stop: int) -> tuple[bytes, int]:
    """The records of ``rows[start:stop]`` up to the first row declined, and its index
    (``stop`` when every row was taken)."""
    if _MODULE is None:
        return b"", start
    data, taken = _MODULE.render_rows(ops, rows, start, stop)
    return data, taken
