"""What every source kind provides: the ``Source`` it opens and the ``SourceKind`` plugin.

A kind is one module of this package defining ``KIND``, a :class:`SourceKind`: it reads
its own ``[sources.NAME]`` keys into its :class:`SourceConfig`, opens a DSN for
``dpone export``, and its :class:`Source` maps its own type names onto the type
policy's families (:mod:`dpone.typepolicy.families`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from dpone.contracts.schema import SourceColumn, SourceSchema
from dpone.errors import DponeError, PolicyError
from dpone.typepolicy import refusal

FETCH_ROWS = 10_000


class SourceError(DponeError):
    """The source could not be read."""

    code = "source_error"


class Source(Protocol):
    """What an exporter needs from a database."""

    @property
    def local_files(self) -> tuple[Path, ...]:
        """Files on this machine the source reads (an export must never write over them)."""
        ...

    def schema(self, table: str) -> SourceSchema:
        """The table's ordered columns, typed in the policy's names, and nullability."""
        ...

    def rows(self, table: str, schema: SourceSchema) -> Iterator[tuple[Any, ...]]:
        """Driver rows in the schema's column order."""
        ...


@runtime_checkable
class BatchedSource(Source, Protocol):
    """A source that also hands its rows as the driver fetches them, a list at a time."""

    def batches(self, table: str, schema: SourceSchema) -> Iterator[list[tuple[Any, ...]]]:
        """The rows of :meth:`rows`, in the same order, in lists of at most ``FETCH_ROWS``."""
        ...


@runtime_checkable
class SnapshotSource(Source, Protocol):
    """A source whose rows come from one snapshot it can name (recorded in the receipt)."""

    def snapshot_identity(self) -> Mapping[str, str] | None:
        """What identifies the snapshot the last rows were read from, once they all were."""
        ...


def row_batches(
    source: Source, table: str, schema: SourceSchema
) -> Iterator[list[tuple[Any, ...]]]:
    """The rows of ``source`` in lists: its own batches, or its rows gathered."""
    if isinstance(source, BatchedSource):
        yield from source.batches(table, schema)
        return
    rows = source.rows(table, schema)
    while batch := list(itertools.islice(rows, FETCH_ROWS)):
        yield batch


@dataclass(frozen=True)
class SourceConfig:
    """A configured source (``[sources.NAME]``); each kind's plugin subclasses it."""

    name: str
    kind: str

    def describe(self) -> str:
        """Where the source is, without any secret (a DSN of its kind's scheme)."""
        raise NotImplementedError

    def open(self) -> Source:
        """The source, with any secret read now (never kept in the configuration)."""
        raise NotImplementedError


class SourceFields(Protocol):
    """The keys of one ``[sources.NAME]`` table as a plugin reads them.

    The project's reader implements it: each problem is collected with its key path and
    line, and a method returns its default (None) for a missing or wrong value.
    """

    def has(self, key: str) -> bool:
        """Whether the table sets ``key``."""
        ...

    def text(self, key: str, *, required: bool = False) -> str | None:
        """A non-empty string."""
        ...

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        """One of ``choices``."""
        ...

    def port(self, key: str, default: int) -> int:
        """A TCP port (1-65535)."""
        ...

    def env_name(self, key: str, *, required: bool = False) -> str | None:
        """The name of an environment variable."""
        ...

    def path(self, key: str) -> Path | None:
        """A path, relative to the project file's directory."""
        ...

    def problem(self, key: str, message: str) -> None:
        """Report a problem of ``key`` (or of the table, for "")."""
        ...


class SourceKind(Protocol):
    """One kind of source: the plugin a module of this package names ``KIND``."""

    @property
    def kind(self) -> str:
        """The value of ``kind = ...`` that chooses it."""
        ...

    @property
    def schemes(self) -> tuple[str, ...]:
        """The DSN schemes ``dpone export --source`` opens it by (``sqlite`` in ``sqlite:``)."""
        ...

    @property
    def keys(self) -> tuple[str, ...]:
        """Its keys of ``[sources.NAME]`` besides ``kind``."""
        ...

    @property
    def hints(self) -> Mapping[str, str]:
        """What to write instead of a key it refuses (``password``: where secrets come from)."""
        ...

    def read(self, name: str, fields: SourceFields) -> SourceConfig | None:
        """Its configuration, or None when a problem was reported."""
        ...

    def from_dsn(self, dsn: str) -> Source:
        """The source a DSN of one of its schemes names."""
        ...


# A column to map: its name, the mapping of its declared type onto the policy's
# families (raising PolicyError when none holds it exactly), and whether it is nullable.
ColumnMapping = tuple[str, Callable[[], str], bool]


def mapped_schema(columns: Iterable[ColumnMapping]) -> SourceSchema:
    """The schema of ``columns`` (each its name, the mapping of its declared type onto
    the policy's families, and whether it is nullable); a mapping that refuses its type
    (``PolicyError``) is collected, and every refused column is named in one error
    (:func:`~dpone.typepolicy.refusal`), not only the first."""
    mapped: list[SourceColumn] = []
    refused: list[PolicyError] = []
    for name, family, nullable in columns:
        try:
            mapped.append(SourceColumn(name, family(), nullable=nullable))
        except PolicyError as exc:
            refused.append(exc)
    if refused:
        raise refusal(refused)
    return SourceSchema.of(mapped)
