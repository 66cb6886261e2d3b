"""``fleet bench PROFILE --host H [--baseline-host H2 | --baseline restart]``: what the
drafter buys, measured on the host against its own server.

The load runs ON the host (``fleet/onhost/bench.py``): ``vllm bench serve`` where the
host's vLLM has it, else fleet's own small load generator with the same shape (N prompts
from a seed or a file, at most C in flight, streamed, greedy, ``ignore_eos``). So no
request crosses the control machine's link, and both sides of a comparison get the same
prompts, seed and client. ``/metrics`` before and after give the speculative-decoding
counters (:func:`fleet.serving.readiness.acceptance`).

The baseline is the same profile without its drafter: on a second host that serves it
(``--baseline-host``), or on the same host restarted without it and then restored
(``--baseline restart``: two restarts, each a full load). The report gives both sides'
request throughput, output tokens/s, TTFT, TPOT, ITL and end-to-end latency (median, p99),
the acceptance rate and length, and the speed-up (output tokens/s and TPOT), with warnings
where the numbers mislead: an acceptance length near 1.0 (the drafter proposes nothing the
target keeps), random prompts (acceptance on random words is not acceptance on traffic),
a baseline that itself runs a drafter, failed requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fleet.errors import OperationFailed
from fleet.onhost.client import run_onhost
from fleet.serving import readiness

if TYPE_CHECKING:
    from collections.abc import Callable

    from fleet.inventory import HostSpec
    from fleet.serving.profile import Profile
    from fleet.transport import Runner, Session

SideRole = Literal["speculative", "baseline"]
SCRIPT = "bench"
NO_GAIN_LENGTH = 1.1  # a mean acceptance length below this: the drafter buys nothing


@dataclass(frozen=True)
class BenchSpec:
    """The load, the same for both sides."""

    num_prompts: int = 64
    input_len: int = 256
    output_len: int = 128
    concurrency: int = 8
    seed: int = 0
    prompts: list[str] | None = None  # a file's prompts (one per line); None: random
    tool: Literal["auto", "vllm", "fleet"] = "auto"
    time_limit: float = 3600.0

    @property
    def dataset(self) -> str:
        return "prompts" if self.prompts else "random"

    def to_json(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "num_prompts": self.num_prompts,
                "input_len": self.input_len if not self.prompts else None,
                "output_len": self.output_len, "concurrency": self.concurrency,
                "seed": self.seed}  # fmt: skip


class BenchAnswer(BaseModel):
    model_config = ConfigDict(extra="allow")

    tool: str
    summary: dict[str, Any] = Field(default_factory=dict)
    metrics_before: str | None = None
    metrics_after: str | None = None


@dataclass
class Side:
    """One server measured."""

    host: str
    role: SideRole
    tool: str
    summary: dict[str, Any]
    spec_decode: readiness.SpecDecode | None = None

    def stat(self, name: str, which: str = "median") -> float | None:
        value = (self.summary.get(name) or {}).get(which)
        return float(value) if isinstance(value, int | float) else None

    def number(self, name: str) -> float | None:
        value = self.summary.get(name)
        return float(value) if isinstance(value, int | float) else None

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "tool": self.tool,
            **self.summary,
            "spec_decode": self.spec_decode.to_json() if self.spec_decode else None,
        }


def measure(
    conn: Runner, profile: Profile, spec: BenchSpec, *, api_key: str | None, role: SideRole
) -> Side:
    """Load the server of ``profile`` on the host (one on-host call) and read the result."""
    python = conn.host.python or "python3"
    request: dict[str, Any] = {
        "op": "bench",
        "port": profile.port,
        "model": profile.served_model_name,
        "tokenizer": profile.model,
        "vllm": profile.vllm_executable(python),
        "num_prompts": spec.num_prompts,
        "input_len": spec.input_len,
        "output_len": spec.output_len,
        "concurrency": spec.concurrency,
        "seed": spec.seed,
        "tool": spec.tool,
        "time_limit": spec.time_limit,
    }
    if spec.prompts:
        request["prompts"] = spec.prompts
    if api_key:
        request["api_key"] = api_key  # on stdin only
    answer = run_onhost(conn, SCRIPT, request, BenchAnswer, timeout=spec.time_limit + 300)
    spec_decode = None
    if answer.metrics_before is not None and answer.metrics_after is not None:
        name = profile.served_model_name
        before = readiness.parse_metrics(answer.metrics_before, name)
        after = readiness.parse_metrics(answer.metrics_after, name)
        if after.found:
            spec_decode = readiness.acceptance(before, after)
    return Side(conn.host.name, role, answer.tool, answer.summary, spec_decode)


@dataclass
class BenchReport:
    profile: str
    spec: BenchSpec
    speculative: Side
    baseline: Side | None = None
    baseline_how: str | None = None  # "host" | "restart"
    notes: list[str] = field(default_factory=list)

    @property
    def speedup(self) -> dict[str, float | None]:
        """baseline -> speculative: output tokens/s (higher is better) and TPOT, ITL, TTFT,
        end-to-end latency (lower is better), each as a factor above 1 when it improved."""
        base, main = self.baseline, self.speculative
        if base is None:
            return {}

        def ratio(a: float | None, b: float | None) -> float | None:
            return a / b if a and b else None

        return {
            "output_throughput": ratio(main.number("output_throughput"),
                                       base.number("output_throughput")),
            "request_throughput": ratio(main.number("request_throughput"),
                                        base.number("request_throughput")),
            "tpot_median": ratio(base.stat("tpot_ms"), main.stat("tpot_ms")),
            "itl_median": ratio(base.stat("itl_ms"), main.stat("itl_ms")),
            "ttft_median": ratio(base.stat("ttft_ms"), main.stat("ttft_ms")),
            "e2el_median": ratio(base.stat("e2el_ms"), main.stat("e2el_ms")),
        }  # fmt: skip

    @property
    def warnings(self) -> list[str]:
        out: list[str] = []
        spec = self.speculative.spec_decode
        if spec is None or spec.drafts <= 0:
            out.append(
                f"{self.speculative.host}: no speculative-decoding counters moved: the server "
                "runs without a drafter (or vLLM exposes no vllm:spec_decode_* metrics)"
            )
        elif (
            spec.mean_acceptance_length is not None and spec.mean_acceptance_length < NO_GAIN_LENGTH
        ):
            out.append(
                f"{self.speculative.host}: mean acceptance length "
                f"{spec.mean_acceptance_length:.2f}: the drafter proposes almost nothing the "
                "target keeps, so speculative decoding only costs time here (check the "
                "drafter matches the target and its aux layers)"
            )
        gain = self.speedup.get("output_throughput")
        if gain is not None and gain < 1.0:
            out.append(
                f"with the drafter the server is slower here ({gain:.2f}x output tokens/s): "
                "drafting costs more than the accepted tokens save (a small target, a busy "
                "or CPU host, a high concurrency); speculative decoding pays off where the "
                "target's step is expensive and the batch small"
            )
        if self.spec.dataset == "random":
            out.append(
                "random prompts: acceptance on random words is not acceptance on your traffic "
                "(models fall into repetition on them, which drafters predict well, so it can "
                "be inflated); measure with --prompts FILE of real prompts"
            )
        base_spec = self.baseline.spec_decode if self.baseline is not None else None
        if self.baseline is not None and base_spec is not None and base_spec.drafts > 0:
            out.append(
                f"the baseline ({self.baseline.host}) runs a drafter too: the speed-up "
                "compares two speculative servers"
            )
        for side in (self.speculative, self.baseline):
            if side is not None and side.number("failed"):
                errors = "; ".join(str(e) for e in side.summary.get("errors") or [])[:300]
                out.append(f"{side.host} ({side.role}): {side.number('failed'):.0f} request(s) "
                           f"failed: {errors}")  # fmt: skip
        return out

    @property
    def ok(self) -> bool:
        sides = [s for s in (self.speculative, self.baseline) if s is not None]
        return all((s.number("completed") or 0) > 0 for s in sides)

    def to_json(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 3)

        return {
            "profile": self.profile,
            "load": self.spec.to_json(),
            "speculative": self.speculative.to_json(),
            "baseline": self.baseline.to_json() if self.baseline else None,
            "baseline_how": self.baseline_how,
            "speedup": {k: r(v) for k, v in self.speedup.items()},
            "warnings": self.warnings,
            "notes": self.notes,
            "ok": self.ok,
        }


def read_prompts(path: str) -> list[str]:
    """A prompts file of the control machine: one prompt per line (blank lines skipped)."""
    from pathlib import Path

    from fleet.errors import UsageError
    from fleet.safeyaml import InputFileError, read_regular

    try:
        raw = read_regular(Path(path).expanduser(), max_bytes=16 * 1024 * 1024, what="prompts")
        text = raw.decode("utf-8")
    except InputFileError as exc:
        raise UsageError(str(exc)) from None
    except UnicodeDecodeError:
        raise UsageError(f"--prompts {path}: not UTF-8 text") from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise UsageError(f"--prompts {path}: no prompts in it")
    return lines


def require_serving(conn: Runner, profile: Profile) -> None:
    """The profile's server must be ready on the host (bench measures, it does not serve)."""
    from fleet.serving import host_calls
    from fleet.serving.status import report_of

    entry = host_calls.status(conn, [profile.name]).profiles.get(profile.name)
    state = report_of(profile.name, entry, conn.host.target).state if entry else "stopped"
    if state != "ready":
        raise OperationFailed(
            f"{conn.host.name}: {profile.name} is {state}, not ready",
            hint=f"fleet serve {profile.name} --host {conn.host.name}",
        )


