"""The PostgreSQL source of ``bench/export.py``: its rows, and psycopg's bare fetch of them.

The cluster is the tests' throwaway one (``tests/postgres_cluster.py``); the table is
``bench/refresh.py``'s rows in PostgreSQL's types, loaded with ``COPY``, then frozen
and analysed so that no measured read is the one that sets the pages' hint bits.
``psycopg`` (the ``postgres`` extra) is imported only when used.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Any

TABLE = "items"
CREATE = (
    f"CREATE TABLE {TABLE} (id bigint NOT NULL PRIMARY KEY, qty int NOT NULL, name text, "
    "balance numeric(18, 2), updated_at timestamp(6) NOT NULL, external_id uuid, blob bytea)"
)
# What the export selects (its columns quoted, the table qualified), so both read alike.
SELECT = (
    'SELECT "id", "qty", "name", "balance", "updated_at", "external_id", "blob" '
    f"FROM public.{TABLE}"
)
# bench/refresh.py's words and more: quotes, a carriage return, a literal \N, bidi,
# a joined emoji and a byte-order mark (PostgreSQL's text holds no NUL).
WORDS = (
    "alpha",
    "beta\ttab",
    "gamma\nline",
    "delta\\slash",
    "ε-unicode",
    "",
    "zeta",
    'it\'s "quoted"',
    "cr\r\nlf",
    "\\N",
    "\u202eltr עברית",
    "👩\u200d👩\u200d👧 \ufeff",
)


def _rows(rows: int, seed: int) -> Iterator[tuple[Any, ...]]:
    rng = random.Random(seed)
    for i in range(1, rows + 1):
        when = (
            f"20{rng.randint(10, 29)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
            f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}."
            f"{rng.randint(0, 999_999):06d}"
        )
        yield (
            i,
            rng.randint(-(2**31), 2**31 - 1),
            None if i % 17 == 0 else f"{rng.choice(WORDS)} {i}",
            None if i % 23 == 0 else f"{rng.randint(-(10**15), 10**15) / 100:.2f}",
            when,
            str(uuid.UUID(int=rng.getrandbits(128))) if i % 5 else None,
            rng.randbytes(rng.randint(1, 12)) if i % 3 else None,
        )


def generate(url: str, rows: int, seed: int = 7) -> None:
    """A new table ``items`` of ``rows`` repeatable mixed rows in the database at ``url``
    (its password from ``PGPASSFILE``), loaded with ``COPY``."""
    import psycopg  # the postgres extra: the SQLite bench runs without it

    with psycopg.connect(url) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        conn.execute(CREATE)
        with conn.cursor() as cursor, cursor.copy(f"COPY {TABLE} FROM STDIN") as copy:
            for row in _rows(rows, seed):
                copy.write_row(row)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"VACUUM (FREEZE, ANALYZE) {TABLE}")


def bare_fetch(url: str, size: int) -> int:
    """Every row of ``items`` into Python tuples through a server-side binary cursor,
    ``fetchmany(size)`` (``size`` 0: iterating the cursor), nothing else."""
    import psycopg

    rows = 0
    with psycopg.connect(url) as conn, conn.cursor(name="bench_bare", binary=True) as cursor:
        cursor.execute(SELECT)
        if size == 0:
            for _ in cursor:
                rows += 1
        else:
            while batch := cursor.fetchmany(size):
                rows += len(batch)
    return rows
