"""``fleet logs``: show, follow or diagnose vLLM logs (remote or local).

    fleet logs --host P PROFILE [--tail N]          last lines of the profile's log
    fleet logs --host P --path FILE --diagnose      ranked diagnoses (filtered on the host)
    fleet logs --host P PROFILE --follow [--diagnose]
    fleet logs --file PATH --diagnose               a local file, no inventory needed

With ``--json``: ``--diagnose`` prints ``{"diagnoses": [...ranked, each with "host"],
"hosts": {name: {...}}}``; ``--follow`` prints one JSON object per line, ``{"host", "line",
"text"}`` per log line, or with ``--diagnose`` ``{"host", "diagnosis"}`` per new finding.
Secrets (API keys, tokens) are masked in every line and diagnosis shown.

Exit codes: 0 clean, 1 a fatal/error diagnosis (or a host failed), 2 bad input,
3 a host unreachable.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fleet.cli.context import AppContext, host_option, pass_app
from fleet.errors import EXIT_INTERRUPTED, EXIT_OK, UsageError
from fleet.redact import redact_text
from fleet.sizes import human_bytes

if TYPE_CHECKING:
    from rich.console import Console

    from fleet.diagnosis.host_logs import RemoteDiagnosis
    from fleet.diagnosis.models import Diagnosis
    from fleet.serving.status import ProfileLog
    from fleet.transport import HostOutcome, Runner

DEFAULT_SHOW = 100
DEFAULT_FOLLOW = 10
MAX_TAIL = 10_000_000  # --tail: more lines than this is bad input (exit 2 at parse time)
SEVERITY_STYLE = {"fatal": "bold red", "error": "red", "warning": "yellow"}


@click.command()
@click.argument("profile", required=False)
@host_option(required=False)
@click.option(
    "--path", "remote_path", metavar="FILE", help="Log file on the host (instead of PROFILE)."
)
@click.option(
    "--file",
    "local_file",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="PATH",
    help="A local log file (no inventory needed).",
)
@click.option(
    "-f", "--follow", is_flag=True, help="Stream new lines as they are written (tail -F)."
)
@click.option(
    "--tail",
    "tail",
    type=click.IntRange(min=1, max=MAX_TAIL),
    default=None,
    metavar="N",
    help=f"Only the last N lines [default: {DEFAULT_SHOW} when showing, all when diagnosing].",
)
@click.option("--diagnose", is_flag=True, help="Name the root cause, evidence and fix.")
@click.option(
    "--raw", is_flag=True, help="Print control characters as they are (default: shown as \\xNN)."
)
@pass_app
def logs(
    app: AppContext,
    profile: str | None,
    hosts: tuple[str, ...],
    remote_path: str | None,
    local_file: Path | None,
    follow: bool,
    tail: int | None,
    diagnose: bool,
    raw: bool,
) -> int:
    """Show, follow or diagnose vLLM logs.

    PROFILE's log is ~/.fleet/run/PROFILE/vllm.log on each host; for a server across hosts
    each host's own program's (a Ray worker's Ray node, PROFILE-ray), named with its node's
    role and rank. With --diagnose the log is filtered on the host (grep with the
    catalogue's prefilter) and only candidate lines are fetched, so multi-GiB logs are
    diagnosed in seconds."""
    app.raw = raw
    if local_file is not None:
        if hosts or profile or remote_path:
            raise UsageError(
                "--file reads a local file; do not combine it with --host/PROFILE/--path"
            )
        if follow:
            raise UsageError("--follow needs --host (use tail -F for a local file)")
        return _local(app, local_file, tail, diagnose)
    if not hosts:
        raise UsageError("give --host PATTERN (with PROFILE or --path FILE), or --file PATH")
    if profile and remote_path:
        raise UsageError("give either PROFILE or --path, not both")
    if not profile and not remote_path:
        raise UsageError("give a PROFILE (its log is ~/.fleet/run/PROFILE/vllm.log) or --path FILE")
    from fleet.diagnosis.host_logs import check_path, profile_log_path

    path = check_path(remote_path if remote_path else profile_log_path(profile or ""))
    selected = app.select(hosts)
    if follow:
        if len(selected) != 1:
            raise UsageError(
                f"--follow streams one host; {len(selected)} match "
                f"({', '.join(h.name for h in selected[:5])})"
            )
        return _follow(app, selected[0], path, tail or DEFAULT_FOLLOW, diagnose, profile)
    if diagnose:
        return _diagnose_hosts(app, selected, path, tail, profile)
    return _show_hosts(app, selected, path, tail or DEFAULT_SHOW, profile)


# --------------------------------------------------------------------------- local


def _local(app: AppContext, path: Path, tail: int | None, diagnose: bool) -> int:
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
    if not diagnose:
        return _show_local(app, path, tail or DEFAULT_SHOW)
    from fleet.diagnosis.engine import diagnoses_exit_code
    from fleet.diagnosis.scan import diagnose_file

    result = diagnose_file(path, tail=tail)
    if app.json_output:
        from fleet.cli.render import emit_json

        emit_json(
            {
                "diagnoses": [d.as_contract() for d in result.diagnoses],
                "file": str(path),
                "lines": result.lines,
                "bytes_read": result.bytes_read,
            }
        )
    else:
        render_diagnoses(app.console, result.diagnoses, where=str(path), lines=result.lines)
    return diagnoses_exit_code(result.diagnoses)


def _show_local(app: AppContext, path: Path, lines: int) -> int:
    from fleet.diagnosis.host_logs import MAX_LINE_BYTES
    from fleet.diagnosis.scan import CHUNK, tail_offset
    from fleet.transport.runner import split_lines

    offset, first = tail_offset(path, lines)
    with open(path, "rb") as fh:
        fh.seek(offset)
        # shown lines are cut as on a host (a one-line file of GiBs is not read whole)
        blocks = iter(lambda: fh.read(CHUNK), b"")
        text = list(split_lines(blocks, max_line=MAX_LINE_BYTES))
    numbered = [(n, redact_text(t)) for n, t in enumerate(text, first)]
    if app.json_output:
        from fleet.cli.render import emit_json

        emit_json({"file": str(path), "lines": [{"line": n, "text": t} for n, t in numbered]})
    else:
        _print_lines(app, numbered)
    return EXIT_OK


def _print_lines(app: AppContext, numbered: list[tuple[int, str]]) -> None:
    from fleet.cli.render import terminal_safe

    out = sys.stdout
    for _n, text in numbered:
        out.write((text if app.raw else terminal_safe(text)) + "\n")
    out.flush()


# --------------------------------------------------------------------------- remote


def _log_of(conn: Runner, path: str, profile: str | None) -> ProfileLog | None:
    """PROFILE's log on this host (a server across hosts: the host's own program's, with
    its node); None for --path."""
    from fleet.serving.status import profile_log

    return profile_log(conn, conn.host, profile) if profile else None


def _diagnose_hosts(
    app: AppContext, selected: list[Any], path: str, tail: int | None, profile: str | None
) -> int:
    from fleet.diagnosis.engine import diagnoses_exit_code
    from fleet.diagnosis.host_logs import diagnose_remote
    from fleet.transport import exit_code

    def run(conn: Runner) -> RemoteDiagnosis:
        where = _log_of(conn, path, profile)
        found = diagnose_remote(conn, where.path if where else path, tail=tail)
        if where is not None and where.node:
            found.node, found.program = where.node, where.program
        return found

    outcomes = app.fan_out(selected, run)
    if app.json_output:
        from fleet.cli.render import emit_json

        emit_json(hosts_json(outcomes))
    else:
        from fleet.cli.render import failure_lines

        for o in outcomes:
            if o.value is not None:
                _render_outcome(app.console, o.host, o.value)
        failure_lines(app.console, outcomes)
    found = any(diagnoses_exit_code(o.value.diagnoses) for o in outcomes if o.value is not None)
    return exit_code(outcomes, problem_found=found)


def hosts_json(outcomes: list[HostOutcome[RemoteDiagnosis]]) -> dict[str, Any]:
    """``{"diagnoses": [...], "hosts": {name: {"diagnoses": [...], "bytes_received": N, ...}}}``.

    The top-level ``diagnoses`` (docs/contracts.md) holds every host's diagnoses, each
    with its ``host``, ranked by :func:`fleet.diagnosis.host_logs.rank_across_hosts`."""
    from fleet.diagnosis.host_logs import RemoteDiagnosis, rank_across_hosts
    from fleet.transport import hosts_json as per_host_json

    ranked = rank_across_hosts(
        [(o.host, o.value.diagnoses) for o in outcomes if o.ok and o.value is not None]
    )
    nodes = {o.host: o.value.node for o in outcomes if o.value is not None and o.value.node}
    for entry in ranked:
        if entry["host"] in nodes:
            entry["node"] = nodes[entry["host"]]
    return {"diagnoses": ranked, **per_host_json(outcomes, RemoteDiagnosis.to_json)}


def _named(host: str, node: dict[str, Any] | None, program: str | None) -> str:
    """``h2 (worker 1 of 2, Ray node)``: a host, and its node of a server across hosts."""
    from fleet.serving.status import node_label

    label = node_label(node, program)
    return f"{host} ({label})" if label else host


def _render_outcome(out: Console, host: str, r: RemoteDiagnosis) -> None:
    from rich.markup import escape

    moved = human_bytes(r.bytes_received)
    of = f" of {human_bytes(r.file_size)} ({100 * r.fraction:.3g}%)" if r.file_size else ""
    who = _named(host, r.node, r.program)
    out.print(
        f"[bold]{escape(who)}[/] [dim]{escape(r.path)} — fetched {moved}{of}, "
        f"{r.candidate_lines} candidate lines[/]",
        soft_wrap=True,
    )
    for note in r.notes:
        out.print(f"  [yellow]note:[/] {escape(note)}", soft_wrap=True)
    render_diagnoses(out, r.diagnoses, where=f"{who}:{r.path}", lines=None)


def _show_hosts(
    app: AppContext, selected: list[Any], path: str, lines: int, profile: str | None
) -> int:
    from fleet.diagnosis.host_logs import tail_lines
    from fleet.transport import exit_code

    def run(conn: Runner) -> tuple[ProfileLog | None, list[tuple[int, str]]]:
        where = _log_of(conn, path, profile)
        return where, tail_lines(conn, where.path if where else path, lines)

    outcomes = app.fan_out(selected, run)
    if app.json_output:
        from fleet.cli.render import emit_json
        from fleet.transport import hosts_json

        def doc(value: tuple[ProfileLog | None, list[tuple[int, str]]]) -> dict[str, Any]:
            where, numbered = value
            out: dict[str, Any] = {"path": where.path if where else path}
            if where is not None and where.node:
                out.update(node=where.node, program=where.program)
            out["lines"] = [{"line": n, "text": t} for n, t in numbered]
            return out

        emit_json(hosts_json(outcomes, doc))
    else:
        from rich.markup import escape

        from fleet.cli.render import failure_lines

        many = len(outcomes) > 1
        for o in outcomes:
            if o.ok and o.value is not None:
                where, numbered = o.value
                node = where.node if where else None
                if many or node:
                    who = _named(o.host, node, where.program if where else None)
                    shown = where.path if where else path
                    app.console.print(f"[bold]==> {escape(who)}:{escape(shown)} <==[/]")
                _print_lines(app, numbered)
        failure_lines(app.console, outcomes)
    return exit_code(outcomes)


def _follow(
    app: AppContext, host: Any, path: str, lines: int, diagnose: bool, profile: str | None
) -> int:
    from fleet.cli.render import terminal_safe
    from fleet.diagnosis.engine import diagnoses_exit_code
    from fleet.diagnosis.host_logs import follow_resumable

    session = app.session()
    where = _log_of(session.connect(host), path, profile) if profile else None
    if where is not None:
        path = where.path
    node = where.node if where else None
    who = _named(host.name, node, where.program if where else None)
    tag = {"node": node} if node else {}
    found: list[Diagnosis] = []
    try:
        # resumed after a dropped connection or a restarted host, from the next byte
        for n, raw, fresh in follow_resumable(session, host, path, lines=lines):
            text = redact_text(raw)
            if not app.json_output:
                sys.stdout.write((text if app.raw else terminal_safe(text)) + "\n")
                sys.stdout.flush()
            elif not diagnose:
                line = {"host": host.name, **tag, "line": n, "text": text}
                sys.stdout.write(json.dumps(line) + "\n")
                sys.stdout.flush()
            if diagnose and fresh:
                found.extend(fresh)
                if app.json_output:
                    for d in fresh:
                        doc = {"host": host.name, **tag, "diagnosis": d.as_contract()}
                        sys.stdout.write(json.dumps(doc) + "\n")
                    sys.stdout.flush()
                else:
                    render_diagnoses(
                        app.console, fresh, where=f"{who}:{path}", lines=None, live=True
                    )
    except KeyboardInterrupt:
        click.echo("fleet: interrupted", err=True)
        return EXIT_INTERRUPTED
    return diagnoses_exit_code(found) if diagnose else EXIT_OK


# --------------------------------------------------------------------------- rendering


def render_diagnoses(
    out: Console,
    diagnoses: list[Diagnosis],
    *,
    where: str,
    lines: int | None,
    live: bool = False,
) -> None:
    """The primary diagnosis as a panel; the others as panels (-v) or one line each."""
    from rich.console import Group
    from rich.markup import escape
    from rich.panel import Panel
    from rich.text import Text

    if not diagnoses:
        n = f" ({lines} lines)" if lines is not None else ""
        out.print(f"[green]✓[/] no problems found in {escape(where)}{n}")
        return
    for i, d in enumerate(diagnoses):
        style = SEVERITY_STYLE.get(d.severity, "red")
        if i > 0 and not live:
            if i == 1:
                out.print("[dim]also found (ranked):[/]")
            first = d.evidence[0].line if d.evidence else None
            where_line = f"[dim]line {first}:[/] " if first else ""
            out.print(
                f"  [{style}]{d.severity}[/] [bold]{escape(d.id)}[/] {where_line}"
                f"{escape(d.summary)}",
                soft_wrap=True,
            )
            continue
        body: list[Any] = [Text(d.summary, style="bold")]
        ev = Text()
        for e in d.evidence:
            ev.append(f"{e.line:>7}  " if e.line else " " * 9, style="dim")
            ev.append(e.text[:400] + "\n")
        if d.count > len(d.evidence):
            ev.append(f"         … {d.count - len(d.evidence)} more matching lines\n", style="dim")
        body += [Text("evidence", style="underline"), ev]
        body.append(Text.assemble(("cause  ", "dim"), d.root_cause))
        body.append(Text.assemble(("remedy ", "dim"), d.remedy))
        if d.fix:
            body.append(Text.assemble(("fix    ", "dim"), (d.fix, "bold green")))
        label = "root cause" if i == 0 and not live else "found"
        out.print(
            Panel(
                Group(*body),
                title=f"[{style}]{d.severity}[/] {escape(d.id)} — {escape(d.title)} "
                f"[dim](confidence: {escape(d.confidence)})[/]",
                subtitle=f"[dim]{label} · {escape(where)}[/]",
                title_align="left",
                subtitle_align="right",
                border_style=style,
            )
        )
