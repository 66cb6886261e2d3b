"""The ``fleet`` console script and ``python -m fleet``: a Ctrl-C is fleet's from the start.

Python's own SIGINT handling would turn a Ctrl-C while the CLI is imported (click and
fleet's modules, some 50 ms) into a traceback and a death by SIGINT (exit -2). Until the
CLI installs its handler (``fleet.cli.errors.main_exit``) a Ctrl-C ends the process at
once with ``fleet: interrupted`` and exit 130: nothing has been started yet. (Only the
interpreter's own start-up, before this module runs, is Python's.)
"""

import _signal  # the C module: `signal` would import enum (milliseconds) first
import os

EXIT_INTERRUPTED = 130  # fleet.errors.EXIT_INTERRUPTED (not imported: this must be instant)


def _before_the_cli(signum: int, frame: object) -> None:
    try:
        os.write(2, b"fleet: interrupted\n")
    finally:
        os._exit(EXIT_INTERRUPTED)


def main() -> None:
    _signal.signal(_signal.SIGINT, _before_the_cli)
    from fleet.cli import main as cli_main

    cli_main()
