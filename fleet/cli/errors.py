"""Turn every failure into one line on stderr and a documented exit code.

A Ctrl-C is always reported: ``fleet: interrupted`` and exit 130, wherever it lands. The
first one raises ``KeyboardInterrupt`` in the command (which closes its connections, so
the hosts end what fleet started); one that lands after the command returned, or while
it cleans up, is never lost or turned into a crash: :func:`main_exit` exits 130 with the
message (a second Ctrl-C exits at once).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import NoReturn

import click

from fleet.errors import EXIT_INTERRUPTED, FleetError

INTERRUPTED = "fleet: interrupted"


def run_cli(command: click.Command, argv: list[str] | None) -> int:
    try:
        rv = command.main(args=argv, prog_name="fleet", standalone_mode=False)
    except FleetError as exc:
        from fleet.cli.render import terminal_safe

        click.echo(f"fleet: error: {terminal_safe(str(exc))}", err=True)
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo(INTERRUPTED, err=True)
        return EXIT_INTERRUPTED
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo(INTERRUPTED, err=True)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    if isinstance(rv, int):
        return rv
    return 0


class Interrupts:
    """SIGINT while a command runs: the first raises ``KeyboardInterrupt`` (once); any
    later one, or one after :meth:`disarm`, ends the process at once with the message."""

    def __init__(self) -> None:
        self.armed = True
        self.seen = 0

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.seen += 1
        if self.armed and self.seen == 1:
            self.armed = False
            raise KeyboardInterrupt
        _exit_now(EXIT_INTERRUPTED, message=True)

    def disarm(self) -> None:
        self.armed = False


def _write_err(text: str) -> None:
    try:
        os.write(2, text.encode())
    except OSError:
        pass


def _flush() -> None:
    """Flush stdout and stderr (a reader that went away, ``fleet ... | head``, is fine)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _exit_now(code: int, *, message: bool = False) -> NoReturn:
    """Flush what was printed and leave now: no interpreter shutdown (which a late Ctrl-C
    could interrupt, or which waits for worker threads a Ctrl-C left blocked)."""
    import logging

    _flush()
    if message:
        _write_err(INTERRUPTED + "\n")
    try:
        logging.shutdown()
    except Exception:
        pass
    os._exit(code)


def main_exit(command: click.Command, argv: list[str] | None) -> NoReturn:
    """The console entry point: run the command, exit with its code (130 and the message
    whenever a Ctrl-C landed, even after the command returned)."""
    interrupts = Interrupts()
    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        signal.signal(signal.SIGINT, interrupts)
    code: int | None = None
    try:
        code = run_cli(command, argv)
    except KeyboardInterrupt:  # landed in run_cli's own handlers: reported below
        code = None
    finally:
        interrupts.disarm()
    if not in_main:
        sys.exit(EXIT_INTERRUPTED if code is None else code)
    if code is None or (interrupts.seen and code != EXIT_INTERRUPTED):
        _exit_now(EXIT_INTERRUPTED, message=True)
    _exit_now(code)
