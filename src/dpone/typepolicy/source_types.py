"""SQL Server column types as declared in a schema, parsed into name and parameters."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dpone.errors import PolicyError

_TYPE = re.compile(r"^\s*(?P<name>[A-Za-z][A-Za-z0-9 ]*?)\s*(?:\(\s*(?P<args>[^()]*?)\s*\))?\s*$")


@dataclass(frozen=True)
class SourceType:
    """A parsed SQL Server type: lowercase ``name`` and its parameters.

    ``max`` is kept as the string ``"max"``; numbers become ints.
    """

    name: str
    params: tuple[int | str, ...] = ()

    def __str__(self) -> str:
        if not self.params:
            return self.name
        return f"{self.name}({', '.join(str(p) for p in self.params)})"


def parse_source_type(text: str, *, column: str) -> SourceType:
    """Parse ``decimal(18, 4)``, ``nvarchar(max)``, ``datetime2`` and the like."""
    match = _TYPE.match(text)
    if match is None:
        raise PolicyError(
            f"column {column!r}: cannot read the SQL Server type {text!r}",
            code="invalid_source_type",
            column=column,
            source_type=text,
        )
    name = " ".join(match["name"].lower().split())
    params: list[int | str] = []
    if match["args"] is not None:
        for raw in match["args"].split(","):
            item = raw.strip().lower()
            if item == "max":
                params.append("max")
            elif item.isdigit():
                params.append(int(item))
            else:
                raise PolicyError(
                    f"column {column!r}: type parameter {raw.strip()!r} of {text!r} "
                    "is not a number or max",
                    code="invalid_source_type",
                    column=column,
                    source_type=text,
                )
    return SourceType(name, tuple(params))
