"""Benchmark ``fleet logs --diagnose`` on a 1 GiB synthetic vLLM log.

1. Throughput: the pure-Python diagnosis of a local file (``fleet.diagnosis.scan``) against
   ``grep -E`` with the same prefilter (the alternation of every catalogue literal), on the
   same file (both read it from the page cache). Prints both rates and the ratio.
2. Bytes moved (with ``--sandbox`` or ``--inventory/--host``): the log is generated *on* the
   host, then diagnosed remotely (grep on the host, candidate lines over SSH); prints
   ``Result.bytes_received`` against the file size.

    python benchmarks/bench_diagnose.py                     # 1 GiB, local only
    python benchmarks/bench_diagnose.py --size-mib 256      # smaller
    python benchmarks/bench_diagnose.py --sandbox           # + a throwaway sandbox host
    python benchmarks/bench_diagnose.py --inventory inv.yaml --host sandbox-01

The synthetic log: a vLLM 0.17 start-up (Kimi-K2.5, TP 8, EAGLE-3), then steady-state
serving (throughput lines, access logs, request ids, a rare rejected request and warning),
and at the very end a CUDA OOM in a worker, the worker dying and the engine dying.
"""

# ruff: noqa: E501  (the generator embeds real, long vLLM log lines)

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Runs with any python3 (stdlib only): locally, or on a host via `python3 - PATH BYTES`.
GENERATOR = r'''
import sys
path, size = sys.argv[1], int(sys.argv[2])
pre = """INFO 11-02 10:14:01 [__init__.py:216] Automatically detected platform cuda.
(APIServer pid=1100) INFO 11-02 10:14:05 [api_server.py:1839] vLLM API server version 0.17.0
(APIServer pid=1100) INFO 11-02 10:14:05 [utils.py:238] non-default args: {'model': '/models/Kimi-K2.5', 'trust_remote_code': True, 'tensor_parallel_size': 8, 'port': 8001, 'speculative_config': {'method': 'eagle3', 'model': '/models/kimi-k25-eagle3', 'num_speculative_tokens': 3}}
(APIServer pid=1100) INFO 11-02 10:14:07 [model.py:531] Resolved architecture: KimiK25ForConditionalGeneration
(APIServer pid=1100) INFO 11-02 10:14:07 [model.py:1554] Using max model len 262144
(EngineCore_DP0 pid=1201) INFO 11-02 10:14:12 [core.py:93] Initializing a V1 LLM engine (v0.17.0) with config: model='/models/Kimi-K2.5', speculative_config=SpeculativeConfig(method='eagle3', num_spec_tokens=3), dtype=torch.bfloat16, max_seq_len=262144, tensor_parallel_size=8, quantization=compressed-tensors
(Worker_TP0 pid=1301) INFO 11-02 10:14:30 [gpu_model_runner.py:4256] Starting to load model /models/Kimi-K2.5...
Loading safetensors checkpoint shards:   0% Completed | 0/64 [00:00<?, ?it/s]\rLoading safetensors checkpoint shards:  50% Completed | 32/64 [03:12<03:12, 6.0s/it]\rLoading safetensors checkpoint shards: 100% Completed | 64/64 [06:24<00:00, 6.0s/it]
(Worker_TP0 pid=1301) INFO 11-02 10:21:01 [default_loader.py:294] Loading weights took 384.51 seconds
(Worker_TP0 pid=1301) INFO 11-02 10:21:03 [gpu_model_runner.py:4339] Model loading took 71.93 GiB memory and 392.234101 seconds
(Worker_TP0 pid=1301) INFO 11-02 10:21:10 [gpu_model_runner.py:4370] Loading drafter model...
(EngineCore_DP0 pid=1201) INFO 11-02 10:22:40 [gpu_worker.py:425] Available KV cache memory: 9.73 GiB
(EngineCore_DP0 pid=1201) INFO 11-02 10:22:40 [kv_cache_utils.py:1314] GPU KV cache size: 212,032 tokens
(EngineCore_DP0 pid=1201) INFO 11-02 10:22:40 [kv_cache_utils.py:1320] Maximum concurrency for 262,144 tokens per request: 3.24x
(Worker_TP0 pid=1301) INFO 11-02 10:24:01 [gpu_model_runner.py:5361] Graph capturing finished in 81 secs, took 2.31 GiB
(APIServer pid=1100) INFO 11-02 10:24:05 [api_server.py:501] Starting vLLM API server 0 on http://0.0.0.0:8001
(APIServer pid=1100) INFO:     Started server process [1100]
(APIServer pid=1100) INFO:     Waiting for application startup.
(APIServer pid=1100) INFO:     Application startup complete.
"""
block = []
for i in range(4000):
    r = "{B}%04d" % i
    block.append("(APIServer pid=1100) INFO 11-02 11:%02d:%02d [async_llm.py:325] Added request chatcmpl-%s." % (i // 60 % 60, i % 60, r))
    block.append('(APIServer pid=1100) INFO:     10.1.%d.%d:%d - "POST /v1/chat/completions HTTP/1.1" 200 OK' % (i % 250, i % 199, 30000 + i))
    if i % 10 == 0:
        block.append("(APIServer pid=1100) INFO 11-02 11:%02d:%02d [loggers.py:123] Engine 000: Avg prompt throughput: %d.%d tokens/s, Avg generation throughput: %d.%d tokens/s, Running: %d reqs, Waiting: 0 reqs, GPU KV cache usage: %d.%d%%, Prefix cache hit rate: 41.%d%%" % (i // 60 % 60, i % 60, 900 + i % 300, i % 10, 1500 + i % 700, i % 7, 8 + i % 40, 20 + i % 50, i % 10, i % 10))
        block.append("(APIServer pid=1100) INFO 11-02 11:%02d:%02d [metrics.py:88] SpecDecoding metrics: Mean acceptance length: 2.%d, Accepted throughput: %d.0 tokens/s, Drafted throughput: %d.0 tokens/s, Accepted: %d tokens, Drafted: %d tokens, Per-position acceptance rate: 0.81, 0.62, 0.44" % (i // 60 % 60, i % 60, i % 10, 600 + i % 90, 900 + i % 90, 1000 + i, 1500 + i))
    if i == 1999:
        block.append("(APIServer pid=1100) ERROR 11-02 11:33:19 [serving_chat.py:222] ValueError: This model's maximum context length is 262144 tokens. However, your request has 270001 input tokens. Please reduce the length of the input messages.")
        block.append('(APIServer pid=1100) INFO:     10.1.3.4:40000 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request')
    if i == 3000:
        block.append("(APIServer pid=1100) WARNING 11-02 11:50:00 [protocol.py:77] The following fields were present in the request but ignored: {'metadata'}")
template = "\n".join(block) + "\n"
crash = """(Worker_TP3 pid=1304) ERROR 11-02 14:01:02 [multiproc_executor.py:839] WorkerProc hit an exception.
(Worker_TP3 pid=1304) ERROR 11-02 14:01:02 [multiproc_executor.py:839] Traceback (most recent call last):
(Worker_TP3 pid=1304) ERROR 11-02 14:01:02 [multiproc_executor.py:839]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 2410, in execute_model
(Worker_TP3 pid=1304) ERROR 11-02 14:01:02 [multiproc_executor.py:839]     logits = self.model.compute_logits(sample_hidden_states)
(Worker_TP3 pid=1304) ERROR 11-02 14:01:02 [multiproc_executor.py:839] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB. GPU 3 has a total capacity of 178.35 GiB of which 1.04 GiB is free.
(EngineCore_DP0 pid=1201) ERROR 11-02 14:01:03 [multiproc_executor.py:154] Worker proc VllmWorker-3 died unexpectedly, shutting down executor.
(APIServer pid=1100) ERROR 11-02 14:01:03 [async_llm.py:480] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
"""
with open(path, "w") as fh:
    fh.write(pre)
    written = len(pre)
    b = 0
    while written + len(crash) < size:
        chunk = template.replace("{B}", "%06d" % b)
        if written + len(chunk) + len(crash) > size:
            chunk = chunk[: size - written - len(crash)]
            chunk = chunk[: chunk.rfind("\n") + 1]
            if not chunk:
                break
        fh.write(chunk)
        written += len(chunk)
        b += 1
    fh.write(crash)
'''


