"""The fleet inventory: Ansible-style YAML, pydantic-validated, and host selection.

Pure: reads a file, returns models. Shape (see DESIGN.md)::

    all:
      vars: {user: root, ssh_key: ~/.ssh/id_ed25519, python: /root/ml-env/bin/python}
      children:
        blackwell:
          vars: {...}
          hosts:
            b200-01: {address: 10.0.0.11}
            b200-02: {address: 10.0.0.12, port: 2222}

Group ``vars`` inherit downward (a child group's vars beat its parent's, host vars beat
group vars). The Ansible names ``ansible_host``, ``ansible_port``, ``ansible_user``,
``ansible_ssh_private_key_file`` and ``ansible_python_interpreter`` are accepted as aliases.
Every problem is reported as one line ``FILE: key.path: problem`` (exit 2).
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fleet.errors import UsageError

ALIASES: dict[str, str] = {
    "ansible_host": "address",
    "ansible_port": "port",
    "ansible_user": "user",
    "ansible_ssh_private_key_file": "ssh_key",
    "ansible_python_interpreter": "python",
}
GROUP_KEYS = ("vars", "hosts", "children")
# A bastion: an inventory host name, or [user@]host[:port] (IPv6 in brackets).
JUMP_RE = re.compile(
    r"^(?:(?P<user>[^@\s:]+)@)?(?P<host>\[[0-9A-Fa-f:.]+\]|[^:@\s\[\]]+)(?::(?P<port>\d{1,5}))?$"
)


class HostVars(BaseModel):
    """Variables a host may carry (all optional; merged from its groups)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    user: str | None = None
    ssh_key: str | None = None
    known_hosts: str | None = None
    jump: str | None = None
    python: str | None = None
    connect_timeout: float | None = Field(default=None, gt=0)

    @field_validator("address", "user", "ssh_key", "known_hosts", "jump", "python")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("jump")
    @classmethod
    def _jump_form(cls, value: str | None) -> str | None:
        if value is not None and not JUMP_RE.match(value):
            raise ValueError("must be an inventory host name or [user@]host[:port]")
        return value


class HostSpec(BaseModel):
    """One host, with its group variables merged in. Fields left ``None`` fall back to
    ``~/.ssh/config`` and then to OpenSSH's defaults when connecting."""

    model_config = ConfigDict(frozen=True)

    name: str
    address: str | None = None
    port: int | None = None
    user: str | None = None
    ssh_key: str | None = None
    known_hosts: str | None = None
    jump: str | None = None
    python: str = "python3"
    connect_timeout: float | None = None
    groups: tuple[str, ...] = ()

    @property
    def target(self) -> str:
        """The address to connect to (the host name when no address is given)."""
        return self.address or self.name

    def known_hosts_path(self) -> Path:
        return Path(self.known_hosts or "~/.ssh/known_hosts").expanduser()


