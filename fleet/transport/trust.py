"""The ``fleet trust`` flow: fetch each host's key (without logging in), compare it with
the pinned keys and, with ``accept_new``, pin keys seen for the first time.

OpenSSH's ``StrictHostKeyChecking=accept-new`` rules: a changed key is never replaced. A
host whose key is unknown (and not accepted) or changed ends ``unreachable`` (exit 3) with
code ``host-key-unknown``/``host-key-changed``, exactly as connecting to it would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleet.transport.connection import scan_host_key
from fleet.transport.hostkeys import TrustStatus, check_key, pin_key
from fleet.transport.outcome import Verdict

if TYPE_CHECKING:
    from fleet.inventory import HostSpec
    from fleet.transport.session import Session


@dataclass(frozen=True)
class TrustReport:
    """One host's key: its status, where it is (to be) pinned, both fingerprints."""

    host: str
    status: TrustStatus
    name: str
    key_type: str
    fingerprint: str
    pinned_fingerprint: str | None
    known_hosts: str

    def verdict(self) -> Verdict:
        if self.status == "unknown":
            return Verdict(
                "unreachable",
                "host-key-unknown",
                f"host key {self.key_type} {self.fingerprint} is not pinned",
                "check the fingerprint, then run trust again with --accept-new",
            )
        if self.status == "changed":
            return Verdict(
                "unreachable",
                "host-key-changed",
                f"HOST KEY CHANGED (pinned {self.pinned_fingerprint}, offered "
                f"{self.fingerprint}); not replaced",
                f"if the host was reinstalled, delete its line for {self.name} from "
                f"{self.known_hosts} and run trust again",
            )
        return Verdict("changed" if self.status == "added" else "ok")

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "name": self.name,
            "key_type": self.key_type,
            "fingerprint": self.fingerprint,
            "pinned_fingerprint": self.pinned_fingerprint,
            "known_hosts": self.known_hosts,
        }


def trust_host(session: Session, spec: HostSpec, *, accept_new: bool) -> TrustReport:
    """Fetch, check and (with ``accept_new``) pin one host's key."""
    name, key = scan_host_key(spec, session.options, session.gateway_for(spec))
    path = spec.known_hosts_path()
    check = check_key(path, name, key)
    status: TrustStatus = check.status
    if status == "unknown" and accept_new:
        pin_key(path, name, key)
        status = "added"
    return TrustReport(
        host=spec.name,
        status=status,
        name=name,
        key_type=check.key_type,
        fingerprint=check.fingerprint,
        pinned_fingerprint=check.pinned_fingerprint,
        known_hosts=str(path),
    )