def run(
    session: Session,
    host: HostSpec,
    profile_name: str,
    spec: BenchSpec,
    *,
    baseline_host: HostSpec | None = None,
    restart: bool = False,
    events: Callable[[dict[str, Any]], None],
) -> BenchReport:
    """Measure ``host``'s server of the profile, then the baseline (see the module)."""
    from fleet.serving.profile import for_host, read_secrets
    from fleet.transport.link import HostLink

    profile = for_host(profile_name, host)
    api_key = read_secrets(profile).get("VLLM_API_KEY")
    link = HostLink(session, host)

    def say(message: str, where: str = host.name) -> None:
        events({"host": where, "event": "bench", "message": message})

    link.call("status", lambda c: require_serving(c, profile))
    say(f"measuring {profile.name} ({spec.num_prompts} prompts, {spec.concurrency} at once)")
    main = link.call("bench", lambda c: measure(c, profile, spec, api_key=api_key,
                                                role="speculative"))  # fmt: skip
    report = BenchReport(profile.name, spec, main)
    if baseline_host is not None:
        other = for_host(profile_name, baseline_host)
        other_link = HostLink(session, baseline_host)
        other_link.call("status", lambda c: require_serving(c, other))
        say("measuring the baseline", baseline_host.name)
        report.baseline = other_link.call(
            "bench", lambda c: measure(c, other, spec, api_key=api_key, role="baseline")
        )
        report.baseline_how = "host"
    elif restart:
        report.baseline = _restarted_baseline(session, host, profile_name, spec, api_key, say,
                                              events, report)  # fmt: skip
        report.baseline_how = "restart"
    return report


