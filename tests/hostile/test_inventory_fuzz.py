"""Generated and known-bad inventories: loaded, or refused with one line and exit 2.

Three generators, thousands of examples in all:

- structure-aware: inventory-shaped trees (groups, children, hosts, vars, Ansible
  aliases) holding hostile values (control characters, injection payloads, huge numbers,
  ``user@host``, ``ip:port``, ``~nouser``, non-string keys...), written as YAML and then
  spliced with YAML-level abuse (anchors and aliases, alias bombs, tags, deep nesting,
  duplicate keys, bad escapes);
- mutations: bytes of a valid inventory flipped, cut and repeated;
- raw bytes.

Each example goes through :func:`fleet.inventory.load_inventory` (time-bounded) and, every
few examples, through the CLI (``fleet hosts`` and ``fleet hosts --json``). A loaded
inventory must never fail later on its values (paths expand, timeouts are finite,
targets are hosts), a refused one must be one line naming the file.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hostile_support import SCALE, Hung, Tally, one_line_error, run_fleet, within
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.errors import UsageError
from fleet.inventory import Inventory, address_problem, load_inventory

HANG_SECONDS = 10.0  # far above any sane load (ms); a hang, not a timing test
CLI_EVERY = 8

PAYLOADS = [
    "$(touch {canary})",
    "`touch {canary}`",
    "x; touch {canary}",
    "a\nb",
    "a\x00b",
    "\x1b[31mred\x1b[0m",
    "-oProxyCommand=touch {canary}",
    "root@10.0.0.1",
    "10.0.0.1:2222",
    "[::1]:22",
    "::1",
    "fe80::1%eth0",
    "~nouser/.ssh/id",
    "~/.ssh/id_ed25519",
    "",
    "   ",
    "a" * 300,
    "a..b",
    "-leading",
    "ünïcödé",
    "\u202eevil",
    "*",
    "all",
    "None",
]
VAR_NAMES = [
    "address",
    "port",
    "user",
    "ssh_key",
    "known_hosts",
    "jump",
    "python",
    "connect_timeout",
    "ansible_host",
    "ansible_port",
    "ansible_user",
    "ansible_ssh_private_key_file",
    "ansible_python_interpreter",
    "adress",
]
# Whole-document abuse, added at the top level.
DOC_SPLICES = [
    "x: &a [*a]\n",
    "a: &a\n  b: *a\n",
    "b0: &b0 [x, x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"b{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 10)}]\n" for i in range(1, 8)),
    "deep: " + "[" * 400 + "]" * 400 + "\n",
    "deep: " + "{a: " * 300 + "1" + "}" * 300 + "\n",
    "t: 1\nt: 2\n",
    "<<: *nowhere\n",
    "? [a, b]\n: x\n",
    "\t- tab\n",
    "%YAML 1.1\n---\n",
    "--- a\n--- b\n",
    "t: &x 1\nu: &x 2\n",
]
# Abuse in the place of one value: each replaces a SPLICE marker in the written YAML.
SPLICE = "__fleet_splice__"
VALUE_SPLICES = [
    "!!int 0b2",
    "!!bool maybe",
    "!!timestamp 2001-02-30",
    "2001-02-30",
    "2001-02-03T04:05:06Z",
    "!!float abc",
    "!!binary AAAA",
    "!custom x",
    "!!python/name:os.system",
    "9" * 5000,
    "-" + "9" * 70,
    '"\\ud800"',
    '"a\\0b"',
    '"\\x1b[2J"',
    "[" * 200 + "]" * 200,
    "&r [*r]",
    "*undefined",
    "{a: 1, a: 2}",
    ".inf",
    "-.inf",
    ".nan",
    "0x1F",
    "0o17",
    "1_000",
    "1:30",
    "190:20:30.15",
    "~",
    "!!str 22",
    "1e400",
    "yes",
    "Off",
    "[a, b]",
    "{}",
    '"$(touch {canary})"',
]


def _plausible() -> st.SearchStrategy[Any]:
    return st.sampled_from(
        ["10.0.0.1", "host-1", "root", "/usr/bin/python3", "~/.ssh/id", 22, 2222, 1.5, 30]
    )


def _hostile() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from(PAYLOADS),
        st.text(max_size=40),
        st.integers(min_value=-(10**30), max_value=10**30),
        st.floats(allow_nan=True, allow_infinity=True),
        st.booleans(),
        st.none(),
        st.just(SPLICE),
    )


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One of ``choices``, picked with the given weights (``one_of`` alone favours some
    branches heavily; hostile values should spice plausible inventories, not drown them)."""
    slots = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.sampled_from(range(len(slots))).flatmap(lambda i: slots[i])


