# fleet on-host module: the rehearsal vLLM's HTTP server (stdlib http.server).
#
# Part of the simulated `vllm serve` (vllm_sim.py). Python 3.8+, standard library only.
#
# The socket is bound (SO_REUSEADDR + SO_REUSEPORT, as vLLM's create_server_socket) before
# the load and `listen()` is called only after uvicorn's `Application startup complete.`:
# connections are refused while loading, exactly as with vLLM. Endpoints as served by vLLM
# (docs/research/vllm-serve.md §3): /health (200, empty; 503 once the engine is dead), /ping,
# /version, /v1/models, /v1/completions and /v1/chat/completions (deterministic text),
# /metrics (Prometheus text exposition, written here by hand, with the metric names and
# help texts read from the installed v1/spec_decode/metrics.py and v1/metrics/loggers.py).
# `--api-key` / VLLM_API_KEY guards /v1/* (401 `{"error": "Unauthorized"}`).
import hashlib
import json
import math
import random
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from socketserver import ThreadingMixIn
from typing import Any, Callable, Dict, List, Optional, Tuple

SIM_TEXT = (
    "the model answers in a steady voice while the fleet keeps its watch over every host and "
    "the drafter proposes tokens that the target accepts or rejects in turn so that "
    "speculative decoding moves faster than plain decoding on eight GPUs"
)
SIM_WORDS = tuple(SIM_TEXT.split(" "))
SIM_BODY_GAP_S = 0.02  # between an answer's head and its body (see Handler._send)


def sim_bind(host: str, port: int) -> socket.socket:
    """vLLM's create_server_socket: bound, not listening (raises OSError when taken)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if hasattr(socket, "SO_REUSEPORT"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def go_float(value: float) -> str:
    """prometheus_client's floatToGoString."""
    d = float(value)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if d != d:
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


def _labels(labels: Dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(
        '{}="{}"'.format(k, str(v).replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\""))
        for k, v in sorted(labels.items())
    )
    return "{" + inner + "}"


def sim_position_rates(rate: float, k: int) -> List[float]:
    """Per-position acceptance of a chain (position i accepted only after i-1) with a
    per-token probability q such that the mean over the K positions equals `rate`."""
    if k <= 0:
        return []
    rate = min(max(rate, 0.0), 1.0)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        q = (lo + hi) / 2
        mean = sum(q ** (i + 1) for i in range(k)) / k
        if mean < rate:
            lo = q
        else:
            hi = q
    q = (lo + hi) / 2
    return [q ** (i + 1) for i in range(k)]


