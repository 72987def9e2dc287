"""Preparation throughput against a raw ``INSERT ... FORMAT TabSeparated`` baseline.

Usage: python bench/prepare.py [--rows 1000000]

Generates a realistic bulk text file (mixed types: decimals, datetime2, strings with
escapes, nullable columns, binary, GUIDs), validates it, and measures in the same run:

- preparation (exact conversion to a sealed RowBinary spool), in its own process so
  its peak RSS is its own;
- the raw insert of equivalent data: the same rows as ClickHouse's own TabSeparated
  (produced by the server from the prepared table), POSTed over HTTP into a fresh
  table of the managed local server.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bulk_text_read import SCHEMA, generate
from bench.stage import fetch_to_file, post_file
from dpone.contracts.receipt import FileReceipt
from dpone.localserver import LocalServer
from dpone.localserver.control import run_admin_sql
from dpone.preparation.file_validation import validate_file
from dpone.preparation.spool import MODE_NATIVE, MODE_PYTHON, prepare_rowbinary


def child_prepare(source: str, receipt_path: str, spool: str, mode: str) -> None:
    receipt = FileReceipt.from_bytes(Path(receipt_path).read_bytes())
    started = time.perf_counter()
    prepared = prepare_rowbinary(source, receipt, spool, mode=mode)
    seconds = time.perf_counter() - started
    print(
        json.dumps(
            {
                "seconds": seconds,
                # Both converters run in this process (the compiled one in its threads).
                "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "rows": prepared.identity.prepared_rows,
                "rowbinary_bytes": prepared.identity.rowbinary_bytes,
                "rowbinary_sha256": prepared.identity.rowbinary_sha256,
                "ddl": ", ".join(
                    f"`{c.name}` {c.clickhouse_type}" for c in prepared.identity.target_schema
                ),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--child", nargs=4)
    parser.add_argument("--modes", default=f"{MODE_PYTHON},{MODE_NATIVE}")
    args = parser.parse_args()
    if args.child:
        child_prepare(*args.child)
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        source = work / "snapshot.tsv"
        rows = generate(source, 0, rows_wanted=args.rows)
        size = source.stat().st_size
        receipt = validate_file(source, SCHEMA)
        (work / "receipt.json").write_bytes(receipt.to_bytes())
        print(f"input: {rows:,} rows, {size / 2**20:.1f} MiB")

        preps = {}
        for mode in args.modes.split(","):
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.prepare",
                    "--child",
                    str(source),
                    str(work / "receipt.json"),
                    str(work / f"spool-{mode}"),
                    mode,
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            preps[mode] = json.loads(out.stdout)
        digests = {p["rowbinary_sha256"] for p in preps.values()}
        assert len(digests) == 1, "the modes produced different spools"
        prep = next(iter(preps.values()))
        spool = work / f"spool-{next(iter(preps))}" / "data.rowbinary"

        with LocalServer(work / "ch") as server:
            port = server.info.http_port
            admin = server.credentials()
            run_admin_sql(port, "CREATE DATABASE bench ENGINE = Atomic", credentials=admin)
            for table in ("prepared", "raw"):
                run_admin_sql(
                    port,
                    f"CREATE TABLE bench.{table} ({prep['ddl']}) ENGINE = MergeTree ORDER BY tuple()",
                    credentials=admin,
                )
            rowbinary_insert = post_file(
                port, "INSERT INTO bench.prepared FORMAT RowBinary", spool, admin, timeout=600
            )
            tsv = work / "equivalent.tsv"
            fetch_to_file(
                port, "SELECT * FROM bench.prepared FORMAT TabSeparated", tsv, admin, timeout=600
            )
            raw_insert = post_file(
                port, "INSERT INTO bench.raw FORMAT TabSeparated", tsv, admin, timeout=600
            )
            counted = run_admin_sql(
                port, "SELECT count() FROM bench.raw", credentials=admin
            ).strip()
        assert int(counted) == rows == prep["rows"], (counted, rows, prep["rows"])

        mib = size / 2**20
        for mode, p in preps.items():
            print(
                f"preparation {mode:17s} {p['seconds']:7.2f} s  {rows / p['seconds']:>10,.0f} rows/s  "
                f"{mib / p['seconds']:6.1f} MiB/s of input  peak RSS {p['peak_mib']:.0f} MiB  "
                f"{p['seconds'] / raw_insert:5.2f}x the raw insert"
            )
        print(
            f"raw TSV insert:                {raw_insert:7.2f} s  {rows / raw_insert:>10,.0f} rows/s  "
            f"({tsv.stat().st_size / 2**20:.1f} MiB TSV)"
        )
        print(
            f"RowBinary insert of the spool: {rowbinary_insert:7.2f} s  ({prep['rowbinary_bytes'] / 2**20:.1f} MiB)"
        )
        print("all modes produced byte-identical spools")


if __name__ == "__main__":
    main()