def _scalar() -> st.SearchStrategy[Any]:
    return weighted((3, _plausible()), (1, _hostile()))


GOOD_VALUES: dict[str, list[Any]] = {
    "address": ["10.0.0.1", "gpu-01.example", "::1", "192.0.2.7"],
    "port": [22, 2222, "2200", 65535],
    "user": ["root", "ops", "svc_vllm"],
    "ssh_key": ["~/.ssh/id_ed25519", "/keys/k"],
    "known_hosts": ["~/.ssh/known_hosts", "/etc/fleet/known_hosts"],
    "jump": ["bastion", "ops@jump.example:2222", "[2001:db8::1]:22"],
    "python": ["/opt/env/bin/python", "python3", "~/env/bin/python"],
    "connect_timeout": [5, 0.5, 30],
}
GOOD_VALUES.update(
    {
        "ansible_host": GOOD_VALUES["address"],
        "ansible_port": GOOD_VALUES["port"],
        "ansible_user": GOOD_VALUES["user"],
        "ansible_ssh_private_key_file": GOOD_VALUES["ssh_key"],
        "ansible_python_interpreter": GOOD_VALUES["python"],
    }
)


@st.composite
def _vars(draw: st.DrawFn) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for _ in range(draw(st.integers(min_value=0, max_value=4))):
        name = draw(weighted((8, st.sampled_from(VAR_NAMES)), (1, st.text(max_size=12))))
        good = GOOD_VALUES.get(name, [1])
        out[name] = draw(weighted((5, st.sampled_from(good)), (1, _hostile())))
    return out


def _host_name() -> st.SearchStrategy[Any]:
    good = st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True)
    bad = st.one_of(
        st.sampled_from(PAYLOADS),
        st.text(max_size=20),
        st.integers(),
        st.booleans(),
        st.none(),
        st.just(SPLICE),
    )
    return weighted((6, good), (1, bad))


def _group(depth: int) -> st.SearchStrategy[Any]:
    host_vars = weighted((1, st.none()), (3, _vars()))
    hosts = weighted(
        (3, st.dictionaries(_host_name(), host_vars, min_size=1, max_size=4)),
        (1, st.dictionaries(_host_name(), host_vars, max_size=2)),
    )
    if depth <= 0:
        children: st.SearchStrategy[Any] = st.just({})
    else:
        children = st.dictionaries(_host_name(), _group(depth - 1), max_size=3)
    body = st.fixed_dictionaries(
        {},
        optional={
            "vars": weighted((8, _vars()), (1, _scalar())),
            "hosts": weighted((8, hosts), (1, _scalar())),
            "children": weighted((8, children), (1, _scalar())),
        },
    )
    typo = st.fixed_dictionaries({"hostz": _scalar()})
    return weighted((20, body), (1, typo), (1, _scalar()))


@st.composite
def structured(draw: st.DrawFn, canary: str) -> bytes:
    top = draw(st.dictionaries(_host_name(), _group(2), min_size=0, max_size=3))
    if draw(st.sampled_from([True, True, True, False])):
        top["all"] = draw(_group(3))
    all_group = top.get("all")
    if isinstance(all_group, dict) and draw(st.sampled_from([True, True, True, False])):
        # most examples hold at least one plausible host, so that value checks are reached
        hosts = all_group.get("hosts")
        if not isinstance(hosts, dict):
            hosts = all_group["hosts"] = {}
        name = draw(st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True))
        hosts[name] = draw(weighted((1, st.none()), (4, _vars())))
    try:
        text = yaml.safe_dump(top, allow_unicode=draw(st.booleans()), sort_keys=False)
    except (yaml.YAMLError, UnicodeError, ValueError):
        text = "all: {}\n"
    while SPLICE in text:
        text = text.replace(SPLICE, draw(st.sampled_from(VALUE_SPLICES)), 1)
    text = text.replace("{canary}", canary)
    lines = text.splitlines(keepends=True)
    for _ in range(draw(st.sampled_from([0, 0, 0, 0, 0, 0, 1, 2]))):
        at = draw(st.sampled_from([0, len(lines)]))
        lines.insert(at, draw(st.sampled_from(DOC_SPLICES)))
    return "".join(lines).encode("utf-8", "surrogatepass")