class SimMetrics:
    """vLLM's Prometheus series for one engine, moving with each completion."""

    def __init__(
        self,
        definitions: List[Dict[str, Any]],
        model_name: str,
        num_spec_tokens: int,
        acceptance_rate: float,
    ) -> None:
        self.lock = threading.Lock()
        self.model_name = model_name
        self.k = num_spec_tokens
        self.rates = sim_position_rates(acceptance_rate, num_spec_tokens)
        self.definitions = {d["name"]: d for d in definitions}
        self.created = time.time()
        self.drafts = 0
        self.draft_tokens = 0
        self.expected = [0.0] * num_spec_tokens
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success: Dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        self.running = 0

    def begin(self) -> None:
        """A request enters the engine (`vllm:num_requests_running` counts it)."""
        with self.lock:
            self.running += 1

    def end(self) -> None:
        with self.lock:
            self.running = max(0, self.running - 1)

    def tokens_per_step(self) -> float:
        """Tokens one decode step yields on average: 1, plus the accepted drafts."""
        return 1.0 + sum(self.rates)

    def accepted_per_pos(self) -> List[int]:
        return [math.floor(e + 1e-9) for e in self.expected]

    def observe(self, prompt_tokens: int, generated: int, reason: str) -> None:
        with self.lock:
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += generated
            self.success[reason] = self.success.get(reason, 0) + 1
            if self.k and generated > 1:
                mean_len = 1 + sum(self.rates)
                drafts = max(1, math.ceil((generated - 1) / mean_len))
                self.drafts += drafts
                self.draft_tokens += drafts * self.k
                for i, rate in enumerate(self.rates):
                    self.expected[i] += drafts * rate

    def _family(
        self, name: str, kind: str, doc: str, samples: List[Tuple[Dict[str, str], float]]
    ) -> List[str]:
        out: List[str] = []
        if kind == "counter":
            total = name + "_total"
            out.append("# HELP %s %s" % (total, doc))
            out.append("# TYPE %s counter" % total)
            for labels, value in samples:
                out.append("%s%s %s" % (total, _labels(labels), go_float(value)))
            created = name + "_created"
            out.append("# HELP %s %s" % (created, doc))
            out.append("# TYPE %s gauge" % created)
            for labels, _value in samples:
                out.append("%s%s %s" % (created, _labels(labels), go_float(self.created)))
        else:
            out.append("# HELP %s %s" % (name, doc))
            out.append("# TYPE %s %s" % (name, kind))
            for labels, value in samples:
                out.append("%s%s %s" % (name, _labels(labels), go_float(value)))
        return out

    def _doc(self, name: str, default: str) -> Tuple[str, str]:
        found = self.definitions.get(name)
        if found is None:
            return default, ""
        return found["documentation"], found["kind"]

    def exposition(self) -> str:
        base = {"engine": "0", "model_name": self.model_name}
        lines: List[str] = []
        info = sys.version_info
        lines += self._family(
            "python_info",
            "gauge",
            "Python platform information",
            [
                (
                    {
                        "implementation": "CPython",
                        "major": str(info[0]),
                        "minor": str(info[1]),
                        "patchlevel": str(info[2]),
                        "version": "%d.%d.%d" % info[:3],
                    },
                    1.0,
                )
            ],
        )
        with self.lock:
            gauges = [
                ("vllm:num_requests_running", float(self.running)),
                ("vllm:num_requests_waiting", 0.0),
                ("vllm:kv_cache_usage_perc", 0.0),
            ]
            for name, value in gauges:
                doc, kind = self._doc(name, "")
                if kind:
                    lines += self._family(name, "gauge", doc, [(dict(base), value)])
            for name, value in (
                ("vllm:prompt_tokens", self.prompt_tokens),
                ("vllm:generation_tokens", self.generation_tokens),
            ):
                doc, kind = self._doc(name, "")
                if kind:
                    lines += self._family(name, "counter", doc, [(dict(base), float(value))])
            doc, kind = self._doc("vllm:request_success", "")
            if kind:
                samples = []
                for reason in sorted(self.success):
                    labels = dict(base)
                    labels["finished_reason"] = reason
                    samples.append((labels, float(self.success[reason])))
                lines += self._family("vllm:request_success", "counter", doc, samples)
            if self.k:
                accepted = self.accepted_per_pos()
                for name, value in (
                    ("vllm:spec_decode_num_drafts", self.drafts),
                    ("vllm:spec_decode_num_draft_tokens", self.draft_tokens),
                    ("vllm:spec_decode_num_accepted_tokens", sum(accepted)),
                ):
                    doc, _kind = self._doc(name, name)
                    lines += self._family(name, "counter", doc, [(dict(base), float(value))])
                name = "vllm:spec_decode_num_accepted_tokens_per_pos"
                doc, _kind = self._doc(name, name)
                samples = []
                for pos, value in enumerate(accepted):
                    labels = dict(base)
                    labels["position"] = str(pos)
                    samples.append((labels, float(value)))
                lines += self._family(name, "counter", doc, samples)
        return "\n".join(lines) + "\n"


def sim_text(model: str, prompt: str, tokens: int) -> str:
    """Deterministic completion text: the same model and prompt give the same words."""
    seed = int(hashlib.sha256((model + "\0" + prompt).encode("utf-8")).hexdigest()[:16], 16)
    rng = random.Random(seed)
    return " " + " ".join(rng.choice(SIM_WORDS) for _ in range(max(0, tokens)))


def sim_schedule(
    prompt_tokens: int, max_tokens: int, per_step: float, timing: Dict[str, float]
) -> List[Tuple[float, int]]:
    """When the tokens of one request come out: ``[(seconds after the previous step,
    tokens)]``. The prefill step yields the first token (``prefill_ms_per_token`` per prompt
    token, plus a step); each decode step after it yields ``per_step`` tokens on average (1
    plus the accepted drafts: the fractions carried over, so the counts are exact) and
    costs ``step_ms``, times ``1 + draft_cost`` per speculative token when a drafter runs."""
    step_s = float(timing.get("step_ms") or 0.0) / 1000.0
    decode_s = step_s * (1.0 + float(timing.get("draft_cost") or 0.0))
    prefill_s = float(timing.get("prefill_ms_per_token") or 0.0) / 1000.0 * prompt_tokens
    out = [(prefill_s + step_s, 1)] if max_tokens > 0 else []
    emitted, carried = 1, 0.0
    while emitted < max_tokens:
        carried += per_step
        take = min(int(carried + 1e-9), max_tokens - emitted)
        carried -= take
        out.append((decode_s, take))
        emitted += take
    return out