class Inventory(BaseModel):
    path: str
    hosts: dict[str, HostSpec]
    groups: dict[str, list[str]]

    def select(self, patterns: list[str]) -> list[HostSpec]:
        """Hosts matched by any pattern (host name, group name, glob, ``all``), in
        inventory order. A pattern matching nothing is a usage error (exit 2)."""
        if not patterns:
            raise UsageError("no hosts selected: give --host PATTERN (a host, a group or 'all')")
        chosen: set[str] = set()
        for pattern in patterns:
            matched = self._match(pattern)
            if not matched:
                known = sorted(self.groups) + sorted(self.hosts)
                close = difflib.get_close_matches(pattern, known, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                raise UsageError(f"{self.path}: no host or group matches '{pattern}'{hint}")
            chosen.update(matched)
        return [spec for name, spec in self.hosts.items() if name in chosen]

    def _match(self, pattern: str) -> set[str]:
        if pattern == "all":
            return set(self.hosts)
        if pattern in self.hosts:
            return {pattern}
        if pattern in self.groups:
            return set(self.groups[pattern])
        matched = {h for h in self.hosts if fnmatch.fnmatchcase(h, pattern)}
        for group, members in self.groups.items():
            if fnmatch.fnmatchcase(group, pattern):
                matched.update(members)
        return matched


def load_inventory(path: str | Path) -> Inventory:
    """Read and validate an inventory file; any problem is a one-line UsageError."""
    import yaml

    p = Path(path).expanduser()
    label = str(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(
            f"{label}: inventory file not found (give --inventory PATH or set FLEET_INVENTORY)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{label}: cannot read inventory: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"{label}: invalid YAML{where}: {problem}") from None
    return parse_inventory(data, label)


def parse_inventory(data: Any, label: str = "inventory") -> Inventory:
    """Build an :class:`Inventory` from already-parsed YAML data (pure)."""
    if data is None:
        raise UsageError(f"{label}: inventory is empty (expected a top-level 'all:' group)")
    if not isinstance(data, dict):
        raise UsageError(f"{label}: top level must be a mapping of groups, e.g. 'all:'")
    builder = _Builder(label)
    all_body = data.get("all")
    if all_body is not None and not isinstance(all_body, dict):
        raise UsageError(f"{label}: all: a group must be a mapping with vars/hosts/children")
    all_body = dict(all_body or {})
    # Top-level groups other than 'all' are children of 'all', as in Ansible.
    extras = {k: v for k, v in data.items() if k != "all"}
    if extras:
        children = all_body.get("children") or {}
        if not isinstance(children, dict):
            raise UsageError(f"{label}: all.children: must be a mapping of group name to group")
        all_body["children"] = {**children, **extras}
    builder.walk_group("all", all_body, 0, "all")
    if not builder.host_own:
        raise UsageError(f"{label}: the inventory defines no hosts")
    hosts: dict[str, HostSpec] = {}
    for name in builder.host_own:
        merged: dict[str, Any] = {}
        for layer in builder.layers(name):
            merged.update(layer)
        hosts[name] = HostSpec(
            name=name,
            groups=tuple(g for g, members in builder.groups.items() if name in members),
            **{k: v for k, v in merged.items() if v is not None},
        )
    _check_jump_loops(hosts, label)
    groups = {g: [h for h in hosts if h in members] for g, members in builder.groups.items()}
    return Inventory(path=label, hosts=hosts, groups=groups)


def _check_jump_loops(hosts: dict[str, HostSpec], label: str) -> None:
    """A bastion chain through inventory hosts must end (a -> b -> a is refused)."""
    for start in hosts:
        chain = [start]
        jump = hosts[start].jump
        while jump is not None and jump in hosts:
            if jump in chain:
                loop = " -> ".join([*chain[chain.index(jump) :], jump])
                raise UsageError(f"{label}: {start}.jump: bastion loop {loop}")
            chain.append(jump)
            jump = hosts[jump].jump


class _Builder:
    """Walks the group tree. Precedence follows Ansible: the vars of every group a host
    belongs to (directly or through children), shallow groups first, then the host's own
    vars; so a host var always wins, whichever group lists the host."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.groups: dict[str, set[str]] = {}
        self.group_vars: dict[str, dict[str, Any]] = {}
        self.group_depth: dict[str, int] = {}
        self.host_own: dict[str, dict[str, Any]] = {}

    def layers(self, host: str) -> list[dict[str, Any]]:
        """Var layers of ``host``, lowest precedence first."""
        member_of = [g for g, members in self.groups.items() if host in members]
        member_of.sort(key=lambda g: (self.group_depth[g], g))
        return [*(self.group_vars[g] for g in member_of), self.host_own[host]]

    def fail(self, where: str, problem: str) -> UsageError:
        return UsageError(f"{self.label}: {where}: {problem}")

    def walk_group(self, name: str, body: Any, depth: int, where: str) -> set[str]:
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise self.fail(where, "a group must be a mapping with vars/hosts/children")
        for key in body:
            if key not in GROUP_KEYS:
                close = difflib.get_close_matches(str(key), GROUP_KEYS, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise self.fail(
                    f"{where}.{key}", f"unknown key; a group holds vars, hosts, children{hint}"
                )
        own_vars = self.vars(body.get("vars"), f"{where}.vars")
        self.group_vars.setdefault(name, {}).update(own_vars)
        # As in Ansible, a group listed at several depths counts at its deepest.
        self.group_depth[name] = max(depth, self.group_depth.get(name, depth))
        members: set[str] = set()
        hosts = body.get("hosts") or {}
        if not isinstance(hosts, dict):
            raise self.fail(f"{where}.hosts", "must be a mapping of host name to variables")
        for host, hvars in hosts.items():
            host_name = str(host)
            own = self.vars(hvars, f"{where}.hosts.{host_name}")
            self.host_own.setdefault(host_name, {}).update(own)
            members.add(host_name)
        children = body.get("children") or {}
        if not isinstance(children, dict):
            raise self.fail(f"{where}.children", "must be a mapping of group name to group")
        for child, child_body in children.items():
            members |= self.walk_group(
                str(child), child_body, depth + 1, f"{where}.children.{child}"
            )
        self.groups.setdefault(name, set()).update(members)
        return members

    def vars(self, raw: Any, where: str) -> dict[str, Any]:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            raise self.fail(where, "must be a mapping of variable names to values")
        renamed: dict[str, Any] = {}
        for key, value in raw.items():
            canonical = ALIASES.get(str(key), str(key))
            if canonical in renamed:
                raise self.fail(f"{where}.{key}", f"given twice (as '{canonical}' and an alias)")
            renamed[canonical] = value
        try:
            model = HostVars.model_validate(renamed)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                known = list(HostVars.model_fields) + list(ALIASES)
                close = difflib.get_close_matches(loc, known, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise self.fail(f"{where}.{loc}", f"unknown host variable{hint}") from None
            raise self.fail(f"{where}.{loc}", err["msg"]) from None
        return model.model_dump(exclude_unset=True)
