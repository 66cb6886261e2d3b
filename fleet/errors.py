"""Error types and the exit codes they map to (see README, "Exit codes").

0 success; 1 the operation failed on at least one host (or a diagnosis found a problem);
2 bad input or usage; 3 could not connect or authenticate (including host keys).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


class FleetError(Exception):
    """Base class: a one-line, user-facing message and an exit code."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class UsageError(FleetError):
    """Bad input: broken inventory, unknown host pattern, path outside the tree... (exit 2)."""

    exit_code = EXIT_USAGE


class OperationFailed(FleetError):
    """The operation ran and failed (exit 1)."""

    exit_code = EXIT_FAILED


class ConnectError(FleetError):
    """Could not connect or authenticate to a host (exit 3)."""

    exit_code = EXIT_UNREACHABLE

    def __init__(self, host: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(f"{host}: {message}", hint=hint)
        self.host = host


class HostKeyError(ConnectError):
    """The host's key is unknown or changed; never accepted silently (exit 3)."""
