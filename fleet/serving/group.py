"""``fleet serve`` of a profile with ``nodes: N``: one server across a group of N hosts.

The group is served as a unit (:mod:`fleet.serving.multinode` for who runs what):

1. preflight on every node at once, with the checks only the nodes can make (their
   address is their own, the ports the head opens are free, the other nodes answer at the
   addresses they will use) in one round trip, the profile's ``requires_patch`` on each in
   a second (``fleet patch --check``'s engine and its own conversation with the patch
   script: the files' sha256, their texts when no plan for them is kept),
   then the group's rules (same vLLM and patched files everywhere, GPUs x nodes = the
   parallel sizes, the backend this vLLM offers). One node refused refuses the group.
2. launch under the supervisor on every node: mp, the workers (``--headless``) first and
   the head last, within torch's rendezvous window; ray, the Ray node of every host first
   (``P-ray``), then, once ``ray status`` on the head counts every node, ``vllm serve`` on
   the head alone. Each launch is idempotent by its launch id, as for one host.
3. follow every node's log with the resumable follow (one thread per node, each through
   its own :class:`~fleet.transport.link.HostLink`); the head's lines drive the phase
   tracker; a node's process exiting, or a fatal line in any node's log, is the group's
   crash: every node is stopped, and the failing node's log is diagnosed first.
4. readiness and the acceptance rate on the head only.

Every node's entry in ``--json`` names its group, rank and role; the head's carries the
endpoint and the acceptance rate.
"""

from __future__ import annotations

import logging
import queue
import secrets as _secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from fleet.diagnosis.factory import diagnosis
from fleet.errors import ConnectError, FleetError
from fleet.onhost.client import HostRefusal
from fleet.onhost.supervisors import ACTIVE_STATES
from fleet.serving import host_calls, readiness
from fleet.serving import preflight as pre
from fleet.serving.multinode import (
    RAY_SUFFIX,
    VLLM_PORT_SPAN,
    Group,
    GroupCheck,
    Member,
    Node,
    Offers,
    judge_group,
    node_of,
)
from fleet.serving.profile import Profile, for_host, read_secrets
from fleet.serving.serve import (
    HEALTH_WAIT,
    TICK,
    Events,
    ServeOptions,
    ServeResult,
    endpoint,
    load_ended,
    required_patch_set,
)
from fleet.serving.supervisor import choose
from fleet.transport.link import HostLink

if TYPE_CHECKING:
    from fleet.diagnosis.models import Diagnosis
    from fleet.patching.manifest import PatchSet
    from fleet.serving.observed import PreflightAnswer
    from fleet.transport import Runner, Session

log = logging.getLogger(__name__)
DEAD_GRACE_S = 3.0  # after the first node fails: a worker that died too is the one named
RAY_JOIN_S = 120.0  # every node's raylet registered with the head's GCS within this


@dataclass
class NodeRun:
    member: Member
    profile: Profile
    link: HostLink
    result: ServeResult
    answer: PreflightAnswer | None = None
    node: Node | None = None
    launches: list[host_calls.LaunchAnswer] = field(default_factory=list)
    diagnoses: list[Diagnosis] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.member.host.name


def serve_group(
    session: Session, group: Group, profile_name: str, options: ServeOptions, events: Events
) -> dict[str, ServeResult]:
    """Serve the profile on the group; one :class:`ServeResult` per node, by host name."""
    started = time.monotonic()
    runs: list[NodeRun] = []
    for member in group.members:
        profile = for_host(profile_name, member.host)
        budget = options.timeout or profile.load_timeout_s
        link = HostLink(session, member.host, deadline=started + budget + HEALTH_WAIT)
        result = ServeResult(host=member.host.name, profile=profile.name, outcome="refused",
                             group=group.name, rank=member.rank, role=member.role)  # fmt: skip
        runs.append(NodeRun(member, profile, link, result))
    served = _GroupServe(group, runs, options, events, started)
    try:
        served.serve()
    finally:
        for run in runs:
            run.result.link = run.link.stats.to_json()
            run.result.elapsed_s = time.monotonic() - started
            run.result.notes += served.check.notes if run.member.rank == 0 else []
            served.emit(run, "result", outcome=run.result.outcome, phase=run.result.phase,
                        message=run.result.message, pid=run.result.pid,
                        launched=run.result.launched)  # fmt: skip
    return {run.name: run.result for run in runs}