class SimServer(ThreadingMixIn, HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class SimApp:
    """What the handler needs to know about the server."""

    def __init__(
        self,
        served: List[str],
        root: str,
        max_model_len: int,
        api_keys: List[str],
        version: str,
        metrics: SimMetrics,
        access_log: Callable[[str], None],
        quiet_paths: List[str],
        dead_status: int,
        delay_s: float = 0.0,
        timing: Optional[Dict[str, float]] = None,
    ) -> None:
        self.served = served
        self.root = root
        self.max_model_len = max_model_len
        self.api_keys = ["Bearer " + k for k in api_keys]
        self.version = version
        self.metrics = metrics
        self.access_log = access_log
        self.quiet_paths = quiet_paths
        self.dead = False
        self.dead_status = dead_status
        self.delay_s = delay_s  # a test knob: every answer this late (a slow network)
        # how long generation takes (sim_schedule): step_ms, prefill_ms_per_token and
        # draft_cost (the drafter's share of a step per speculative token); 0: at once
        self.timing = dict(timing or {})
        self.created = int(time.time())
        self.counter = 0
        self.lock = threading.Lock()

    def next_id(self) -> int:
        with self.lock:
            self.counter += 1
            return self.counter


def sim_handler(app: SimApp) -> Any:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "uvicorn"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            if app.delay_s > 0:
                time.sleep(app.delay_s)
            self.send_response(status)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            if self.close_connection:
                self.send_header("connection", "close")
            self.end_headers()
            if self.command != "HEAD" and body:
                # uvicorn writes the head and the body as two writes (h11: the response
                # start, then its body): a client that drops the connection once the head
                # says "close" loses the body (fleet's tunnel did, on the real vLLM)
                self.wfile.flush()
                time.sleep(SIM_BODY_GAP_S)
                self.wfile.write(body)
            self._log_access(status)

        def _json(self, status: int, doc: Any) -> None:
            self._send(status, json.dumps(doc).encode("utf-8"))

        def _authorized(self) -> bool:
            if not app.api_keys or not self.path.startswith("/v1"):
                return True
            if self.headers.get("Authorization", "") in app.api_keys:
                return True
            self._json(401, {"error": "Unauthorized"})
            return False

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                return json.loads(raw.decode("utf-8") or "{}")
            except ValueError:
                return None

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/health", "/ping"):
                self._send(app.dead_status if app.dead else 200, b"")
            elif not self._authorized():
                return
            elif path == "/version":
                self._json(200, {"version": app.version})
            elif path == "/metrics":
                self._send(
                    200,
                    app.metrics.exposition().encode("utf-8"),
                    "text/plain; version=0.0.4; charset=utf-8",
                )
            elif path == "/v1/models":
                self._json(200, self._models())
            else:
                self._json(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/ping":
                self._send(app.dead_status if app.dead else 200, b"")
                return
            if not self._authorized():
                return
            if path not in ("/v1/completions", "/v1/chat/completions"):
                self._json(404, {"detail": "Not Found"})
                return
            body = self._body()
            if not isinstance(body, dict):
                self._error(400, "BadRequestError", "Expecting value: line 1 column 1 (char 0)")
                return
            if app.dead:
                self._error(500, "InternalServerError", "EngineCore encountered an issue.")
                return
            model = body.get("model") or app.served[0]
            if model not in app.served:
                self._error(404, "NotFoundError", "The model `%s` does not exist." % model, "model")
                return
            if path == "/v1/completions":
                prompt = body.get("prompt", "")
                if isinstance(prompt, list):
                    prompt = " ".join(str(p) for p in prompt)
                prompt = str(prompt)
            else:
                messages = body.get("messages") or []
                prompt = "\n".join(
                    str(m.get("content", "")) for m in messages if isinstance(m, dict)
                )
            try:
                max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
            except (TypeError, ValueError):
                self._error(400, "BadRequestError", "max_tokens must be an integer")
                return
            prompt_tokens = max(1, len(prompt) // 4)
            if max_tokens < 1 or prompt_tokens + max_tokens > app.max_model_len:
                self._error(
                    400,
                    "BadRequestError",
                    "This model's maximum context length is %d tokens. However, you requested "
                    "%d tokens (%d in the messages, %d in the completion). Please reduce the "
                    "length of the messages or completion."
                    % (app.max_model_len, prompt_tokens + max_tokens, prompt_tokens, max_tokens),
                )
                return
            stream = bool(body.get("stream"))
            options = body.get("stream_options")
            usage_chunk = isinstance(options, dict) and bool(options.get("include_usage"))
            steps = sim_schedule(prompt_tokens, max_tokens, app.metrics.tokens_per_step(),
                                 app.timing)  # fmt: skip
            words = sim_text(model, prompt, max_tokens).split(" ")[1:]
            ident = app.next_id()
            app.metrics.begin()
            try:
                if stream:
                    self._stream(path, model, ident, steps, words, prompt_tokens, usage_chunk)
                    return
                for wait, _count in steps:
                    if wait > 0:
                        time.sleep(wait)
            finally:
                app.metrics.end()
            text = " " + " ".join(words) if words else ""
            app.metrics.observe(prompt_tokens, max_tokens, "length")
            usage = {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + max_tokens,
                "completion_tokens": max_tokens,
                "prompt_tokens_details": None,
            }
            if path == "/v1/completions":
                choice: Dict[str, Any] = {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": "length",
                    "stop_reason": None,
                    "prompt_logprobs": None,
                }
                doc = {
                    "id": "cmpl-%032x" % ident,
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [choice],
                    "usage": usage,
                }
            else:
                choice = {
                    "index": 0,
                    "message": {"role": "assistant", "content": text.strip(), "tool_calls": []},
                    "logprobs": None,
                    "finish_reason": "length",
                    "stop_reason": None,
                }
                doc = {
                    "id": "chatcmpl-%032x" % ident,
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [choice],
                    "usage": usage,
                }
            self._json(200, doc)

        def _stream(
            self,
            path: str,
            model: str,
            ident: int,
            steps: List[Tuple[float, int]],
            words: List[str],
            prompt_tokens: int,
            usage_chunk: bool,
        ) -> None:
            """Server-sent events as vLLM streams them: one chunk per engine step (a step
            with accepted drafts carries several tokens), the finish reason on the last,
            the usage chunk when asked (``stream_options.include_usage``), ``[DONE]``."""
            chat = path == "/v1/chat/completions"
            if app.delay_s > 0:
                time.sleep(app.delay_s)
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            self._log_access(200)
            created = int(time.time())
            head: Dict[str, Any] = {
                "id": ("chatcmpl-%032x" if chat else "cmpl-%032x") % ident,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created,
                "model": model,
            }

            def choice(text: str, finish: Optional[str]) -> Dict[str, Any]:
                if chat:
                    return {"index": 0, "delta": {"content": text}, "logprobs": None,
                            "finish_reason": finish}  # fmt: skip
                return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                        "stop_reason": None}  # fmt: skip

            sent = 0
            try:
                if chat:
                    hello = {"role": "assistant", "content": ""}
                    first = {"index": 0, "delta": hello, "logprobs": None, "finish_reason": None}
                    self._chunk("data: %s\n\n" % json.dumps(dict(head, choices=[first])))
                for number, (wait, count) in enumerate(steps):
                    if wait > 0:
                        time.sleep(wait)
                    text = "".join(" " + w for w in words[sent : sent + count])
                    sent += count
                    last = number == len(steps) - 1
                    doc = dict(head, choices=[choice(text, "length" if last else None)])
                    if not chat:
                        doc["usage"] = None
                    self._chunk("data: %s\n\n" % json.dumps(doc))
                if usage_chunk:
                    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + sent,
                             "completion_tokens": sent}  # fmt: skip
                    self._chunk("data: %s\n\n" % json.dumps(dict(head, choices=[], usage=usage)))
                self._chunk("data: [DONE]\n\n")
                self._chunk("")
            except OSError:  # the client went away: vLLM aborts the request
                app.metrics.observe(prompt_tokens, sent, "abort")
                return
            app.metrics.observe(prompt_tokens, sent, "length")

        def _chunk(self, text: str) -> None:
            data = text.encode("utf-8")
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _log_access(self, status: int) -> None:
            path = self.path.split("?", 1)[0]
            if path not in app.quiet_paths:
                client = "%s:%d" % (self.client_address[0], self.client_address[1])
                phrase = self.responses.get(status, ("",))[0]
                app.access_log(
                    'INFO:     %s - "%s %s HTTP/%s" %d %s'
                    % (client, self.command, self.path, self.request_version[5:], status, phrase)
                )

        def _error(self, status: int, kind: str, message: str, param: Optional[str] = None) -> None:
            self._json(
                status,
                {"error": {"message": message, "type": kind, "param": param, "code": status}},
            )

        def _models(self) -> Dict[str, Any]:
            data = []
            for name in app.served:
                data.append(
                    {
                        "id": name,
                        "object": "model",
                        "created": app.created,
                        "owned_by": "vllm",
                        "root": app.root,
                        "parent": None,
                        "max_model_len": app.max_model_len,
                        "permission": [
                            {
                                "id": "modelperm-%032x" % (abs(hash(name)) % (1 << 128)),
                                "object": "model_permission",
                                "created": app.created,
                                "allow_create_engine": False,
                                "allow_sampling": True,
                                "allow_logprobs": True,
                                "allow_search_indices": False,
                                "allow_view": True,
                                "allow_fine_tuning": False,
                                "organization": "*",
                                "group": None,
                                "is_blocking": False,
                            }
                        ],
                    }
                )
            return {"object": "list", "data": data}

    return Handler


def sim_serve(sock: socket.socket, app: SimApp) -> SimServer:
    """Start listening on the pre-bound socket and serve in a daemon thread."""
    server = SimServer(sock.getsockname()[:2], sim_handler(app), bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.server_address = sock.getsockname()[:2]
    sock.listen(128)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2})
    thread.daemon = True
    thread.start()
    return server
