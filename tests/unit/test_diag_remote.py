"""The remote log commands (fleet.diagnosis.remote), run HERE by real shells on real files.

A ``LocalConnection`` runs each command the way a host's login shell would (``<shell> -c
COMMAND``), so the byte caps, the one-snapshot line numbering and the ``sh -c`` wrapping
are checked on the real ``grep``/``awk``/``tail``; nothing of the code under test is mocked.
"""

# ruff: noqa: E501  (real vLLM messages are long lines)

from __future__ import annotations

import os
import select
import shlex
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fleet.diagnosis import Engine
from fleet.diagnosis import remote as R
from fleet.transport import Result

OOM = (
    "(EngineCore_DP0 pid=7) ERROR 11-02 10:15:01 [core.py:708] torch.OutOfMemoryError: CUDA out "
    "of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
    "1.00 GiB is free."
)
KV = (
    "(EngineCore_DP0 pid=7) ERROR 11-02 10:15:01 [core.py:708] ValueError: No available memory "
    "for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine."
)
INFO = "(APIServer pid=1) INFO 11-02 10:14:01 [api_server.py:1] line {n}"


@dataclass
class _Host:
    name: str = "local"
    python: str = "python3"


@dataclass
class LocalConnection:
    """Runs commands as ``<shell> -c COMMAND`` (what sshd does with the login shell)."""

    shell: str = "sh"
    env: dict[str, str] | None = None
    host: _Host = field(default_factory=_Host)
    commands: list[str] = field(default_factory=list)

    def run(self, command: str, *, stdin: bytes | None = None, timeout: float | None = None) -> Result:
        self.commands.append(command)
        proc = subprocess.run([self.shell, "-c", command], input=stdin, capture_output=True,
                              env=self.env, timeout=timeout)
        return Result(self.host.name, command, proc.returncode, proc.stdout, proc.stderr, 0.0,
                      bytes_received=len(proc.stdout) + len(proc.stderr))


def shells() -> list[str]:
    return [s for s in ("sh", "bash", "dash", "fish", "tcsh", "csh", "zsh") if shutil.which(s)]


# --------------------------------------------------------------------------- sh -c (7)


def test_every_remote_command_is_one_sh_word(tmp_path: Path) -> None:
    log = tmp_path / "v.log"
    commands = [
        R.grep_command(str(log)),
        R.grep_command(str(log), tail=5),
        R.tail_command(str(log), 5),
        R.follow_command(str(log), 5),
        R.grep_command("~/.fleet/run/p/vllm.log"),
    ]
    for cmd in commands:
        assert "\n" not in cmd
        words = shlex.split(cmd)
        assert words[:2] == ["sh", "-c"] and len(words) == 3, cmd
        assert "$((" in words[2] or "awk" in words[2] or "exec" in words[2]


def test_port_holder_runs_under_sh() -> None:
    conn = LocalConnection()
    R.port_holder(conn, "8000")  # type: ignore[arg-type]
    assert conn.commands and shlex.split(conn.commands[0])[:2] == ["sh", "-c"]


@pytest.mark.parametrize("shell", shells())
def test_grep_and_tail_commands_under_any_login_shell(shell: str, tmp_path: Path) -> None:
    """The same answer whatever the login shell is (fish and csh cannot run ``$((..))``,
    ``2>/dev/null`` or ``if ...; then`` themselves)."""
    log = tmp_path / "it's a \"log\" $x.log"
    lines = [INFO.format(n=n) for n in range(1, 40)] + [KV]
    log.write_text("\n".join(lines) + "\n")
    conn = LocalConnection(shell=shell)
    result = R.diagnose_remote(conn, str(log), tail=10)  # type: ignore[arg-type]
    assert [d.id for d in result.diagnoses][:1] == ["kv-cache-no-memory"]
    assert result.diagnoses[0].evidence[0].line == 40
    assert result.file_size == log.stat().st_size
    res = conn.run(R.tail_command(str(log), 3))
    header = R.Header()
    numbered = list(R.parse_numbered(res.stdout.splitlines(), header))
    assert numbered == [(n, lines[n - 1]) for n in (38, 39, 40)]


# --------------------------------------------------------------------------- byte cap (4)


def _all_candidates(path: Path, count: int) -> list[str]:
    """``count`` lines that all match the prefilter (and a rule); the last one differs."""
    lines = [f"{OOM} #{n}" for n in range(1, count)] + [KV]
    path.write_text("\n".join(lines) + "\n")
    return lines


def test_every_line_a_candidate_is_capped_in_bytes(tmp_path: Path) -> None:
    log = tmp_path / "all.log"
    lines = _all_candidates(log, 60_000)  # ~11 MiB, every line matches the prefilter
    size = log.stat().st_size
    conn = LocalConnection()
    cap = 32 * 1024
    result = R.diagnose_remote(conn, str(log), head_bytes=cap, tail_bytes=cap)  # type: ignore[arg-type]
    assert result.bytes_received < 0.01 * size
    assert result.truncated and result.dropped_lines > 0
    assert any("skipped" in note for note in result.notes)
    # both ends are kept, with their real line numbers
    found = {d.id: d for d in result.diagnoses}
    assert found["cuda-oom"].evidence[0].line == 1
    assert found["kv-cache-no-memory"].evidence[0].line == len(lines)


def test_default_cap_bounds_the_output(tmp_path: Path) -> None:
    log = tmp_path / "all.log"
    _all_candidates(log, 60_000)
    size = log.stat().st_size
    assert size > 2 * R.output_cap()
    res = LocalConnection().run(R.grep_command(str(log)))
    assert res.ok, res.stderr
    assert len(res.stdout_bytes) <= R.output_cap() + 200
    header = R.Header()
    pairs = list(R.parse_grep(res.stdout.splitlines(), header))
    assert header.dropped > 0
    assert pairs[0][0] == 1 and pairs[-1] == (60_000, KV)


