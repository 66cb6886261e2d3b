"""Remote logs at scale: filter on the host, fetch only candidate lines.

``fleet logs --host H PROFILE --diagnose`` runs one shell command on the host, a one-line
POSIX sh script (built by :mod:`fleet.transport.shell`, so fish or csh as login shell do
not matter)::

    grep -a -n -E -B3 -A3 -e '<literal1>|<literal2>|...' -- FILE | cut | awk '<cap>' | head -c

where the alternation is every prefilter literal of the catalogue (a line no literal occurs
in cannot match any rule), ``-n`` keeps the real line numbers (evidence cites them), and the
context window gives the engine the lines around each hit. Only those lines cross the
network: a healthy multi-GiB log costs a few kilobytes, and even a log whose every line is
a candidate sends at most ``HEAD_BYTES + TAIL_BYTES`` (its start and its end; the dropped
middle is counted and reported). The command prints a ``#fleet`` header (file size, line
offset) first so the caller can report the fraction moved. With ``--tail`` the size is
taken once and only that snapshot is read (``head -c SIZE``), so the line numbers of a log
still being written stay right. Only regular files are read (a FIFO or ``/dev/zero`` is
refused at once), finite commands run under ``timeout`` where the host has it, and a
follow (``tail -F``) ends as soon as fleet closes the connection.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleet.diagnosis.catalogue import CompiledCatalogue, load_catalogue
from fleet.diagnosis.engine import Engine, diagnose_numbered
from fleet.diagnosis.factory import with_values
from fleet.diagnosis.models import SEVERITY_ORDER, Diagnosis
from fleet.errors import OperationFailed, UsageError
from fleet.onhost import layout
from fleet.redact import redact_text
from fleet.sizes import human_bytes
from fleet.transport import shell
from fleet.transport.shell import Raw, RemotePath

if TYPE_CHECKING:
    from fleet.inventory import HostSpec
    from fleet.transport import Runner
    from fleet.transport.session import Session

log = logging.getLogger(__name__)

WINDOW = 3
HEAD_LINES = 100_000  # at most this many output lines from the start of the grep output...
TAIL_LINES = 100_000  # ...and from its end; the middle is dropped (counted in the header)
HEAD_BYTES = 2 * 2**20  # ...and at most this many bytes of each (a log whose every line
TAIL_BYTES = 2 * 2**20  # is a candidate must not cross the network whole)
MAX_LINE_BYTES = 20000  # longer candidate lines are cut on the host (the engine reads 16384)
EXIT_NO_FILE = 66
EXIT_NOT_REGULAR = 67
TIME_LIMIT = 570  # seconds a finite log command may run on the host (fleet waits 600)
MEMORY_LIMIT_KIB = 2**20  # the log commands' address space on the host (1 GiB): grep and
# tail hold a whole line, and a multi-GiB line (a preallocated log, NUL bytes) must fail
# ("memory exhausted") rather than exhaust the host


def profile_log_path(profile: str) -> str:
    """Where ``fleet serve`` keeps a profile's vLLM log on a host (``~/``-relative; the
    layout and the name check are :mod:`fleet.onhost.layout`'s)."""
    if not layout.profile_name_ok(profile):
        raise UsageError(f"invalid profile name {profile!r}: {layout.PROFILE_NAME_RULE}")
    return "~/" + layout.log_path(profile)


def check_path(path: str) -> str:
    """Validate a remote log path before connecting (``~/...`` or an absolute path)."""
    shell.path(path)
    return path


def prefilter_regex(catalogue: CompiledCatalogue | None = None) -> str:
    """One POSIX ERE: the alternation of all prefilter literals."""
    cat = catalogue or load_catalogue()
    return "|".join(cat.prefilter_ere())


