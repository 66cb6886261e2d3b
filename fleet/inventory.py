"""The fleet inventory: Ansible-style YAML, pydantic-validated, and host selection.

Pure: reads a file, returns models. Shape (docs/contracts.md)::

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
Every problem is reported as one line ``FILE: key.path: problem`` (exit 2), at load time:
values that could only fail later (an infinite timeout, ``user@`` or ``:port`` inside an
address, ``~nouser`` paths, NUL bytes, names that cannot be a host) are refused here. The
YAML itself is read by :func:`fleet.safeyaml.load_yaml` (bounded depth and aliases, no
duplicate keys), and building the inventory is linear in its size.
"""

from __future__ import annotations

import difflib
import fnmatch
import ipaddress
import os
import re
import stat
import unicodedata
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from fleet.errors import UsageError

ALIASES: dict[str, str] = {
    "ansible_host": "address",
    "ansible_port": "port",
    "ansible_user": "user",
    "ansible_ssh_private_key_file": "ssh_key",
    "ansible_python_interpreter": "python",
}
GROUP_KEYS = ("vars", "hosts", "children")
MAX_INVENTORY_BYTES = 16 * 1024 * 1024
MAX_NAME = 255
"""Longest host or group name, user or address (DNS names stop at 253)."""
MAX_PATH = 4096
MAX_CONNECT_TIMEOUT = 3600.0
PATH_VARS = frozenset({"ssh_key", "known_hosts", "python"})
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
    connect_timeout: float | None = Field(
        default=None, gt=0, le=MAX_CONNECT_TIMEOUT, allow_inf_nan=False
    )

    @field_validator("port", "connect_timeout", mode="before")
    @classmethod
    def _not_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("must be a number, not true/false")
        return value

    @field_validator("address", "user", "ssh_key", "known_hosts", "jump", "python")
    @classmethod
    def _not_blank(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return value
        if not value.strip():
            raise ValueError("must not be empty")
        limit = MAX_PATH if info.field_name in PATH_VARS else MAX_NAME
        problem = text_problem(value, limit)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("address")
    @classmethod
    def _address_form(cls, value: str | None) -> str | None:
        problem = address_problem(value) if value is not None else None
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("user")
    @classmethod
    def _user_form(cls, value: str | None) -> str | None:
        if value is not None and (value.startswith("-") or any(c.isspace() for c in value)):
            raise ValueError("must be a user name (no spaces, not starting with '-')")
        return value

    @field_validator("ssh_key", "known_hosts")
    @classmethod
    def _local_path(cls, value: str | None) -> str | None:
        problem = local_path_problem(value) if value is not None else None
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("python")
    @classmethod
    def _remote_python(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if value.startswith("~") and not value.startswith("~/"):
            raise ValueError(
                "only a leading '~/' is expanded on the host; give the full path (not ~user/...)"
            )
        if value.startswith("-"):
            raise ValueError("must be a path or command name, not an option")
        return value

    @field_validator("jump")
    @classmethod
    def _jump_form(cls, value: str | None) -> str | None:
        match = JUMP_RE.match(value) if value is not None else None
        if value is not None and not match:
            raise ValueError("must be an inventory host name or [user@]host[:port]")
        if match and match["port"] and not 1 <= int(match["port"]) <= 65535:
            raise ValueError("port must be 1-65535")
        return value


def text_problem(value: str, limit: int = MAX_NAME) -> str | None:
    """Why ``value`` cannot be a name, address or path (None when it can): too long,
    or holding control or invisible formatting characters (NUL, newline, bidi marks...)."""
    if len(value) > limit:
        return f"longer than {limit} characters"
    for ch in value:
        if unicodedata.category(ch)[0] == "C" and ch != " ":
            return f"must not contain control characters ({ch!r} found)"
    return None


_LABEL_RE = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")


def address_problem(value: str) -> str | None:
    """Why ``value`` is not a host to connect to: a DNS name (labels of letters, digits,
    ``-`` and ``_``, at most 63 each, 253 in all), an IPv4 address or a bare IPv6 address.
    ``user@``, ``:port`` and ``[...]`` are refused with a pointer to the right variable."""
    if "@" in value:
        return "must not contain 'user@': give the user as the host variable 'user'"
    if value.startswith("["):
        return "give an IPv6 address without brackets, and the port as the host variable 'port'"
    if ":" in value:
        if value.count(":") == 1:
            return "must not contain ':port': give the port as the host variable 'port'"
        try:
            ipaddress.IPv6Address(value.split("%", 1)[0])
        except ValueError:
            return "is not a valid IPv6 address"
        zone = value.partition("%")[2]
        if "%" in value and not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", zone):
            return "has an invalid IPv6 zone"
        return None
    name = value[:-1] if value.endswith(".") else value
    if len(name) > 253:
        return "is longer than 253 characters (the limit of a DNS name)"
    labels = name.split(".")
    if not all(_LABEL_RE.match(label) for label in labels):
        return (
            "is not a host name or IP address (letters, digits, '-', '_' and dots; "
            "each dot-separated part 1-63 characters)"
        )
    return None


def local_path_problem(value: str) -> str | None:
    """Why a local path (``ssh_key``, ``known_hosts``) cannot be used as given."""
    if value.startswith("~"):
        try:
            expanded = str(Path(value).expanduser())
        except RuntimeError:
            user = value[1:].split("/", 1)[0]
            return (
                f"'~{user}' names no local user"
                if user
                else "'~' cannot be expanded (no home directory)"
            )
        if expanded.startswith("~"):
            return "'~' cannot be expanded"
    return None


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
    vars: dict[str, Any] = {}
    """Free variables (Ansible's host vars: ``models_dir``, ``vllm_port``...), merged from
    the host's groups like the others; serve profiles render with them."""

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


def show(value: Any, limit: int = 60) -> str:
    """A name or key as it may appear inside a one-line message: control characters
    escaped, long values shortened."""
    text = value if isinstance(value, str) else repr(value)
    if text.isprintable() and len(text) <= limit:
        return text
    text = text.encode("unicode_escape", "backslashreplace").decode("ascii")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _read_text(p: Path, label: str) -> str:
    """The inventory's text: a regular file, at most MAX_INVENTORY_BYTES, UTF-8."""
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise UsageError(
            f"{label}: inventory file not found (give --inventory PATH or set FLEET_INVENTORY)"
        ) from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{label}: cannot read inventory: {_reason(exc)}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise UsageError(f"{label}: the inventory is {kind} (give a YAML file)")
    if st.st_size > MAX_INVENTORY_BYTES:
        raise UsageError(
            f"{label}: the inventory is larger than {MAX_INVENTORY_BYTES // (1024 * 1024)} MiB"
        )
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise UsageError(f"{label}: the inventory is not a regular file")
            data = os.read(fd, MAX_INVENTORY_BYTES + 1)
        finally:
            os.close(fd)
    except OSError as exc:
        raise UsageError(f"{label}: cannot read inventory: {_reason(exc)}") from None
    if len(data) > MAX_INVENTORY_BYTES:
        raise UsageError(
            f"{label}: the inventory is larger than {MAX_INVENTORY_BYTES // (1024 * 1024)} MiB"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise UsageError(
            f"{label}: the inventory is not UTF-8 text (byte 0x{data[exc.start]:02x} "
            f"on line {line})"
        ) from None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return show(str(exc) or type(exc).__name__, 120)


def load_inventory(path: str | Path) -> Inventory:
    """Read and validate an inventory file; any problem is a one-line UsageError."""
    from fleet.safeyaml import YamlError, load_yaml

    label = show(str(path), 200)
    try:
        p = Path(path).expanduser()
    except RuntimeError as exc:
        raise UsageError(f"{label}: cannot read inventory: {_reason(exc)}") from None
    text = _read_text(p, label)
    try:
        data = load_yaml(text)
    except YamlError as exc:
        raise UsageError(f"{label}: {exc}") from None
    return parse_inventory(data, label)


def parse_inventory(data: Any, label: str = "inventory") -> Inventory:
    """Build an :class:`Inventory` from already-parsed YAML data (pure, linear in its
    size)."""
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
        clash = next((k for k in extras if k in children), None)
        if clash is not None:
            raise UsageError(
                f"{label}: {show(clash)}: group given both at the top level and under all.children"
            )
        all_body["children"] = {**children, **extras}
    builder.walk_group("all", all_body, 0, "all")
    if not builder.host_own:
        raise UsageError(f"{label}: the inventory defines no hosts")
    # One pass over the memberships (never hosts x groups): host -> its groups, in order.
    member_of: dict[str, list[str]] = {name: [] for name in builder.host_own}
    for group, members in builder.groups.items():
        for host in members:
            member_of[host].append(group)
    hosts: dict[str, HostSpec] = {}
    for name in builder.host_own:
        merged: dict[str, Any] = {}
        for layer in builder.layers(name, member_of[name]):
            merged.update(layer)
        if merged.get("address") is None:  # unset, or null: the host name is the address
            problem = address_problem(name)
            if problem:
                raise UsageError(
                    f"{label}: {show(name)}: no address given, and the host name {problem}"
                )
        known = {k: v for k, v in merged.items() if k in HostVars.model_fields and v is not None}
        free = {k: v for k, v in merged.items() if k not in HostVars.model_fields}
        hosts[name] = HostSpec(name=name, groups=tuple(member_of[name]), vars=free, **known)
    _check_jumps(hosts, label)
    order = {name: i for i, name in enumerate(hosts)}
    groups = {g: sorted(members, key=order.__getitem__) for g, members in builder.groups.items()}
    return Inventory(path=label, hosts=hosts, groups=groups)


def _check_jumps(hosts: dict[str, HostSpec], label: str) -> None:
    """A bastion chain through inventory hosts must end (a -> b -> a is refused), and a
    bastion outside the inventory must be a host to connect to. Each host is walked once:
    linear in the number of hosts."""
    ends: set[str] = set()  # hosts whose chain is known to end
    for start in hosts:
        chain: list[str] = []
        on_chain: set[str] = set()
        current: str | None = start
        while current is not None and current in hosts and current not in ends:
            if current in on_chain:
                loop = " -> ".join([*chain[chain.index(current) :], current])
                raise UsageError(f"{label}: {show(start)}.jump: bastion loop {show(loop, 200)}")
            chain.append(current)
            on_chain.add(current)
            current = hosts[current].jump
        if current is not None and current not in hosts:
            _check_outside_jump(hosts[chain[-1]] if chain else hosts[start], current, label)
        ends.update(chain)


def _check_outside_jump(host: HostSpec, jump: str, label: str) -> None:
    match = JUMP_RE.match(jump)
    if match is None:  # already refused by HostVars; kept for parse_inventory callers
        raise UsageError(f"{label}: {show(host.name)}.jump: not [user@]host[:port]")
    target = match["host"]
    target = target[1:-1] if target.startswith("[") else target
    problem = address_problem(target)
    if problem:
        raise UsageError(f"{label}: {show(host.name)}.jump: the bastion {problem}")


_FREE_VAR = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")
MAX_FREE_VALUE = 4096


def _is_free_var(name: str) -> bool:
    """A free variable (as Ansible's host vars): a lower-case identifier that is neither an
    Ansible connection name we do not take nor a near-miss of a known variable (those are
    typos: refused with a suggestion)."""
    if not _FREE_VAR.match(name) or name.startswith("ansible_"):
        return False
    known = list(HostVars.model_fields) + list(ALIASES)
    return not difflib.get_close_matches(name, known, n=1, cutoff=0.8)


def _free_value(value: Any, fail: Any) -> Any:
    """A free variable's value: a scalar or a list of scalars, bounded, no NUL."""
    items = value if isinstance(value, list) else [value]
    if isinstance(value, list) and len(value) > 256:
        raise fail("a list of more than 256 items")
    for item in items:
        if item is not None and not isinstance(item, str | int | float | bool):
            raise fail("a free variable holds a string, a number, a boolean or a list of them")
        if isinstance(item, str) and (len(item) > MAX_FREE_VALUE or "\0" in item):
            raise fail(f"a string longer than {MAX_FREE_VALUE} characters or with a NUL")
    return value


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

    def layers(self, host: str, member_of: list[str]) -> list[dict[str, Any]]:
        """Var layers of ``host`` (a member of ``member_of``), lowest precedence first."""
        ordered = sorted(member_of, key=lambda g: (self.group_depth[g], g))
        return [*(self.group_vars[g] for g in ordered), self.host_own[host]]

    def fail(self, where: str, problem: str) -> UsageError:
        return UsageError(f"{self.label}: {where}: {problem}")

    def name(self, raw: Any, where: str, what: str) -> str:
        """A host or group name from a mapping key: a string (or an integer, as YAML
        reads ``123:``), printable, without spaces, at most MAX_NAME characters."""
        if isinstance(raw, bool) or not isinstance(raw, str | int):
            raise self.fail(f"{where}.{show(raw)}", f"a {what} name must be a string (quote it)")
        name = str(raw)
        problem = text_problem(name, MAX_NAME)
        if problem is None and (not name.strip() or any(c.isspace() for c in name)):
            problem = "must not be empty or contain spaces"
        if problem:
            raise self.fail(f"{where}.{show(name)}", f"bad {what} name: {problem}")
        return name

    def walk_group(self, name: str, body: Any, depth: int, where: str) -> set[str]:
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise self.fail(where, "a group must be a mapping with vars/hosts/children")
        for key in body:
            if key not in GROUP_KEYS:
                shown = show(key)
                close = difflib.get_close_matches(shown, GROUP_KEYS, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise self.fail(
                    f"{where}.{shown}", f"unknown key; a group holds vars, hosts, children{hint}"
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
            host_name = self.name(host, f"{where}.hosts", "host")
            own = self.vars(hvars, f"{where}.hosts.{host_name}")
            self.host_own.setdefault(host_name, {}).update(own)
            members.add(host_name)
        children = body.get("children") or {}
        if not isinstance(children, dict):
            raise self.fail(f"{where}.children", "must be a mapping of group name to group")
        for child, child_body in children.items():
            child_name = self.name(child, f"{where}.children", "group")
            members |= self.walk_group(
                child_name, child_body, depth + 1, f"{where}.children.{child_name}"
            )
        self.groups.setdefault(name, set()).update(members)
        return members

    def vars(self, raw: Any, where: str) -> dict[str, Any]:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            raise self.fail(where, "must be a mapping of variable names to values")
        renamed: dict[str, Any] = {}
        free: dict[str, Any] = {}
        for key, value in raw.items():
            if not isinstance(key, str):
                raise self.fail(f"{where}.{show(key)}", "unknown host variable")
            canonical = ALIASES.get(key, key)
            if canonical in renamed:
                raise self.fail(
                    f"{where}.{show(key)}", f"given twice (as '{canonical}' and an alias)"
                )
            if canonical not in HostVars.model_fields and _is_free_var(canonical):
                at = f"{where}.{key}"
                free[canonical] = _free_value(value, lambda p, at=at: self.fail(at, p))
                continue
            renamed[canonical] = value
        try:
            model = HostVars.model_validate(renamed)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(show(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                known = list(HostVars.model_fields) + list(ALIASES)
                close = difflib.get_close_matches(loc, known, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise self.fail(f"{where}.{loc}", f"unknown host variable{hint}") from None
            raise self.fail(f"{where}.{loc}", show(err["msg"], 200)) from None
        return {**model.model_dump(exclude_unset=True), **free}