# --------------------------------------------------------------------------- one snapshot (5)


def _growing_wc(bin_dir: Path, log: Path) -> dict[str, str]:
    """A ``wc`` that appends 5 lines to ``log`` after each run: the log grows between the
    commands of one remote script, as a live vLLM log does."""
    bin_dir.mkdir()
    real = shutil.which("wc")
    assert real
    wc = bin_dir / "wc"
    wc.write_text(
        f"#!/bin/sh\n{real} \"$@\"\nrc=$?\n"
        f"for i in 1 2 3 4 5; do echo \"grown $i\" >> {shlex.quote(str(log))}; done\nexit $rc\n"
    )
    wc.chmod(wc.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(log.parent)}


def test_tail_numbers_come_from_one_snapshot(tmp_path: Path) -> None:
    log = tmp_path / "live.log"
    log.write_text("".join(INFO.format(n=n) + "\n" for n in range(1, 21)) + KV + "\n")
    conn = LocalConnection(env=_growing_wc(tmp_path / "bin", log))
    res = conn.run(R.tail_command(str(log), 4))
    assert res.ok, res.stderr
    numbered = list(R.parse_numbered(res.stdout.splitlines(), R.Header()))
    final = log.read_text().splitlines()
    assert len(final) > 21  # it did grow meanwhile
    assert [n for n, _ in numbered] == [18, 19, 20, 21]
    for n, text in numbered:
        assert final[n - 1] == text


def test_diagnose_tail_numbers_come_from_one_snapshot(tmp_path: Path) -> None:
    log = tmp_path / "live.log"
    log.write_text("".join(INFO.format(n=n) + "\n" for n in range(1, 21)) + KV + "\n")
    conn = LocalConnection(env=_growing_wc(tmp_path / "bin", log))
    result = R.diagnose_remote(conn, str(log), tail=4)  # type: ignore[arg-type]
    assert len(log.read_text().splitlines()) > 21
    assert result.diagnoses[0].id == "kv-cache-no-memory"
    assert result.diagnoses[0].evidence[0].line == 21


def test_tail_counts_a_last_line_without_newline(tmp_path: Path) -> None:
    log = tmp_path / "partial.log"
    log.write_text("a\nb\nc")
    res = LocalConnection().run(R.tail_command(str(log), 2))
    assert list(R.parse_numbered(res.stdout.splitlines(), R.Header())) == [(2, "b"), (3, "c")]


def test_follow_starts_where_the_snapshot_ends(tmp_path: Path) -> None:
    """``tail -n`` of the snapshot, then ``tail -F`` from the byte after it: the lines
    written meanwhile are neither lost nor shown twice, and numbers stay right."""
    log = tmp_path / "f.log"
    log.write_text("".join(f"l{n}\n" for n in range(1, 11)) + "l11-start")
    env = _growing_wc(tmp_path / "bin", log)
    proc = subprocess.Popen(["sh", "-c", R.follow_command(str(log), 3)], stdout=subprocess.PIPE,
                            env=env)
    data = b""
    try:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + 30
        while data.count(b"\n") < 1 + 3 + 5 and time.monotonic() < deadline:
            if select.select([fd], [], [], 1.0)[0]:  # header, l9-l11, the grown lines
                data += os.read(fd, 65536)
    finally:
        proc.kill()
        proc.wait()
    got = data.decode().split("\n")[:9]
    assert len(got) == 9, got
    header = R.Header()
    numbered = list(R.parse_numbered(got, header))
    final = log.read_text().split("\n")
    for n, text in numbered:
        assert final[n - 1] == text, (n, text)
    assert numbered[0] == (9, "l9")
    assert numbered[2][1].startswith("l11-start")


# --------------------------------------------------------------------------- follow cost (6)


@dataclass
class StreamConnection:
    """A connection whose stream is a recorded ``tail -F`` output."""

    lines: list[str]
    host: _Host = field(default_factory=_Host)

    def stream(self, command: str, timeout: float | None = None) -> Iterator[str]:
        return iter(self.lines)


def test_follow_recomputes_results_only_for_new_findings(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"n": 0}
    original = Engine.results

    def counting(self: Engine) -> list[R.Diagnosis]:
        calls["n"] += 1
        return original(self)

    monkeypatch.setattr(Engine, "results", counting)
    body = [INFO.format(n=n) for n in range(1, 50)]
    body += [f"{OOM} repeat {n}" for n in range(3000)]  # one finding, 3000 matching lines
    body += [INFO.format(n=n) for n in range(50, 100)] + [KV]
    conn = StreamConnection(["#fleet size=1 offset=100", *body])
    fresh_ids: list[tuple[int, str]] = []
    count = 0
    for n, _text, fresh in R.follow(conn, "x.log"):  # type: ignore[arg-type]
        count += 1
        fresh_ids += [(n, d.id) for d in fresh]
    assert count == len(body)
    assert fresh_ids == [(150, "cuda-oom"), (100 + len(body), "kv-cache-no-memory")]
    assert calls["n"] <= 4  # one per new finding, not one per matching line


def test_follow_of_an_unreadable_file_fails() -> None:
    from fleet.errors import OperationFailed

    with pytest.raises(OperationFailed, match="cannot read"):
        list(R.follow(StreamConnection([]), "x.log"))  # type: ignore[arg-type]
