"""``fleet source show|grep``: read the installed vLLM source on hosts (see fleet.source)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from fleet.cli.context import AppContext, host_option, pass_app
from fleet.source import MAX_LIMIT

if TYPE_CHECKING:
    from fleet.source import GrepResult, ShownFile
    from fleet.transport import HostOutcome, Runner


@click.group()
def source() -> None:
    """Read the installed vLLM source on hosts: ``show`` (sed -n) and ``grep`` (grep -rn).

    Paths are relative to the vLLM package directory found with each host's python;
    paths leaving that tree (absolute, '..', symlinks pointing out) are refused (exit 2).
    """


def _finish(app: AppContext, outcomes: list[HostOutcome[Any]]) -> int:
    """Failed hosts on stderr (the output of the others is the source text); the exit
    code. A path refused on a host is bad input: ``fleet: error: ...`` as every usage
    error."""
    from fleet.cli.render import failure_lines
    from fleet.transport import exit_code

    if not app.json_output:
        from fleet.cli.render import terminal_safe

        for o in outcomes:
            if o.status == "refused":
                click.echo(f"fleet: error: {o.host}: {terminal_safe(o.error or '')}", err=True)
        failure_lines(app.err_console, [o for o in outcomes if o.status != "refused"])
    return exit_code(outcomes)


@source.command()
@host_option()
@click.argument("file_spec", metavar="FILE[:A-B]")
@click.option(
    "--raw", is_flag=True, help="Print control characters as they are (default: shown as \\xNN)."
)
@pass_app
def show(app: AppContext, hosts: tuple[str, ...], file_spec: str, raw: bool) -> int:
    """Print lines A-B of FILE (relative to the vLLM package directory) with line
    numbers, e.g. ``model_executor/models/deepseek_v2.py:1263-1275``. Hosts whose
    output is identical are shown once."""
    from fleet.source import parse_file_spec, show_file

    spec = parse_file_spec(file_spec)
    selected = app.select(hosts)
    session = app.session()
    outcomes = app.fan_out(selected, lambda conn: show_file(conn, spec), session)
    if app.json_output:
        from fleet.cli.render import emit_json
        from fleet.transport import hosts_json

        emit_json(
            hosts_json(
                outcomes,
                lambda v: {
                    "vllm_path": v.vllm_dir,
                    "path": v.path,
                    "start": v.start,
                    "end": v.lines[-1][0] if v.lines else None,
                    "total_lines": v.total_lines,
                    "lines": [{"line": n, "text": t} for n, t in v.lines],
                },
            )
        )
    else:
        _print_shown(outcomes, spec.label, raw)
    return _finish(app, outcomes)


def _print_shown(outcomes: list[HostOutcome[ShownFile]], label: str, raw: bool) -> None:
    from fleet.cli.render import terminal_safe

    safe = (lambda t: t) if raw else terminal_safe
    groups: dict[tuple[str, tuple[tuple[int, str], ...]], list[str]] = {}
    shown: dict[tuple[str, tuple[tuple[int, str], ...]], ShownFile] = {}
    for o in outcomes:
        value = o.value
        if o.ok and value is not None:
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
            # color=True: click would strip ANSI sequences from --raw text off a terminal
            click.echo(f"{number:>{width}}  {safe(text)}", color=True)


@source.command()
@host_option()
@click.argument("regex")
@click.argument("path", default=".", required=False)
@click.option("-i", "--ignore-case", is_flag=True, help="Case-insensitive match.")
@click.option("-F", "--fixed-strings", is_flag=True, help="REGEX is a plain string.")
@click.option(
    "-m",
    "--max-count",
    type=click.IntRange(min=1, max=MAX_LIMIT),
    default=None,
    help="Matches per file.",
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
    type=click.IntRange(min=0, max=MAX_LIMIT),
    default=1000,
    show_default=True,
    help="Most matching lines returned per host (0: no limit).",
)
@click.option(
    "--raw", is_flag=True, help="Print control characters as they are (default: shown as \\xNN)."
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
    raw: bool,
) -> int:
    """Search the vLLM tree (or PATH in it) for the extended regex REGEX (``grep -rn -E``);
    each line is prefixed by its host."""
    from fleet.source import check_regex, check_relative, grep_tree

    check_relative(path, "path")
    check_regex(regex, fixed=fixed_strings)
    selected = app.select(hosts)
    session = app.session()

    def one(conn: Runner) -> GrepResult:
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

    outcomes = app.fan_out(selected, one, session)
    if app.json_output:
        from fleet.cli.render import emit_json
        from fleet.transport import hosts_json

        doc = hosts_json(
            outcomes,
            lambda v: {
                "vllm_path": v.vllm_dir,
                "matches": len(v.matches),
                "truncated": v.truncated,
                "warnings": v.warnings,
            },
        )
        matches: list[dict[str, Any]] = []
        for o in outcomes:
            if o.ok and o.value is not None:
                matches += [
                    {"host": o.host, "path": m.path, "line": m.line, "text": m.text}
                    for m in sorted(o.value.matches, key=lambda m: (m.path, m.line))
                ]
        emit_json({"matches": matches, **doc})
    else:
        from fleet.cli.render import terminal_safe

        for o in outcomes:
            value = o.value
            if not o.ok or value is None:
                continue
            for m in sorted(value.matches, key=lambda m: (m.path, m.line)):
                click.echo(
                    f"{o.host}: {m.path}:{m.line}:{m.text if raw else terminal_safe(m.text)}",
                    color=True,  # --raw is the host's bytes, on a terminal or not
                )
            if value.truncated:
                click.echo(
                    f"{o.host}: (output cut at {limit} lines; use --limit 0 for all)", err=True
                )
            for warning in value.warnings:
                click.echo(f"{o.host}: warning: {terminal_safe(warning)}", err=True)
        searched = [o.value for o in outcomes if o.ok and o.value is not None]
        if searched and not any(r.matches for r in searched):
            click.echo(f"no matches on {len(searched)} host(s)", err=True)
    return _finish(app, outcomes)
