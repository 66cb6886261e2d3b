"""``fleet serve`` on one host: preflight, launch, follow the load, readiness.

:func:`serve_host` takes a host from "vLLM installed" to "serving" or stops early with a
diagnosis: preflight (one round trip, and a second for the profile's ``requires_patch``,
checked with ``fleet patch --check``'s engine) refuses what can be known in seconds; the
launch starts vLLM under the chosen supervisor (:mod:`fleet.serving.supervisor`); the
follower streams the log from byte 0 (one long-lived stream, resumed after a dropped
connection) into the phase tracker and the diagnosis engine; a crash (the process
exited, or a fatal line) ends the follow at once and the log is diagnosed; no new bytes
for the stall budget is ``stalled``, the load budget ``timeout``; ``Application startup
complete.`` starts the readiness checks through the SSH connection. Every step is
reported to ``events`` (the live display, ``--events``).

One owner of the host's connection for the whole serve: a
:class:`~fleet.transport.link.HostLink`. Every step asks it for the live connection and
runs through it, so a drop at any step (preflight, launch, the follow, readiness, metrics,
the diagnosis) reconnects with backoff within the load budget and the step carries on.
The launch is idempotent on the host (its launch id, under the profile's lock): a launch
retried after its answer was lost starts nothing twice. A server of the profile already
loading (an earlier serve interrupted with Ctrl-C, or another fleet serve) is re-attached
to: its log followed from the start, the same pid, no second launch.
"""

from __future__ import annotations

import logging
import secrets as _secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fleet.diagnosis.factory import diagnosis
from fleet.diagnosis.models import Diagnosis
from fleet.errors import ConnectError
from fleet.onhost.client import HostRefusal
from fleet.onhost.supervisors import ACTIVE_STATES
from fleet.serving import host_calls, readiness
from fleet.serving import preflight as pre
from fleet.serving.observed import PreflightAnswer, ServerSeen
from fleet.serving.profile import Profile, ProfileError, for_host, read_secrets
from fleet.serving.supervisor import choose
from fleet.transport.link import HostLink
from fleet.transport.outcome import Verdict

if TYPE_CHECKING:
    from fleet.inventory import HostSpec
    from fleet.patching.manifest import PatchSet
    from fleet.transport import Runner, Session

log = logging.getLogger(__name__)

Outcome = Literal["ready", "crashed", "stalled", "timeout", "refused", "launched"]
# what a serve reports as it goes (the live display, --events): one dict per event
Events = Callable[[dict[str, Any]], None]
TICK = 1.0
HEALTH_WAIT = 120.0  # beyond the load budget: readiness and metrics may still reconnect
LOCK_POLL_S = 1.0
# what a running server of the profile holds, so a --restart does not count it against itself
REPLACED_HOLDS = frozenset({"port-in-use", "gpu-memory-utilization-too-high"})


@dataclass
class ServeOptions:
    wait: bool = True
    skip_preflight: bool = False
    restart: bool = False
    timeout: float | None = None
    stall_timeout: float | None = None


@dataclass
class ServeResult:
    """One host's ``fleet serve`` (the ``serve --json`` entry of docs/contracts.md)."""

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
    attached: bool = False
    supervisor: str | None = None
    notes: list[str] = field(default_factory=list)
    follow: dict[str, Any] = field(default_factory=dict)
    link: dict[str, Any] = field(default_factory=dict)
    group: str | None = None  # a server across hosts: its head, this node's rank and role
    rank: int | None = None
    role: str | None = None
    failed_node: str | None = None

    def verdict(self) -> Verdict:
        if self.outcome == "ready":
            return Verdict("changed" if self.launched else "ok")
        if self.outcome == "launched":
            return Verdict("changed" if self.launched else "ok")
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
            "launched": self.launched,
            "attached": self.attached,
            "supervisor": self.supervisor,
            "notes": self.notes,
            "follow": self.follow,
            "link": self.link,
            **(
                {"group": self.group, "rank": self.rank, "role": self.role,
                 "failed_node": self.failed_node}
                if self.group is not None
                else {}
            ),
        }  # fmt: skip


