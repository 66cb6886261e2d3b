"""``fleet rollout``: a health-gated rolling update of a profile's servers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from fleet.cli.context import AppContext, Seconds, host_option, pass_app
from fleet.errors import EXIT_FAILED, EXIT_OK, UsageError

if TYPE_CHECKING:
    from rich.console import Console

    from fleet.serving.rollout import Plan, Rollout

ACTION_STYLE = {"keep": "dim", "roll": "yellow", "start": "cyan"}
RESULT_STYLE = {"kept": "green", "ready": "bold green", "failed": "bold red", "untouched": "dim"}


@click.command()
@click.argument("profile")
@host_option()
@click.option("--batch", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="Hosts changed at once (never more servers down than this).")  # fmt: skip
@click.option("--canary", type=click.IntRange(0, 1024), default=0, show_default=True,
              help="Hosts changed first, alone, before the first batch.")  # fmt: skip
@click.option("--check", is_flag=True, help="Print the plan; change nothing.")
@click.option("--drain-timeout", type=Seconds(), default=300.0, show_default=True, metavar="S",
              help="Wait at most S s for a server's requests to end before its stop.")  # fmt: skip
@click.option("--timeout", type=Seconds(), default=None, metavar="S",
              help="Load budget of each serve [default: the profile's].")  # fmt: skip
@click.option("--events", is_flag=True, help="One JSON object per event on stdout.")
@pass_app
def rollout(
    app: AppContext,
    profile: str,
    hosts: tuple[str, ...],
    batch: int,
    canary: int,
    check: bool,
    drain_timeout: float,
    timeout: float | None,
    events: bool,
) -> int:
    """Bring the hosts' servers of PROFILE to the profile as it is now, a batch at a time:
    drain, stop, patch if the profile requires it, serve, readiness and the acceptance
    rate; the next batch only when this one is ready, the --canary hosts first and alone.

    Hosts that already serve the profile as it is now are kept. Before a batch goes down,
    every other serving host must be ready. The first failure halts the rollout: the failed
    hosts are diagnosed, the hosts not yet touched keep serving. Run it again to resume.
    Exit 0 when every host serves the profile and is ready, 1 if the rollout halted.
    """
    from fleet.cli.cmd_serve import Display
    from fleet.serving.profile import for_host, profile_path
    from fleet.serving.rollout import RolloutOptions, observe, plan, run
    from fleet.serving.serve import required_patch_set
    from fleet.transport import exit_code

    profile_path(profile)  # an unknown profile is exit 2 before connecting
    selected = app.select(hosts)
    rendered = {h.name: for_host(profile, h) for h in selected}
    first = rendered[selected[0].name]
    if first.nodes > 1:
        raise UsageError(
            f"{profile}: a server across {first.nodes} hosts (nodes > 1) is not rolled by "
            "fleet rollout yet: use fleet stop and fleet serve on the group"
        )
    patch_set = required_patch_set(first)
    session = app.session()
    seen = app.fan_out(selected, lambda c: observe(c, rendered[c.host.name], patch_set), session)
    broken = [o for o in seen if o.value is None]
    if broken:
        from fleet.cli.render import failure_lines

        app.err_console.print(
            "fleet rollout: every selected host must answer before anything changes:",
            markup=False,
        )
        failure_lines(app.err_console, broken)
        return exit_code(seen)
    observed = {o.host: o.value for o in seen if o.value is not None}
    the_plan = plan(
        profile,
        [observed[h.name] for h in selected],
        {name: p.fingerprint() for name, p in rendered.items()},
        batch=batch,
        canary=canary,
    )
    if check:
        if app.json_output:
            from fleet.cli.render import emit_json

            emit_json({"check": True, "plan": the_plan.to_json(),
                       "hosts": {h: o.to_json() for h, o in observed.items()}})  # fmt: skip
        else:
            _render_plan(app.console, the_plan, observed)
        return EXIT_OK
    options = RolloutOptions(batch=batch, canary=canary, drain_timeout=drain_timeout,
                             timeout=timeout)  # fmt: skip
    with Display(app, [h.name for h in selected], events=events) as display:
        report = run(session, selected, profile, the_plan, observed, options, display)
    if app.json_output:
        from fleet.cli.render import emit_json

        emit_json(report.to_json())
    elif not events:
        _render_report(app.console, report)
    return EXIT_OK if report.ok else EXIT_FAILED


def _render_plan(out: Console, the_plan: Plan, observed: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"fleet rollout {the_plan.profile} --check", title_justify="left")
    for col in ("host", "now", "action", "batch", "why"):
        table.add_column(col, no_wrap=col != "why")
    for h in the_plan.hosts:
        seen = observed[h.host]
        batch = "-" if h.batch is None else ("canary" if h.batch == 0 and the_plan.canary
                                             else str(h.batch + 1))  # fmt: skip
        action = h.action + (" + patch" if h.patch else "")
        table.add_row(escape(h.host), escape(seen.state),
                      f"[{ACTION_STYLE[h.action]}]{action}[/]", batch, escape(h.why))  # fmt: skip
    out.print(table)
    if the_plan.changes:
        order = " -> ".join("[" + ", ".join(b) + "]" for b in the_plan.batches)
        out.print(f"{the_plan.changes} host(s) to change, in this order: {escape(order)}",
                  soft_wrap=True)  # fmt: skip
    else:
        out.print("every host serves the profile as it is now: nothing to change")


def _render_report(out: Console, report: Rollout) -> None:
    from rich.markup import escape
    from rich.table import Table

    from fleet.cli.cmd_logs import render_diagnoses

    table = Table(title=f"fleet rollout {report.plan.profile}", title_justify="left")
    for col in ("host", "before", "action", "result", "runs now"):
        table.add_column(col, no_wrap=True)
    for name, r in report.hosts.items():
        table.add_row(escape(name), escape(r.before.state), escape(r.action),
                      f"[{RESULT_STYLE[r.result]}]{r.result}[/]", escape(r.runs))  # fmt: skip
    out.print(table)
    for name, r in report.hosts.items():
        if r.result == "failed":
            out.print(f"[bold]{escape(name)}[/]: {escape(r.message or 'failed')}", soft_wrap=True)
            if r.serve is not None and r.serve.diagnoses:
                render_diagnoses(out, r.serve.diagnoses, where=f"{name} (rollout)", lines=None)
        elif r.result == "ready" and r.message:
            out.print(f"[bold]{escape(name)}[/]: {escape(r.message)}", soft_wrap=True)
    if report.halted:
        out.print(f"[bold red]halted[/]: {escape(report.halted)}", soft_wrap=True)
        out.print("fix the cause, then run the same fleet rollout again: it resumes")
    else:
        out.print(f"[bold green]done[/] in {report.elapsed_s:.0f}s")
