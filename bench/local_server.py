"""Start-up time and idle memory of the managed local ClickHouse server.

Prints the median of several cold-ish starts (same data directory, so only the first
is a first start) and the idle resident memory of the server process, against a
baseline measured in the same run: starting a bare Python interpreter.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dpone.localserver import LocalServer

RUNS = 5


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def main() -> None:
    baseline = []
    for _ in range(RUNS):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        baseline.append(time.perf_counter() - t)
    starts, stops, rss = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(RUNS):
            server = LocalServer(Path(tmp) / "data")
            t = time.perf_counter()
            info = server.start()
            starts.append(time.perf_counter() - t)
            time.sleep(2.0)  # let it settle to idle
            rss.append(_rss_mib(info.pid))
            report = server.stop()
            stops.append(report.seconds)
    base = statistics.median(baseline)
    start = statistics.median(starts)
    print(f"python startup baseline median: {base * 1000:.0f} ms")
    print(
        f"server start-to-ready: first {starts[0]:.2f} s, median {start:.2f} s "
        f"({start / base:.1f}x the bare interpreter)"
    )
    print(f"clean stop median: {statistics.median(stops):.2f} s")
    print(f"idle RSS median: {statistics.median(rss):.0f} MiB")


if __name__ == "__main__":
    main()
