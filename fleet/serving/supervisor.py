"""The supervisor seam of ``fleet serve`` (control side, pure): which supervisor runs a
profile's server on a host, and the files it needs.

A profile says ``supervisor: auto | supervisord | systemd``. The host's preflight answer
says what each backend can do there (``fleet/onhost/supervisors.py`` ``describe``): systemd
when the host was booted with it (PID 1), ``systemctl`` answers and fleet logs in as root;
supervisord always (fleet installs its own from the wheel it pushes). ``auto`` takes
systemd where it is usable, else supervisord. The on-host half of each backend starts,
asks and stops the program (``fleet/onhost/supervisors.py``); this half renders what it
writes (:func:`files`). To add a backend: a class there with ``describe``, ``prepare``,
``start``, ``state`` and ``stop`` (states in supervisord's words), its files here, and a
test on a host that really runs it (CONTRIBUTING.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from fleet.serving import units

if TYPE_CHECKING:
    from fleet.serving.multinode import Node
    from fleet.serving.observed import SupervisorSeen
    from fleet.serving.profile import Profile

SupervisorName = Literal["supervisord", "systemd"]  # the on-host classes: supervisors.BACKENDS


@dataclass(frozen=True)
class Choice:
    """The backend chosen for a host, or why the one the profile names cannot run."""

    backend: SupervisorName | None
    reason: str

    @property
    def ok(self) -> bool:
        return self.backend is not None


def choose(wanted: str, offered: Mapping[str, SupervisorSeen]) -> Choice:
    """``wanted`` (the profile's ``supervisor``) against what the host offers."""
    systemd = offered.get("systemd")
    usable = bool(systemd and systemd.usable)
    why_not = (systemd.why if systemd else None) or "not usable"
    if wanted == "systemd":
        if usable:
            return Choice("systemd", "the profile asks for systemd")
        return Choice(None, f"the profile asks for systemd, but {why_not}")
    if wanted == "supervisord":
        return Choice("supervisord", "the profile asks for supervisord")
    if usable:
        return Choice("systemd", "auto: the host runs systemd and fleet logs in as root")
    return Choice("supervisord", f"auto: supervisord, as systemd cannot ({why_not})")


def files(
    backend: SupervisorName,
    profile: Profile,
    layout: units.Layout,
    *,
    python: str,
    secrets: str,
    node: Node | None = None,
    argv: list[str] | None = None,
) -> dict[str, str]:
    """What the backend writes on the host, by the name the on-host script knows
    (``node``: this host's part of a server across hosts; ``argv``: a program other than
    vLLM, the Ray node of such a server)."""
    out = {"secrets.env": secrets}
    if backend == "systemd":
        out["launch.sh"] = units.launch_script(profile, layout, python=python, node=node,
                                               argv=argv)  # fmt: skip
        out["unit"] = units.systemd_unit(profile, layout)
        return out
    # under supervisord vLLM dies with its supervisor (no unsupervised orphan on the GPUs)
    out["launch.sh"] = units.launch_script(
        profile, layout, python=python, die_with_parent=True, node=node, argv=argv
    )
    out["program.conf"] = units.program_conf(profile, layout)
    out["supervisord.conf"] = units.supervisord_conf(layout)
    return out
