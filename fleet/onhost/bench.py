# fleet bench script: runs ON THE HOST in a bundle (see _common.py).
#
# `fleet bench`: load the vLLM server on this host's own 127.0.0.1 and measure it, so no
# traffic crosses the control machine's link. Where the host's vLLM has `vllm bench serve`
# (vLLM's own benchmark client, run with the host's vllm executable), that is used and its
# saved JSON result read; otherwise fleet's own small load generator below runs the same
# shape of load: N prompts made from a seed, at most C requests in flight, streamed
# completions, greedy, `ignore_eos` so every request yields its output length. Either way
# /metrics is read before and after (the speculative-decoding counters), and the answer
# has the same summary: request and output-token throughput, TTFT, TPOT, ITL and
# end-to-end latency (mean, median, p99), completed and failed requests.
#
# The API key travels in the request on stdin and reaches `vllm bench` as OPENAI_API_KEY in
# its environment (never on a command line). The benchmark runs as a child with a time
# limit; it ends when fleet goes away (the runtime's watchdog).
import os
import random
import shutil
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

from fleet.onhost._common import Refused, dumps, find_vllm, loads, start_group
from fleet.onhost.localhttp import headers, metrics

PERCENTILES = (50, 99)
# the words random prompts are made of (one to two tokens each in most tokenizers)
WORD_TEXT = (
    "the of and to in is that for on with as by at from it an be this are or was which one "
    "all can has more their time will about would there when what so up out if into other "
    "only new some could these two may first then do any like my now over such our man me "
    "even most made after also did many before must through back years where much your way "
    "well down should because each just those people how too little state good very make "
    "world still own see men work long get here between both life being under never day "
    "same another know while last might us great old year off come since against go came "
    "right used take three"
)
WORDS = tuple(WORD_TEXT.split(" "))