class _GroupServe:
    def __init__(
        self,
        group: Group,
        runs: list[NodeRun],
        options: ServeOptions,
        events: Events,
        started: float,
    ) -> None:
        self.group = group
        self.runs = runs
        self.options = options
        self.events = events
        self.started = started
        self.head = runs[0]
        self.profile = self.head.profile
        self.budget = options.timeout or self.profile.load_timeout_s
        self.check = GroupCheck()

    def emit(self, run: NodeRun, kind: str, **fields: Any) -> None:
        self.events({"host": run.name, "event": kind, "group": self.group.name,
                     "rank": run.member.rank, "role": run.member.role,
                     "t": round(time.monotonic() - self.started, 2), **fields})  # fmt: skip

    def each(self, fn: Callable[[NodeRun], Any], runs: list[NodeRun] | None = None) -> list[Any]:
        """``fn`` on every node at once; the first failure is raised after all ended."""
        targets = runs if runs is not None else self.runs
        with ThreadPoolExecutor(max_workers=len(targets), thread_name_prefix="fleet-node") as pool:
            futures = [pool.submit(fn, run) for run in targets]
            outcomes = []
            failure: BaseException | None = None
            for future in futures:
                try:
                    outcomes.append(future.result())
                except BaseException as exc:  # re-raised below, once all ended
                    failure = failure or exc
                    outcomes.append(None)
        if failure is not None:
            raise failure
        return outcomes

    def all_results(self, **fields: Any) -> None:
        for run in self.runs:
            for key, value in fields.items():
                setattr(run.result, key, value)

    # -- 1. preflight ---------------------------------------------------------------------
    def node_request(self, run: NodeRun) -> dict[str, Any]:
        profile = run.profile
        ports: list[int] = []
        if run.member.rank == 0:
            ports.append(profile.ray_port if profile.distributed_backend == "ray"
                         else profile.master_port)  # fmt: skip
            if profile.vllm_port_base is not None:
                ports += list(
                    range(profile.vllm_port_base, profile.vllm_port_base + VLLM_PORT_SPAN)
                )
        peers = [
            {"name": m.host.name, "address": m.address, "port": m.host.port or 22}
            for m in self.group.members
            if m is not run.member
        ]
        return {"address": run.member.address, "ports": ports, "peers": peers,
                "interface": profile.node_interface}  # fmt: skip

    def preflight(self, patch_set: PatchSet | None) -> bool:
        def observe(run: NodeRun) -> None:
            self.emit(run, "step", step="preflight")
            request = self.node_request(run)
            run.answer = run.link.call(
                "preflight", lambda c: host_calls.preflight(c, run.profile, request)
            )

        self.each(observe)
        answers = {run.name: run.answer for run in self.runs if run.answer is not None}
        running = [
            r for r in self.runs if r.answer and r.answer.server.program.state in ACTIVE_STATES
        ]
        if running and not self.options.restart:
            names = ", ".join(r.name for r in running)
            self.all_results(
                code="already-running",
                message=f"a server of {self.profile.name} already runs on {names}: fleet "
                "status shows it; --restart replaces the group's",
            )
            return False
        patch_shas: dict[str, dict[str, str | None]] = {}
        for run in self.runs:
            assert run.answer is not None
            report = pre.judge(run.profile, run.answer, host=run.name)
            found = list(report.diagnoses)
            if run.member.rank > 0:  # workers serve no HTTP: their API port is not theirs
                found = [d for d in found if d.id != "port-in-use"]
            if running:  # --restart: what the group's own server holds
                found = [
                    d
                    for d in found
                    if d.id not in ("port-in-use", "gpu-memory-utilization-too-high")
                ]
            run.diagnoses = found
            run.result.notes += report.notes
        if patch_set is not None and not self.options.skip_preflight:
            from fleet.patching.apply import apply_host

            def check(run: NodeRun) -> None:
                self.emit(run, "step", step="patch-check")
                report = run.link.call(
                    "patch-check", lambda c: apply_host(c, patch_set, check=True)
                )
                run.diagnoses += pre.judge_patch(report, host=run.name)
                patch_shas[run.name] = {f.path: f.sha256_before for f in report.files}

            self.each(check)
        profiles = {run.name: run.profile for run in self.runs}
        self.check = judge_group(self.profile, self.group, answers, patch_shas or None, profiles)
        for run in self.runs:
            run.diagnoses += self.check.diagnoses.get(run.name, [])
            self.emit(run, "preflight", ok=not any(d.is_problem for d in run.diagnoses),
                      diagnoses=[d.id for d in run.diagnoses])  # fmt: skip
        refused = [r for r in self.runs if any(d.is_problem for d in r.diagnoses)]
        if refused and not self.options.skip_preflight:
            first = refused[0]
            why = f"{first.diagnoses[0].id}: {first.diagnoses[0].summary}"
            for run in self.runs:
                run.result.code = "preflight-failed"
                run.result.diagnoses = run.diagnoses
                run.result.message = (
                    f"preflight ({first.name}, {first.member.role} {first.member.rank}): {why}"
                )
            return False
        for run in refused:
            run.result.notes.append(
                "preflight found " + ", ".join(d.id for d in run.diagnoses) + " (--skip-preflight)"
            )
        return True

    # -- 2. launch ------------------------------------------------------------------------
    def launch(self, run: NodeRun, *, ray: bool) -> host_calls.LaunchAnswer:
        assert run.answer is not None and run.node is not None
        choice = choose(run.profile.supervisor, run.answer.supervisors)
        if choice.backend is None:
            raise HostRefusal(f"{run.name}: {choice.reason}", code="supervisor-unavailable")
        run.result.supervisor = choice.backend
        launch_id = _secrets.token_hex(8)
        profile, argv, node = run.profile, None, run.node
        if ray:
            profile = run.profile.model_copy(update={"name": run.profile.name + RAY_SUFFIX})
            argv = run.node.ray_argv(run.profile, _ray_executable(run))
            node = replace(run.node, ray_program=True)
        secrets = read_secrets(run.profile)
        self.emit(run, "step", step="launch-ray" if ray else "launch")
        answer = run.link.call(
            "launch",
            lambda c: host_calls.launch(
                c, profile, home=run.answer.home, secrets=secrets,  # type: ignore[union-attr]
                restart=self.options.restart, backend=choice.backend,  # type: ignore[arg-type]
                launch_id=launch_id, node=node, argv=argv,
            ),
        )  # fmt: skip
        run.launches.append(answer)
        run.result.launched = True
        if not ray:
            run.result.pid = answer.pid
        self.emit(run, "launch", pid=answer.pid, program=answer.name,
                  supervisor=answer.supervisor, source=answer.supervisor_source)  # fmt: skip
        return answer

    def start(self) -> list[tuple[NodeRun, host_calls.LaunchAnswer]]:
        """Every node's programs, in the order the backend needs; what to follow."""
        profile = self.profile
        assert self.head.answer is not None
        offers = Offers.of(self.head.answer)
        for run in self.runs:
            run.node = node_of(run.member, self.group, run.profile, offers, self.budget)
        followed: list[tuple[NodeRun, host_calls.LaunchAnswer]] = []
        if profile.distributed_backend == "ray":
            rays = [(self.head, self.launch(self.head, ray=True))]
            rays += zip(self.runs[1:], self.each(lambda r: self.launch(r, ray=True), self.runs[1:]),
                        strict=True)  # fmt: skip
            followed += rays
            self.wait_ray_cluster()
            followed.append((self.head, self.launch(self.head, ray=False)))
            return followed
        workers = self.runs[1:]
        answers = self.each(lambda r: self.launch(r, ray=False), workers)
        followed += list(zip(workers, answers, strict=True))
        followed.append((self.head, self.launch(self.head, ray=False)))
        return followed

    def wait_ray_cluster(self) -> None:
        """Until ``ray status`` on the head counts every node of the group."""
        head, want = self.head, len(self.runs)
        deadline = time.monotonic() + RAY_JOIN_S
        address = f"{self.group.head.address}:{self.profile.ray_port}"
        seen = 0
        self.emit(head, "step", step="ray-cluster")
        while time.monotonic() < deadline:
            answer = head.link.call(
                "ray-status",
                lambda c: host_calls.ray_nodes(c, ray=_ray_executable(head), address=address),
            )
            seen = answer.nodes
            if seen >= want:
                self.emit(head, "ray-cluster", nodes=seen, gpus=answer.gpus)
                return
            time.sleep(1.0)
        raise HostRefusal(
            f"{head.name}: the Ray cluster has {seen} of {want} nodes after {RAY_JOIN_S:.0f}s "
            f"(ray status --address {address})",
            code="ray-cluster-incomplete",
        )

    # -- 3. follow, 4. readiness ------------------------------------------------------------
    def serve(self) -> None:
        patch_set = required_patch_set(self.profile)
        if not self.preflight(patch_set):
            return
        try:
            followed = self.start()
        except HostRefusal as exc:
            self.stop_all()
            self.all_results(outcome="refused", code=exc.code,
                             message=exc.message)  # fmt: skip
            return
        if not self.options.wait:
            self.all_results(
                outcome="launched", message="started: fleet status / fleet logs --follow"
            )
            return
        failing = self.follow(followed)
        if failing is None and self.head.result.outcome == "ready":
            self.ready()
            return
        self.stop_all()
        self.crashed(failing)

    def follow(self, followed: list[tuple[NodeRun, host_calls.LaunchAnswer]]) -> NodeRun | None:
        """Every followed program's log at once; the head's drives the phases. Returns the
        node that failed first (None: ready, stalled or out of time)."""
        from fleet.diagnosis.engine import Engine
        from fleet.serving.phases import PhaseTracker
        from fleet.transport.follow import LogFollower, PhysicalLines

        head_answer = self.head.answer
        version = head_answer.vllm.version if head_answer is not None else None
        tracker = PhaseTracker(version, clock=time.monotonic)
        stall = self.options.stall_timeout or self.profile.stall_timeout_s
        events: queue.Queue[tuple[int, bytes | None, bool]] = queue.Queue()
        followers: list[LogFollower] = []
        engines: list[Any] = []
        splitters: list[PhysicalLines] = []
        for index, (node_run, launch) in enumerate(followed):
            follower = LogFollower(node_run.link, node_run.member.host, launch.log,
                                   pid=launch.pid or 0,
                                   inode=launch.log_inode, tick=TICK)  # fmt: skip
            followers.append(follower)
            engines.append(Engine(host=node_run.name))
            splitters.append(PhysicalLines())

            def pump(i: int = index, f: LogFollower = follower) -> None:
                try:
                    for chunk in f.chunks():
                        events.put((i, chunk, False))
                    events.put((i, None, f.exited))
                except (ConnectError, FleetError) as exc:
                    log.info("follow of node %d ended: %s", i, exc)
                    events.put((i, None, True))

            threading.Thread(target=pump, daemon=True, name=f"fleet-follow-{index}").start()
        head_index = len(followed) - 1  # the head's vllm is launched (and listed) last
        last_bytes = time.monotonic()
        failing: NodeRun | None = None
        line_nos = [0] * len(followed)
        try:
            while True:
                try:
                    index, chunk, ended = events.get(timeout=TICK)
                except queue.Empty:
                    index, chunk, ended = -1, b"", False
                now = time.monotonic()
                run: NodeRun | None = followed[index][0] if index >= 0 else None
                if chunk is None and run is not None:
                    if ended:
                        failing = run
                        self.emit(run, "node-exited", program=followed[index][1].name)
                        break
                    continue
                if chunk:
                    last_bytes = now
                    for line in splitters[index].feed(chunk):
                        line_nos[index] += 1
                        engines[index].feed(line_nos[index], line)
                        if index == head_index:
                            for event in tracker.feed(line):
                                self.emit(self.head, "phase", phase=event.phase,
                                          previous=event.previous,
                                          message=event.message[:200])  # fmt: skip
                    fatal = []
                    if engines[index].findings:
                        fatal = [d for d in engines[index].results() if d.severity == "fatal"]
                    if fatal and run is not None:
                        failing = run
                        break
                    if tracker.phase == "ready":
                        self.all_results(outcome="ready")
                        break
                if now - last_bytes > stall:
                    self.all_results(outcome="stalled")
                    break
                if now - self.started > self.budget:
                    self.all_results(outcome="timeout")
                    break
            if failing is not None:
                failing = self.first_dead(failing, followed, events)
        finally:
            for follower in followers:
                follower.close()
        self.all_results(phase=tracker.phase)
        for (run, launch), follower in zip(followed, followers, strict=True):
            entry = {"program": launch.name, "bytes": follower.stats.bytes,
                     "log_offset": follower.offset, "sha256": follower.stats.sha256,
                     "reconnects": follower.stats.reconnects, "lines": 0}  # fmt: skip
            run.result.follow.setdefault("programs", []).append(entry)
        if failing is None and self.head.result.outcome in ("stalled", "timeout"):
            found, message = load_ended(self.head.result.outcome, self.head.name, tracker.phase,
                                        stall_s=stall, budget_s=self.budget)  # fmt: skip
            self.all_results(diagnoses=[found], message=message)
            self.stop_all()
        return failing

    def first_dead(
        self,
        failing: NodeRun,
        followed: list[tuple[NodeRun, host_calls.LaunchAnswer]],
        events: queue.Queue[tuple[int, bytes | None, bool]],
    ) -> NodeRun:
        """A dead node often takes the others with it (the head's collectives fail when a
        worker dies): a worker whose process ends within the grace after the first failure
        is the one to name, not the head that reported it."""
        if failing.member.rank > 0:
            return failing
        deadline = time.monotonic() + DEAD_GRACE_S
        while time.monotonic() < deadline:
            try:
                index, chunk, ended = events.get(timeout=0.2)
            except queue.Empty:
                continue
            run = followed[index][0]
            if chunk is None and ended and run.member.rank > 0:
                return run
        # no worker's end seen yet: ask their supervisors which program is gone
        for run, launch in followed:
            if run.member.rank == 0:
                continue

            def ask(conn: Runner, name: str = launch.name) -> host_calls.StatusAnswer:
                return host_calls.status(conn, [name])

            try:
                answer = run.link.call("status", ask)
            except Exception:  # an unreachable worker is the likelier culprit still
                return run
            entry = answer.profiles.get(launch.name)
            if entry is None or entry.program.state not in ACTIVE_STATES:
                return run
        return failing

    def ready(self) -> None:
        head = self.head
        api_key = read_secrets(head.profile).get("VLLM_API_KEY")
        self.emit(head, "step", step="readiness")
        try:
            ready = head.link.call(
                "readiness",
                lambda c: readiness.check(c, head.profile.port, head.profile.served_model_name,
                                          api_key=api_key),
            )  # fmt: skip
        except (readiness.NotReady, ConnectionRefusedError) as exc:
            self.stop_all()
            self.all_results(outcome="crashed", code="not-ready", message=str(exc))
            return
        head.result.spec_decode = ready.spec_decode
        head.result.endpoint = endpoint(head.member.host, head.profile)
        for run in self.runs:
            run.result.message = (
                "ready"
                if run is head
                else f"ready: worker {run.member.rank} of {head.name}'s group"
            )
        spec = ready.spec_decode.to_json() if ready.spec_decode else None
        self.emit(head, "readiness", steps=ready.steps, spec_decode=spec)

    def stop_all(self) -> None:
        """Every program of the group on every node (a crash on one is the group's)."""

        def stop(run: NodeRun) -> None:
            grace = run.profile.stop_grace_s + 30
            for name in (run.profile.name, run.profile.name + RAY_SUFFIX):

                def one(conn: Runner, program: str = name) -> host_calls.StopAnswer:
                    return host_calls.stop(conn, program, timeout=grace)

                try:
                    run.link.call("stop", one)
                except Exception as exc:  # the others are stopped whatever one answers
                    log.info("%s: stop %s: %s", run.name, name, exc)

        self.emit(self.head, "step", step="stop-group")
        try:
            self.each(stop)
        except Exception:  # reported per node above
            pass

    def crashed(self, failing: NodeRun | None) -> None:
        """The group crashed: the failing node's log diagnosed first, then the others'.
        A failing node whose log ends without an error (killed, its host gone) is named
        first by its exit: the others' errors (a collective that timed out, a Ray actor
        that died) follow from it."""
        from fleet.diagnosis.host_logs import diagnose_remote

        if failing is None:
            return
        where = f"{failing.name} ({failing.member.role} {failing.member.rank})"
        order = [failing, *[r for r in self.runs if r is not failing]]
        found: list[Diagnosis] = []
        for run in order:
            mine: list[Diagnosis] = []
            for launch in run.launches:

                def read(conn: Runner, path: str = launch.log) -> list[Diagnosis]:
                    return diagnose_remote(conn, path).diagnoses

                try:
                    mine += run.link.call("diagnose", read)
                except Exception:  # the crash is reported even if a log cannot be read
                    pass
            if run is failing and not mine:
                mine = [diagnosis("process-exited", host=failing.name, seen_by="follow",
                                  evidence=[f"{where} exited; its log ends without an error"],
                                  what=f"node {where} exited while loading")]  # fmt: skip
            found += mine
        for run in self.runs:
            run.result.outcome = "crashed"
            run.result.diagnoses = found
            run.result.message = (
                f"crashed: node {where} failed first: {found[0].id}: {found[0].summary}"
            )
            run.result.failed_node = failing.name
        self.emit(failing, "crash", failed_node=failing.name, diagnoses=[d.id for d in found])


def _ray_executable(run: NodeRun) -> str:
    """``ray`` beside the host's python (where ``pip install ray`` puts it)."""
    python = run.member.host.python or "python3"
    parent = python.rsplit("/", 1)[0] if "/" in python else ""
    return f"{parent}/ray" if parent else "ray"
