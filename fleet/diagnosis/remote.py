"""Remote logs at scale: filter on the host, fetch only candidate lines.

``fleet logs --host H PROFILE --diagnose`` runs one shell command on the host::

    grep -a -n -E -B3 -A3 -e '<literal1>|<literal2>|...' -- FILE | awk '<cap>'

where the alternation is every prefilter literal of the catalogue (a line no literal occurs
in cannot match any rule), ``-n`` keeps the real line numbers (evidence cites them), and the
context window gives the engine the lines around each hit. Only those lines cross the
network: a healthy multi-GiB log costs a few kilobytes. The command prints a ``#fleet``
header (file size, line offset) first so the caller can report the fraction moved.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fleet.diagnosis.catalogue import CompiledCatalogue, load_catalogue
from fleet.diagnosis.engine import Engine, diagnose_numbered, with_values
from fleet.diagnosis.models import Diagnosis
from fleet.errors import OperationFailed, UsageError

if TYPE_CHECKING:
    from fleet.transport import HostConnection

WINDOW = 3
HEAD_LINES = 100_000  # at most this many output lines from the start of the grep output...
TAIL_LINES = 100_000  # ...and from its end; the middle is dropped (counted in the header)
MAX_LINE_BYTES = 20000  # longer candidate lines are cut on the host (the engine reads 16384)
RUN_DIR = "~/.fleet/run"
EXIT_NO_FILE = 66

_PROFILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")


def profile_log_path(profile: str) -> str:
    """Where a serve profile's vLLM log lives on a host (owned by ``fleet serve`` later)."""
    if not _PROFILE.fullmatch(profile) or ".." in profile:
        raise UsageError(f"invalid profile name {profile!r}")
    return f"{RUN_DIR}/{profile}/vllm.log"


def shell_path(path: str) -> str:
    """Quote a remote path for sh; a leading ``~/`` means the remote user's home."""
    if not path or "\x00" in path or "\n" in path:
        raise UsageError(f"invalid remote path {path!r}")
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    if path.startswith("~"):
        raise UsageError(f"unsupported remote path {path!r} (use ~/... or an absolute path)")
    return shlex.quote(path)


def prefilter_regex(catalogue: CompiledCatalogue | None = None) -> str:
    """One POSIX ERE: the alternation of all prefilter literals."""
    cat = catalogue or load_catalogue()
    return "|".join(cat.prefilter_ere())


def _header(qpath: str, tail: int | None) -> str:
    check = (
        f"f={qpath}; if [ ! -r \"$f\" ]; then echo \"fleet: cannot read $f\" >&2; "
        f"exit {EXIT_NO_FILE}; fi; size=$(wc -c < \"$f\"); "
    )
    if tail is None:
        return check + 'offset=0; echo "#fleet size=$size offset=$offset"; '
    n = int(tail)
    return (
        check + f'total=$(wc -l < "$f"); offset=$((total > {n} ? total - {n} : 0)); '
        'echo "#fleet size=$size offset=$offset"; '
    )


_CAP = (
    "awk -v H={h} -v T={t} '"
    "NR<=H{{print; next}} {{b[NR%T]=$0; n=NR}} "
    'END{{if(n){{s=n-T+1; if(s<=H) s=H+1; if(s>H+1) print "#fleet dropped=" (s-H-1); '
    "for(i=s;i<=n;i++) print b[i%T]}}}}'"
)


def grep_command(
    path: str,
    *,
    tail: int | None = None,
    window: int = WINDOW,
    catalogue: CompiledCatalogue | None = None,
) -> str:
    """The one remote command that returns the candidate lines of ``path`` (numbered)."""
    qpath = shell_path(path)
    ere = shlex.quote(prefilter_regex(catalogue))
    grep = f"LC_ALL=C grep -a -n -E -B{int(window)} -A{int(window)} -e {ere}"
    source = f'tail -n {int(tail)} -- "$f" | {grep}' if tail is not None else f'{grep} -- "$f"'
    cap = _CAP.format(h=HEAD_LINES, t=TAIL_LINES)
    # cut: a pathological multi-GiB line must not cross the network whole
    return _header(qpath, tail) + f"{source} | cut -c1-{MAX_LINE_BYTES} | {cap}"


def tail_command(path: str, lines: int) -> str:
    """Plain ``tail`` with the same header (for showing a log without diagnosing)."""
    qpath = shell_path(path)
    return _header(qpath, lines) + f'tail -n {int(lines)} -- "$f"'