# Check the file (readable, regular: a FIFO or a device would block or never end), take
# ONE snapshot of its size and print the ``#fleet`` header. With a tail the line offset is
# counted in that snapshot, and the commands after it read only that snapshot (``head -c
# "$size"``), so a log that grows meanwhile cannot shift the line numbers. ``$T`` is
# ``timeout --foreground N`` where the host has coreutils' timeout (a remote-side time
# limit); ``--foreground`` keeps it in the command's process group, which the transport's
# guard ends when fleet goes away (without it, timeout's own group would outlive fleet).
_CHECK = (
    "export LC_ALL=C; ulimit -v {{memory}} 2>/dev/null; f={{path}}; "
    'if [ ! -r "$f" ]; then echo "fleet: cannot read $f" >&2; exit {{no_file}}; fi; '
    'if [ ! -f "$f" ]; then echo "fleet: $f is not a regular file" >&2; exit {{not_regular}}; fi; '
    "T=; if timeout --foreground 9 true 2>/dev/null; then T='timeout --foreground {{limit}}'; fi; "
    "size=$(wc -c < \"$f\" | tr -d ' ')"
)
_HEADER_ALL = Raw('offset=0; echo "#fleet size=$size offset=$offset"')
_HEADER_TAIL = (
    'total=$(head -c "$size" -- "$f" | wc -l); '
    # a last line still being written (no newline yet) is a line for tail too
    'if [ "$size" -gt 0 ] && [ -n "$(tail -c +"$size" -- "$f" | head -c 1)" ]; '
    "then total=$((total + 1)); open=1; else open=0; fi; "
    "offset=$((total > {{tail}} ? total - {{tail}} : 0)); "
    'echo "#fleet size=$size offset=$offset open=$open"'
)


def _header(path: str, tail: int | None) -> shell.Fragment:
    check = shell.script(
        _CHECK,
        path=RemotePath(path),
        no_file=EXIT_NO_FILE,
        not_regular=EXIT_NOT_REGULAR,
        limit=TIME_LIMIT,
        memory=MEMORY_LIMIT_KIB,
    )
    if tail is None:
        return shell.sequence(check, _HEADER_ALL)
    return shell.sequence(check, shell.script(_HEADER_TAIL, tail=int(tail)))


# Keep the first H lines (at most HB bytes) and the last T lines (at most TB bytes) of the
# candidate output; the middle is dropped and counted in a ``#fleet dropped=N`` line. The
# tail is a ring indexed by line number, so memory on the host stays bounded too.
_CAP = Raw(
    "awk -v H=$H -v T=$TL -v HB=$HB -v TB=$TB '"
    "!c && NR<=H && hb+length($0)+1<=HB {print; hb+=length($0)+1; next} "
    "!c {c=1; s=NR; first=NR} "
    "{b[NR]=$0; tb+=length($0)+1; "
    "while (s<NR && (NR-s+1>T || tb>TB)) {tb-=length(b[s])+1; delete b[s]; s++}} "
    'END{if(c){if(s>first) print "#fleet dropped=" (s-first); '
    "for(i=s;i<=NR;i++) print b[i]}}'"
)
_GREP = (
    "H={{h}}; TL={{t}}; HB={{hb}}; TB={{tb}}; "
    "{{source}} | cut -c1-{{max_line}} | {{cap}} | head -c {{hard}}"
)
_GREP_ARGS = "grep -a -n -E -B{{window}} -A{{window}} -e {{ere}}"
_FROM_FILE = '$T {{grep}} -- "$f"'
_FROM_TAIL = 'head -c "$size" -- "$f" | tail -n {{tail}} | $T {{grep}}'
_TAIL = 'head -c "$size" -- "$f" | tail -n {{lines}} | cut -b 1-{{max_line}}'


def output_cap(head_bytes: int = HEAD_BYTES, tail_bytes: int = TAIL_BYTES) -> int:
    """The hard byte cap (``head -c``) behind the awk caps (which count bytes in the C
    locale; an awk counting characters would stop here)."""
    return int(head_bytes) + int(tail_bytes) + 2**16


def grep_command(
    path: str,
    *,
    tail: int | None = None,
    window: int = WINDOW,
    catalogue: CompiledCatalogue | None = None,
    head_bytes: int = HEAD_BYTES,
    tail_bytes: int = TAIL_BYTES,
) -> shell.Command:
    """The one remote command that returns the candidate lines of ``path`` (numbered).

    Its output is at most ``head_bytes + tail_bytes`` (plus a header), whatever the log."""
    grep = shell.script(_GREP_ARGS, window=int(window), ere=prefilter_regex(catalogue))
    if tail is not None:
        source = shell.script(_FROM_TAIL, tail=int(tail), grep=grep)
    else:
        source = shell.script(_FROM_FILE, grep=grep)
    # cut: a pathological multi-GiB line must not cross the network whole
    body = shell.script(
        _GREP,
        h=HEAD_LINES,
        t=TAIL_LINES,
        hb=int(head_bytes),
        tb=int(tail_bytes),
        source=source,
        max_line=MAX_LINE_BYTES,
        cap=_CAP,
        hard=output_cap(head_bytes, tail_bytes),
    )
    return shell.sh(shell.sequence(_header(path, tail), body))


