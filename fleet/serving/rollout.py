"""``fleet rollout PROFILE --host P``: bring the hosts to the profile as it is now, a batch
at a time, gated on health.

**Observe** (one status call per host, and ``fleet patch --check``'s engine when the profile
requires a patch set): the profile's server on each host, its state and the fingerprint
its launch recorded (:meth:`fleet.serving.profile.Profile.fingerprint`: the rendered
profile's sha256).

**Plan** (pure, :func:`plan`): ``keep`` a host that serves the profile as it is now and is
ready; ``roll`` one that serves another version of it (or serves it badly): drain, stop,
patch if needed, serve; ``start`` one that serves nothing of it (or is still loading it):
patch if needed, serve (a load in progress is followed, not started again). The hosts to
change go in batches in inventory order: the ``--canary`` hosts first and alone, then
``--batch`` hosts at a time.

**Run** (:func:`run`): before a batch goes down, every other host that serves must still
be ready (a fresh status of each): otherwise the rollout halts, so never more than one
batch of servers is down. Each host of the batch in parallel: drain (the engine's
``vllm:num_requests_running`` and ``_waiting`` reach 0, bounded; a vLLM with
``--shutdown-timeout`` also drains on stop), stop, patch, serve (preflight, launch, the
followed load, readiness, the acceptance rate). The next batch starts only when every host
of this one is ready. On the first failure the rollout halts: the failed hosts carry their
diagnoses, the hosts not yet touched keep serving what they served, and the report says
which host runs what. Running it again resumes: the hosts already at the profile are kept.

Every step talks to its host through a :class:`~fleet.transport.link.HostLink`, so a
dropped connection reconnects and the step carries on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fleet.errors import UsageError

if TYPE_CHECKING:
    from fleet.inventory import HostSpec
    from fleet.patching.manifest import PatchSet
    from fleet.serving.profile import Profile
    from fleet.serving.serve import Events, ServeResult
    from fleet.transport import Runner, Session
    from fleet.transport.link import HostLink

log = logging.getLogger(__name__)

Action = Literal["keep", "roll", "start"]
RolloutResult = Literal["kept", "ready", "failed", "untouched"]
SERVING = ("ready", "loading", "starting")
PATCH_OK = ("already-applied", "not-needed")
DRAIN_POLL_S = 0.5


@dataclass
class Observed:
    """One host before the rollout: its server of the profile and the patch set's state."""

    host: str
    state: str  # ready | loading | starting | crashed | stopped
    fingerprint: str | None = None
    pid: int | None = None
    patch: str | None = None  # fleet patch --check's status; None: the profile needs none

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "fingerprint": self.fingerprint, "pid": self.pid,
                "patch": self.patch}  # fmt: skip


@dataclass
class HostStep:
    host: str
    action: Action
    why: str
    patch: bool = False  # apply the profile's patch set before serving
    batch: int | None = None  # 0: the canary batch

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "why": self.why, "patch": self.patch, "batch": self.batch}


@dataclass
class Plan:
    profile: str
    hosts: list[HostStep]
    batches: list[list[str]]
    canary: int
    batch_size: int

    def of(self, host: str) -> HostStep:
        return next(h for h in self.hosts if h.host == host)

    @property
    def changes(self) -> int:
        return sum(1 for h in self.hosts if h.action != "keep")

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "canary": self.canary,
            "batch": self.batch_size,
            "batches": self.batches,
            "hosts": {h.host: h.to_json() for h in self.hosts},
        }


def plan(
    profile: str,
    observed: Sequence[Observed],
    fingerprints: dict[str, str],
    *,
    batch: int = 1,
    canary: int = 0,
) -> Plan:
    """What the rollout does to each host, and in which batches (pure)."""
    if batch < 1:
        raise UsageError(f"--batch {batch}: must be at least 1")
    if canary < 0:
        raise UsageError(f"--canary {canary}: must not be negative")
    hosts: list[HostStep] = []
    for seen in observed:
        want = fingerprints[seen.host]
        needs_patch = seen.patch is not None and seen.patch not in PATCH_OK
        current = seen.fingerprint == want
        if seen.state == "ready" and current:
            why = "serves the profile as it is now"
            if needs_patch:
                why += f" (its patch set on disk: {seen.patch}; the next start patches it)"
            hosts.append(HostStep(seen.host, "keep", why))
            continue
        if seen.state in SERVING and not current:
            why = (
                "serves an earlier version of the profile"
                if seen.fingerprint
                else "serves the profile, started without a fingerprint (an earlier fleet)"
            )
            hosts.append(HostStep(seen.host, "roll", why, patch=needs_patch))
        elif seen.state in ("loading", "starting"):
            why = f"is {seen.state} the profile as it is now: followed until ready"
            hosts.append(HostStep(seen.host, "start", why, patch=False))
        else:
            hosts.append(HostStep(seen.host, "start", f"serves nothing ({seen.state})",
                                  patch=needs_patch))  # fmt: skip
        if needs_patch:
            hosts[-1].why += f"; patch set {seen.patch}"
    todo = [h for h in hosts if h.action != "keep"]
    batches: list[list[str]] = []
    rest = list(todo)
    if canary and rest:
        batches.append([h.host for h in rest[:canary]])
        rest = rest[canary:]
    while rest:
        batches.append([h.host for h in rest[:batch]])
        rest = rest[batch:]
    for index, names in enumerate(batches):
        for h in hosts:
            if h.host in names:
                h.batch = index
    return Plan(profile, hosts, batches, canary, batch)