def follow_command(path: str, lines: int) -> str:
    """``tail -F`` from the last ``lines`` lines, with the line offset in the header."""
    qpath = shell_path(path)
    return _header(qpath, lines) + f'exec tail -n {int(lines)} -F -- "$f" 2>/dev/null'


_GREP_LINE = re.compile(r"(\d+)[:-](.*)", re.DOTALL)


@dataclass
class Header:
    size: int = 0
    offset: int = 0
    dropped: int = 0


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


@dataclass
class RemoteDiagnosis:
    host: str
    path: str
    diagnoses: list[Diagnosis]
    bytes_received: int = 0
    file_size: int = 0
    candidate_lines: int = 0
    dropped_lines: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def fraction(self) -> float:
        return self.bytes_received / self.file_size if self.file_size else 0.0


def _missing(conn: HostConnection, path: str, stderr: str) -> OperationFailed:
    msg = stderr.strip().splitlines()[-1] if stderr.strip() else f"cannot read {path}"
    return OperationFailed(f"{conn.host.name}: {msg}", hint="check the profile name or --path")


def diagnose_remote(
    conn: HostConnection,
    path: str,
    *,
    tail: int | None = None,
    catalogue: CompiledCatalogue | None = None,
    timeout: float | None = 600.0,
) -> RemoteDiagnosis:
    """Filter ``path`` on the host, fetch the candidate lines, diagnose them here."""
    cat = catalogue or load_catalogue()
    res = conn.run(grep_command(path, tail=tail, catalogue=cat), timeout=timeout)
    if res.exit_code == EXIT_NO_FILE:
        raise _missing(conn, path, res.stderr)
    if not res.ok:
        raise OperationFailed(
            f"{conn.host.name}: log filter exited {res.exit_code}: {res.stderr.strip()[-300:]}"
        )
    header = Header()
    text = res.stdout.split("\n")
    if text and text[-1] == "":
        text.pop()
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
    )
    if header.dropped:
        out.notes.append(f"{header.dropped} candidate lines in the middle of the log were skipped")
    return out


_SS_USER = re.compile(r'users:\(\("(?P<comm>[^"]+)",pid=(?P<pid>\d+)')


def port_holder(conn: HostConnection, port: str) -> tuple[str, str] | None:
    """(command, pid) of the process listening on ``port`` on the host, when visible."""
    if not port.isdigit():
        return None
    try:
        res = conn.run(
            f"ss -H -ltnp 'sport = :{int(port)}' 2>/dev/null || true", timeout=20.0
        )
    except OperationFailed:
        return None
    m = _SS_USER.search(res.stdout)
    return (m.group("comm"), m.group("pid")) if m else None


def enrich(
    conn: HostConnection, diagnoses: list[Diagnosis], catalogue: CompiledCatalogue | None = None
) -> list[Diagnosis]:
    """Add what only the live host can tell (the process holding a port in use)."""
    out: list[Diagnosis] = []
    for d in diagnoses:
        if d.id == "port-in-use" and d.values.get("port"):
            holder = port_holder(conn, d.values["port"])
            if holder is not None:
                d = with_values(d, catalogue, holder=f"{holder[0]} (pid {holder[1]})",
                                holder_pid=holder[1])
        out.append(d)
    return out


def follow(
    conn: HostConnection,
    path: str,
    *,
    lines: int = 10,
    catalogue: CompiledCatalogue | None = None,
    timeout: float | None = None,
) -> Iterator[tuple[int, str, list[Diagnosis]]]:
    """Stream ``tail -F``; yield (line number, text, diagnoses that became new with it)."""
    cat = catalogue or load_catalogue()
    engine = Engine(cat, host=conn.host.name)
    header = Header()
    known: set[tuple[str, int]] = set()
    seen = 0
    stream = conn.stream(follow_command(path, lines), timeout=timeout)
    started = False
    for raw in stream:
        if not started:
            started = parse_header(raw, header)
            if started:
                continue
            started = True
        n = header.offset + engine.lines_seen + 1
        engine.feed(n, raw)
        fresh: list[Diagnosis] = []
        if engine.candidates != seen:
            seen = engine.candidates
            for d in engine.results():
                key = (d.id, d.evidence[0].line if d.evidence else 0)
                if key not in known:
                    known.add(key)
                    fresh.append(d)
        yield n, raw, fresh
    if not started:
        raise OperationFailed(
            f"{conn.host.name}: cannot read {path}", hint="check the profile name or --path"
        )
