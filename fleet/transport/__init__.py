"""SSH transport: one connection per host per run, strict host keys, bounded fan-out.

Vocabulary follows Fabric: a :class:`HostConnection` runs commands and returns a
:class:`Result`; :func:`fan_out` maps a function over hosts (Fabric's ``Group``)."""

from fleet.transport.connection import (
    ConnectionLost,
    ConnectOptions,
    HostConnection,
    Result,
    to_command,
)
from fleet.transport.fanout import HostOutcome, exit_code, fan_out
from fleet.transport.session import Session

__all__ = [
    "ConnectOptions",
    "ConnectionLost",
    "HostConnection",
    "HostOutcome",
    "Result",
    "Session",
    "exit_code",
    "fan_out",
    "to_command",
]