def endpoint(host: HostSpec, profile: Profile) -> str:
    return f"http://{host.target}:{profile.port}"


def drain_args(profile: Profile, observed: PreflightAnswer) -> tuple[str, ...]:
    """Where the host's vLLM has ``--shutdown-timeout`` (0.18+), a stop drains the requests
    in flight for up to the profile's grace period instead of aborting them (the
    supervisor waits that long, and 30 s more, before it kills)."""
    if not observed.vllm.offers.get("shutdown_timeout"):
        return ()
    if any(a.split("=", 1)[0] == "--shutdown-timeout" for a in profile.extra_args):
        return ()
    return ("--shutdown-timeout", str(int(profile.stop_grace_s)))


def required_patch_set(profile: Profile) -> PatchSet | None:
    """The patch set the profile's ``requires_patch`` names (an unknown one: exit 2). A
    profile served without its drafter needs none: the patch set is EAGLE-3's."""
    if not profile.requires_patch or profile.speculative is None:
        return None
    from fleet.errors import UsageError
    from fleet.patching.manifest import load_patch_set

    try:
        return load_patch_set(profile.requires_patch)
    except UsageError as exc:
        raise ProfileError(f"{profile.name}: requires_patch: {exc.message}") from None


def load_ended(
    what: str, host: str, phase: str, *, stall_s: float, budget_s: float
) -> tuple[Diagnosis, str]:
    """The diagnosis and the message of a load that stalled (``what``: ``stalled``, no new
    output for ``stall_s``) or ran out of its budget (``timeout``): one host's, or a
    group's, seen on its head (:mod:`fleet.serving.group`)."""
    if what == "stalled":
        found = diagnosis("load-stalled", host=host, seen_by="follow",
                          evidence=[f"no new output for {stall_s:.0f}s in phase {phase}"],
                          idle_s=f"{stall_s:.0f}", phase=phase)  # fmt: skip
        return found, f"stalled in {phase}: no output for {stall_s:.0f}s"
    found = diagnosis("load-timeout", host=host, seen_by="follow",
                      evidence=[f"not ready after {budget_s:.0f}s (phase {phase})"],
                      timeout_s=f"{budget_s:.0f}", phase=phase)  # fmt: skip
    return found, f"not ready within {budget_s:.0f}s (phase {phase})"


def serve_host(
    session: Session,
    host: HostSpec,
    profile_name: str,
    options: ServeOptions,
    events: Events,
    *,
    variant: Callable[[Profile], Profile] | None = None,
) -> ServeResult:
    """Serve the profile on the host (see the module); ``variant``: serve the profile as
    this function changes it (``fleet bench``'s baseline: the same without its drafter)."""
    started = time.monotonic()
    profile = for_host(profile_name, host)
    if variant is not None:
        profile = variant(profile)
    secrets = read_secrets(profile)
    patch_set = required_patch_set(profile)
    budget = options.timeout or profile.load_timeout_s
    link = HostLink(session, host, deadline=started + budget + HEALTH_WAIT)

    def emit(kind: str, **fields: Any) -> None:
        events(
            {"host": host.name, "event": kind, "t": round(time.monotonic() - started, 2), **fields}
        )

    result = ServeResult(host=host.name, profile=profile.name, outcome="refused")
    run = _Serve(link, host, profile, options, result, emit, started, budget)
    try:
        run.serve(secrets, patch_set)
    finally:
        result.link = link.stats.to_json()
    return _done(result, started, emit)


def _done(result: ServeResult, started: float, emit: Callable[..., None]) -> ServeResult:
    result.elapsed_s = time.monotonic() - started
    emit("result", outcome=result.outcome, phase=result.phase, message=result.message,
         pid=result.pid, launched=result.launched, attached=result.attached)  # fmt: skip
    return result


