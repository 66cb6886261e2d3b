"""The ``fleet`` command line: a thin click layer.

Subcommands are imported lazily (only the one that runs is imported), so ``fleet --help``
stays instant. Each subcommand lives in ``fleet/cli/cmd_<name>.py``.
"""

from __future__ import annotations

import importlib
import os

import click

from fleet import __version__
from fleet.cli.context import AppContext, setup_logging

# name -> (module:attribute, one-line help shown by ``fleet --help`` without importing)
COMMANDS: dict[str, tuple[str, str]] = {
    "hosts": ("fleet.cli.cmd_hosts:hosts", "List the inventory."),
    "ping": ("fleet.cli.cmd_hosts:ping", "Connect; report latency and host-key status."),
    "trust": ("fleet.cli.cmd_hosts:trust", "Pin host keys into the fleet's known_hosts."),
    "inspect": ("fleet.cli.cmd_inspect:inspect", "Gather facts: GPUs, Python, vLLM, EAGLE-3."),
    "source": ("fleet.cli.cmd_source:source", "Read the installed vLLM source (sed/grep)."),
    "patch": ("fleet.cli.cmd_patch:patch", "Apply, check, diff or revert a vLLM patch set."),
    "logs": ("fleet.cli.cmd_logs:logs", "Show, follow or diagnose vLLM logs."),
    "serve": ("fleet.cli.cmd_serve:serve", "Serve a profile: preflight, launch, follow, ready."),
    "status": ("fleet.cli.cmd_serve:status", "State of each profile's server per host."),
    "stop": ("fleet.cli.cmd_serve:stop", "Stop a profile's server (idempotent)."),
    "rollout": ("fleet.cli.cmd_rollout:rollout", "Rolling, health-gated update of a profile."),
    "bench": ("fleet.cli.cmd_bench:bench", "Measure a served profile with and without EAGLE-3."),
    "profile": ("fleet.cli.cmd_serve:profile", "Serve profiles: JSON Schema, rendered view."),
    "sandbox": ("fleet.cli.cmd_sandbox:sandbox", "Rehearsal fleet on this machine (real sshd)."),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module_name, attr = entry[0].split(":")
        command = getattr(importlib.import_module(module_name), attr)
        assert isinstance(command, click.Command)
        _add_global_flags(command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(AppContext).json_output = True


def _add_global_flags(command: click.Command) -> None:
    """Accept ``--json`` after the subcommand too (``fleet ping --host h --json``)."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _add_global_flags(sub)
        return
    if not any("--json" in p.opts for p in command.params):
        command.params.append(
            click.Option(
                ["--json"],
                is_flag=True,
                expose_value=False,
                callback=_set_json,
                help="Machine output on stdout (same as the global --json).",
            )
        )


EPILOG = (
    "Exit codes: 0 success; 1 failed on at least one host (or a diagnosis found a problem); "
    "2 bad input or usage; 3 could not connect or authenticate (including host keys)."
)


@click.group(cls=LazyGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--inventory",
    "inventory_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Inventory file [default: $FLEET_INVENTORY or ./inventory.yaml].",
)
@click.option("--json", "json_output", is_flag=True, help="Machine output on stdout, nothing else.")
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="More detail; -vv also logs every remote command (secrets masked) on stderr.",
)
@click.option(
    "--forks",
    type=click.IntRange(1, 1024),
    default=32,
    show_default=True,
    help="Hosts worked on in parallel.",
)
@click.version_option(version=__version__, prog_name="fleet")
@click.pass_context
def cli(
    ctx: click.Context,
    inventory_path: str | None,
    json_output: bool,
    verbose: int,
    forks: int,
) -> None:
    """Inspect, patch, serve and diagnose vLLM on fleets of multi-GPU hosts over SSH."""
    setup_logging(verbose)
    ctx.obj = AppContext(
        inventory_path=inventory_path or os.environ.get("FLEET_INVENTORY") or "inventory.yaml",
        json_output=json_output,
        verbose=verbose,
        forks=forks,
    )


def main(argv: list[str] | None = None) -> None:
    """Console entry point: maps fleet errors to one line on stderr and an exit code (a
    Ctrl-C, wherever it lands, to ``fleet: interrupted`` and 130)."""
    from fleet.cli.errors import main_exit

    main_exit(cli, argv)
