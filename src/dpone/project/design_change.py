"""How a source's columns differ from its target's: the design change a refresh decides.

Pure: both sides are ``(name, ClickHouse type)`` pairs in column order, the target's
as ``system.columns`` shows them, the source's as the type policy plans them (its
overrides applied), which is exactly what a new generation would be created with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Columns = Sequence[tuple[str, str]]


def column_changes(target: Columns, source: Columns) -> list[dict[str, Any]]:
    """One entry per differing column: ``added``, ``removed``, ``type_changed``, or
    ``moved`` (same name and type at another position); empty when they agree."""
    before, after = dict(target), dict(source)
    changes: list[dict[str, Any]] = []
    for name, type_ in source:
        if name not in before:
            changes.append({"column": name, "change": "added", "source_type": type_})
        elif before[name] != type_:
            changes.append(
                {
                    "column": name,
                    "change": "type_changed",
                    "target_type": before[name],
                    "source_type": type_,
                }
            )
    for name, type_ in target:
        if name not in after:
            changes.append({"column": name, "change": "removed", "target_type": type_})
    kept_before = [n for n, _ in target if n in after]
    kept_after = [n for n, _ in source if n in before]
    if not changes and kept_before != kept_after:
        for position, (was, now) in enumerate(zip(kept_before, kept_after, strict=True)):
            if was != now:
                changes.append({"column": now, "change": "moved", "position": position + 1})
    return changes


def describe_change(change: dict[str, Any]) -> str:
    """One change in words, for an error message."""
    column, kind = change["column"], change["change"]
    if kind == "added":
        return f"column {column!r} added ({change['source_type']})"
    if kind == "removed":
        return f"column {column!r} removed (was {change['target_type']})"
    if kind == "type_changed":
        return f"column {column!r} changes type {change['target_type']} -> {change['source_type']}"
    return f"column {column!r} moved to position {change['position']}"