@dataclass
class _Serve:
    """One host's serve, step by step (each step through the link)."""

    link: HostLink
    host: HostSpec
    profile: Profile
    options: ServeOptions
    result: ServeResult
    emit: Callable[..., None]
    started: float
    budget: float

    def step(self, name: str) -> None:
        log.info("%s: serve %s: %s", self.host.name, self.profile.name, name)
        self.emit("step", step=name)

    # -- preflight and launch ---------------------------------------------------------------
    def observe(self) -> PreflightAnswer:
        """The preflight observations; while another fleet serve or stop of the profile
        holds its lock on the host, asked again until it is free (bounded)."""
        wait_until = time.monotonic() + 120.0
        while True:
            self.step("preflight")
            observed = self.link.call("preflight", lambda c: host_calls.preflight(c, self.profile))
            if not observed.server.lock_held or time.monotonic() > wait_until:
                return observed
            time.sleep(LOCK_POLL_S)

    def serve(self, secrets: dict[str, str], patch_set: PatchSet | None) -> None:
        result, profile, options = self.result, self.profile, self.options
        observed = self.observe()
        server = observed.server
        program = server.program
        state = program.state
        if server.lock_held:
            result.code = "host-busy"
            result.message = "another fleet serve or stop of this profile is running on the host"
            return
        if state in ACTIVE_STATES and not options.restart:
            if state == "RUNNING" and server.health == 200:
                result.outcome = result.phase = "ready"
                result.pid = program.pid
                result.supervisor = program.supervisor
                result.endpoint = endpoint(self.host, profile)
                result.message = f"already running, pid {result.pid}, ready"
                return
            launch = _launch_record(server)
            if launch is None:
                result.code = "already-running"
                result.message = (
                    f"a server for {profile.name} already runs (pid {program.pid}, "
                    f"{str(state).lower()}) but its launch record is unreadable: fleet status "
                    "shows it; --restart replaces it"
                )
                return
            self.attach(launch, observed)
            return
        report = pre.judge(profile, observed, host=self.host.name)
        result.notes += report.notes
        if state in ACTIVE_STATES:  # --restart: the port and GPUs are held by the server replaced
            held = [d for d in report.diagnoses if d.id in REPLACED_HOLDS]
            report.diagnoses = [d for d in report.diagnoses if d.id not in REPLACED_HOLDS]
            if held:
                result.notes.append(
                    "--restart: " + ", ".join(d.id for d in held)
                    + " not counted (the server being replaced holds them)"
                )  # fmt: skip
        choice = choose(profile.supervisor, observed.supervisors)
        if not choice.ok or choice.backend is None:
            result.code = "supervisor-unavailable"
            result.message = f"{choice.reason}: set the profile's supervisor to auto or supervisord"
            return
        result.supervisor = choice.backend
        if patch_set is not None and not options.skip_preflight:
            self.step("patch-check")
            report.diagnoses += self.patch_check(patch_set)
        self.emit("preflight", ok=report.ok, diagnoses=[d.id for d in report.diagnoses],
                  supervisor=choice.backend)  # fmt: skip
        if not report.ok and not options.skip_preflight:
            result.diagnoses = report.diagnoses
            result.code = "preflight-failed"
            first = report.diagnoses[0]
            result.message = f"preflight: {first.id}: {first.summary}"
            return
        if not report.ok:
            result.notes.append(
                "preflight found " + ", ".join(d.id for d in report.diagnoses)
                + " (--skip-preflight)"
            )  # fmt: skip
        launch_id = _secrets.token_hex(8)
        self.step("launch")
        try:
            launch = self.link.call(
                "launch",
                lambda c: host_calls.launch(
                    c,
                    profile,
                    home=observed.home,
                    secrets=secrets,
                    restart=options.restart,
                    backend=choice.backend,  # type: ignore[arg-type]
                    launch_id=launch_id,
                    extra_args=drain_args(profile, observed),
                ),
            )
        except HostRefusal as exc:
            if exc.code not in ("host-busy", "already-running"):
                raise
            result.code = exc.code
            result.message = exc.message.removeprefix(f"{self.host.name}: ")
            return
        if launch.attached:
            self.attach(launch, observed)
            return
        result.launched = True
        result.pid = launch.pid
        result.supervisor = launch.supervisor
        self.emit("launch", pid=launch.pid, log=launch.log, supervisor=launch.supervisor,
                  source=launch.supervisor_source, resumed=launch.resumed)  # fmt: skip
        if not options.wait:
            result.outcome = "launched"
            result.message = f"started, pid {launch.pid}: fleet status / fleet logs --follow"
            return
        self.follow_and_check(launch, secrets, version=report.vllm_version)

    def attach(self, launch: host_calls.LaunchAnswer, observed: PreflightAnswer) -> None:
        """Follow a server of this profile that is already loading (no second launch)."""
        result = self.result
        result.attached = True
        result.pid = launch.pid
        result.supervisor = launch.supervisor
        since = time.time() - launch.started_at if launch.started_at else None
        self.emit("attach", pid=launch.pid, log=launch.log, supervisor=launch.supervisor,
                  loading_s=round(since, 1) if since is not None else None)  # fmt: skip
        result.notes.append(
            f"re-attached to the server already loading (pid {launch.pid}"
            + (f", started {since:.0f}s ago" if since is not None else "")
            + "): no second launch"
        )
        if not self.options.wait:
            result.outcome = "launched"
            result.message = (
                f"already loading, pid {launch.pid}: fleet status / fleet logs --follow"
            )
            return
        version = observed.vllm.version
        self.follow_and_check(launch, read_secrets(self.profile), version=version)

    def patch_check(self, patch_set: PatchSet) -> list[Diagnosis]:
        """``requires_patch``: the patch set must be applied (or not needed) on the host."""
        from fleet.patching.apply import apply_host

        report = self.link.call("patch-check", lambda c: apply_host(c, patch_set, check=True))
        return pre.judge_patch(report, host=self.host.name)

    # -- follow, readiness, diagnosis -------------------------------------------------------
    def follow_and_check(
        self, launch: host_calls.LaunchAnswer, secrets: dict[str, str], *, version: str | None
    ) -> None:
        result, profile = self.result, self.profile
        self.step("follow")
        self.follow(launch, version=version)
        if result.outcome != "ready":
            return
        api_key = secrets.get("VLLM_API_KEY")
        self.step("readiness")
        try:
            ready = self.link.call(
                "readiness",
                lambda c: readiness.check(
                    c, profile.port, profile.served_model_name, api_key=api_key,
                    on_step=lambda s: self.step(f"readiness:{s}"),
                ),
            )  # fmt: skip
        except (readiness.NotReady, ConnectionRefusedError) as exc:
            result.outcome = "crashed"
            result.code = "not-ready"
            result.message = str(exc)
            result.diagnoses = self.diagnose_log(launch.log)
            return
        result.spec_decode = ready.spec_decode
        result.endpoint = endpoint(self.host, profile)
        self.emit(
            "readiness",
            steps=ready.steps,
            spec_decode=ready.spec_decode.to_json() if ready.spec_decode else None,
        )
        result.message = "ready"

    def follow(self, launch: host_calls.LaunchAnswer, *, version: str | None) -> None:
        """Stream the log through the tracker and the engine until ready, a crash, a stall
        or the budget; the outcome and phase go into the result."""
        from fleet.diagnosis.engine import Engine
        from fleet.serving.phases import PhaseTracker
        from fleet.transport.follow import LogFollower, PhysicalLines

        result, profile, options, started = self.result, self.profile, self.options, self.started
        tracker = PhaseTracker(version, clock=time.monotonic)
        engine = Engine(host=self.host.name)
        budget = self.budget
        stall = options.stall_timeout or profile.stall_timeout_s
        follower = LogFollower(
            self.link, self.host, launch.log, pid=launch.pid or 0, inode=launch.log_inode, tick=TICK
        )
        last_bytes = time.monotonic()
        last_progress = tracker.progress
        splitter = PhysicalLines()
        line_no = 0
        fatal: Diagnosis | None = None
        reported = 0.0
        lines: list[str] = []
        try:
            for chunk in follower.chunks():
                now = time.monotonic()
                if chunk:
                    last_bytes = now
                    lines = splitter.feed(chunk)
                    for line in lines:
                        line_no += 1
                        for event in tracker.feed(line):
                            self.emit("phase", phase=event.phase, previous=event.previous,
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
                    last = lines[-1][-160:] if chunk and lines else None
                    self.emit("progress", **progress.as_json(),
                              elapsed_s=round(now - started, 1), last_line=last)  # fmt: skip
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
            "log_offset": follower.offset,
            "sha256": follower.stats.sha256,
            "reconnects": follower.stats.reconnects,
            "rotations": follower.stats.rotations,
            "lines": line_no,
        }
        result.notes += follower.stats.notes
        if result.outcome == "ready":
            return
        if follower.exited or fatal is not None:
            self.crashed(launch, tracker.phase, fatal)
        elif result.outcome in ("stalled", "timeout"):
            ended, result.message = load_ended(result.outcome, self.host.name, tracker.phase,
                                               stall_s=stall, budget_s=budget)  # fmt: skip
            result.diagnoses = [ended]
            self.emit("stall" if result.outcome == "stalled" else "timeout", phase=tracker.phase)

    def crashed(self, launch: host_calls.LaunchAnswer, phase: str, fatal: Diagnosis | None) -> None:
        """The process exited or printed a fatal line: what the log and the supervisor
        say, the cause first."""
        result = self.result
        result.outcome = "crashed"
        found = self.diagnose_log(launch.log) or ([fatal] if fatal else [])
        program = self.program_after(launch)
        if program is not None and not program.daemon and program.supervisor == "supervisord":
            found.insert(
                0,
                diagnosis(
                    "supervisor-died", host=self.host.name,
                    evidence=["supervisord is not running: vLLM was stopped with it"],
                    seen_by="status", supervisor="supervisord",
                ),
            )  # fmt: skip
        if not found:
            why = program.description if program is not None and program.description else None
            found = [
                diagnosis(
                    "process-exited", host=self.host.name,
                    evidence=["the server exited" + (f" ({why})" if why else "")],
                    seen_by="follow", what="it exited while loading",
                )
            ]  # fmt: skip
        result.diagnoses = found
        first = found[0]
        result.message = f"crashed in {phase}: {first.id}: {first.summary}"
        self.emit("crash", phase=phase, diagnoses=[d.id for d in found])

    def program_after(self, launch: host_calls.LaunchAnswer) -> host_calls.ProgramState | None:
        try:
            answer = self.link.call("status", lambda c: host_calls.status(c, [launch.name]))
        except Exception:  # the crash is reported even if the supervisor cannot be asked
            return None
        entry = answer.profiles.get(launch.name)
        return entry.program if entry is not None else None

    def diagnose_log(self, log: str) -> list[Diagnosis]:
        """The whole log, filtered on the host (the same engine as fleet logs --diagnose)."""
        from fleet.diagnosis.host_logs import diagnose_remote

        def run(conn: Runner) -> list[Diagnosis]:
            return diagnose_remote(conn, log).diagnoses

        try:
            return self.link.call("diagnose", run)
        except ConnectError as exc:  # past the deadline: the crash is still reported
            self.result.notes.append(f"the log could not be diagnosed: {exc.message}")
            return []
        except Exception:  # the crash is reported even if the diagnosis cannot be fetched
            return []


def _launch_record(server: ServerSeen) -> host_calls.LaunchAnswer | None:
    """The launch record (state.json) of the server running now, with its current pid."""
    from pydantic import ValidationError

    record = dict(server.launch)
    if server.program.pid:
        record["pid"] = server.program.pid
    record.setdefault("state", server.program.state or "UNKNOWN")
    try:
        return host_calls.LaunchAnswer.model_validate(record)
    except ValidationError:
        return None