def prompts(request: Dict[str, Any]) -> List[str]:
    """The prompts: given ones (a file of the user's), or `num_prompts` random ones of about
    `input_len` tokens made from `seed` (the same seed, the same prompts)."""
    given = request.get("prompts")
    count = int(request.get("num_prompts") or 0)
    if isinstance(given, list) and given:
        texts = [str(p) for p in given]
        return [texts[i % len(texts)] for i in range(count or len(texts))]
    rng = random.Random(int(request.get("seed") or 0))
    words = max(1, int(int(request.get("input_len") or 128) * 3 // 4))
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(count)]


def _percentiles(values: List[float]) -> Dict[str, Optional[float]]:
    """mean, median and p99 (linear interpolation, as numpy's default)."""
    if not values:
        return {"mean": None, "median": None, "p99": None}
    data = sorted(values)

    def pick(q: float) -> float:
        pos = (len(data) - 1) * q / 100.0
        low = int(pos)
        high = min(low + 1, len(data) - 1)
        return data[low] + (data[high] - data[low]) * (pos - low)

    return {"mean": sum(data) / len(data), "median": pick(50), "p99": pick(99)}


def one_request(
    port: int, model: str, prompt: str, output_len: int, api_key: Optional[str], timeout: float
) -> Dict[str, Any]:
    """One streamed completion: when its first text came, every gap after it, its tokens."""
    import http.client

    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    out: Dict[str, Any] = {"ok": False, "ttft": None, "itl": [], "tokens": 0, "chunks": 0}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    start = time.perf_counter()
    last = start
    try:
        conn.request("POST", "/v1/completions", dumps(body).encode("utf-8"), headers(api_key))
        response = conn.getresponse()
        if response.status != 200:
            out["error"] = "HTTP %d: %s" % (
                response.status,
                response.read(300).decode("utf-8", "replace"),
            )
            return out
        while True:
            line = response.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            doc = loads(data)
            usage = doc.get("usage")
            if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
                out["tokens"] = int(usage["completion_tokens"])
            choices = doc.get("choices") or []
            text = choices[0].get("text") if choices and isinstance(choices[0], dict) else None
            if not text:
                continue
            now = time.perf_counter()
            if out["ttft"] is None:
                out["ttft"] = now - start
            else:
                out["itl"].append(now - last)
            last = now
            out["chunks"] += 1
        out["latency"] = time.perf_counter() - start
        out["tokens"] = out["tokens"] or out["chunks"]
        out["ok"] = out["ttft"] is not None
        if not out["ok"]:
            out["error"] = "no text streamed"
    except (OSError, ValueError, http.client.HTTPException) as exc:
        out["error"] = type(exc).__name__ + ": " + str(exc)
    finally:
        conn.close()
    return out


def fleet_load(request: Dict[str, Any]) -> Tuple[List[Dict[str, Any]], float]:
    """Every prompt once, at most `concurrency` in flight (threads); (results, seconds)."""
    import threading

    texts = prompts(request)
    port = int(request["port"])
    model = str(request["model"])
    output_len = int(request.get("output_len") or 128)
    api_key = request.get("api_key")
    timeout = float(request.get("request_timeout") or 600.0)
    results: List[Dict[str, Any]] = [{} for _ in texts]
    cursor = [0]
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                index = cursor[0]
                cursor[0] += 1
            if index >= len(texts):
                return
            results[index] = one_request(port, model, texts[index], output_len, api_key, timeout)

    width = max(1, min(int(request.get("concurrency") or 1), len(texts) or 1))
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(width)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, time.perf_counter() - started


def summarize(results: List[Dict[str, Any]], duration: float) -> Dict[str, Any]:
    """vLLM's benchmark summary (vllm/benchmarks/serve.py's names and definitions): TPOT of a
    request is (latency - TTFT) / (tokens - 1); ITL every gap between streamed chunks."""
    done = [r for r in results if r.get("ok")]
    tokens = sum(int(r.get("tokens") or 0) for r in done)
    ms = 1000.0
    tpot = [
        (r["latency"] - r["ttft"]) / (r["tokens"] - 1) * ms for r in done if r.get("tokens", 0) > 1
    ]
    out: Dict[str, Any] = {
        "completed": len(done),
        "failed": len(results) - len(done),
        "duration_s": duration,
        "total_output_tokens": tokens,
        "request_throughput": len(done) / duration if duration > 0 else None,
        "output_throughput": tokens / duration if duration > 0 else None,
        "ttft_ms": _percentiles([r["ttft"] * ms for r in done]),
        "tpot_ms": _percentiles(tpot),
        "itl_ms": _percentiles([gap * ms for r in done for gap in r["itl"]]),
        "e2el_ms": _percentiles([r["latency"] * ms for r in done]),
        "errors": [r.get("error") for r in results if not r.get("ok")][:5],
    }
    return out


def _vllm_bench_usable(vllm: str, env: Dict[str, str]) -> bool:
    """Does this vllm executable have `bench serve`? (`--help` answers 0.)"""
    import subprocess

    if not vllm or not os.path.isfile(vllm):
        return False
    try:
        proc = start_group([vllm, "bench", "serve", "--help"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env=env)  # fmt: skip
        return proc.wait(timeout=180) == 0
    except (OSError, subprocess.SubprocessError):
        return False


def vllm_bench(request: Dict[str, Any], env: Dict[str, str], workdir: str) -> Dict[str, Any]:
    """`vllm bench serve` against this host's server; its saved result, summarized."""
    import subprocess

    argv = [
        str(request["vllm"]), "bench", "serve",
        "--backend", "vllm",
        "--base-url", "http://127.0.0.1:%d" % int(request["port"]),
        "--endpoint", "/v1/completions",
        "--model", str(request.get("tokenizer") or request["model"]),
        "--served-model-name", str(request["model"]),
        "--num-prompts", str(int(request.get("num_prompts") or 1)),
        "--max-concurrency", str(int(request.get("concurrency") or 1)),
        "--seed", str(int(request.get("seed") or 0)),
        "--temperature", "0",
        "--ignore-eos",
        "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", ",".join(str(p) for p in PERCENTILES),
        "--save-result", "--result-dir", workdir, "--result-filename", "result.json",
    ]  # fmt: skip
    if request.get("prompts"):
        path = os.path.join(workdir, "prompts.jsonl")
        with open(path, "w", encoding="utf-8") as fh:
            for text in prompts(request):
                fh.write(dumps({"prompt": text}) + "\n")
        argv += ["--dataset-name", "custom", "--dataset-path", path,
                 "--custom-output-len", str(int(request.get("output_len") or 128))]  # fmt: skip
    else:
        argv += ["--dataset-name", "random",
                 "--random-input-len", str(int(request.get("input_len") or 128)),
                 "--random-output-len", str(int(request.get("output_len") or 128))]  # fmt: skip
    log_path = os.path.join(workdir, "bench.log")
    with open(log_path, "wb") as log:
        proc = start_group(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            code = proc.wait(timeout=float(request.get("time_limit") or 3600))
        except subprocess.TimeoutExpired:
            raise Refused("vllm bench serve ran past its time limit", "command-timeout") from None
    try:
        with open(os.path.join(workdir, "result.json"), encoding="utf-8") as result:
            doc = loads(result.read())
    except (OSError, ValueError):
        with open(log_path, "rb") as output:
            tail = output.read()[-2000:].decode("utf-8", "replace")
        raise Refused("vllm bench serve exited %d without a result: %s" % (code, tail),
                      "failed") from None  # fmt: skip

    def stat(name: str) -> Dict[str, Optional[float]]:
        return {"mean": doc.get("mean_%s_ms" % name), "median": doc.get("median_%s_ms" % name),
                "p99": doc.get("p99_%s_ms" % name)}  # fmt: skip

    errors = [e for e in (doc.get("errors") or []) if e][:5]
    return {
        "completed": doc.get("completed"),
        "failed": doc.get("failed") or 0,
        "duration_s": doc.get("duration"),
        "total_output_tokens": doc.get("total_output_tokens"),
        "request_throughput": doc.get("request_throughput"),
        "output_throughput": doc.get("output_throughput"),
        "ttft_ms": stat("ttft"),
        "tpot_ms": stat("tpot"),
        "itl_ms": stat("itl"),
        "e2el_ms": stat("e2el"),
        "errors": errors,
    }


def op_bench(request: Dict[str, Any]) -> Dict[str, Any]:
    port = int(request["port"])
    before = metrics(port)
    if before is None:
        raise Refused("no vLLM answers on 127.0.0.1:%d (GET /metrics)" % port, "not-ready")
    env = dict(os.environ)
    if request.get("api_key"):
        env["OPENAI_API_KEY"] = str(request["api_key"])
    tool = str(request.get("tool") or "auto")
    use_vllm = tool == "vllm" or (
        tool == "auto" and _vllm_bench_usable(str(request.get("vllm") or ""), env)
    )
    if tool == "vllm" and not _vllm_bench_usable(str(request.get("vllm") or ""), env):
        raise Refused("this host's vllm has no `bench serve` (--tool fleet runs fleet's own)",
                      "failed")  # fmt: skip
    workdir = tempfile.mkdtemp(prefix="fleet-bench-")
    try:
        if use_vllm:
            summary = vllm_bench(request, env, workdir)
            used = "vllm bench serve"
        else:
            results, duration = fleet_load(request)
            summary = summarize(results, duration)
            used = "fleet"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "tool": used,
        "summary": summary,
        "metrics_before": before,
        "metrics_after": metrics(port),
        "vllm_dir": find_vllm(),
    }


def op_tools(request: Dict[str, Any]) -> Dict[str, Any]:
    """Which benchmark client this host has: `vllm bench serve` or fleet's own."""
    vllm = str(request.get("vllm") or "")
    return {"vllm_dir": find_vllm(), "vllm_bench": _vllm_bench_usable(vllm, dict(os.environ))}


OPS = {"bench": op_bench, "tools": op_tools}