def tail_command(path: str, lines: int) -> shell.Command:
    """Plain ``tail`` with the same header (for showing a log without diagnosing)."""
    tail = shell.script(_TAIL, lines=int(lines), max_line=MAX_LINE_BYTES)
    return shell.sh(shell.sequence(_header(path, lines), tail))


_GREP_LINE = re.compile(r"(\d+)[:-](.*)", re.DOTALL)


@dataclass
class Header:
    size: int = 0
    offset: int = 0
    dropped: int = 0
    open: int = 0  # 1: the snapshot's last line had no newline yet (still being written)


def parse_header(line: str, header: Header) -> bool:
    """Update ``header`` from a ``#fleet key=value ...`` line; False if it is not one."""
    if not line.startswith("#fleet "):
        return False
    for item in line[7:].split():
        key, _, value = item.partition("=")
        if value.isdigit() and hasattr(header, key):
            setattr(header, key, int(value))
    return True


def parse_grep(lines: Iterable[str], header: Header | None = None) -> Iterator[tuple[int, str]]:
    """(real line number, text) from ``grep -n`` output with context (``N:`` / ``N-`` / ``--``)."""
    hdr = header if header is not None else Header()
    for line in lines:
        if line.startswith("#fleet "):
            parse_header(line, hdr)
            continue
        if line == "--":
            continue
        m = _GREP_LINE.match(line)
        if m:
            yield int(m.group(1)) + hdr.offset, m.group(2)


def parse_numbered(lines: Iterable[str], header: Header | None = None) -> Iterator[tuple[int, str]]:
    """(line number, text) from header + plain lines (``tail`` / ``tail -F`` output)."""
    hdr = header if header is not None else Header()
    n = 0
    for line in lines:
        if n == 0 and parse_header(line, hdr):
            continue
        n += 1
        yield hdr.offset + n, line


def tail_lines(
    conn: Runner, path: str, lines: int, *, timeout: float = 120.0
) -> list[tuple[int, str]]:
    """The last ``lines`` lines of ``path`` on the host, numbered, secrets masked."""
    res = conn.run(tail_command(path, lines), timeout=timeout)
    _check_exhausted(conn, path, res.stderr)
    if res.exit_code in (EXIT_NO_FILE, EXIT_NOT_REGULAR) or not res.ok:
        msg = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else "tail failed"
        raise OperationFailed(
            f"{conn.host.name}: {msg}",
            hint="check the profile name or --path",
            code="log-not-found",
        )
    text = res.stdout.split("\n")
    if text and text[-1] == "":
        text.pop()
    return [(n, redact_text(t)) for n, t in parse_numbered(text, Header())]


@dataclass
class RemoteDiagnosis:
    host: str
    path: str
    diagnoses: list[Diagnosis]
    bytes_received: int = 0
    file_size: int = 0
    candidate_lines: int = 0
    dropped_lines: int = 0
    truncated: bool = False
    notes: list[str] = field(default_factory=list)
    node: dict[str, Any] | None = None  # a server across hosts: the node this log is of
    program: str | None = None  # the profile's program whose log it is (P, or P-ray)

    @property
    def fraction(self) -> float:
        return self.bytes_received / self.file_size if self.file_size else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "diagnoses": [d.as_contract() for d in self.diagnoses],
            "bytes_received": self.bytes_received,
            "file_size": self.file_size,
            "candidate_lines": self.candidate_lines,
            "truncated": self.truncated,
            "notes": self.notes,
            **({"node": self.node} if self.node else {}),
            **({"program": self.program} if self.program else {}),
        }


