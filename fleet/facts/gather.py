"""Gather a host's facts in one round trip: one command, the facts script on its stdin."""

from __future__ import annotations

import shlex
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

from fleet.errors import OperationFailed
from fleet.facts.models import HostFacts
from fleet.facts.parsers import FactsError, parse_facts_output

if TYPE_CHECKING:
    from fleet.transport import HostConnection

FACTS_TIMEOUT = 120.0
EXIT_NOT_EXECUTABLE = 126
EXIT_COMMAND_NOT_FOUND = 127


@cache
def facts_script() -> bytes:
    """The remote facts script (a package resource, run by the host's Python from stdin)."""
    return resources.files("fleet.facts").joinpath("remote_facts.py").read_bytes()


def python_word(python: str) -> str:
    """The host's interpreter as one shell word: quoted, except a leading ``~/``, which is
    expanded by the remote shell (``"$HOME"/...``) since it names a path on the host."""
    if python.startswith("~/"):
        return '"$HOME"/' + shlex.quote(python[2:])
    return shlex.quote(python)


def facts_command(python: str) -> str:
    """``PY -`` run by ``sh`` whatever the login shell is."""
    from fleet.source import sh_command  # (fleet.source imports python_word from here)

    return sh_command(f"exec {python_word(python)} -")


def gather_facts(conn: HostConnection, *, timeout: float = FACTS_TIMEOUT) -> HostFacts:
    """Run the facts script on ``conn``'s host with its ``python`` and parse the answer.

    One command over the already-open connection. Raises :class:`OperationFailed` (the
    host's outcome becomes "failed") when the interpreter is missing or the output cannot
    be understood; a single failed fact only lands in ``HostFacts.errors``.
    """
    python = conn.host.python
    res = conn.run(facts_command(python), stdin=facts_script(), timeout=timeout)
    if res.exit_code in (EXIT_NOT_EXECUTABLE, EXIT_COMMAND_NOT_FOUND):
        problem = "not found" if res.exit_code == EXIT_COMMAND_NOT_FOUND else "not executable"
        raise OperationFailed(
            f"{conn.host.name}: python interpreter {python!r} {problem} on the host",
            hint="set the host's 'python' in the inventory to the vLLM environment's python",
        )
    try:
        return parse_facts_output(res.stdout)
    except FactsError as exc:
        detail = (res.stderr.strip().splitlines() or [""])[-1]
        suffix = f" (exit {res.exit_code}{': ' + detail if detail else ''})"
        raise FactsError(f"{conn.host.name}: {exc.message}{suffix}") from None
