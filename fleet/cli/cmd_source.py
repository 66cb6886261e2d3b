"""``fleet source show|grep``: read the installed vLLM source on hosts (see fleet.source)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click

from fleet.cli.context import AppContext, host_option, pass_app
from fleet.errors import EXIT_USAGE

if TYPE_CHECKING:
    from fleet.source import GrepResult, ShownFile
    from fleet.transport import HostConnection, HostOutcome

T = TypeVar("T")


@click.group()
def source() -> None:
    """Read the installed vLLM source on hosts: ``show`` (sed -n) and ``grep`` (grep -rn).

    Paths are relative to the vLLM package directory found with each host's python;
    paths leaving that tree (absolute, '..', symlinks pointing out) are refused (exit 2).
    """


@dataclass
class Refused:
    """A host refused the path: it resolves outside the vLLM tree there."""

    message: str


def _run_refusable(fn: Callable[[HostConnection], T]) -> Callable[[HostConnection], T | Refused]:
    from fleet.source import PathEscapesTree

    def one(conn: HostConnection) -> T | Refused:
        try:
            return fn(conn)
        except PathEscapesTree as exc:
            return Refused(exc.message)

    return one


def _refusals(outcomes: list[HostOutcome[Any]]) -> list[str]:
    return [o.value.message for o in outcomes if isinstance(o.value, Refused)]


def _host_json(o: HostOutcome[Any], ok_body: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """One host's ``--json`` entry: refused (path left the tree), ok, or failed."""
    if isinstance(o.value, Refused):
        return {"ok": False, "status": "refused", "error": o.value.message}
    if o.ok and o.value is not None:
        return {"ok": True, **ok_body(o.value)}
    return o.failure_json()


def _finish(outcomes: list[HostOutcome[Any]]) -> int:
    from fleet.transport import exit_code

    refused = _refusals(outcomes)
    if refused:
        for message in refused:
            click.echo(f"fleet: error: {message}", err=True)
        return EXIT_USAGE
    return exit_code(outcomes)


def _echo_failures(outcomes: list[HostOutcome[Any]]) -> None:
    for o in outcomes:
        if not o.ok:
            click.echo(f"{o.host}: {o.status}: {o.error}", err=True)
            if o.hint:
                click.echo(f"  next: {o.hint}", err=True)


@source.command()
@host_option()
@click.argument("file_spec", metavar="FILE[:A-B]")
@pass_app
def show(app: AppContext, hosts: tuple[str, ...], file_spec: str) -> int:
    """Print lines A-B of FILE (relative to the vLLM package directory) with line
    numbers, e.g. ``model_executor/models/deepseek_v2.py:1263-1275``. Hosts whose
    output is identical are shown once."""
    from fleet.source import parse_file_spec, show_file
    from fleet.transport import fan_out

    spec = parse_file_spec(file_spec)
    selected = app.select(hosts)
    session = app.session()
    outcomes = fan_out(
        session, selected, _run_refusable(lambda conn: show_file(conn, spec)), forks=app.forks
    )
    if app.json_output:
        from fleet.cli.render import emit_json

        out = {
            o.host: _host_json(
                o,
                lambda v: {
                    "vllm_path": v.vllm_dir,
                    "path": v.path,
                    "start": v.start,
                    "end": v.lines[-1][0] if v.lines else None,
                    "total_lines": v.total_lines,
                    "lines": [{"line": n, "text": t} for n, t in v.lines],
                },
            )
            for o in outcomes
        }
        emit_json({"hosts": out})
    else:
        _print_shown(outcomes, spec.label)
        _echo_failures(outcomes)
    return _finish(outcomes)