def rank_across_hosts(
    per_host: Sequence[tuple[str, Sequence[Diagnosis]]],
) -> list[dict[str, Any]]:
    """Every host's diagnoses in one ranked list, each with its ``host``: every host's
    primary cause first, then the others; within each, by severity, then by the engine's
    rank on its host, then by host order."""
    ranked: list[tuple[tuple[bool, int, int, int], dict[str, Any]]] = []
    for h, (host, diagnoses) in enumerate(per_host):
        for i, d in enumerate(diagnoses):
            key = (i > 0, SEVERITY_ORDER.get(d.severity, 9), i, h)
            ranked.append((key, {"host": host, **d.as_contract()}))
    ranked.sort(key=lambda item: item[0])
    return [entry for _key, entry in ranked]


def _missing(conn: Runner, path: str, stderr: str) -> OperationFailed:
    msg = stderr.strip().splitlines()[-1] if stderr.strip() else f"cannot read {path}"
    return OperationFailed(
        f"{conn.host.name}: {msg}", hint="check the profile name or --path", code="log-not-found"
    )


def _check_exhausted(conn: Runner, path: str, stderr: str) -> None:
    """A pipeline's status is its last command's: a grep or tail that ran out of memory
    (a line longer than the host-side limit) is only in stderr."""
    if "memory exhausted" in stderr or "Cannot allocate memory" in stderr:
        raise OperationFailed(
            f"{conn.host.name}: {path} has a line longer than fleet reads on the host "
            f"(the log commands ran out of their {MEMORY_LIMIT_KIB // 1024} MiB)",
            hint="a log of NUL bytes or a preallocated file? check it with ls -ls / head -c",
        )


def diagnose_remote(
    conn: Runner,
    path: str,
    *,
    tail: int | None = None,
    catalogue: CompiledCatalogue | None = None,
    timeout: float | None = 600.0,
    head_bytes: int = HEAD_BYTES,
    tail_bytes: int = TAIL_BYTES,
) -> RemoteDiagnosis:
    """Filter ``path`` on the host, fetch the candidate lines, diagnose them here."""
    cat = catalogue or load_catalogue()
    command = grep_command(
        path, tail=tail, catalogue=cat, head_bytes=head_bytes, tail_bytes=tail_bytes
    )
    res = conn.run(command, timeout=timeout)
    if res.exit_code in (EXIT_NO_FILE, EXIT_NOT_REGULAR):
        raise _missing(conn, path, res.stderr)
    _check_exhausted(conn, path, res.stderr)
    if not res.ok:
        raise OperationFailed(
            f"{conn.host.name}: log filter exited {res.exit_code}: {res.stderr.strip()[-300:]}"
        )
    header = Header()
    raw = res.stdout_bytes
    first_nl = raw.find(b"\n") + 1
    cut_hard = len(raw) - first_nl >= output_cap(head_bytes, tail_bytes)
    text = raw.decode("utf-8", errors="replace").split("\n")
    if text and text[-1] == "":
        text.pop()
    elif cut_hard and text:
        text.pop()  # the hard cap cut this line short
    pairs = list(parse_grep(text, header))
    host = conn.host.name
    diagnoses = diagnose_numbered(pairs, host=host, catalogue=cat)
    diagnoses = enrich(conn, diagnoses, cat)
    out = RemoteDiagnosis(
        host=host,
        path=path,
        diagnoses=diagnoses,
        bytes_received=res.bytes_received,
        file_size=header.size,
        candidate_lines=len(pairs),
        dropped_lines=header.dropped,
        truncated=bool(header.dropped) or cut_hard,
    )
    if header.dropped:
        each_end = human_bytes(head_bytes, spec="g", units=("MiB", "B"))
        out.notes.append(
            f"{header.dropped} candidate lines in the middle of the log were skipped "
            f"(at most {HEAD_LINES} lines or {each_end} are fetched from each end)"
        )
    if cut_hard:
        out.notes.append("the candidate lines were cut at the output cap; the end may be missing")
    log.info(
        "%s: %s: %d candidate lines of a %s-byte log, %d bytes moved (%.3f%%), %d dropped, "
        "%d diagnoses", host, path, len(pairs), header.size, res.bytes_received,
        100.0 * res.bytes_received / header.size if header.size else 0.0, header.dropped,
        len(diagnoses),
    )  # fmt: skip
    return out


_SS = "ss -H -ltnp {{filter}} 2>/dev/null || true"
_SS_USER = re.compile(r'users:\(\("(?P<comm>[^"]+)",pid=(?P<pid>\d+)')


