"""Read and validate a generated bulk text file; print MB/s and peak memory.

Usage: python bench/bulk_text_read.py [--mib 1024] [--keep DIR]

Three phases, each in its own process so peak RSS is its own: a baseline that only
reads and hashes the file, the logical reader alone, and full validation (reader,
hash and exact conversion of every cell under the type policy).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dpone.connectors.bulk_text_codec import BulkTextReader, BulkTextWriter
from dpone.contracts.schema import SourceColumn, SourceSchema
from dpone.preparation.file_validation import validate_file
from dpone.typepolicy import plan_columns

SCHEMA = SourceSchema.of(
    [
        SourceColumn("id", "bigint", False),
        SourceColumn("name", "nvarchar(200)", True),
        SourceColumn("amount", "decimal(18, 4)", True),
        SourceColumn("ts", "datetime2(7)", False),
        SourceColumn("ratio", "float", True),
        SourceColumn("code", "char(8)", False),
        SourceColumn("payload", "varbinary(64)", True),
        SourceColumn("g", "uniqueidentifier", True),
    ]
)
WORDS = ["alpha", "beta", "gamma\ttab", "delta\nline", "ünï", "quote'd", "back\\slash", "x\x1dy"]


def generate(path: Path, target_bytes: int, rows_wanted: int | None = None) -> int:
    """Write rows until ``target_bytes`` (or exactly ``rows_wanted`` rows when given)."""
    rng = random.Random(42)
    plans = plan_columns(SCHEMA.columns)
    rows = 0
    with open(path, "wb", buffering=1 << 20) as out:
        writer = BulkTextWriter(out, [p.codec_column for p in plans])
        while (writer.bytes < target_bytes) if rows_wanted is None else (rows < rows_wanted):
            i = rows
            writer.write(
                [
                    str(i),
                    None
                    if i % 7 == 0
                    else " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))),
                    None
                    if i % 5 == 0
                    else f"{rng.randint(-(10**13), 10**13)}.{rng.randint(0, 9999):04d}",
                    f"20{rng.randint(10, 29)}-0{rng.randint(1, 9)}-1{rng.randint(0, 9)} "
                    f"1{rng.randint(0, 9)}:3{rng.randint(0, 9)}:0{rng.randint(0, 9)}.{rng.randint(0, 9999999):07d}",
                    None if i % 3 == 0 else repr(rng.random() * 1000),
                    f"C{i % 10_000_000:07d}",
                    None if i % 4 == 0 else rng.randbytes(rng.randint(0, 32)),
                    None if i % 2 == 0 else "6f9619ff-8b86-d011-b42d-00c04fc964ff",
                ]
            )
            rows += 1
    return rows


def phase(name: str, path: str) -> None:
    started = time.perf_counter()
    if name == "baseline":
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        rows = -1
    elif name == "reader":
        plans = plan_columns(SCHEMA.columns)
        with open(path, "rb") as f:
            rows = sum(1 for _ in BulkTextReader(f, [p.codec_column for p in plans]))
    else:
        rows = validate_file(path, SCHEMA).rows_validated
    seconds = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"phase": name, "seconds": seconds, "rows": rows, "peak_mib": peak_mib}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--phase")
    parser.add_argument("--file")
    args = parser.parse_args()
    if args.phase:
        phase(args.phase, args.file)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.tsv"
        t = time.perf_counter()
        rows = generate(path, args.mib << 20)
        size = path.stat().st_size
        print(
            f"generated {rows:,} rows, {size / 2**20:,.0f} MiB in {time.perf_counter() - t:.1f} s"
        )
        results = {}
        for name in ("baseline", "reader", "validate"):
            out = subprocess.run(
                [sys.executable, __file__, "--phase", name, "--file", str(path)],
                capture_output=True,
                text=True,
                check=True,
            )
            results[name] = json.loads(out.stdout)
        base = results["baseline"]["seconds"]
        for name, r in results.items():
            mbps = size / 2**20 / r["seconds"]
            print(
                f"{name:9s} {r['seconds']:7.2f} s  {mbps:8.1f} MiB/s  "
                f"{r['seconds'] / base:6.1f}x baseline  peak RSS {r['peak_mib']:.0f} MiB"
            )


if __name__ == "__main__":
    main()
