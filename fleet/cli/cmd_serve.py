"""``fleet serve``, ``fleet status``, ``fleet stop`` and ``fleet profile``."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click

from fleet.cli.context import AppContext, Seconds, host_option, pass_app
from fleet.errors import EXIT_OK, UsageError

if TYPE_CHECKING:
    from rich.console import Console

    from fleet.inventory import HostSpec
    from fleet.serving.serve import ServeResult
    from fleet.serving.status import StopReport
    from fleet.transport import HostOutcome

OUTCOME_STYLE = {
    "ready": "bold green",
    "launched": "green",
    "crashed": "bold red",
    "stalled": "red",
    "timeout": "red",
    "refused": "yellow",
}
STATE_STYLE = {
    "ready": "bold green",
    "loading": "cyan",
    "starting": "cyan",
    "crashed": "bold red",
    "stopped": "dim",
}


# --------------------------------------------------------------------------- serve


class Display:
    """What ``fleet serve`` shows while it waits: a live table on a terminal, one line per
    phase change otherwise, one JSON object per event with ``--events``."""

    def __init__(self, app: AppContext, hosts: list[str], *, events: bool) -> None:
        self.app = app
        self.events = events
        self.lock = threading.Lock()
        self.rows: dict[str, dict[str, Any]] = {h: {"phase": "connecting"} for h in hosts}
        self.live: Any = None
        self.started = time.monotonic()
        self.shown_step: dict[str, tuple[Any, int]] = {}  # host -> (phase, tenth) last printed
        out = app.err_console
        self.tty = out.is_terminal and not app.json_output and not events

    def __enter__(self) -> Display:
        if self.tty:
            from rich.live import Live

            self.live = Live(
                get_renderable=self.table, console=self.app.err_console, refresh_per_second=4
            )
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)

    def __call__(self, event: dict[str, Any]) -> None:
        from fleet.cli.render import emit_json_line, escape

        with self.lock:
            row = self.rows.setdefault(event["host"], {})
            kind = event["event"]
            if kind == "progress":
                row.update({k: event.get(k) for k in ("phase", "percent", "eta_s", "shards")})
                if event.get("last_line"):
                    row["last"] = event["last_line"]
                row["elapsed_s"] = event.get("elapsed_s")
            elif kind == "phase":
                row["phase"] = event["phase"]
            elif kind == "result":
                row["phase"] = event.get("outcome")
            elif kind in ("launch", "attach"):
                row["pid"] = event.get("pid")
                row["supervisor"] = event.get("supervisor")
            if self.events:
                emit_json_line(event)
                return
            if self.tty or self.app.json_output:
                return
            line = _event_line(event) if kind != "progress" else self._progress_line(event)
            if line:
                self.app.err_console.print(
                    f"{escape(event['host'])}: {escape(line)}", soft_wrap=True
                )

    def _progress_line(self, event: dict[str, Any]) -> str | None:
        """A pipe's view of a long phase: one line each time it passes a tenth (10%, 20%,
        ... of the weight shards), so a 40-minute load says how far it is in a log."""
        pct = event.get("percent")
        if not isinstance(pct, int | float) or not 0 <= pct < 100:
            return None
        step = int(pct // 10)
        phase = event.get("phase")
        last_phase, last_step = self.shown_step.get(event["host"], (None, 0))
        if step == 0 or (phase == last_phase and step <= last_step):
            return None
        self.shown_step[event["host"]] = (phase, step)
        return _progress_text(event)

    def table(self) -> Any:
        from rich.markup import escape
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        table = Table(box=None, pad_edge=False, expand=False)
        for col in ("host", "phase", "progress", "shards", "elapsed", "ETA", "last line"):
            table.add_column(
                col, no_wrap=True, overflow="ellipsis", max_width=60 if col == "last line" else None
            )
        with self.lock:
            for host, row in self.rows.items():
                pct = row.get("percent")
                bar = (
                    ProgressBar(total=100, completed=pct or 0, width=20) if pct is not None else ""
                )
                shards = row.get("shards") or {}
                table.add_row(
                    escape(host),
                    escape(str(row.get("phase") or "")),
                    bar,
                    f"{shards.get('done')}/{shards.get('total')}" if shards else "",
                    _clock(row.get("elapsed_s")),
                    _clock(row.get("eta_s")),
                    escape(str(row.get("last") or "")),
                )
        return table


def _clock(seconds: Any) -> str:
    if not isinstance(seconds, int | float):
        return ""
    s = int(seconds)
    return (
        f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )


def _progress_text(event: dict[str, Any]) -> str:
    t = f"[{_clock(event.get('t'))}]"
    # shards and the ETA (from the shard rate) belong to the weights phase only
    weights = event.get("phase") == "weights"
    shards = (event.get("shards") or {}) if weights else {}
    done = f" {shards.get('done')}/{shards.get('total')} shards" if shards else ""
    eta_s = event.get("eta_s") if weights else None
    eta = f", ETA {_clock(eta_s)}" if eta_s is not None else ""
    return f"{t} {event.get('phase')}{done} ({event.get('percent'):.0f}%){eta}"


def _event_line(event: dict[str, Any]) -> str | None:
    kind = event["event"]
    t = f"[{_clock(event.get('t'))}]"
    if kind in ("rollout", "bench"):
        return f"{t} {event.get('message')}"
    if kind == "preflight":
        found = event.get("diagnoses") or []
        return f"{t} preflight: " + ("ok" if event.get("ok") else "found " + ", ".join(found))
    if kind == "launch":
        how = event.get("supervisor")
        if how == "supervisord" and event.get("source"):
            how = f"{event.get('source')} supervisord"
        again = " (a retried launch: started once)" if event.get("resumed") else ""
        return f"{t} launched under {how}, pid {event.get('pid')}{again}"
    if kind == "attach":
        since = event.get("loading_s")
        ago = f", loading for {_clock(since)}" if since is not None else ""
        return f"{t} re-attached to the running server (pid {event.get('pid')}{ago})"
    if kind == "phase":
        return f"{t} phase {event['phase']}"
    if kind == "crash":
        return f"{t} crashed in {event.get('phase')}: {', '.join(event.get('diagnoses') or [])}"
    if kind == "stall":
        return f"{t} stalled in {event.get('phase')}"
    if kind == "readiness":
        spec = event.get("spec_decode") or {}
        rate = spec.get("acceptance_rate")
        extra = f", acceptance rate {rate:.2f}" if isinstance(rate, float) else ""
        return f"{t} ready: {', '.join(event.get('steps') or [])}{extra}"
    return None


@click.command()
@click.argument("profile")
@host_option()
@click.option("--no-wait", is_flag=True, help="Return once vLLM is started (follow later).")
@click.option("--timeout", type=Seconds(), default=None, metavar="S",
              help="Load budget in seconds [default: the profile's load_timeout_s].")  # fmt: skip
@click.option("--stall-timeout", type=Seconds(), default=None, metavar="S",
              help="No new output for S seconds: stalled [default: the profile's].")  # fmt: skip
@click.option("--skip-preflight", is_flag=True, help="Start even if preflight finds a problem.")
@click.option("--restart", is_flag=True, help="Replace a server already running this profile.")
@click.option("--no-drafter", is_flag=True,
              help="Serve it without its drafter (a fleet bench baseline).")  # fmt: skip
@click.option("--events", is_flag=True, help="One JSON object per event on stdout.")
@pass_app
def serve(
    app: AppContext,
    profile: str,
    hosts: tuple[str, ...],
    no_wait: bool,
    timeout: float | None,
    stall_timeout: float | None,
    skip_preflight: bool,
    restart: bool,
    no_drafter: bool,
    events: bool,
) -> int:
    """Serve PROFILE (playbooks/PROFILE.yaml) on each host: preflight, start vLLM under a
    supervisor, follow the load with progress, then check readiness and the acceptance rate.

    Preflight refuses in seconds what would crash after the load (EAGLE-3 support, GPUs
    and memory, drafter/target fit, files, the port). Exit 0 when every host is ready, 1 if
    one crashed, stalled, timed out or was refused, 2 for bad input, 3 if unreachable.
    """
    from fleet.serving.profile import for_host, profile_path
    from fleet.serving.serve import ServeOptions, serve_host
    from fleet.transport import exit_code

    profile_path(profile)  # an unknown profile is exit 2 before connecting
    selected = app.select(hosts)
    session = app.session()
    options = ServeOptions(
        wait=not no_wait,
        skip_preflight=skip_preflight,
        restart=restart,
        timeout=timeout,
        stall_timeout=stall_timeout,
    )
    with Display(app, [h.name for h in selected], events=events) as display:
        try:
            if for_host(profile, selected[0]).nodes > 1:
                if no_drafter:
                    raise UsageError("--no-drafter: not for a server across several hosts")
                outcomes = _serve_groups(app, session, selected, profile, options, display)
            else:
                variant = (lambda p: p.without_drafter()) if no_drafter else None

                def one(host: HostSpec) -> ServeResult:
                    # serve_host owns the host's connection (its HostLink) for the whole serve
                    return serve_host(session, host, profile, options, display, variant=variant)

                outcomes = app.map_hosts(selected, one, session)
        except KeyboardInterrupt:
            _interrupted(app, display, profile)
            raise
    if app.json_output:
        from fleet.cli.render import emit_json
        from fleet.transport import hosts_json

        emit_json(hosts_json(outcomes, lambda r: r.to_json()))
    elif not events:
        _render_serve(app.console, outcomes)
    return exit_code(outcomes)


def _serve_groups(
    app: AppContext,
    session: Any,
    selected: list[HostSpec],
    profile: str,
    options: Any,
    display: Display,
) -> list[HostOutcome[ServeResult]]:
    """A profile across several hosts: the hosts, in inventory order, in groups of
    ``nodes`` (each served as one server, its head first); one outcome per host."""
    from fleet.serving.group import serve_group
    from fleet.serving.multinode import split_groups
    from fleet.serving.profile import for_host
    from fleet.transport import HostOutcome

    groups = split_groups(selected, for_host(profile, selected[0]).nodes)
    by_head = {g.head.host.name: g for g in groups}

    def one(head: HostSpec) -> dict[str, ServeResult]:
        return serve_group(session, by_head[head.name], profile, options, display)

    done = app.map_hosts([g.head.host for g in groups], one, session)
    outcomes: list[HostOutcome[ServeResult]] = []
    for group, outcome in zip(groups, done, strict=True):
        for member in group.members:
            if outcome.value is not None:
                outcomes.append(
                    HostOutcome.of_value(member.host.name, outcome.value[member.host.name])
                )
            else:
                outcomes.append(replace(outcome, host=member.host.name))  # type: ignore[arg-type]
    return outcomes


def _interrupted(app: AppContext, display: Display, profile: str) -> None:
    """Ctrl-C: the servers fleet started or followed keep loading; say so, and how to
    follow them again, see them, or stop them."""
    from fleet.cli.render import emit_json

    with display.lock:
        rows = {h: dict(r) for h, r in display.rows.items()}
    started = {h: r for h, r in rows.items() if r.get("pid")}
    if app.json_output:
        emit_json({"interrupted": True, "hosts": {
            h: {"outcome": "interrupted", "server": "running" if h in started else "unknown",
                "pid": r.get("pid"), "phase": r.get("phase")}
            for h, r in rows.items()
        }})  # fmt: skip
    for host, row in started.items():
        app.err_console.print(
            f"{host}: interrupted; the server keeps loading under {row.get('supervisor')} "
            f"(pid {row.get('pid')}, phase {row.get('phase')}). "
            f"`fleet serve {profile} --host {host}` follows it again, `fleet status --host "
            f"{host}` shows it, `fleet stop {profile} --host {host}` stops it.",
            soft_wrap=True, markup=False, highlight=False,
        )  # fmt: skip


def _render_serve(out: Console, outcomes: list[HostOutcome[ServeResult]]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from fleet.cli.cmd_logs import render_diagnoses
    from fleet.cli.render import failure_lines

    table = Table(title="fleet serve", title_justify="left")
    for col in ("host", "outcome", "phase", "elapsed"):
        table.add_column(col, no_wrap=True)
    for o in outcomes:
        r = o.value
        if r is None:
            table.add_row(escape(o.host), f"[bold red]{escape(o.status)}[/]", "-", "-")
            continue
        style = OUTCOME_STYLE.get(r.outcome, "")
        table.add_row(
            escape(o.host), f"[{style}]{escape(r.outcome)}[/]", escape(r.phase), _clock(r.elapsed_s)
        )
    out.print(table)
    failure_lines(out, [o for o in outcomes if o.value is None])
    for o in outcomes:
        r = o.value
        if r is None:
            continue
        if r.outcome == "ready":
            line = f"[bold]{escape(o.host)}[/]: ready at {escape(r.endpoint or '?')}"
            if r.pid:
                line += f" (pid {r.pid})"
            spec = r.spec_decode
            if spec is not None and spec.acceptance_rate is not None:
                rates = ", ".join(f"{p:.2f}" for p in spec.per_position)
                line += (
                    f"; EAGLE-3 acceptance rate {spec.acceptance_rate:.2f}, mean acceptance "
                    f"length {spec.mean_acceptance_length:.2f}, per position {rates}"
                )
            out.print(line, soft_wrap=True)
        elif r.message:
            out.print(f"[bold]{escape(o.host)}[/]: {escape(r.message)}", soft_wrap=True)
        for note in r.notes:
            out.print(f"  [yellow]note:[/] {escape(note)}", soft_wrap=True)
        if r.diagnoses:
            render_diagnoses(out, r.diagnoses, where=f"{o.host} (serve {r.profile})", lines=None)


# --------------------------------------------------------------------------- status / stop


@click.command()
@click.argument("profile", required=False)
@host_option()
@pass_app
def status(app: AppContext, profile: str | None, hosts: tuple[str, ...]) -> int:
    """Each profile's server per host: starting, loading (phase, %), ready, crashed or
    stopped; pid, uptime, endpoint, the last acceptance rate."""
    from fleet.serving.status import host_status
    from fleet.transport import exit_code

    selected = app.select(hosts)
    session = app.session()
    outcomes = app.fan_out(selected, lambda c: host_status(c, profile), session)
    if app.json_output:
        from fleet.cli.render import emit_json
        from fleet.transport import hosts_json

        emit_json(
            hosts_json(
                outcomes, lambda profiles: {"profiles": {p.name: p.to_json() for p in profiles}}
            )
        )
        return exit_code(outcomes)
    from rich.markup import escape
    from rich.table import Table

    from fleet.cli.render import failure_lines
    from fleet.serving.status import node_label

    table = Table(title="fleet status", title_justify="left")
    columns = ("host", "profile", "node", "state", "phase", "pid", "uptime", "endpoint",
               "acceptance")  # fmt: skip
    for col in columns:
        table.add_column(col, no_wrap=True)
    for o in outcomes:
        for p in o.value or []:
            style = STATE_STYLE.get(p.state, "")
            phase = p.phase + (f" {p.percent:.0f}%" if p.percent is not None else "")
            acc = f"{p.acceptance_rate:.2f}" if p.acceptance_rate is not None else "-"
            node = node_label(p.node, p.name) or "-"
            table.add_row(
                escape(o.host), escape(p.name), escape(node), f"[{style}]{p.state}[/]",
                escape(phase), str(p.pid or "-"), _clock(p.uptime_s) or "-",
                escape(p.endpoint or "-"), acc,
            )  # fmt: skip
        if o.ok and not o.value:
            table.add_row(escape(o.host), "-", "", "[dim]no profiles[/]", *[""] * 5)
    app.console.print(table)
    failure_lines(app.console, outcomes)
    return exit_code(outcomes)


@click.command()
@click.argument("profile")
@host_option()
@pass_app
def stop(app: AppContext, profile: str, hosts: tuple[str, ...]) -> int:
    """Stop PROFILE's server through its supervisor: TERM, then KILL after the grace
    period; idempotent ("already stopped"). Reports the GPU memory in use afterwards.

    A server across hosts stops as a whole: selecting some of its nodes stops the rest of
    their group too (each named, with the node it was stopped with)."""
    from fleet.serving.profile import profile_path
    from fleet.serving.status import rest_of_groups, stop_host
    from fleet.transport import exit_code

    profile_path(profile)
    selected = app.select(hosts)
    session = app.session()
    inventory = {h.name: h for h in selected}
    outcomes = app.fan_out(
        selected, lambda c: stop_host(c, inventory[c.host.name], profile), session
    )
    reports = {o.host: o.value for o in outcomes if o.value is not None}
    rest, warnings = rest_of_groups(reports, app.inventory().hosts)
    if rest:
        group_of = {host.name: of for host, of in rest}
        inventory.update((host.name, host) for host, _of in rest)

        def stop_rest(conn: Any) -> StopReport:
            report = stop_host(conn, inventory[conn.host.name], profile)
            report.group_of = group_of[conn.host.name]
            return report

        outcomes += app.fan_out([host for host, _of in rest], stop_rest, session)
    if app.json_output:
        from fleet.cli.render import emit_json
        from fleet.transport import hosts_json

        doc = hosts_json(outcomes, lambda r: r.to_json())
        emit_json({**doc, "warnings": warnings} if warnings else doc)
        return exit_code(outcomes)
    from rich.markup import escape

    from fleet.cli.render import host_table
    from fleet.serving.status import node_label

    def cells(r: StopReport) -> list[str]:
        node = node_label(r.node) or "-"
        if r.group_of:
            node += f" (with {r.group_of})"
        what = "already stopped" if not r.was_running else f"stopped pid {r.pid}"
        if r.stopped_in_s is not None:
            what += f" in {r.stopped_in_s:.1f}s"
        used = f"{r.gpu_memory_used_mib} MiB" if r.gpu_memory_used_mib is not None else "-"
        return [escape(node), what, used]

    host_table(app.console, outcomes, ["node", "result", "GPU memory used after"], cells,
               title="fleet stop")  # fmt: skip
    if rest:
        names = ", ".join(f"{host.name} ({of}'s group)" for host, of in rest)
        app.console.print(
            f"[yellow]note:[/] stopped the rest of the group too: {escape(names)} (a server "
            "across hosts stops as a whole)",
            soft_wrap=True,
        )
    for warning in warnings:
        app.console.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
    return exit_code(outcomes)


# --------------------------------------------------------------------------- profile


@click.group()
def profile() -> None:
    """Serve profiles: their JSON Schema, and a profile rendered for a host."""


@profile.command("schema")
def profile_schema() -> int:
    """The JSON Schema of serve profiles (for editors)."""
    from fleet.cli.render import emit_json
    from fleet.serving.profile import schema

    emit_json(schema())
    return EXIT_OK


@profile.command("show")
@click.argument("name")
@click.option("--host", "host", required=True, metavar="HOST", help="The host to render it for.")
@pass_app
def profile_show(app: AppContext, name: str, host: str) -> int:
    """PROFILE rendered with HOST's inventory variables (secrets are named, never read)."""
    import yaml

    from fleet.serving.profile import for_host

    matches = app.select([host])
    if len(matches) != 1:
        raise UsageError(f"--host {host!r} matches {len(matches)} hosts; give one host")
    rendered = for_host(name, matches[0])
    doc = rendered.model_dump(mode="json", exclude_none=True)
    if app.json_output:
        from fleet.cli.render import emit_json

        emit_json(doc)
    else:
        sys.stdout.write(f"# {name} rendered for {matches[0].name}\n")
        sys.stdout.write(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
    return EXIT_OK
