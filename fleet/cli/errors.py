"""Turn every failure into one line on stderr and a documented exit code."""

from __future__ import annotations

import click

from fleet.errors import FleetError


def run_cli(command: click.Command, argv: list[str] | None) -> int:
    try:
        rv = command.main(args=argv, prog_name="fleet", standalone_mode=False)
    except FleetError as exc:
        click.echo(f"fleet: error: {exc}", err=True)
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("fleet: interrupted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("fleet: interrupted", err=True)
        return 130
    except BrokenPipeError:
        return 0
    if isinstance(rv, int):
        return rv
    return 0
