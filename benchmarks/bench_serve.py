"""fleet serve on sandbox hosts: the figures of its README section (not a test).

    .venv/bin/python benchmarks/bench_serve.py [--hosts 8] [--load-seconds 30]

1. time from ``fleet serve`` to the refusal in preflight, on N unpatched vLLM 0.17.0 hosts;
2. the memory of fleet (max RSS of the process) while it follows N loads to ready;
3. scenario x outcome x diagnosis id x wall time, one host per scenario;
4. the whole ``fleet serve`` under cut SSH sessions: cuts, reconnects per step, lines and
   bytes lost or repeated, launches, outcome.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleet.sandbox.core import Sandbox  # noqa: E402

SCENARIOS: list[tuple[str, dict[str, object], tuple[str, ...]]] = [
    ("ready (patched)", {}, ()),
    ("unpatched, preflight", {}, ("--unpatched",)),
    ("unpatched, --skip-preflight", {}, ("--unpatched", "--skip-preflight")),
    ("OOM while loading", {"fault": "oom"}, ()),
    ("NCCL error", {"fault": "nccl"}, ()),
    ("port in use (skip preflight)", {"fault": "port-in-use"}, ("--skip-preflight",)),
    ("stall (--stall-timeout 5)", {"fault": "stall", "load_seconds": 60}, ("--stall-timeout", "5")),
    ("slow load (--timeout 10)", {"slow_factor": 30.0}, ("--timeout", "10")),
    ("crash after ready", {"fault": "crash-after-ready", "crash_after_s": 0.2}, ()),
    ("truncated line", {"fault": "truncated-line"}, ()),
]


def fleet(box: Sandbox, *args: str, timeout: float = 600) -> tuple[int, dict, float, int]:
    """(exit code, --json doc, wall seconds, max RSS KiB of the fleet process)."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [*box.fleet_argv(), "--json", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=box.fleet_env(),
    )
    out, err = proc.communicate(timeout=timeout)
    wall = time.monotonic() - started
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    try:
        doc = json.loads(out)
    except ValueError:
        doc = {"error": err[-500:]}
    return proc.returncode, doc, wall, rss


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--load-seconds", type=float, default=30.0)
    parser.add_argument("--cuts-only", action="store_true", help="Only part 4 (one host).")
    args = parser.parse_args()
    if args.cuts_only:
        args.hosts = 1
    with tempfile.TemporaryDirectory(prefix="fleet-bench-serve-") as tmp:
        box = Sandbox.up(Path(tmp) / "sb", hosts=args.hosts, versions=["0.17.0"],
                         load_seconds=args.load_seconds)  # fmt: skip
        try:
            return _run(box, args)
        finally:
            box.down(purge=True)


def _run(box: Sandbox, args: argparse.Namespace) -> int:
    n = len(box.hosts)
    if args.cuts_only:
        assert fleet(box, "patch", "--host", "all")[0] == 0
        print("4.", _cuts(box, box.hosts[0].name))
        return 0
    code, doc, wall, _ = fleet(box, "serve", "kimi-eagle3", "--host", "all")
    refused = sum(1 for h in doc.get("hosts", {}).values() if h.get("outcome") == "refused")
    print(f"1. preflight refusal on {n} unpatched 0.17.0 hosts: {wall:.2f} s "
          f"(exit {code}, {refused}/{n} refused)")  # fmt: skip
    assert fleet(box, "patch", "--host", "all")[0] == 0
    code, doc, wall, rss = fleet(box, "serve", "kimi-eagle3", "--host", "all")
    outcomes = [h.get("outcome") for h in doc.get("hosts", {}).values()]
    ready = outcomes.count("ready")
    print(f"2. following {n} loads of {args.load_seconds:.0f} s to ready: {wall:.1f} s, "
          f"{ready}/{n} ready; fleet's max RSS {rss / 1024:.0f} MiB")  # fmt: skip
    for name, entry in sorted(doc.get("hosts", {}).items()):
        if entry.get("outcome") != "ready":
            print(
                f"   {name}: {entry.get('outcome')}: {entry.get('error') or entry.get('message')}"
            )
    fleet(box, "stop", "kimi-eagle3", "--host", "all")

    print("\n3. | scenario | outcome | diagnosis | wall time |")
    print("   |---|---|---|---|")
    host = box.hosts[0].name
    for title, knobs, extra in SCENARIOS:
        box.set_sim(host, **{"load_seconds": 3.0, **knobs})
        flags = [a for a in extra if a not in ("--unpatched",)]
        if "--unpatched" in extra:
            fleet(box, "patch", "--host", host, "--revert")
        code, doc, wall, _ = fleet(box, "serve", "kimi-eagle3", "--host", host, *flags)
        entry = doc.get("hosts", {}).get(host, {})
        ids = [d["id"] for d in entry.get("diagnoses") or []]
        print(f"   | {title} | {entry.get('outcome')} (exit {code}) | "
              f"{ids[0] if ids else '-'} | {wall:.1f} s |")  # fmt: skip
        fleet(box, "stop", "kimi-eagle3", "--host", host)
        if "--unpatched" in extra:
            fleet(box, "patch", "--host", host)
    box.set_sim(host)

    print("\n4.", _cuts(box, host))
    return 0