# -- the run -------------------------------------------------------------------------------


@dataclass
class RolloutOptions:
    batch: int = 1
    canary: int = 0
    drain_timeout: float = 300.0
    timeout: float | None = None  # the load budget of each serve (default: the profile's)


@dataclass
class HostRun:
    """One host's part of the rollout."""

    host: str
    action: Action
    before: Observed
    result: RolloutResult = "untouched"
    steps: list[str] = field(default_factory=list)
    serve: ServeResult | None = None
    message: str | None = None
    code: str | None = None
    drained: dict[str, Any] = field(default_factory=dict)

    @property
    def runs(self) -> str:
        """What the host serves once the rollout is over (or halted)."""
        if self.result in ("kept", "ready"):
            return "this profile"
        if self.result == "untouched":
            if self.before.state in SERVING:
                return "the profile as it was" if self.action == "roll" else "this profile"
            return "nothing"
        return "nothing"

    def to_json(self) -> dict[str, Any]:
        serve = self.serve.to_json() if self.serve is not None else None
        return {
            "action": self.action,
            "result": self.result,
            "runs": self.runs,
            "before": self.before.to_json(),
            "steps": self.steps,
            "drained": self.drained or None,
            "message": self.message,
            "code": self.code,
            "serve": serve,
        }


@dataclass
class Rollout:
    plan: Plan
    hosts: dict[str, HostRun]
    halted: str | None = None  # why the rollout stopped before the end
    halted_batch: int | None = None
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.halted is None and all(
            r.result in ("kept", "ready") for r in self.hosts.values()
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "halted": None
            if self.halted is None
            else {"batch": self.halted_batch, "reason": self.halted},
            "elapsed_s": round(self.elapsed_s, 1),
            "plan": self.plan.to_json(),
            "hosts": {name: r.to_json() for name, r in self.hosts.items()},
        }


def observe(conn: Runner, profile: Profile, patch_set: PatchSet | None) -> Observed:
    """One host's server of the profile and its patch set (a status call, and the patch
    set checked as ``fleet patch --check`` does)."""
    from fleet.serving import host_calls
    from fleet.serving.status import report_of

    answer = host_calls.status(conn, [profile.name])
    entry = answer.profiles.get(profile.name)
    state, fingerprint, pid = "stopped", None, None
    if entry is not None:
        report = report_of(profile.name, entry, conn.host.target)
        state, pid = report.state, report.pid
        found = entry.launch.get("fingerprint")
        fingerprint = found if isinstance(found, str) else None
    patch = None
    if patch_set is not None:
        from fleet.patching.apply import apply_host

        patch = apply_host(conn, patch_set, check=True).status
    return Observed(conn.host.name, state, fingerprint, pid, patch)


def run(
    session: Session,
    hosts: Sequence[HostSpec],
    profile_name: str,
    the_plan: Plan,
    observed: dict[str, Observed],
    options: RolloutOptions,
    events: Events,
) -> Rollout:
    """Carry out ``the_plan`` (see the module docstring)."""
    started = time.monotonic()
    by_name = {h.name: h for h in hosts}
    report = Rollout(
        the_plan,
        {
            h.host: HostRun(h.host, h.action, observed[h.host],
                            result="kept" if h.action == "keep" else "untouched")
            for h in the_plan.hosts
        },
    )  # fmt: skip

    def say(host: str | None, message: str, **fields: Any) -> None:
        events({"host": host or "-", "event": "rollout", "message": message,
                "t": round(time.monotonic() - started, 2), **fields})  # fmt: skip

    up = {h for h, o in observed.items() if o.state == "ready"}
    count = len(the_plan.batches)
    for index, names in enumerate(the_plan.batches):
        label = "canary batch" if index == 0 and the_plan.canary else f"batch {index + 1}/{count}"
        not_ready = _gate(session, [by_name[h] for h in sorted(up - set(names))], profile_name)
        if not_ready:
            report.halted = (
                f"before {label} ({', '.join(names)}): "
                + ", ".join(f"{h} is {state}" for h, state in not_ready.items())
                + f"; halted so that no more than {len(names)} server(s) are down at once"
            )
            report.halted_batch = index
            say(None, f"halted: {report.halted}")
            break
        say(None, f"{label}: {', '.join(names)}", batch=index, hosts=names)
        runs = [report.hosts[h] for h in names]
        with ThreadPoolExecutor(max_workers=len(runs), thread_name_prefix="fleet-rollout") as pool:
            list(
                pool.map(
                    lambda r: _one_host(
                        session, by_name[r.host], profile_name, the_plan.of(r.host), r,
                        options, events, say,
                    ),
                    runs,
                )
            )  # fmt: skip
        failed = [r for r in runs if r.result != "ready"]
        up |= {r.host for r in runs if r.result == "ready"}
        up -= {r.host for r in failed}
        if failed:
            report.halted = f"{label}: " + "; ".join(
                f"{r.host} {r.message or r.result}" for r in failed
            )
            report.halted_batch = index
            say(None, f"halted: {report.halted}")
            break
    report.elapsed_s = time.monotonic() - started
    return report


