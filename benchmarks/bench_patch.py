"""Wall time of ``fleet patch --host all`` on a sandbox fleet, printed as a Markdown table.

    .venv/bin/python benchmarks/bench_patch.py [--hosts 8] [--runs 3] [--vllm 0.17.0 ...]

Starts N real sshd hosts (vLLM versions round-robin; default 0.11.0, 0.13.0, 0.15.0,
0.16.0, 0.17.0, 0.18.0), then times, as real ``fleet`` processes: ``--check``, the
first apply, the second apply (a no-op), ``--revert``, repeated ``--runs`` times (median
reported); plus the SSH connections each host's sshd accepted during one apply (from the
sshd logs: must be 1) and the engine alone on the real files of each version.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fleet.patching.engine import plan_host
from fleet.patching.manifest import load_patch_set
from fleet.sandbox.core import Sandbox
from fleet.sandbox.vllm_source import vllm_file

DEFAULT_VERSIONS = ["0.11.0", "0.13.0", "0.15.0", "0.16.0", "0.17.0", "0.18.0"]


def timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return time.perf_counter() - started, proc


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--vllm", action="append", default=None)
    args = parser.parse_args()
    versions = args.vllm or DEFAULT_VERSIONS
    rows: list[tuple[str, str]] = []

    ps = load_patch_set()
    for version in versions:
        texts = {
            f.path: (p.read_text("utf-8") if (p := vllm_file(version, f.path)).exists() else None)
            for f in ps.manifest.files
        }
        started = time.perf_counter()
        plan_host(ps, version, texts)
        rows.append(
            (
                f"engine only, vLLM {version} (plan all files)",
                f"{(time.perf_counter() - started) * 1000:.0f} ms",
            )
        )

    with tempfile.TemporaryDirectory(prefix="fleet-bench-patch-") as tmp:
        box = Sandbox.up(Path(tmp) / "sb", hosts=args.hosts, versions=versions, load_seconds=1)
        try:
            fleet = [sys.executable, "-m", "fleet", "--inventory", str(box.inventory_path)]
            times: dict[str, list[float]] = {"check": [], "apply": [], "again": [], "revert": []}
            connections: dict[str, int] = {}
            for run in range(args.runs):
                for step, extra in (
                    ("check", ["--check"]),
                    ("apply", []),
                    ("again", []),
                    ("revert", ["--revert"]),
                ):
                    marks = box.log_marks() if (run == 0 and step == "apply") else None
                    took, proc = timed([*fleet, "--json", "patch", "--host", "all", *extra])
                    if proc.returncode != 0:
                        print(proc.stdout, proc.stderr, file=sys.stderr)
                        return 1
                    doc = json.loads(proc.stdout)["hosts"]
                    if step == "again":
                        assert all(
                            f["status"] in ("already-applied", "not-needed")
                            for r in doc.values()
                            for f in r["files"]
                        )
                    times[step].append(took)
                    if marks is not None:
                        connections = {
                            h.name: box.connection_count(h.name, since=marks[h.name])
                            for h in box.hosts
                        }
        finally:
            box.down()

    label = {
        "check": "--check",
        "apply": "(apply)",
        "again": "(second apply: no-op)",
        "revert": "--revert",
    }
    for step, values in times.items():
        rows.append(
            (
                f"`fleet patch --host all {label[step]}` ({args.hosts} hosts, "
                f"median of {args.runs})",
                f"{statistics.median(values):.2f} s",
            )
        )
    rows.append(
        (
            "SSH connections per host during one apply (sshd logs)",
            f"min {min(connections.values())}, max {max(connections.values())}",
        )
    )
    print(f"vLLM versions (round-robin): {', '.join(versions)}\n")
    print("| measurement | result |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
