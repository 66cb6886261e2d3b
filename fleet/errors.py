"""Error types, their stable codes, and the exit codes they map to (README, "Exit codes").

0 success; 1 the operation failed on at least one host (or a diagnosis found a problem);
2 bad input or usage; 3 could not connect or authenticate (including host keys).

Every :class:`FleetError` carries a stable kebab-case ``code`` (``host-key-unknown``,
``auth-failed``, ``python-missing``, ``path-escapes-tree``, ``patch-conflict``...): it is
the ``code`` field of a host's ``--json`` entry, and programs should test it rather than
the message. The README lists every code (the table is checked against this module's
:data:`CODES` by a unit test).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130

CODES: dict[str, str] = {
    # usage (exit 2)
    "bad-input": "bad input or usage (the message says which)",
    "inventory-invalid": "the inventory file cannot be read or is invalid",
    "profile-invalid": "a serve profile is invalid or cannot be rendered for a host",
    "path-escapes-tree": "a path resolves outside the vLLM tree on the host",
    "known-hosts-invalid": "the known_hosts path is not a regular file fleet can update",
    # connecting (exit 3)
    "unreachable": "the host cannot be reached",
    "connect-refused": "nothing listens on the host's SSH port",
    "connect-timeout": "connecting timed out",
    "dns-failed": "the host name does not resolve",
    "auth-failed": "SSH authentication failed (user, key)",
    "host-key-unknown": "the host's key is not pinned: check it, then `fleet trust --accept-new`",
    "host-key-changed": "the host's key differs from the pinned one: refused",
    "host-key-revoked": "the host offered a key marked @revoked in known_hosts",
    "connection-lost": "the SSH connection dropped during the command",
    "bastion-failed": "the bastion (jump host) could not be reached",
    # the operation on a host (exit 1)
    "failed": "the operation failed on the host",
    "command-timeout": "a remote command did not finish in time",
    "python-missing": "the host's `python` (inventory) is missing or not executable",
    "vllm-not-found": "no vLLM is installed for the host's `python`",
    "vllm-version-unknown": "the installed vLLM's version cannot be read",
    "path-not-found": "no such file or directory in the vLLM tree",
    "not-a-file": "the path is not a regular file",
    "log-not-found": "the log file cannot be read on the host",
    "patch-conflict": "the patch set does not apply cleanly; nothing was written",
    "patch-write-failed": "writing the patch failed; the originals were restored",
    "host-busy": "another fleet run holds this host's lock",
    "onhost-error": "the on-host script failed or answered something unreadable",
    "bad-request": "the on-host script was sent a request it does not understand (a bug)",
    "vllm-changed": "the host's vLLM changed between reading and writing; run again",
    "refused": "the host refused the request",
    "preflight-failed": "preflight found a problem before anything was started",
    "already-running": "a server for this profile already runs on the host",
    "serve-crashed": "vLLM exited or printed a fatal error while starting",
    "serve-stalled": "vLLM printed nothing new and made no progress for the stall budget",
    "serve-timeout": "vLLM was not ready within the load budget",
    "not-ready": "vLLM answered but a readiness check failed",
    "supervisor-failed": "the supervisor could not be installed, started or asked",
    "supervisor-unavailable": "the profile's supervisor cannot run on the host (e.g. systemd)",
    "ray-cluster-incomplete": "not every node of a Ray group joined the head's cluster in time",
    "internal-error": "a bug in fleet (rerun with -vv and report the traceback)",
}


class FleetError(Exception):
    """Base class: a one-line, user-facing message, a stable code and an exit code."""

    exit_code = EXIT_FAILED
    code = "failed"

    def __init__(self, message: str, *, hint: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class UsageError(FleetError):
    """Bad input: broken inventory, unknown host pattern, path outside the tree... (exit 2)."""

    exit_code = EXIT_USAGE
    code = "bad-input"


class OperationFailed(FleetError):
    """The operation ran and failed (exit 1)."""

    exit_code = EXIT_FAILED
    code = "failed"


class ConnectError(FleetError):
    """Could not connect or authenticate to a host (exit 3)."""

    exit_code = EXIT_UNREACHABLE
    code = "unreachable"

    def __init__(
        self, host: str, message: str, *, hint: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(f"{host}: {message}", hint=hint, code=code)
        self.host = host


class HostKeyError(ConnectError):
    """The host's key is unknown, changed or revoked; never accepted silently (exit 3)."""

    code = "host-key-unknown"
