"""The only place that quotes or assembles shell text sent to a host.

Every remote command is a :class:`Command`, and only this module makes one:

- :func:`join` turns an argv list into one command line, each argument one shell word;
- :func:`sh` runs a one-line POSIX ``sh`` script whatever the login shell is (sshd hands
  the command to the user's shell: bash, zsh, fish or csh);
- :func:`script` fills a constant template's ``{{name}}`` fields, quoting each value by its
  type (text -> one word, :class:`RemotePath` -> a path with the ``~/`` rule, ``int`` ->
  digits, :class:`Raw` -> a trusted constant fragment, a :class:`Fragment` made by
  :func:`script` -> as it is, a list -> words);
- :func:`python` runs the host's interpreter on a script sent on stdin.

``HostConnection.run``/``stream`` accept a :class:`Command` or an argv list, nothing else,
so a hand-built string is a type error (and ``tests/unit/test_layout.py`` checks that no
other module imports ``shlex`` or builds a ``Command``/``Raw`` from anything but a
constant). :func:`masked` is a command as it may be logged (secrets hidden).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from fleet.errors import UsageError


class Command(str):
    """Shell text built by this module: the only kind of string a host is sent to run."""

    __slots__ = ()


class Raw(str):
    """A trusted fragment of shell text written in fleet's code (never user input)."""

    __slots__ = ()


class Fragment(str):
    """sh text made by :func:`script`: inserted verbatim when given to another template."""

    __slots__ = ()


class RemotePath(str):
    """A path on the host; a leading ``~/`` means the remote user's home."""

    __slots__ = ()


_SPECIAL = re.compile(r"([\\'!])")


def word(text: str) -> str:
    """``text`` as ONE word for every common login shell: sh, bash, zsh, fish and csh.

    Runs of ordinary characters go in single quotes; each backslash, single quote and
    ``!`` is written unquoted, escaped by a backslash: inside single quotes fish reads two
    backslashes as one and csh expands ``!`` (history), while outside quotes every shell
    reads an escaped character the same way. csh cannot quote a newline: refused."""
    if "\n" in text or "\0" in text:
        raise UsageError(f"a remote command cannot contain a newline or NUL: {text[:80]!r}")
    if not text:
        return "''"
    out = []
    for piece in _SPECIAL.split(text):
        if piece in ("\\", "'", "!"):
            out.append("\\" + piece)
        elif piece:
            out.append("'" + piece + "'")
    return "".join(out)


def path(remote: str) -> str:
    """A remote path as one sh word: ``~`` and a leading ``~/`` are the remote user's home
    (``"$HOME"/...``, expanded by the host's sh); ``~user`` and NUL/newline are refused."""
    if not remote or "\0" in remote or "\n" in remote:
        raise UsageError(f"invalid remote path {remote!r}")
    if remote == "~":
        return '"$HOME"'
    if remote.startswith("~/"):
        rest = remote[2:]
        return '"$HOME"/' + word(rest) if rest else '"$HOME"/'
    if remote.startswith("~"):
        raise UsageError(f"unsupported remote path {remote!r} (use ~/... or an absolute path)")
    return word(remote)


def join(argv: Sequence[str]) -> Command:
    """An argv list as one command line (each argument one word for any login shell)."""
    if isinstance(argv, str):
        raise TypeError("join() takes a list of arguments, not a string")
    if not argv:
        raise ValueError("empty command")
    return Command(" ".join(word(str(a)) for a in argv))


_FIELD = re.compile(r"\{\{([a-z_][a-z0-9_]*)\}\}")

Value = str | int | Raw | Fragment | RemotePath | Sequence[str]


def _render(value: Value, name: str) -> str:
    if isinstance(value, bool):
        raise TypeError(f"{{{{{name}}}}}: a bool is not a shell value")
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, Raw | Fragment):
        return str(value)
    if isinstance(value, RemotePath):
        return path(value)
    if isinstance(value, str):
        return word(value)
    return " ".join(word(str(v)) for v in value)


def script(template: str, **values: Value) -> Fragment:
    """A one-line sh script: ``template`` (a constant of fleet's code) with each
    ``{{name}}`` replaced by its value, quoted by type (see the module docstring); the
    result can itself be a value of another template."""
    used: set[str] = set()

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise KeyError(f"shell template field {{{{{name}}}}} has no value")
        used.add(name)
        return _render(values[name], name)

    text = _FIELD.sub(fill, template)
    unused = set(values) - used
    if unused:
        raise KeyError(f"values not used by the shell template: {sorted(unused)}")
    if "\n" in text:
        raise UsageError("a remote sh script must be one line")
    return Fragment(text)