def _gate(session: Session, hosts: list[HostSpec], profile_name: str) -> dict[str, str]:
    """The hosts (of those that serve) that are not ready now: ``{host: state}``."""
    from fleet.serving import host_calls
    from fleet.serving.status import report_of
    from fleet.transport import fan_out

    def state(conn: Any) -> str:
        entry = host_calls.status(conn, [profile_name]).profiles.get(profile_name)
        return report_of(profile_name, entry, conn.host.target).state if entry else "stopped"

    out: dict[str, str] = {}
    for outcome in fan_out(session, hosts, state):
        if outcome.value != "ready":
            out[outcome.host] = outcome.value or f"unreachable ({outcome.code})"
    return out


def _one_host(
    session: Session,
    host: HostSpec,
    profile_name: str,
    step: HostStep,
    out: HostRun,
    options: RolloutOptions,
    events: Events,
    say: Callable[..., None],
) -> None:
    """drain, stop, patch, serve: one host of a batch (its result into ``out``)."""
    from fleet.serving.profile import for_host
    from fleet.serving.serve import ServeOptions, required_patch_set, serve_host
    from fleet.transport.link import HostLink

    profile = for_host(profile_name, host)
    link = HostLink(session, host, reconnect_s=120.0)
    try:
        if step.action == "roll":
            out.steps.append("drain")
            out.drained = _drain(link, profile.port, options.drain_timeout)
            waited = out.drained.get("waited_s")
            say(host.name, f"drained ({out.drained.get('outcome')}, {waited}s)", **out.drained)
            out.steps.append("stop")
            from fleet.serving.status import stop_host

            stopped = link.call("stop", lambda c: stop_host(c, host, profile_name))
            say(host.name, f"stopped (pid {stopped.pid})" if stopped.was_running else "stopped")
        if step.patch:
            out.steps.append("patch")
            patch_set = required_patch_set(profile)
            if patch_set is not None:
                from fleet.patching.apply import apply_host

                applied = link.call("patch", lambda c: apply_host(c, patch_set))
                verdict = applied.verdict()
                if verdict.status == "failed":
                    out.result, out.code = "failed", verdict.code
                    out.message = f"patch {patch_set.name}: {verdict.error or applied.status}"
                    say(host.name, out.message)
                    return
                say(host.name, f"patched ({applied.status})")
        out.steps.append("serve")
        result = serve_host(session, host, profile_name, ServeOptions(timeout=options.timeout),
                            events)  # fmt: skip
        out.serve = result
        if result.outcome == "ready":
            out.result = "ready"
            rate = result.spec_decode.acceptance_rate if result.spec_decode else None
            out.message = "ready" + (f", acceptance rate {rate:.2f}" if rate is not None else "")
        else:
            out.result, out.code = "failed", result.verdict().code
            out.message = result.message or result.outcome
    except Exception as exc:  # one host's fault halts the rollout with its reason
        from fleet.transport import HostOutcome

        failure: HostOutcome[None] = HostOutcome.of_error(host.name, exc)
        out.result, out.code, out.message = "failed", failure.code, failure.error
        log.debug("%s: rollout step failed", host.name, exc_info=exc)


def _drain(link: HostLink, port: int, timeout: float) -> dict[str, Any]:
    """Wait until the server holds no request (bounded by ``timeout``)."""
    from fleet.serving import readiness

    started = time.monotonic()
    first: readiness.Load | None = None
    while True:
        try:
            now = link.call("drain", lambda c: readiness.load(c, port))
        except (ConnectionRefusedError, readiness.NotReady):
            return {"outcome": "not serving", "waited_s": round(time.monotonic() - started, 1)}
        first = first or now
        waited = round(time.monotonic() - started, 1)
        if now.idle or not now.found:
            return {"outcome": "idle", "waited_s": waited, "running_at_start": first.running,
                    "waiting_at_start": first.waiting}  # fmt: skip
        if time.monotonic() - started >= timeout:
            return {"outcome": "timeout", "waited_s": waited, "running": now.running,
                    "waiting": now.waiting, "running_at_start": first.running}  # fmt: skip
        time.sleep(DRAIN_POLL_S)
