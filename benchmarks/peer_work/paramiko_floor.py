"""The floor of fleet's own stack: what any client built on it must spend, and no more.

    python paramiko_floor.py HOSTS OUT SCRIPT [ARG...]

The same work as ``ssh_run.sh floor`` (one connection per host, SCRIPT run remotely as
``sh -s -- PY PKG ARG...``, every host at once; OUT/NAME gets the host's output, OUT/NAME.rc
its exit status), but over paramiko in one process instead of one ``ssh`` per host, after
importing the libraries a fleet run imports (click, PyYAML, pydantic with one model that
validates each host's line, paramiko). Nothing else: no inventory, no retries, no facts
parsing, no output. Its control CPU is the least a client on this stack can use for the
work, so it tells which part of fleet's control CPU is fleet's own. HOSTS, FB_USER, FB_KEY
and FB_KNOWN_HOSTS as for ``ssh_run.sh``.
"""

from __future__ import annotations

import os
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor

import click  # noqa: F401  (imported for its cost: fleet's CLI is click)
import yaml  # noqa: F401  (fleet's inventory is YAML)
from pydantic import BaseModel

# paramiko's config module imports Invoke when it is installed (it is, for Fabric), only
# for ``Match exec``; fleet keeps it out (fleet/transport/_paramiko.py), so the floor does.
sys.modules["invoke"] = None  # type: ignore[assignment]
import paramiko  # noqa: E402

del sys.modules["invoke"]


class Host(BaseModel):
    name: str
    address: str
    port: int
    python: str
    pkg: str


def pinned_name(host: Host) -> str:
    return host.address if host.port == 22 else f"[{host.address}]:{host.port}"


def one(
    host: Host,
    key: paramiko.PKey,
    known: paramiko.HostKeys,
    script: bytes,
    args: list[str],
    out: str,
) -> None:
    rc = 255
    with open(os.path.join(out, host.name), "wb") as fh:
        client = paramiko.SSHClient()
        try:
            # the host's pinned keys only (the file is read once, not once per host)
            name = pinned_name(host)
            for keytype, pinned in (known.lookup(name) or {}).items():
                client.get_host_keys().add(name, keytype, pinned)
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            client.connect(
                host.address,
                port=host.port,
                username=os.environ["FB_USER"],
                pkey=key,
                look_for_keys=False,
                allow_agent=False,
                timeout=30,
            )
            words = ["sh", "-s", "--", host.python, host.pkg, *args]
            chan = client.get_transport().open_session()  # type: ignore[union-attr]
            chan.set_combine_stderr(True)
            chan.exec_command(" ".join(shlex.quote(w) for w in words))
            chan.sendall(script)
            chan.shutdown_write()
            while data := chan.recv(65536):
                fh.write(data)
            rc = chan.recv_exit_status()
        except Exception as exc:
            fh.write(f"{type(exc).__name__}: {exc}\n".encode())
        finally:
            client.close()
    with open(os.path.join(out, host.name + ".rc"), "w") as fh:
        fh.write(f"{rc}\n")


def main(argv: list[str]) -> int:
    hosts_file, out, script_file, *args = argv
    fields = list(Host.model_fields)
    with open(hosts_file) as fh:
        lines = [line.split() for line in fh if line.strip()]
    hosts = [Host(**dict(zip(fields, words, strict=True))) for words in lines]
    with open(script_file, "rb") as fh:
        script = fh.read()
    key = paramiko.PKey.from_path(os.environ["FB_KEY"])
    known = paramiko.HostKeys(os.environ["FB_KNOWN_HOSTS"])
    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        for host in hosts:
            pool.submit(one, host, key, known, script, args, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