def _cuts(box: Sandbox, host: str, *, max_cuts: int = 10) -> str:
    """The whole ``fleet serve`` command while the host's SSH sessions are cut every 0.5-3
    s (preflight, launch, the follow, readiness, metrics: wherever they land), up to
    ``max_cuts`` times: cuts, reconnects, bytes and lines lost or repeated, launches,
    outcome."""
    from fleet.onhost.layout import log_path
    from tests.integration.serve_run import (
        ServeRun,
        fresh_logs,
        launches,
        log_prefix_sha256,
    )

    fleet(box, "stop", "kimi-eagle3", "--host", host)
    fresh_logs(box, host)
    box.set_sim(host, number_lines=True, load_seconds=30, http_delay_s=0.2)
    cuts = 0
    done = threading.Event()

    def cutter() -> None:
        nonlocal cuts
        rng = random.Random(11)
        while not done.wait(rng.uniform(0.5, 3.0)) and cuts < max_cuts:
            cuts += box.cut_sessions(host) > 0

    thread = threading.Thread(target=cutter, daemon=True)
    run = ServeRun(box, host).start()
    thread.start()
    try:
        code, r, _err = run.finish(timeout=600)
    finally:
        done.set()
    follow = r.get("follow") or {}
    offset = int(follow.get("log_offset") or 0)
    intact = follow.get("sha256") == log_prefix_sha256(box, host, offset)
    head = box.on_host(host, ["head", "-c", str(offset), log_path("kimi-eagle3")])
    host_lines = [x for x in head.stdout.replace("\r", "\n").split("\n") if x.strip()]
    started = launches(box, host)
    fleet(box, "stop", "kimi-eagle3", "--host", host)
    box.set_sim(host)
    link = r.get("link") or {}
    steps = ", ".join(f"{k} {v}" for k, v in sorted((link.get("by_step") or {}).items()))
    spec = r.get("spec_decode") or {}
    lost, duplicated = _lost_and_duplicated(host_lines, int(follow.get("lines") or 0), intact)
    return (
        f"fleet serve with cut SSH sessions: {cuts} cuts, {link.get('reconnects')} reconnects "
        f"({steps}), {follow.get('lines')} of {len(host_lines)} log lines received: "
        f"{lost} lost, {duplicated} duplicated; "
        f"bytes {'identical' if intact else 'DIFFERENT'} (sha256 of {offset} bytes), "
        f"{started} launch(es), outcome {r.get('outcome')} (exit {code}), "
        f"acceptance rate {spec.get('acceptance_rate')}"
    )


def _lost_and_duplicated(host_lines: list[str], received: int, intact: bool) -> tuple[int, int]:
    """Lines lost and lines received twice. The host log's lines carry the rehearsal
    vLLM's `` [seq=N]`` numbers (each once, from 1: checked here); when the sha256 of the
    bytes fleet received equals the host log's prefix, fleet received exactly those lines,
    in order, each once. Otherwise the difference of the counts is all that is known."""
    import re

    seqs = [int(m.group(1)) for x in host_lines for m in [re.search(r" \[seq=(\d+)\]", x)] if m]
    assert seqs == list(range(1, len(seqs) + 1)), "the host log's own line numbers have gaps"
    if intact:
        return 0, 0
    return max(0, len(host_lines) - received), max(0, received - len(host_lines))


if __name__ == "__main__":
    raise SystemExit(main())
