"""Process records: pid + start time, so a recycled pid is never signalled."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fleet.sandbox.local import generate_keypair, reserved_ports, write_text_atomic
from fleet.sandbox.procs import ProcessRecord, descendants, start_token, stop_tree

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def test_start_token_of_self_is_stable_and_of_nothing_is_none() -> None:
    token = start_token(os.getpid())
    assert token is not None
    assert start_token(os.getpid()) == token
    assert start_token(0) is None
    assert start_token(2**22 + 12345) is None


def test_record_round_trips_and_detects_a_different_process() -> None:
    proc = subprocess.Popen(SLEEPER)
    try:
        record = ProcessRecord.of(proc.pid)
        assert record is not None and record.alive()
        assert ProcessRecord.from_json(record.to_json()) == record
        impostor = ProcessRecord(proc.pid, "not-its-start-time")
        assert not impostor.alive()
        assert impostor.signal(9) is False
        assert proc.poll() is None  # nothing was sent
    finally:
        proc.kill()
        proc.wait()
    assert not record.alive()
    assert ProcessRecord.from_json("{}") is None
    assert ProcessRecord.from_json("garbage") is None


def test_stop_tree_stops_a_process_and_its_children() -> None:
    script = (
        "import subprocess, sys, time\n"
        f"kids = [subprocess.Popen({SLEEPER!r}) for _ in range(2)]\n"
        "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        kids = [int(p) for p in parent.stdout.readline().split()]
        assert sorted(descendants(parent.pid)) == sorted(kids)
        kid_records = [ProcessRecord.of(k) for k in kids]
        record = ProcessRecord.of(parent.pid)
        assert record is not None
        stopped = stop_tree(record, timeout=5)
        assert sorted(stopped) == sorted([parent.pid, *kids])
        assert parent.wait(timeout=5) is not None
        for kid in kid_records:
            assert kid is not None and not kid.alive()
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_stop_tree_escalates_to_sigkill() -> None:
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\ntime.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert stubborn.stdout is not None
    assert stubborn.stdout.readline().strip() == "ready"
    record = ProcessRecord.of(stubborn.pid)
    assert record is not None
    assert stop_tree(record, timeout=0.3) == [stubborn.pid]
    assert not record.alive()  # SIGTERM was ignored; SIGKILL followed
    stubborn.wait(timeout=5)


def test_stop_tree_of_a_dead_record_does_nothing() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    record = ProcessRecord.of(proc.pid)
    proc.wait()
    if record is not None:
        assert stop_tree(record) == []


def test_reserved_ports_are_distinct_and_bindable() -> None:
    with reserved_ports("127.0.0.1", 5) as ports:
        assert len(set(ports)) == 5
    import socket

    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_keypair_is_openssh_ed25519_with_private_mode_0600(tmp_path: Path) -> None:
    public = generate_keypair(tmp_path / "k" / "id_ed25519", "a comment")
    assert public.startswith("ssh-ed25519 AAAA") and public.endswith(" a comment")
    private = tmp_path / "k" / "id_ed25519"
    assert private.read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert (private.stat().st_mode & 0o777) == 0o600
    assert (tmp_path / "k" / "id_ed25519.pub").read_text().strip() == public
    # a second key is a different key
    assert generate_keypair(tmp_path / "k2", "x").split()[1] != public.split()[1]
    res = subprocess.run(
        ["ssh-keygen", "-y", "-f", str(private)], capture_output=True, text=True, check=False
    )
    if res.returncode == 0:  # OpenSSH agrees on the public half
        assert res.stdout.split()[:2] == public.split()[:2]


def test_atomic_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "dir" / "file"
    write_text_atomic(target, "one\n", mode=0o600)
    write_text_atomic(target, "two\n", mode=0o600)
    assert target.read_text() == "two\n"
    assert (target.stat().st_mode & 0o777) == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["file"]
