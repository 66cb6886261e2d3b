"""``fleet patch``: apply, check, diff or revert a vLLM patch set on hosts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from fleet.cli.context import AppContext, host_option, pass_app
from fleet.errors import EXIT_FAILED, EXIT_OK, UsageError
from fleet.patching.manifest import DEFAULT_PATCH_SET

if TYPE_CHECKING:
    from fleet.patching.service import HostReport
    from fleet.transport import HostConnection, HostOutcome

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
    from fleet.patching.manifest import load_patch_set
    from fleet.patching.service import apply_host, revert_host
    from fleet.transport import exit_code, fan_out

    if force and not revert:
        raise UsageError("--force only applies to --revert")
    patch_set = load_patch_set(patch_name)
    selected = app.select(hosts)
    session = app.session()
    dry = check or show_diff

    def one(conn: HostConnection) -> HostReport:
        if revert:
            return revert_host(conn, patch_set, force=force, check=check, with_diff=show_diff)
        return apply_host(conn, patch_set, check=dry, with_diff=show_diff)

    outcomes = fan_out(session, selected, one, forks=app.forks)
    if app.json_output:
        _emit(outcomes, show_diff)
    else:
        _render(outcomes, patch_name, show_diff, revert, dry)
    code = exit_code(outcomes)
    if code == EXIT_OK and any(o.value is not None and not o.value.ok for o in outcomes):
        code = EXIT_FAILED
    return code


def _emit(outcomes: list[HostOutcome[HostReport]], show_diff: bool) -> None:
    from fleet.cli.render import emit_json

    out: dict[str, Any] = {}
    for o in outcomes:
        if o.ok and o.value is not None:
            out[o.host] = o.value.to_json(with_diff=show_diff)
        else:
            out[o.host] = {**o.failure_json(), "files": []}
    emit_json({"hosts": out})


def _short(sha: str | None) -> str:
    return sha[:12] if sha else "-"


def _render(
    outcomes: list[HostOutcome[HostReport]],
    patch_name: str,
    show_diff: bool,
    revert: bool,
    dry: bool,
) -> None:
    from rich.markup import escape
    from rich.table import Table

    from fleet.cli.render import console

    out = console()
    verb = "revert" if revert else "apply"
    title = f"fleet patch {patch_name}: {verb}{' (dry run: nothing written)' if dry else ''}"
    table = Table(title=title, title_justify="left")
    for col in ("host", "vLLM", "file", "status", "sha256 before", "sha256 after", "note"):
        table.add_column(col, no_wrap=col in ("host", "status"))
    for o in outcomes:
        if not o.ok or o.value is None:
            table.add_row(
                o.host, "-", "-", f"[bold red]{o.status}[/]", "-", "-", escape(o.error or "")
            )
            continue
        r = o.value
        for i, f in enumerate(r.files):
            style = STATUS_STYLE.get(f.status, "")
            note = f.note or ""
            if f.conflict is not None:
                note = f.conflict.reason
            elif f.edits and f.status in ("would-apply", "applied"):
                note = ", ".join(f.edits)
            table.add_row(
                o.host if i == 0 else "",
                r.vllm_version if i == 0 else "",
                f.path,
                f"[{style}]{f.status}[/]" if style else f.status,
                _short(f.sha256_before),
                _short(f.sha256_after),
                escape(note),
            )
        table.add_section()
    ok = sum(1 for o in outcomes if o.ok and o.value is not None and o.value.ok)
    table.caption = f"{ok}/{len(outcomes)} hosts ok"
    out.print(table)

    for o in outcomes:
        if not o.ok or o.value is None:
            out.print(f"[bold red]{o.host}[/]: {escape(o.error or o.status)}", soft_wrap=True)
            if o.hint:
                out.print(f"  [dim]next:[/] {escape(o.hint)}", soft_wrap=True)
            continue
        r = o.value
        for f in r.files:
            if f.conflict is None:
                continue
            c = f.conflict
            out.print(f"[bold red]{o.host}[/]: conflict: {escape(c.describe())}", soft_wrap=True)
            for cand in c.candidates:
                out.print(f"    {f.path}:{cand.line}: {escape(cand.text.strip())}", soft_wrap=True)
        if not r.ok:
            out.print(f"  [dim]nothing was written on {o.host}[/]")
        if r.backup_dir and r.changed:
            out.print(f"[dim]{o.host}: originals kept in {escape(r.backup_dir)}[/]")
    if show_diff:
        from rich.syntax import Syntax

        for o in outcomes:
            if not o.ok or o.value is None:
                continue
            for f in o.value.files:
                if f.diff:
                    out.rule(f"{o.host}: {f.path}")
                    out.print(Syntax(f.diff, "diff", theme="ansi_dark", word_wrap=False))
