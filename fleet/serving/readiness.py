"""Readiness through the SSH connection, and the speculative-decoding acceptance rate.

Every request goes over a direct-tcpip channel of the host's SSH connection to its own
``127.0.0.1:<port>`` (``Runner.open_tcp``), so nothing needs to be reachable from the
control machine. The steps: ``GET /health`` answers 200, ``/v1/models`` lists the served
name, a short ``/v1/completions``, then ``/metrics`` before and after the test completions,
parsed with ``prometheus_client``'s text parser:

    acceptance rate         = Δ accepted tokens / Δ draft tokens
    mean acceptance length  = 1 + Δ accepted tokens / Δ drafts
    per-position rate (i)   = Δ accepted tokens at position i / Δ drafts
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleet.errors import OperationFailed

if TYPE_CHECKING:
    from fleet.transport import Runner

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
PROMPTS = (
    "Explain speculative decoding in one sentence.",
    "Write a haiku about GPUs.",
    "List three prime numbers.",
)


LISTEN_TIMEOUT = 30.0  # seconds from "Application startup complete." to a listening port


class NotReady(OperationFailed):
    code = "not-ready"


class _Tunnelled(http.client.HTTPConnection):
    """http.client over a socket-like object (a paramiko channel) opened elsewhere."""

    def __init__(self, sock: Any, timeout: float) -> None:
        super().__init__("127.0.0.1", timeout=timeout)
        self._given = sock

    def connect(self) -> None:
        self.sock = self._given

    def close(self) -> None:
        """Forget the channel without closing it: ``getresponse`` calls this as soon as
        the headers say the server will close (``Connection: close``), while the body may
        still be on its way. A socket's makefile keeps its file open past that close; a
        paramiko channel does not, and uvicorn sends the body after the headers, so the
        body was lost (``IncompleteRead``, found on the real vLLM). :func:`request`
        closes the channel once the answer is read."""
        self.sock = None
        super().close()


@dataclass
class HttpAnswer:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8"))


def request(
    conn: Runner,
    port: int,
    method: str,
    path: str,
    *,
    body: dict[str, Any] | None = None,
    api_key: str | None = None,
    timeout: float = 30.0,
) -> HttpAnswer:
    """One HTTP request to the host's own port, through the SSH connection. Connection
    refused (nothing listens yet): :class:`ConnectionRefusedError`."""
    sock = conn.open_tcp(port, timeout=timeout)
    http_conn = _Tunnelled(sock, timeout)
    headers = {"Host": f"127.0.0.1:{port}", "Connection": "close"}
    payload = None
    if body is not None:
        payload = json.dumps(body).encode("utf-8")
        headers["Content-Type"] = "application/json"
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        http_conn.request(method, path, body=payload, headers=headers)
        response = http_conn.getresponse()
        return HttpAnswer(response.status, response.read())
    except (OSError, http.client.HTTPException) as exc:
        alive = getattr(conn, "transport_alive", None)
        if alive is not None and not alive():
            # the SSH connection dropped under the request: a connection fault (the
            # caller's link reconnects), not an answer of the server
            from fleet.transport.connection import ConnectionLost

            raise ConnectionLost(
                conn.host.name, f"connection lost during {method} {path}"
            ) from None
        raise ConnectionRefusedError(f"{method} {path}: {exc}") from None
    finally:
        http_conn.close()
        close = getattr(sock, "close", None)
        if close is not None:
            close()


def wait_listening(conn: Runner, port: int, *, timeout: float = 30.0) -> HttpAnswer:
    """``GET /health`` once the port listens. uvicorn prints ``Application startup
    complete.`` and only then calls ``listen()`` on the socket vLLM bound at start-up
    (uvicorn ``server.py``: lifespan start-up, then ``create_server``), so a probe sent on
    that line can be refused for a moment (longer on a busy host): refusals are retried
    with backoff (tenacity) for ``timeout`` seconds, then the last one is raised."""
    from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

    retrying = Retrying(
        retry=retry_if_exception_type(ConnectionRefusedError),
        stop=stop_after_delay(timeout),
        wait=wait_exponential(multiplier=0.05, max=1.0),
        reraise=True,
    )
    return retrying(request, conn, port, "GET", "/health")


# -- /metrics ------------------------------------------------------------------------------


@dataclass
class SpecCounters:
    """The speculative-decoding counters of one scrape (summed over engines)."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: dict[int, float] = field(default_factory=dict)
    found: bool = False


