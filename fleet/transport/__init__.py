"""SSH transport: one connection per host per run, strict host keys, bounded fan-out.

Vocabulary follows Fabric: a :class:`HostConnection` (or a :class:`LocalRunner`: both are
:class:`Runner`) runs commands and returns a :class:`Result`; :func:`fan_out` maps a
function over hosts (Fabric's ``Group``) and returns one :class:`HostOutcome` per host.
Shell text is built only by :mod:`fleet.transport.shell`.
"""

from fleet.transport import _paramiko  # noqa: F401  (first: paramiko without Invoke)
from fleet.transport.connection import ConnectionLost, ConnectOptions, HostConnection
from fleet.transport.fanout import fan_out, map_hosts
from fleet.transport.outcome import (
    HostOutcome,
    Verdict,
    exit_code,
    hosts_json,
    raise_if_all_bad_input,
)
from fleet.transport.runner import LocalRunner, Result, Runner
from fleet.transport.session import Session

__all__ = [
    "ConnectOptions",
    "ConnectionLost",
    "HostConnection",
    "HostOutcome",
    "LocalRunner",
    "Result",
    "Runner",
    "Session",
    "Verdict",
    "exit_code",
    "fan_out",
    "hosts_json",
    "map_hosts",
    "raise_if_all_bad_input",
]
