"""Rendering of driver rows to the canonical cells the type policy expects.

Shared by every source: the Python value a driver returns for a column of a given
declared type becomes ``None``, ``str`` (text or canonical text) or ``bytes``, by the
renderer the type registry (``dpone.typepolicy.registry``) pairs with that type.
Anything that cannot be rendered exactly is refused with the column.
"""

from __future__ import annotations

from collections.abc import Callable

from dpone.connectors.bulk_text_codec import Cell, CodecColumn, ColumnKind, field_encoders
from dpone.typepolicy import registry
from dpone.typepolicy.renderers import (
    ANY_CASE_UUID,
    CANONICAL_UUID,
    Renderer,
    RenderError,
    render_binary,
    render_float64,
    render_integer,
    render_text,
    render_uuid,
)
from dpone.typepolicy.source_types import SourceType

__all__ = ["FAMILIES", "RenderError", "Renderer", "field_for", "render_row", "renderer_for"]


def renderer_for(st: SourceType) -> Renderer:
    """The renderer of one declared type (the type policy decides acceptance)."""
    found = registry.declared_type(st.name)
    if found is None:
        raise RenderError(f"no renderer for SQL Server type {st}", code="unsupported_type")
    return found[1].rendering(st).render


# What each renderer renders, by name: how the compiled renderer
# (dpone.exporters.native_render) chooses the rules of a column.
FAMILIES: dict[Renderer, str] = {r.render: r.name for r in registry.RENDERINGS}


def _int_field(value: object) -> str:
    if type(value) is not int:
        raise TypeError
    return str(value)  # digits and a sign: nothing the codec escapes or refuses


def _float64_field(value: object) -> str:
    if type(value) is not float:
        raise TypeError
    return repr(value)  # as render_float64 renders it; no character the codec escapes or refuses


def _uuid_field(value: object) -> str:
    if type(value) is not str:
        raise TypeError
    if CANONICAL_UUID.fullmatch(value):
        return value
    if ANY_CASE_UUID.fullmatch(value):
        return value.lower()  # as render_uuid renders it
    raise TypeError


def field_for(st: SourceType, column: CodecColumn) -> Callable[[object], str]:
    """A driver value's field text in one step, for the common values of ``st``.

    For every value it takes it returns exactly what :func:`render_row` and the
    codec's ``encode_record`` make of it; any other value raises (any exception), and
    the caller renders that row again cell by cell, which names what is wrong.
    """
    render = renderer_for(st)
    encode = field_encoders([column])[0]
    if column.kind is not ColumnKind.RAW and render in (render_text, render_binary):
        return encode  # the renderer hands str or bytes through; the encoder checks the type
    fused: dict[Renderer, Callable[[object], str]] = {
        render_integer: _int_field,
        render_float64: _float64_field,
        render_uuid: _uuid_field,
    }
    direct = fused.get(render)
    if direct is not None:
        return direct

    def both(value: object) -> str:
        cell = render(value)
        if cell is None:
            raise TypeError
        return encode(cell)

    return both


def render_row(
    renderers: list[Renderer], names: list[str], row: tuple[object, ...], *, record: int
) -> list[Cell]:
    """Render driver row number ``record`` (1-based); NULL stays None.

    Errors name the record and the column, never the value (it may be confidential).
    """
    try:  # the common case in one pass; a failure is rendered again cell by cell to name it
        return [
            None if value is None else render(value)
            for render, value in zip(renderers, row, strict=True)
        ]
    except (RenderError, ArithmeticError, ValueError):
        pass
    cells: list[Cell] = []
    for render, name, value in zip(renderers, names, row, strict=True):
        if value is None:
            cells.append(None)
            continue
        try:
            cells.append(render(value))
        except (RenderError, ArithmeticError, ValueError) as exc:
            # Only our own reasons are known to be free of the value's text.
            reason = (
                exc.message
                if isinstance(exc, RenderError)
                else (f"cannot render this {type(value).__name__} value")
            )
            raise RenderError(
                f"record {record}, column {name!r}: {reason}",
                code="value_not_renderable",
                record=record,
                column=name,
            ) from exc
    return cells