def _print_shown(outcomes: list[HostOutcome[ShownFile | Refused]], label: str) -> None:
    groups: dict[tuple[str, tuple[tuple[int, str], ...]], list[str]] = {}
    shown: dict[tuple[str, tuple[tuple[int, str], ...]], ShownFile] = {}
    for o in outcomes:
        value = o.value
        if o.ok and value is not None and not isinstance(value, Refused):
            key = (value.path, tuple(value.lines))
            groups.setdefault(key, []).append(o.host)
            shown[key] = value
    for key, names in groups.items():
        value = shown[key]
        width = len(str(value.lines[-1][0])) if value.lines else 1
        end = value.lines[-1][0] if value.lines else value.start
        click.echo(f"==> {', '.join(names)}: {value.path}:{value.start}-{end} <==")
        if not value.lines:
            click.echo(f"(no lines in {label}; the file has {value.total_lines} lines)")
        for number, text in value.lines:
            click.echo(f"{number:>{width}}  {text}")


@source.command()
@host_option()
@click.argument("regex")
@click.argument("path", default=".", required=False)
@click.option("-i", "--ignore-case", is_flag=True, help="Case-insensitive match.")
@click.option("-F", "--fixed-strings", is_flag=True, help="REGEX is a plain string.")
@click.option(
    "-m", "--max-count", type=click.IntRange(min=1), default=None, help="Matches per file."
)
@click.option(
    "--include",
    "includes",
    multiple=True,
    metavar="GLOB",
    help="Only files whose name matches GLOB, e.g. '*.py' (repeatable).",
)
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=1000,
    show_default=True,
    help="Most matching lines returned per host (0: no limit).",
)
@pass_app
def grep(
    app: AppContext,
    hosts: tuple[str, ...],
    regex: str,
    path: str,
    ignore_case: bool,
    fixed_strings: bool,
    max_count: int | None,
    includes: tuple[str, ...],
    limit: int,
) -> int:
    """Search the vLLM tree (or PATH in it) for the extended regex REGEX (``grep -rn -E``);
    each line is prefixed by its host."""
    from fleet.source import check_regex, check_relative, grep_tree
    from fleet.transport import fan_out

    check_relative(path, "path")
    check_regex(regex, fixed=fixed_strings)
    selected = app.select(hosts)
    session = app.session()

    def one(conn: HostConnection) -> GrepResult:
        return grep_tree(
            conn,
            regex,
            path,
            ignore_case=ignore_case,
            fixed=fixed_strings,
            max_count=max_count,
            includes=includes,
            limit=limit or None,
        )

    outcomes = fan_out(session, selected, _run_refusable(one), forks=app.forks)
    if app.json_output:
        from fleet.cli.render import emit_json

        matches: list[dict[str, Any]] = []
        per_host: dict[str, Any] = {}
        for o in outcomes:
            per_host[o.host] = _host_json(
                o,
                lambda v: {
                    "vllm_path": v.vllm_dir,
                    "matches": len(v.matches),
                    "truncated": v.truncated,
                    "warnings": v.warnings,
                },
            )
            value = o.value
            if per_host[o.host]["ok"] and value is not None and not isinstance(value, Refused):
                matches += [
                    {"host": o.host, "path": m.path, "line": m.line, "text": m.text}
                    for m in sorted(value.matches, key=lambda m: (m.path, m.line))
                ]
        emit_json({"matches": matches, "hosts": per_host})
    else:
        for o in outcomes:
            value = o.value
            if not o.ok or value is None or isinstance(value, Refused):
                continue
            for m in sorted(value.matches, key=lambda m: (m.path, m.line)):
                click.echo(f"{o.host}: {m.path}:{m.line}:{m.text}")
            if value.truncated:
                click.echo(
                    f"{o.host}: (output cut at {limit} lines; use --limit 0 for all)", err=True
                )
            for warning in value.warnings:
                click.echo(f"{o.host}: warning: {warning}", err=True)
        searched = [
            o.value
            for o in outcomes
            if o.ok and o.value is not None and not isinstance(o.value, Refused)
        ]
        if searched and not any(r.matches for r in searched):
            click.echo(f"no matches on {len(searched)} host(s)", err=True)
        _echo_failures(outcomes)
    return _finish(outcomes)