def _samples(text: str) -> list[Any]:
    """Every sample of a ``/metrics`` exposition (prometheus_client's parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return [s for family in text_string_to_metric_families(text) for s in family.samples]
    except (ValueError, TypeError) as exc:
        raise OperationFailed(f"unreadable /metrics: {exc}") from None


def parse_metrics(text: str, model_name: str | None = None) -> SpecCounters:
    """The spec-decode counters of a ``/metrics`` exposition; only series of
    ``model_name`` when given."""
    out = SpecCounters()
    for sample in _samples(text):
        if model_name and sample.labels.get("model_name") not in (None, model_name):
            continue
        name = sample.name
        if name.endswith("_created"):
            continue
        base = name.removesuffix("_total")
        if base == DRAFTS:
            out.drafts += sample.value
        elif base == DRAFT_TOKENS:
            out.draft_tokens += sample.value
        elif base == ACCEPTED:
            out.accepted += sample.value
        elif base == PER_POSITION:
            try:
                pos = int(sample.labels.get("position", ""))
            except ValueError:
                continue
            out.per_position[pos] = out.per_position.get(pos, 0.0) + sample.value
        else:
            continue
        out.found = True
    return out


@dataclass
class Load:
    """The requests an engine holds at one scrape (``vllm:num_requests_running`` and
    ``vllm:num_requests_waiting``, summed over engines)."""

    running: float = 0.0
    waiting: float = 0.0
    found: bool = False

    @property
    def idle(self) -> bool:
        return self.running <= 0 and self.waiting <= 0


def parse_load(text: str) -> Load:
    """The in-flight and queued requests of a ``/metrics`` exposition."""
    out = Load()
    for sample in _samples(text):
        if sample.name == "vllm:num_requests_running":
            out.running += sample.value
            out.found = True
        elif sample.name == "vllm:num_requests_waiting":
            out.waiting += sample.value
            out.found = True
    return out


def load(conn: Runner, port: int) -> Load:
    """``/metrics``' request gauges of the server on the host's ``port``."""
    return parse_load(_metrics(conn, port))


@dataclass
class SpecDecode:
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    per_position: list[float]
    drafts: float
    draft_tokens: float
    accepted: float

    def to_json(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 4)

        return {
            "acceptance_rate": r(self.acceptance_rate),
            "mean_acceptance_length": r(self.mean_acceptance_length),
            "per_position": [round(p, 4) for p in self.per_position],
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted,
        }


def acceptance(before: SpecCounters, after: SpecCounters) -> SpecDecode:
    """The rates between two scrapes (a first scrape of zero counters is "before")."""
    drafts = after.drafts - before.drafts
    tokens = after.draft_tokens - before.draft_tokens
    accepted = after.accepted - before.accepted
    positions = sorted(after.per_position)
    per_pos = [
        (after.per_position[p] - before.per_position.get(p, 0.0)) / drafts if drafts > 0 else 0.0
        for p in positions
    ]
    return SpecDecode(
        acceptance_rate=accepted / tokens if tokens > 0 else None,
        mean_acceptance_length=1 + accepted / drafts if drafts > 0 else None,
        per_position=per_pos,
        drafts=drafts,
        draft_tokens=tokens,
        accepted=accepted,
    )


# -- the readiness steps -------------------------------------------------------------------


@dataclass
class Readiness:
    steps: list[str] = field(default_factory=list)
    spec_decode: SpecDecode | None = None
    completion: str | None = None


def check(
    conn: Runner,
    port: int,
    served_name: str,
    *,
    api_key: str | None = None,
    completions: int = len(PROMPTS),
    max_tokens: int = 32,
    listen_timeout: float = LISTEN_TIMEOUT,
    on_step: Callable[[str], None] | None = None,
) -> Readiness:
    """/health, /v1/models, test completions and the acceptance rate (the server is up:
    the caller waited for /health or ``Application startup complete.``). ``on_step`` is
    told each step as it starts (health, models, metrics, completions)."""
    out = Readiness()
    step = on_step or (lambda _name: None)
    step("health")
    health = wait_listening(conn, port, timeout=listen_timeout)
    if health.status != 200:
        raise NotReady(f"{conn.host.name}: GET /health answered {health.status}")
    out.steps.append("health")
    step("models")
    models = request(conn, port, "GET", "/v1/models", api_key=api_key)
    if models.status != 200:
        raise NotReady(f"{conn.host.name}: GET /v1/models answered {models.status}")
    names = [m.get("id") for m in (models.json().get("data") or []) if isinstance(m, dict)]
    if served_name not in names:
        raise NotReady(f"{conn.host.name}: /v1/models lists {names}, not {served_name!r}")
    out.steps.append("models")
    step("metrics")
    before = parse_metrics(_metrics(conn, port), served_name)
    step("completions")
    for prompt in PROMPTS[: max(1, completions)]:
        answer = request(
            conn,
            port,
            "POST",
            "/v1/completions",
            body={"model": served_name, "prompt": prompt, "max_tokens": max_tokens,
                  "temperature": 0},
            api_key=api_key,
            timeout=120.0,
        )  # fmt: skip
        if answer.status != 200:
            raise NotReady(f"{conn.host.name}: POST /v1/completions answered {answer.status}")
        choices = answer.json().get("choices") or [{}]
        out.completion = str(choices[0].get("text", ""))[:200]
    out.steps.append("completions")
    step("metrics")
    after = parse_metrics(_metrics(conn, port), served_name)
    if after.found:
        out.spec_decode = acceptance(before, after)
        out.steps.append("metrics")
    return out


def _metrics(conn: Runner, port: int) -> str:
    answer = request(conn, port, "GET", "/metrics")
    if answer.status != 200:
        raise NotReady(f"{conn.host.name}: GET /metrics answered {answer.status}")
    return answer.body.decode("utf-8", errors="replace")
