"""``fleet patch``: apply, check, diff or revert a vLLM patch set on hosts."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from fleet.cli.context import AppContext, host_option, pass_app
from fleet.errors import UsageError
from fleet.patching.manifest import DEFAULT_PATCH_SET

if TYPE_CHECKING:
    from rich.console import Console

    from fleet.patching.apply import HostReport
    from fleet.transport import HostOutcome, Runner

STATUS_STYLE = {
    "applied": "bold green",
    "reverted": "bold green",
    "already-applied": "green",
    "not-needed": "dim",
    "would-apply": "yellow",
    "would-revert": "yellow",
    "conflict": "bold red",
}


@click.command()
@host_option()
@click.option(
    "--patch",
    "patch_name",
    default=DEFAULT_PATCH_SET,
    show_default=True,
    metavar="NAME",
    help="Patch set (a directory of templates/patches).",
)
@click.option("--check", is_flag=True, help="Report what would change; write nothing.")
@click.option(
    "--diff", "show_diff", is_flag=True, help="Show a unified diff per file; write nothing."
)
@click.option("--revert", is_flag=True, help="Restore the originals saved by an earlier apply.")
@click.option("--force", is_flag=True, help="With --revert: restore files changed since the patch.")
@pass_app
def patch(
    app: AppContext,
    hosts: tuple[str, ...],
    patch_name: str,
    check: bool,
    show_diff: bool,
    revert: bool,
    force: bool,
) -> int:
    """Apply a version-aware patch set to the installed vLLM on each host.

    Every edit is anchored in the real file (no line numbers) and recognised when already
    applied, so a second run changes nothing. On any conflict nothing is written on that
    host. Writes are guarded by each file's sha256, backed up on the host under
    ~/.fleet/patches/, atomic per file, compiled with the host's Python, and reversible
    with --revert. Exit 0 when every host is patched (or would be, with --check), 1 on a
    conflict, 3 if a host is unreachable.
    """
    from fleet.patching.apply import apply_host, revert_host
    from fleet.patching.manifest import load_patch_set
    from fleet.transport import exit_code

    if force and not revert:
        raise UsageError("--force only applies to --revert")
    patch_set = load_patch_set(patch_name)
    selected = app.select(hosts)
    session = app.session()
    dry = check or show_diff

    def one(conn: Runner) -> HostReport:
        if revert:
            return revert_host(conn, patch_set, force=force, check=check, with_diff=show_diff)
        return apply_host(conn, patch_set, check=dry, with_diff=show_diff)

    outcomes = app.fan_out(selected, one, session)
    if app.json_output:
        _emit(outcomes, show_diff)
    else:
        _render(app.console, outcomes, patch_name, show_diff, revert, dry, verbose=app.verbose > 0)
    return exit_code(outcomes)


def _emit(outcomes: list[HostOutcome[HostReport]], show_diff: bool) -> None:
    from fleet.cli.render import emit_json
    from fleet.transport import hosts_json

    doc = hosts_json(outcomes, lambda r: r.to_json(with_diff=show_diff))
    for entry in doc["hosts"].values():
        # the fields of the JSON contract (docs/contracts.md) on every host entry, known or not
        entry.setdefault("vllm_version", None)
        entry.setdefault("files", [])
    emit_json(doc)


def _short(sha: str | None) -> str:
    return sha[:12] if sha else "-"


def _styled(status: str) -> str:
    from rich.markup import escape

    style = STATUS_STYLE.get(status, "")
    return f"[{style}]{escape(status)}[/]" if style else escape(status)


def _render(
    out: Console,
    outcomes: list[HostOutcome[HostReport]],
    patch_name: str,
    show_diff: bool,
    revert: bool,
    dry: bool,
    verbose: bool = False,
) -> None:
    from rich.markup import escape
    from rich.table import Table

    from fleet.cli.render import failure_lines

    verb = "revert" if revert else "apply"
    # every string that comes from a host or a user is escaped: it is not rich markup
    title = f"fleet patch {escape(patch_name)}: {verb}"
    title += " (dry run: nothing written)" if dry else ""
    table = Table(title=title, title_justify="left")
    for col in ("host", "vLLM", "status", "files"):
        table.add_column(col, overflow="fold", no_wrap=col in ("host", "vLLM", "status"))
    for o in outcomes:
        if o.value is None:
            table.add_row(escape(o.host), "-", f"[bold red]{escape(o.status)}[/]", "-")
            continue
        r = o.value
        status = r.status
        touched = [f for f in r.files if f.status != "not-needed"]
        if touched:
            files = escape(
                ", ".join(
                    f.path.rsplit("/", 1)[-1] + ("" if f.status == status else f" ({f.status})")
                    for f in touched
                )
            )
        else:
            files = escape(next((f.note for f in r.files if f.note), "") or "nothing to do")
        table.add_row(escape(o.host), escape(r.vllm_version), _styled(status), files)
    ok = sum(1 for o in outcomes if o.ok)
    table.caption = f"{ok}/{len(outcomes)} hosts ok" + ("" if verbose else "; per file: -v")
    out.print(table)
    if verbose:  # per file: full path, status, sha256 before -> after, edits
        for o in outcomes:
            if o.value is None:
                continue
            v = o.value
            out.print(
                f"[bold]{escape(o.host)}[/] vLLM {escape(v.vllm_version)} {escape(v.package_dir)}",
                soft_wrap=True,
            )
            for f in o.value.files:
                out.print(
                    f"  {_styled(f.status):<12} {escape(f.path)}  "
                    f"{_short(f.sha256_before)} -> {_short(f.sha256_after)}",
                    soft_wrap=True,
                )
                detail = ", ".join(f.edits) if f.edits else (f.note or "")
                if detail:
                    out.print(f"      [dim]{escape(detail)}[/]", soft_wrap=True)

    failure_lines(out, [o for o in outcomes if o.value is None])
    for o in outcomes:
        if o.value is None:
            continue
        r = o.value
        for f in r.files:
            if f.conflict is None:
                continue
            c = f.conflict
            host = escape(o.host)
            out.print(f"[bold red]{host}[/]: conflict: {escape(c.describe())}", soft_wrap=True)
            for cand in c.candidates:
                where = escape(f"{f.path}:{cand.line}: {cand.text.strip()}")
                out.print(f"    {where}", soft_wrap=True)
        if not r.ok:
            out.print(f"  [dim]nothing was written on {escape(o.host)}[/]", soft_wrap=True)
        if r.backup_dir and r.changed:
            out.print(
                f"[dim]{escape(o.host)}: originals kept in {escape(r.backup_dir)}[/]",
                soft_wrap=True,
            )
    if show_diff:
        from rich.syntax import Syntax

        for o in outcomes:
            if o.value is None:
                continue
            for f in o.value.files:
                if f.diff:
                    out.rule(escape(f"{o.host}: {f.path}"))
                    out.print(Syntax(f.diff, "diff", theme="ansi_dark", word_wrap=False))
