"""Speed checks for the foundation, printed as a Markdown table (see README, "Performance").

    .venv/bin/python benchmarks/bench_fleet.py [--hosts 16] [--help-runs 15]

Measures, on a sandbox fleet of real sshd hosts started for the run:
- ``fleet --help`` wall time (median of N runs; lazy imports keep it small);
- ``fleet sandbox up`` for N hosts;
- ``fleet inspect --host all`` wall time over N hosts, and the SSH connections each
  host's sshd accepted during it (read from the sshd logs: must be 1);
- ``fleet ping --host all`` wall time.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fleet.sandbox.core import Sandbox


def timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return time.perf_counter() - started, proc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--help-runs", type=int, default=15)
    parser.add_argument("--vllm", action="append", default=None)
    args = parser.parse_args()
    versions = args.vllm or ["0.17.0", "0.18.0"]
    fleet = [sys.executable, "-m", "fleet"]
    rows: list[tuple[str, str]] = []

    help_times = [timed([*fleet, "--help"])[0] for _ in range(args.help_runs)]
    rows.append(
        (
            f"`fleet --help` (median of {args.help_runs})",
            f"{statistics.median(help_times) * 1000:.0f} ms",
        )
    )

    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        started = time.perf_counter()
        box = Sandbox.up(Path(tmp) / "sb", hosts=args.hosts, versions=versions, load_seconds=1)
        rows.append(
            (f"`fleet sandbox up` ({args.hosts} hosts)", f"{time.perf_counter() - started:.1f} s")
        )
        try:
            inv = str(box.inventory_path)
            marks = box.log_marks()
            took, proc = timed([*fleet, "--inventory", inv, "inspect", "--host", "all", "--json"])
            if proc.returncode != 0:
                print(proc.stdout, proc.stderr, file=sys.stderr)
                return 1
            counts = {h.name: box.connection_count(h.name, since=marks[h.name]) for h in box.hosts}
            rows.append((f"`fleet inspect --host all` ({args.hosts} hosts)", f"{took:.2f} s"))
            rows.append(
                (
                    "SSH connections per host during inspect (sshd logs)",
                    ", ".join(sorted({str(c) for c in counts.values()}))
                    + f" (min {min(counts.values())}, max {max(counts.values())})",
                )
            )
            took, proc = timed([*fleet, "--inventory", inv, "ping", "--host", "all"])
            rows.append((f"`fleet ping --host all` ({args.hosts} hosts)", f"{took:.2f} s"))
        finally:
            box.down()

    print("| measurement | result |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