def _restarted_baseline(
    session: Session,
    host: HostSpec,
    profile_name: str,
    spec: BenchSpec,
    api_key: str | None,
    say: Callable[..., None],
    events: Callable[[dict[str, Any]], None],
    report: BenchReport,
) -> Side:
    """The same host restarted without the drafter, measured, then restored."""
    from fleet.serving.profile import for_host
    from fleet.serving.serve import ServeOptions, serve_host
    from fleet.transport.link import HostLink

    def restart_as(variant: Callable[[Profile], Profile] | None, what: str) -> None:
        say(f"restarting {what}")
        result = serve_host(session, host, profile_name, ServeOptions(restart=True), events,
                            variant=variant)  # fmt: skip
        if result.outcome != "ready":
            raise OperationFailed(
                f"{host.name}: restarting {what}: {result.outcome}: {result.message}",
                hint=f"fleet serve {profile_name} --host {host.name} --restart",
            )
        report.notes.append(f"restarted {what}: ready in {result.elapsed_s:.0f}s")

    restart_as(lambda p: p.without_drafter(), "without the drafter")
    try:
        plain = for_host(profile_name, host).without_drafter()
        say("measuring the baseline")
        side = HostLink(session, host).call(
            "bench", lambda c: measure(c, plain, spec, api_key=api_key, role="baseline")
        )
    finally:
        restart_as(None, "with the drafter again")
    return side
