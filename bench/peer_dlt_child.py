"""The dlt side of ``bench.refresh --peer dlt``: one dlt replace of the SQLite ``items`` table.

Run by the dlt venv's interpreter (see :mod:`bench.peer_dlt`), never by dpone's: it
imports dlt, pyarrow and SQLAlchemy and nothing of dpone or of the bench package.

Usage: ``python peer_dlt_child.py SOURCE_DB PIPELINES_DIR [TABLE ...]`` (default: the
table ``items``; several tables load in one pipeline run), with the destination in
dlt's own environment variables (``DESTINATION__CLICKHOUSE__CREDENTIALS__*``), which the
parent sets for this process only: the password is never in argv.

The path is dlt's fastest documented one: the ``sql_database`` source with the
``pyarrow`` backend, parquet load files, ``replace`` with the ``staging-optimized``
strategy (a staging table, then ``EXCHANGE TABLES``).

The table adapter: SQLite's SQLAlchemy reflection knows ``bigint``, ``int``,
``nvarchar`` and ``decimal``, but gives ``datetime2(7)``, ``uniqueidentifier`` and
``varbinary`` SQLite's NUMERIC affinity, so the pyarrow backend would try to read
timestamps, GUIDs and bytes as decimals and fail. The adapter gives those columns the
SQLAlchemy types SQL Server's own dialect reflects for them (``DATETIME2`` is a
``DateTime``, ``UNIQUEIDENTIFIER`` text as pyodbc returns it, ``VARBINARY`` a
``LargeBinary``): what dlt would see reading the same table from SQL Server.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from typing import Any

import dlt  # type: ignore[import-not-found]
import sqlalchemy as sa  # type: ignore[import-not-found]
from dlt.sources.sql_database import sql_database  # type: ignore[import-not-found]

TABLE = "items"
DATASET = "peer"


def _declared_types(source: str, table: str) -> dict[str, str]:
    """Each column's declared type name, lower case, as the CREATE TABLE wrote it."""
    with sqlite3.connect(f"file:{source}?mode=ro", uri=True) as conn:
        rows = conn.execute(f"PRAGMA table_info({table})").fetchall()
    conn.close()
    return {str(row[1]): str(row[2]).lower().split("(")[0].strip() for row in rows}


def _adapter(declared: dict[str, str]) -> Any:
    """A table adapter giving SQL Server's types that SQLite reflection misreads."""
    replacements: dict[str, Any] = {
        "datetime2": sa.DateTime(),
        "uniqueidentifier": sa.String(36),
        "varbinary": sa.LargeBinary(),
    }

    def adapt(table: Any) -> None:
        for column in table.columns:
            replacement = replacements.get(declared.get(column.name, ""))
            if replacement is not None:
                column.type = replacement

    return adapt


def main() -> None:
    """Run one replace of ``items`` into the configured ClickHouse database."""
    source, pipelines_dir, tables = sys.argv[1], sys.argv[2], sys.argv[3:] or [TABLE]
    os.environ["DESTINATION__REPLACE_STRATEGY"] = "staging-optimized"
    pipeline = dlt.pipeline(
        pipeline_name="dpone_bench_peer",
        destination="clickhouse",
        dataset_name=DATASET,
        pipelines_dir=pipelines_dir,
        progress=None,
    )
    data = sql_database(
        credentials=f"sqlite:///{source}",
        table_names=tables,
        backend="pyarrow",
        # Every table of the bench has the same columns.
        table_adapter_callback=_adapter(_declared_types(source, tables[0])),
    )
    info = pipeline.run(data, write_disposition="replace", loader_file_format="parquet")
    info.raise_on_failed_jobs()


if __name__ == "__main__":
    main()
