"""``fleet serve`` on one host: preflight, launch, follow the load, readiness.

:func:`serve_host` takes a host from "vLLM installed" to "serving" or stops early with a
diagnosis: preflight (one round trip) refuses what can be known in seconds; the launch
starts vLLM under fleet's supervisord; the follower streams the log from byte 0 (one
long-lived stream, resumed after a dropped connection) into the phase tracker and the
diagnosis engine; a crash (the process exited, or a fatal line) ends the follow at once
and the log is diagnosed; no new bytes for the stall budget is ``stalled``, the load budget
``timeout``; ``Application startup complete.`` starts the readiness checks through the SSH
connection. Every step is reported to ``events`` (the live display, ``--events``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fleet.diagnosis.models import Diagnosis
from fleet.onhost.runner import Refusal
from fleet.serving import preflight as pre
from fleet.serving import readiness, remote
from fleet.serving.profile import Profile, for_host, read_secrets
from fleet.transport.outcome import Verdict

if TYPE_CHECKING:
    from fleet.inventory import HostSpec
    from fleet.transport import Session

Outcome = Literal["ready", "crashed", "stalled", "timeout", "refused", "launched"]
Events = Callable[[dict[str, Any]], None]
TICK = 1.0
HEALTH_WAIT = 120.0


@dataclass
class ServeOptions:
    wait: bool = True
    skip_preflight: bool = False
    restart: bool = False
    timeout: float | None = None
    stall_timeout: float | None = None


@dataclass
class ServeResult:
    """One host's ``fleet serve`` (DESIGN's ``serve --json`` entry)."""

    host: str
    profile: str
    outcome: Outcome
    phase: str = "starting"
    diagnoses: list[Diagnosis] = field(default_factory=list)
    elapsed_s: float = 0.0
    endpoint: str | None = None
    pid: int | None = None
    spec_decode: readiness.SpecDecode | None = None
    message: str | None = None
    code: str | None = None
    launched: bool = False
    notes: list[str] = field(default_factory=list)
    follow: dict[str, Any] = field(default_factory=dict)

    def verdict(self) -> Verdict:
        if self.outcome == "ready":
            return Verdict("changed" if self.launched else "ok")
        if self.outcome == "launched":
            return Verdict("changed")
        if self.outcome == "refused":
            return Verdict("refused", self.code or "preflight-failed", self.message)
        code = {"crashed": "serve-crashed", "stalled": "serve-stalled"}.get(
            self.outcome, "serve-timeout"
        )
        hint = self.diagnoses[0].fix if self.diagnoses and self.diagnoses[0].fix else None
        return Verdict("failed", self.code or code, self.message, hint)

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "profile": self.profile,
            "phase": self.phase,
            "diagnoses": [d.as_contract() for d in self.diagnoses],
            "elapsed_s": round(self.elapsed_s, 1),
            "endpoint": self.endpoint,
            "pid": self.pid,
            "spec_decode": self.spec_decode.to_json() if self.spec_decode else None,
            "message": self.message,
            "notes": self.notes,
            "follow": self.follow,
        }


def endpoint(host: HostSpec, profile: Profile) -> str:
    return f"http://{host.target}:{profile.port}"


def serve_host(
    session: Session,
    host: HostSpec,
    profile_name: str,
    options: ServeOptions,
    events: Events,
) -> ServeResult:
    started = time.monotonic()
    profile = for_host(profile_name, host)
    secrets = read_secrets(profile)
    conn = session.connect(host)

    def emit(kind: str, **fields: Any) -> None:
        events(
            {"host": host.name, "event": kind, "t": round(time.monotonic() - started, 2), **fields}
        )

    result = ServeResult(host=host.name, profile=profile.name, outcome="refused")
    observed = remote.preflight(conn, profile)
    report = pre.judge(profile, observed.model_dump(), host=host.name)
    result.notes += report.notes
    server = observed.server
    program = (server.get("program") or {}) if isinstance(server, dict) else {}
    state = program.get("state")
    if server.get("lock_held"):
        result.code = "host-busy"
        result.message = "another fleet serve or stop of this profile is running on the host"
        return _done(result, started, emit)
    if state in ("RUNNING", "STARTING", "BACKOFF") and not options.restart:
        if state == "RUNNING" and server.get("health") == 200:
            result.outcome = "ready"
            result.phase = "ready"
            result.pid = program.get("pid")
            result.endpoint = endpoint(host, profile)
            result.message = f"already running, pid {result.pid}, ready"
            return _done(result, started, emit)
        result.code = "already-running"
        result.message = (
            f"a server for {profile.name} already runs (pid {program.get('pid')}, "
            f"{state.lower()}, not ready): fleet status shows it; --restart replaces it"
        )
        return _done(result, started, emit)
    emit("preflight", ok=report.ok, diagnoses=[d.id for d in report.diagnoses])
    if not report.ok and not options.skip_preflight:
        result.diagnoses = report.diagnoses
        result.code = "preflight-failed"
        first = report.diagnoses[0]
        result.message = f"preflight: {first.id}: {first.summary}"
        return _done(result, started, emit)
    if not report.ok:
        result.notes.append(
            "preflight found " + ", ".join(d.id for d in report.diagnoses) + " (--skip-preflight)"
        )
    try:
        launch = remote.launch(
            conn, profile, home=observed.home, secrets=secrets, restart=options.restart
        )
    except Refusal as exc:
        if exc.code not in ("host-busy", "already-running"):
            raise
        # another fleet serve got there first (the profile's lock on the host)
        result.code = exc.code
        result.message = exc.message.removeprefix(f"{host.name}: ")
        return _done(result, started, emit)
    result.launched = True
    result.pid = launch.pid
    emit("launch", pid=launch.pid, log=launch.log, supervisor=launch.supervisor_source)
    if not options.wait:
        result.outcome = "launched"
        result.message = f"started, pid {launch.pid}: fleet status / fleet logs --follow"
        return _done(result, started, emit)
    _follow(
        session, host, profile, launch, options, result, emit, started, version=report.vllm_version
    )
    if result.outcome == "ready":
        api_key = secrets.get("VLLM_API_KEY")
        try:
            ready = readiness.check(conn, profile.port, profile.served_model_name, api_key=api_key)
        except (readiness.NotReady, ConnectionRefusedError) as exc:
            result.outcome = "crashed"
            result.code = "not-ready"
            result.message = str(exc)
            result.diagnoses = _diagnose_log(session, host, launch.log)
            return _done(result, started, emit)
        result.spec_decode = ready.spec_decode
        result.endpoint = endpoint(host, profile)
        emit(
            "readiness",
            steps=ready.steps,
            spec_decode=ready.spec_decode.to_json() if ready.spec_decode else None,
        )
        result.message = "ready"
    return _done(result, started, emit)


def _done(result: ServeResult, started: float, emit: Callable[..., None]) -> ServeResult:
    result.elapsed_s = time.monotonic() - started
    emit("result", outcome=result.outcome, phase=result.phase, message=result.message)
    return result


def _follow(
    session: Session,
    host: HostSpec,
    profile: Profile,
    launch: remote.LaunchAnswer,
    options: ServeOptions,
    result: ServeResult,
    emit: Callable[..., None],
    started: float,
    *,
    version: str | None,
) -> None:
    """Stream the log through the tracker and the engine until ready, a crash, a stall or
    the budget; the outcome and phase go into ``result``."""
    from fleet.diagnosis.engine import Engine
    from fleet.serving.follow import LogFollower, physical_lines
    from fleet.serving.phases import PhaseTracker

    tracker = PhaseTracker(version, clock=time.monotonic)
    engine = Engine(host=host.name)
    budget = options.timeout or profile.load_timeout_s
    stall = options.stall_timeout or profile.stall_timeout_s
    follower = LogFollower(
        session, host, launch.log, pid=launch.pid or 0, inode=launch.log_inode, tick=TICK
    )
    last_bytes = time.monotonic()
    last_progress = tracker.progress
    buf = b""
    line_no = 0
    fatal: Diagnosis | None = None
    reported = 0.0
    try:
        for chunk in follower.chunks():
            now = time.monotonic()
            if chunk:
                last_bytes = now
                lines, buf = physical_lines(buf + chunk)
                for line in lines:
                    line_no += 1
                    for event in tracker.feed(line):
                        emit("phase", phase=event.phase, previous=event.previous,
                             line=event.line, message=event.message[:200])  # fmt: skip
                    engine.feed(line_no, line)
                if engine.findings:
                    found = [d for d in engine.results() if d.severity == "fatal"]
                    if found:
                        fatal = found[0]
                        break
                if tracker.phase == "ready":
                    result.outcome = "ready"
                    break
            progress = tracker.progress
            if progress != last_progress or now - reported > 5:
                reported = now
                last_progress = progress
                emit("progress", **progress.as_json(), elapsed_s=round(now - started, 1),
                     last_line=(lines[-1][-160:] if chunk and lines else None))  # fmt: skip
            if now - last_bytes > stall:
                result.outcome = "stalled"
                break
            if now - started > budget:
                result.outcome = "timeout"
                break
    finally:
        follower.close()
    result.phase = tracker.phase
    result.follow = {
        "bytes": follower.stats.bytes,
        "reconnects": follower.stats.reconnects,
        "rotations": follower.stats.rotations,
        "lines": line_no,
    }
    result.notes += follower.stats.notes
    if result.outcome == "ready":
        return
    if follower.exited or fatal is not None:
        result.outcome = "crashed"
        result.diagnoses = _diagnose_log(session, host, launch.log) or ([fatal] if fatal else [])
        if not result.diagnoses:
            result.diagnoses = [
                pre.diagnosis(
                    "process-exited",
                    host.name,
                    ["the server exited"],
                    what="it exited while loading",
                )
            ]
        first = result.diagnoses[0]
        result.message = f"crashed in {tracker.phase}: {first.id}: {first.summary}"
        emit("crash", phase=tracker.phase, diagnoses=[d.id for d in result.diagnoses])
    elif result.outcome == "stalled":
        result.diagnoses = [
            pre.diagnosis(
                "load-stalled", host.name,
                [f"no new output for {stall:.0f}s in phase {tracker.phase}"], seen_by="follow",
                idle_s=f"{stall:.0f}", phase=tracker.phase,
            )
        ]  # fmt: skip
        result.message = f"stalled in {tracker.phase}: no output for {stall:.0f}s"
        emit("stall", phase=tracker.phase)
    elif result.outcome == "timeout":
        result.diagnoses = [
            pre.diagnosis(
                "load-timeout", host.name,
                [f"not ready after {budget:.0f}s (phase {tracker.phase})"], seen_by="follow",
                timeout_s=f"{budget:.0f}", phase=tracker.phase,
            )
        ]  # fmt: skip
        result.message = f"not ready within {budget:.0f}s (phase {tracker.phase})"
        emit("timeout", phase=tracker.phase)


def _diagnose_log(session: Session, host: HostSpec, log: str) -> list[Diagnosis]:
    """The whole log, filtered on the host (the same engine as fleet logs --diagnose)."""
    from fleet.diagnosis.remote import diagnose_remote

    try:
        return diagnose_remote(session.connect(host), log).diagnoses
    except Exception:  # the crash is reported even if the diagnosis cannot be fetched
        return []
