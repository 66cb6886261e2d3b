"""Hostile-input speed checks (issue 10), printed as a Markdown table.

    .venv/bin/python benchmarks/bench_hostile.py [--no-sandbox]

Measures what must stay linear or bounded:
- loading an inventory with one group per host (2,000 / 8,000 / 20,000 hosts);
- refusing a 1 KB alias bomb and 500-deep nesting (``fleet hosts``, real process);
- a one-host ``fleet ping`` with 10,000 and 20,000 other lines in known_hosts (a sandbox
  host: real sshd), and parsing 200,000 lines;
- redacting adversarial 300 KB lines.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import paramiko

from fleet.inventory import load_inventory
from fleet.redact import redact_text
from fleet.transport.hostkeys import check_key


def inventory_text(hosts: int) -> str:
    lines = ["all:", "  children:"]
    for i in range(hosts):
        lines += [
            f"    g{i}:",
            "      hosts:",
            f"        h{i}: {{address: 10.{i // 65536}.{i // 256 % 256}.{i % 256}, port: 22}}",
        ]
    return "\n".join(lines) + "\n"


def bomb() -> str:
    rows = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    rows += [f"l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "\n".join(rows) + "\nall: {hosts: {x: {address: *l8}}}\n"


def timed(fn: object) -> float:
    started = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-sandbox", action="store_true", help="skip the ping rows")
    args = parser.parse_args()
    rows: list[tuple[str, str]] = []
    fleet = [sys.executable, "-m", "fleet"]
    with tempfile.TemporaryDirectory(prefix="fleet-bench-hostile-") as tmp:
        d = Path(tmp)
        for n in (2_000, 8_000, 20_000):
            inv = d / f"inv-{n}.yaml"
            inv.write_text(inventory_text(n))
            took = timed(lambda inv=inv: load_inventory(inv))
            rows.append((f"inventory load, {n:,} hosts, one group each", f"{took:.2f} s"))
        for label, text in (
            ("1 KB alias bomb refused (`fleet hosts`)", bomb()),
            ("500-deep nesting refused (`fleet hosts`)", "all: " + "[" * 500 + "]" * 500),
        ):
            inv = d / "bad.yaml"
            inv.write_text(text)
            started = time.perf_counter()
            proc = subprocess.run(
                [*fleet, "--inventory", str(inv), "hosts"], capture_output=True, text=True
            )
            took = time.perf_counter() - started
            rows.append((label, f"{took:.2f} s, exit {proc.returncode}"))

        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "k")], check=True
        )
        key = paramiko.PKey.from_path(str(d / "k"))
        other = " ".join([key.get_name(), key.get_base64()])
        big = d / "kh-200k"
        big.write_text(
            "".join(f"10.9.{i // 256 % 256}.{i % 256} {other}\n" for i in range(200_000))
        )
        took = timed(lambda: check_key(big, "unknown.example", key))
        rows.append(("known_hosts 200,000 lines: parse and look up", f"{took:.2f} s"))

        if not args.no_sandbox:
            from fleet.sandbox.core import Sandbox

            box = Sandbox.up(d / "sb", hosts=1, versions=["0.17.0"], load_seconds=1)
            try:
                pinned = box.known_hosts_path.read_text()
                for n in (10_000, 20_000):
                    junk = "".join(f"10.8.{i // 256 % 256}.{i % 256} {other}\n" for i in range(n))
                    box.known_hosts_path.write_text(junk + pinned)
                    started = time.perf_counter()
                    proc = subprocess.run(
                        [*fleet, "--inventory", str(box.inventory_path), "ping", "--host", "all"],
                        capture_output=True,
                        text=True,
                    )
                    took = time.perf_counter() - started
                    rows.append(
                        (f"one-host `fleet ping`, {n:,} known_hosts lines",
                         f"{took:.2f} s, exit {proc.returncode}")
                    )  # fmt: skip
            finally:
                box.down()

    for label, line in (
        ("redact `--api-key a ` x 30,000", "--api-key a " * 30_000),
        ("redact `'--api-key', ` x 30,000", "'--api-key', " * 30_000),
        ("redact `api_key: [` x 30,000", "api_key: [" * 30_000),
    ):
        took = timed(lambda line=line: redact_text(line))
        rows.append((label, f"{took * 1000:.0f} ms"))

    print("| measure | result |")
    print("|---|---|")
    for label, value in rows:
        print(f"| {label} | {value} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
