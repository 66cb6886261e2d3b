"""The OpenSSH client against a sandbox host, as an operator would run it by hand.

Host keys strictly checked against the sandbox's pinned known_hosts (never the user's),
the sandbox's client key only, no prompts: a test that reaches a host this way proves the
host is what fleet's inventory says, independently of fleet's own transport.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from fleet.sandbox.core import Sandbox


def ssh_argv(
    box: Sandbox, name: str, command: str, *, known_hosts: Path | None = None
) -> list[str]:
    """``ssh ... user@address command`` for host ``name`` of ``box``."""
    host = box.host(name)
    return [
        "ssh",
        "-F",
        "/dev/null",
        "-i",
        str(box.client_key_path),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f"UserKnownHostsFile={known_hosts or box.known_hosts_path}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=10",
        "-p",
        str(host.port),
        f"{box.state.user}@{host.address}",
        command,
    ]


def ssh(
    box: Sandbox,
    name: str,
    command: str,
    *,
    timeout: float = 60.0,
    known_hosts: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` on host ``name`` with the OpenSSH client; its completed process."""
    argv = ssh_argv(box, name, command, known_hosts=known_hosts)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