def port_holder(conn: Runner, port: str) -> tuple[str, str] | None:
    """(command, pid) of the process listening on ``port`` on the host, when visible."""
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        return None
    try:
        res = conn.run(shell.sh(shell.script(_SS, filter=f"sport = :{int(port)}")), timeout=20.0)
    except OperationFailed:
        return None
    m = _SS_USER.search(res.stdout)
    return (m.group("comm"), m.group("pid")) if m else None


def enrich(
    conn: Runner, diagnoses: list[Diagnosis], catalogue: CompiledCatalogue | None = None
) -> list[Diagnosis]:
    """Add what only the live host can tell (the process holding a port in use)."""
    out: list[Diagnosis] = []
    for d in diagnoses:
        if d.id == "port-in-use" and d.values.get("port"):
            holder = port_holder(conn, d.values["port"])
            if holder is not None:
                d = with_values(
                    d, catalogue, holder=f"{holder[0]} (pid {holder[1]})", holder_pid=holder[1]
                )
        out.append(d)
    return out


def follow_resumable(
    session: Session,
    host: HostSpec,
    path: str,
    *,
    lines: int = 10,
    catalogue: CompiledCatalogue | None = None,
    tick: float = 1.0,
) -> Generator[tuple[int, str, list[Diagnosis]], None, None]:
    """``fleet logs --follow``: yield (line number, text, diagnoses that became new with
    it), surviving a dropped connection or a restarted host. The last ``lines`` lines of
    one snapshot (and its ``#fleet`` header), then the bytes after that snapshot through
    :class:`fleet.transport.follow.LogFollower`, which reconnects (with backoff, through a
    :class:`~fleet.transport.link.HostLink`) and asks for the byte after the last one it
    received -- no line is lost, repeated or renumbered across a reconnect."""
    from fleet.transport.follow import LogFollower
    from fleet.transport.link import HostLink
    from fleet.transport.runner import split_lines

    link = HostLink(session, host)
    res = link.call("tail", lambda conn: conn.run(tail_command(path, lines), timeout=120.0))
    if res.exit_code in (EXIT_NO_FILE, EXIT_NOT_REGULAR) or not res.ok:
        msg = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else "tail failed"
        raise OperationFailed(
            f"{host.name}: {msg}", hint="check the profile name or --path", code="log-not-found"
        )
    header = Header()
    first = res.stdout_bytes.split(b"\n", 1)[0].decode("utf-8", errors="replace")
    if not parse_header(first, header):
        raise OperationFailed(f"{host.name}: cannot read {path}: no header from the host")
    follower = LogFollower(link, host, path, offset=header.size, tick=tick)
    snapshot = res.stdout_bytes
    if header.open and snapshot.endswith(b"\n"):
        snapshot = snapshot[:-1]  # the newline is cut's, not the file's

    def chunks() -> Iterator[bytes]:
        # one byte stream: a last line of the snapshot without its newline yet is joined
        # with the rest that follows
        yield snapshot
        try:
            yield from follower.chunks()
        finally:
            follower.close()

    yield from follow_lines(split_lines(chunks()), host=host.name, catalogue=catalogue)


def follow_lines(
    stream: Iterable[str], *, host: str | None = None, catalogue: CompiledCatalogue | None = None
) -> Iterator[tuple[int, str, list[Diagnosis]]]:
    """The pure part of :func:`follow_resumable`: ``#fleet`` header, then numbered lines.

    The ranked results are recomputed only when the engine found something new (a rule's
    first match, a new exception): a long run of matching lines costs one computation per
    new finding, not one per line."""
    engine = Engine(catalogue or load_catalogue(), host=host)
    header = Header()
    known: set[tuple[str, str]] = set()
    seen = engine.findings
    started = False
    for raw in stream:
        if not started:
            started = True
            if parse_header(raw, header):
                continue
        n = header.offset + engine.lines_seen + 1
        engine.feed(n, raw)
        fresh: list[Diagnosis] = []
        if engine.findings != seen:
            seen = engine.findings
            for d in engine.results():
                if d.id == "unrecognized-error":
                    key = (d.id, d.evidence[0].text if d.evidence else "")
                else:
                    key = (d.id, "")
                if key not in known:
                    known.add(key)
                    fresh.append(d)
        yield n, raw, fresh