def generate(path: Path, size: int) -> None:
    subprocess.run(
        [sys.executable, "-", str(path), str(size)], input=GENERATOR.encode(), check=True
    )


def _rate(nbytes: int, seconds: float) -> str:
    return f"{nbytes / 2**20 / seconds:8.1f} MiB/s"


def bench_local(size: int, keep: bool) -> None:
    from fleet.diagnosis.catalogue import load_catalogue
    from fleet.diagnosis.host_logs import prefilter_regex
    from fleet.diagnosis.scan import diagnose_file

    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    log = tmp / "vllm.log"
    try:
        t0 = time.perf_counter()
        generate(log, size)
        nbytes = log.stat().st_size
        print(
            f"synthetic log: {log} ({nbytes / 2**20:.0f} MiB) in {time.perf_counter() - t0:.1f} s"
        )
        cat = load_catalogue()
        ere = prefilter_regex(cat)
        # warm the page cache for both contenders
        with open(log, "rb") as fh:
            while fh.read(64 * 2**20):
                pass

        t0 = time.perf_counter()
        result = diagnose_file(log, catalogue=cat)
        ours = time.perf_counter() - t0
        ranked = ", ".join(d.id for d in result.diagnoses) or "(clean)"
        print(
            f"fleet (python, scan + engine): {ours:7.2f} s {_rate(nbytes, ours)}  "
            f"-> {ranked}; {result.fed_lines} of {result.lines} lines decoded"
        )

        grep = shutil.which("grep")
        if grep is None:
            print("grep not found: no comparison")
            return
        cmd = ["grep", "-a", "-n", "-E", "-e", ere, str(log)]
        env = dict(os.environ, LC_ALL="C")
        # (stdout must not be /dev/null: GNU grep then stops at the first match)
        t0 = time.perf_counter()
        out = subprocess.run(cmd, stdout=subprocess.PIPE, env=env, check=False).stdout
        theirs = time.perf_counter() - t0
        grep_lines = out.count(b"\n")
        print(
            f"grep -E (same {len(cat.prefilter_literals)} literals):  {theirs:7.2f} s "
            f"{_rate(nbytes, theirs)}  -> {grep_lines} matching lines"
        )
        print(
            f"ratio fleet/grep: {ours / theirs:.2f}x the time of grep -E "
            f"({theirs / ours:.2f} of grep's throughput)"
        )
    finally:
        if keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def bench_remote(inventory_path: str, host: str, size: int) -> None:
    from fleet.diagnosis.host_logs import diagnose_remote
    from fleet.inventory import load_inventory
    from fleet.transport import Session, shell

    inventory = load_inventory(inventory_path)
    spec = inventory.hosts[host]
    remote_path = "~/.fleet/run/bench/vllm.log"
    with Session(inventory) as session:
        conn = session.connect(spec)
        t0 = time.perf_counter()
        generate = shell.script(
            "mkdir -p {{dir}} && {{python}} - {{log}} {{size}}",
            dir=shell.RemotePath("~/.fleet/run/bench"),
            python=spec.python or "python3",
            log=shell.RemotePath(remote_path),
            size=int(size),
        )
        gen = conn.run(shell.sh(generate), stdin=GENERATOR, timeout=1800)
        if not gen.ok:
            print(f"{host}: generating the log failed: {gen.stderr.strip()}")
            return
        print(
            f"{host}: wrote {size / 2**20:.0f} MiB at {remote_path} in "
            f"{time.perf_counter() - t0:.1f} s"
        )
        try:
            t0 = time.perf_counter()
            res = diagnose_remote(conn, remote_path, timeout=1800)
            took = time.perf_counter() - t0
            ranked = ", ".join(d.id for d in res.diagnoses) or "(clean)"
            print(f"{host}: diagnosed in {took:.2f} s -> {ranked}")
            print(
                f"bytes moved: {res.bytes_received} of {res.file_size} "
                f"({100 * res.fraction:.4f}% of the log), {res.candidate_lines} candidate lines"
            )
        finally:
            remove = shell.script("rm -f -- {{log}}", log=shell.RemotePath(remote_path))
            conn.run(shell.sh(remove), timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--keep", action="store_true", help="keep the generated local log")
    ap.add_argument("--no-local", action="store_true", help="skip the local throughput run")
    ap.add_argument("--inventory", help="inventory with the host to measure bytes moved on")
    ap.add_argument("--host", help="host name in --inventory")
    ap.add_argument("--sandbox", action="store_true", help="start a one-host sandbox for it")
    args = ap.parse_args()
    size = args.size_mib * 2**20
    if not args.no_local:
        bench_local(size, args.keep)
    if args.inventory and args.host:
        bench_remote(args.inventory, args.host, size)
    elif args.sandbox:
        from fleet.sandbox.core import Sandbox

        box = Sandbox.up(
            Path(tempfile.mkdtemp(prefix="fleet-bench-sandbox-")), hosts=1, versions=["0.17.0"]
        )
        try:
            bench_remote(str(box.inventory_path), box.hosts[0].name, size)
        finally:
            box.down()


if __name__ == "__main__":
    main()