VALID = b"""all:
  vars: {user: root, ssh_key: ~/.ssh/id_ed25519, python: /root/env/bin/python}
  children:
    blackwell:
      vars: {port: 2200}
      hosts:
        b200-01: {address: 10.0.0.11}
        b200-02: {address: 10.0.0.12, port: 2222, connect_timeout: 5}
      children:
        canary:
          hosts:
            b200-03: {ansible_host: 10.0.0.13, ansible_user: ops}
    hopper:
      hosts:
        h100-01: {jump: bastion, ansible_port: 2022}
        bastion: {address: 192.0.2.1}
"""


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(VALID)
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "repeat"]))
        at = draw(st.integers(min_value=0, max_value=max(0, len(data) - 1)))
        if op == "flip" and data:
            data[at] = draw(st.integers(min_value=0, max_value=255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[at : at + draw(st.integers(min_value=1, max_value=20))]
        else:
            chunk = bytes(data[at : at + draw(st.integers(min_value=1, max_value=40))])
            data[at:at] = chunk * draw(st.integers(min_value=2, max_value=50))
    return bytes(data)


def check_loaded(inv: Inventory) -> str | None:
    """A loaded inventory must not fail later on its values: why it would, or None."""
    for spec in inv.hosts.values():
        try:
            spec.known_hosts_path()
            if spec.ssh_key:
                Path(spec.ssh_key).expanduser()
        except RuntimeError as exc:
            return f"{spec.name}: path fails later: {exc}"
        if spec.connect_timeout is not None and not math.isfinite(spec.connect_timeout):
            return f"{spec.name}: connect_timeout {spec.connect_timeout}"
        problem = address_problem(spec.target)
        if problem:
            return f"{spec.name}: target {spec.target!r} {problem}"
        for value in (spec.name, spec.address, spec.user, spec.ssh_key, spec.python):
            if value is not None and (not value.isprintable() or len(value) > 4096):
                return f"{spec.name}: unprintable or huge value {value[:40]!r}"
        try:
            json.dumps(spec.model_dump(mode="json")).encode("utf-8")
        except (UnicodeError, ValueError) as exc:
            return f"{spec.name}: not printable as JSON: {exc}"
    return None


class Runner:
    """Feeds one example to the loader (and sometimes the CLI) and tallies the outcome."""

    def __init__(self, tally: Tally, category: str, canary: str) -> None:
        self.tally = tally
        self.category = category
        self.canary = Path(canary)
        self.dir = Path(tempfile.mkdtemp(prefix="fleet-hostile-inv-"))
        self.count = 0

    def __call__(self, data: bytes) -> None:
        self.count += 1
        path = self.dir / "inventory.yaml"
        path.write_bytes(data)
        self.tally.attempt(self.category)
        started = time.monotonic()
        loaded: Inventory | None = None
        try:
            loaded = load_inventory(path)
        except UsageError as exc:
            message = str(exc)
            if "\n" in message or not message.startswith(str(path)) or len(message) > 1000:
                self.tally.bad(self.category, "wrong exit", f"not one line: {message[:200]!r}")
        except Exception as exc:
            self.tally.bad(self.category, "tracebacks", f"{type(exc).__name__}: {exc}"[:300])
        elapsed = time.monotonic() - started
        if elapsed > HANG_SECONDS:
            self.tally.bad(self.category, "hangs", f"{elapsed:.1f}s on {data[:80]!r}")
        if loaded is not None:
            problem = check_loaded(loaded)
            if problem:
                self.tally.bad(self.category, "wrong exit", f"accepted, fails later: {problem}")
        if self.count % CLI_EVERY == 0:
            self.cli(path, loaded is not None)
        if self.canary.exists():
            self.tally.bad(self.category, "executions", f"canary created by {data[:80]!r}")
            self.canary.unlink()

    def cli(self, path: Path, loads: bool) -> None:
        for args in (["hosts"], ["hosts", "--json"]):
            run = run_fleet(["--inventory", str(path), *args], env={"COLUMNS": "200"})
            if run.traceback:
                self.tally.bad(self.category, "tracebacks", run.trace or run.stderr[-300:])
                continue
            expected = 0 if loads else 2
            if run.code != expected or (expected == 2 and not one_line_error(run)):
                self.tally.bad(
                    self.category,
                    "wrong exit",
                    f"{args}: exit {run.code}, expected {expected}: {run.stderr[:200]!r}",
                )
            if expected == 0 and "--json" in args:
                try:
                    json.loads(run.stdout)
                except ValueError:
                    self.tally.bad(self.category, "wrong exit", "hosts --json: not JSON")


def _assert_clean(tally: Tally, category: str) -> None:
    failures = tally.failures(category)
    assert not failures, (failures, tally.categories[category].examples)


FUZZ = settings(
    max_examples=800 * SCALE,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.timeout(600)
def test_structured_inventories(tally: Tally, canary: str) -> None:
    runner = Runner(tally, "inventory (structured)", canary)

    @FUZZ
    @given(structured(canary))
    def one(data: bytes) -> None:
        runner(data)

    one()
    _assert_clean(tally, "inventory (structured)")


@pytest.mark.timeout(600)
def test_mutated_inventories(tally: Tally, canary: str) -> None:
    runner = Runner(tally, "inventory (mutated bytes)", canary)

    @settings(FUZZ, max_examples=500 * SCALE)
    @given(mutated())
    def one(data: bytes) -> None:
        runner(data)

    one()
    _assert_clean(tally, "inventory (mutated bytes)")


@pytest.mark.timeout(600)
def test_raw_byte_inventories(tally: Tally, canary: str) -> None:
    runner = Runner(tally, "inventory (raw bytes)", canary)

    @settings(FUZZ, max_examples=400 * SCALE)
    @given(st.binary(max_size=400))
    def one(data: bytes) -> None:
        runner(data)

    one()
    _assert_clean(tally, "inventory (raw bytes)")


def _bomb() -> str:
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        lines.append(f"l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 9)}]")
    return "\n".join(lines) + "\nall: {hosts: {x: {address: *l8}}}\n"


# The defects of the issue, each a class: (text, a fragment the one-line error must hold).
KNOWN_BAD = {
    "nesting 300 deep": ("all: " + "[" * 300 + "]" * 300 + "\n", "nested deeper"),
    "nesting 500 deep": ("all: " + "{a: " * 500 + "1" + "}" * 500 + "\n", "nested deeper"),
    "recursive anchor": ("all: &a\n  children:\n    g: *a\n", "recursive alias"),
    "recursive anchor in list": ("all: &a [*a]\n", "recursive alias"),
    "recursive merge": ("all: &a {<<: *a}\n", "recursive alias"),
    "impossible date": ("all:\n  hosts:\n    a: {port: !!timestamp 2001-02-30}\n", "timestamp"),
    "binary int": ("all:\n  hosts:\n    a: {port: !!int 0b2}\n", "invalid integer"),
    "bool maybe": ("all:\n  hosts:\n    a: {port: !!bool maybe}\n", "invalid boolean"),
    "4301-digit int": ("all:\n  hosts:\n    a: {port: " + "9" * 4301 + "}\n", "integer longer"),
    "lone surrogate name": ('all:\n  hosts:\n    "\\ud800x": {}\n', "invalid YAML"),
    "alias bomb (1 KB)": (_bomb(), "alias bomb"),
    "duplicate host": ("all:\n  hosts:\n    a: {}\n    a: {port: 2}\n", "duplicate key 'a'"),
    "duplicate var": ("all:\n  hosts:\n    a: {port: 1, port: 2}\n", "duplicate key 'port'"),
    "timeout inf": ("all:\n  hosts:\n    a: {connect_timeout: .inf}\n", "a.connect_timeout"),
    "timeout nan": ("all:\n  hosts:\n    a: {connect_timeout: .nan}\n", "a.connect_timeout"),
    "timeout bool": ("all:\n  hosts:\n    a: {connect_timeout: true}\n", "a.connect_timeout"),
    "user in address": ("all:\n  hosts:\n    a: {address: root@h1}\n", "a.address"),
    "port in address": ("all:\n  hosts:\n    a: {address: '10.0.0.1:22'}\n", "a.address"),
    "port in address and port": (
        "all:\n  hosts:\n    a: {address: '10.0.0.1:22', port: 22}\n",
        "a.address",
    ),
    "bracketed address": ("all:\n  hosts:\n    a: {address: '[::1]:22'}\n", "a.address"),
    "~nouser key": ("all:\n  hosts:\n    a: {ssh_key: ~nouser-fleet/k}\n", "a.ssh_key"),
    "~nouser known_hosts": (
        "all:\n  hosts:\n    a: {known_hosts: ~nouser-fleet/kh}\n",
        "a.known_hosts",
    ),
    "~user python": ("all:\n  hosts:\n    a: {python: ~bob/bin/python}\n", "a.python"),
    "NUL in address": ('all:\n  hosts:\n    a: {address: "x\\0y"}\n', "a.address"),
    "NUL in path": ('all:\n  hosts:\n    a: {ssh_key: "/k\\0"}\n', "a.ssh_key"),
    "NUL in name": ('all:\n  hosts:\n    "a\\0b": {address: x}\n', "all.hosts.a\\x00b"),
    "NUL in group": ('all:\n  children:\n    "g\\0": {}\n', "all.children.g\\x00"),
    "5 MB address": ("all:\n  hosts:\n    a: {address: " + "a" * 5_000_000 + "}\n", "a.address"),
    "2 KB name": ("all:\n  hosts:\n    ? " + "n" * 2048 + "\n    : {}\n", "bad host name"),
    "name that is no host": ("all:\n  hosts:\n    'a..b': {}\n", "no address given"),
    "label over 63": ("all:\n  hosts:\n    h: {address: " + "a" * 64 + ".com}\n", "h.address"),
    "bastion no host": ("all:\n  hosts:\n    a: {jump: 'u@x..y'}\n", "a.jump"),
    "bastion port": ("all:\n  hosts:\n    a: {jump: 'x:99999'}\n", "a.jump"),
    "null host name": ("all:\n  hosts:\n    ~: {address: x}\n", "must be a string"),
    "control char user": ('all:\n  hosts:\n    a: {user: "ro\\tot"}\n', "a.user"),
    "not UTF-8": ("all:\n  hosts:\n    a\udcff: {}\n", "not UTF-8"),
}


@pytest.mark.parametrize("case", sorted(KNOWN_BAD))
def test_known_bad_inventories(case: str, tmp_path: Path, tally: Tally) -> None:
    text, fragment = KNOWN_BAD[case]
    path = tmp_path / "inventory.yaml"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    category = "inventory (issue cases)"
    tally.attempt(category)
    started = time.monotonic()
    run = run_fleet(["--inventory", str(path), "hosts"])
    elapsed = time.monotonic() - started
    if run.traceback:
        tally.bad(category, "tracebacks", f"{case}: {run.trace or run.stderr[-200:]}")
    elif run.code != 2 or not one_line_error(run):
        tally.bad(category, "wrong exit", f"{case}: exit {run.code}: {run.stderr[:200]!r}")
    if elapsed > HANG_SECONDS:
        tally.bad(category, "hangs", f"{case}: {elapsed:.1f}s")
    assert not run.traceback, run.trace
    assert run.code == 2 and one_line_error(run), run.stderr
    assert fragment in run.stderr, run.stderr
    assert str(path) in run.stderr


@pytest.mark.parametrize("kind", ["directory", "fifo", "device"])
def test_special_inventory_files_are_refused_at_once(
    kind: str, tmp_path: Path, tally: Tally
) -> None:
    import os
    import stat

    path = tmp_path / "inventory.yaml"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # like /dev/zero
        except PermissionError:
            pytest.skip("mknod not permitted here")
    category = "inventory (special files)"
    tally.attempt(category)
    try:
        # through $FLEET_INVENTORY: click's own check of --inventory refuses a directory
        # before fleet reads it (a usage error, exit 2, in click's format)
        run = within(HANG_SECONDS, lambda: run_fleet(["hosts"], env={"FLEET_INVENTORY": str(path)}))
    except Hung as exc:
        tally.bad(category, "hangs", f"{kind}: {exc}")
        raise
    if run.traceback or run.code != 2 or not one_line_error(run):
        tally.bad(category, "wrong exit", f"{kind}: exit {run.code}: {run.stderr[:200]!r}")
    assert run.code == 2 and one_line_error(run), run.stderr
    assert "not a regular file" in run.stderr or "directory" in run.stderr
