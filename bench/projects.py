"""The many-tables project the benchmarks write, and where they work."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench.refresh import generate


def generate_tables(path: Path, tables: int, rows: int) -> None:
    """A new SQLite file of ``tables`` tables ``t00``... of ``rows`` mixed rows each."""
    path.unlink(missing_ok=True)
    for n in range(tables):
        generate(path, rows, seed=n, table=f"t{n:02d}")


def many_tables_project(
    home: Path,
    data_dir: Path,
    tables: int,
    *,
    source: Path,
    database: str,
    store: str = "store.sqlite",
    pool: str = "",
    target: str = "t",
) -> Path:
    """``home/dpone.toml``: tables ``t00``... of ``source`` into ``database.<target>00``..."""
    home.mkdir(parents=True, exist_ok=True)
    text = (
        f'[project]\nwork_dir = "work"\nstore = "{store}"\n'
        f'[clickhouse]\ndata_dir = "{data_dir}"\n'
        + (f'pool = "{pool}"\n' if pool else "")
        + f'[sources.src]\nkind = "sqlite"\npath = "{source}"\n'
    )
    for n in range(tables):
        text += (
            f'[tables.t{n:02d}]\nsource = "src"\ntable = "t{n:02d}"\n'
            f'target = "{database}.{target}{n:02d}"\norder_by = "id"\n'
        )
    config = home / "dpone.toml"
    config.write_text(text)
    return config


def in_work_dir(
    measure: Callable[[Path, argparse.Namespace], None], args: argparse.Namespace, prefix: str
) -> None:
    """Run ``measure`` in ``args.keep`` (kept), else in a temporary directory."""
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        measure(args.keep, args)
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
        measure(Path(scratch), args)