def sh(text: str) -> Command:
    """``sh -c <text>``: run a one-line POSIX sh script whatever the login shell is."""
    return Command("sh -c " + word(text))


class Held(Command):
    """A command that reads a framed payload from stdin (:func:`framed`) and then watches
    the rest of stdin: the transport keeps stdin open until the command ends, so its end
    (EOF) tells the host that fleet is gone (see :func:`python`)."""

    __slots__ = ()


# The on-host loader (python -c): sys.path without the working directory before anything
# is imported, then exactly the framed payload (its length on the first line) is read and
# run in __main__; ``_fleet_stdin`` stays open for the runtime's watchdog
# (fleet/onhost/_common.py, watch_fleet).
LOADER_NAME = "<fleet-onhost>"  # the bundle's file name; in the command line of each run
_LOADER = Raw(
    'import sys;sys.path[:]=[p for p in sys.path if p not in ("",".")];'
    "_fleet_stdin=sys.stdin.buffer;"
    'exec(compile(_fleet_stdin.read(int(_fleet_stdin.readline())),"' + LOADER_NAME + '","exec"))'
)


def python(interpreter: str) -> Held:
    """``sh -c 'exec PY -c LOADER'``: the host's interpreter running a script sent on
    stdin as :func:`framed` bytes, stdin then held open (EOF: fleet is gone).

    ``PY`` is quoted, except a leading ``~/``, which is the host's home (as in every
    remote path)."""
    return Held(sh("exec " + path(interpreter) + " -c " + word(_LOADER)))


def framed(payload: bytes) -> bytes:
    """``payload`` as the loader of :func:`python` reads it: its length, a newline, itself."""
    return b"%d\n" % len(payload) + payload


# Every command fleet runs without a payload runs under this guard: the command in the
# background, a ``cat`` watching stdin (which the transport holds open until the command
# ends). When the command ends it stops the cat; when the cat sees EOF first, fleet is gone
# (its timeout, Ctrl-C, an error, a lost connection) and the whole process group of the
# command is sent SIGTERM, so no remote process outlives fleet's command. The command's
# own stdin is empty (/dev/null, as when fleet sent nothing), or for a stream the held
# stdin too (a command may wait for its end itself: ``cat >/dev/null; kill ...``).
_GUARD = (
    "exec 3<&0 </dev/null; "
    "cat <&3 >/dev/null 2>&1 & c=$!; "
    "( {{body}}; r=$?; kill -PIPE $c 2>/dev/null; exit $r ) {{stdin}} & p=$!; "
    "exec 3<&-; "
    'wait $c; [ "$?" -lt 128 ] && kill -TERM 0 2>/dev/null; '
    "wait $p"
)


def guarded(command: Command, *, stdin_open: bool = False) -> Command:
    """``command`` under the guard above (an ``sh -c`` command; exit status kept);
    ``stdin_open``: the command reads the held stdin too (streams) instead of /dev/null."""
    if not isinstance(command, Command):
        raise TypeError("guarded() takes a Command made by fleet.transport.shell")
    if isinstance(command, Held):
        raise TypeError("a Held command watches its own stdin")
    body = _GUARD.replace("{{stdin}}", "<&3 3<&-" if stdin_open else "3<&-")
    return sh(body.replace("{{body}}", str(command)))


def sequence(*parts: Fragment | Raw) -> Fragment:
    """sh fragments run one after the other (``a; b; c``)."""
    return Fragment("; ".join(parts))


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def assignment(name: str, value: str) -> Fragment:
    """``NAME=value`` for sh (a sourced env file, an ``export``): the name checked, the
    value one word."""
    if not _ENV_NAME.match(name):
        raise UsageError(f"{name!r} is not an environment variable name")
    return Fragment(f"{name}={word(value)}")


def script_file(lines: Sequence[Fragment | Raw]) -> str:
    """A POSIX sh script file (``#!/bin/sh`` and one command per line), every line made
    by this module (a template filled by :func:`script`, or a :class:`Raw` constant)."""
    for line in lines:
        if not isinstance(line, Fragment | Raw) or "\n" in line:
            raise TypeError("script_file() takes lines made by fleet.transport.shell")
    return "#!/bin/sh\n" + "\n".join(lines) + "\n"


def words(text: str) -> list[str]:
    """A command line split into its words as a POSIX shell splits it (quotes honoured,
    nothing expanded): how a profile's ``extra_args`` given as one string is read. A line
    a shell could not split (an unclosed quote) raises ``ValueError``."""
    import shlex

    return shlex.split(text)


def masked(command: str) -> str:
    """The command as it may be logged: API keys and tokens hidden."""
    from fleet.redact import redact_text

    return redact_text(command)
