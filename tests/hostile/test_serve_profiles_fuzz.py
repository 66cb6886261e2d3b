"""Generated serve profiles: rendered, or refused with one line and exit 2, in bounded time.

Generators (``fleet profile show NAME --host H`` in-process, a profile file per example in
``./playbooks/``):

- structure-aware: the shipped profile's shape with fields replaced by hostile values
  (Jinja2 templates that loop, call, repeat text, raise, escape the sandbox; control
  characters; huge, negative, NaN and infinite numbers; wrong types; unknown keys) and
  inventory variables holding the same;
- mutations: bytes of ``playbooks/kimi-eagle3.yaml`` flipped, cut and repeated;
- raw bytes.

A rendered profile must then write its files (launch script, supervisord program,
systemd unit) without an exception other than fleet's one-line refusal. Special files as
the profile or the secrets env file are refused at once.
"""

from __future__ import annotations

import itertools
import os
import socket
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml
from hostile_support import SCALE, Hung, Tally, one_line_error, run_fleet, within
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.errors import FleetError
from fleet.paths import playbooks_dir

HANG_SECONDS = 10.0  # a render takes milliseconds: this is a hang, not a timing test
SHIPPED = (playbooks_dir() / "kimi-eagle3.yaml").read_bytes()
BASE: dict[str, Any] = yaml.safe_load(SHIPPED)
TEMPLATES = [
    "{{ models_dir }}/x",
    "{{ undefined_var }}",
    "{{ models_dir | default('/m') }}",
    "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "{{ 'x' * 10**10 }}",
    "{{ [1] * 10**9 }}",
    "{{ 9**9**9**9 }}",
    "{{ range(10**9) | list }}",
    "{{ lipsum(100000) }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ x | center(10**9) }}",
    "{{ '%0999999999d' % 1 }}",
    "{% set a = 'x' %}{{ a }}",
    "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}",
    "{{ 1 / 0 }}",
    "{{ none.attr }}",
    "{{ [1, 2][7] }}",
    "{{ {}['k'] }}",
    "{{ 2.0 ** 5000 }}",
    "{{" + "(" * 3000 + "1" + ")" * 3000 + "}}",
    "{{",
    "{%",
    "{#",
    "{{ x }",
    "{% if %}",
    "{% include 'x' %}",
    "{% extends 'x' %}",
    "{% import 'x' as y %}",
    "{{ x.__dict__ }}",
]
TEXT = st.one_of(
    st.sampled_from(TEMPLATES),
    st.text(max_size=40),
    st.sampled_from(["a\nb", "a\rb", "a\x00b", "\x1b[2J", "a\u2028b", "-", "", " ", "a" * 70_000]),
)
NUMBER = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 2**63, 10**400]),
)
VALUE = st.recursive(
    st.one_of(TEXT, NUMBER, st.booleans(), st.none()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
KEYS = [
    *BASE.keys(),
    *("speculative.model", "speculative.method", "speculative.num_speculative_tokens"),
    *("env.X", "secrets.env_file", "unknown_key", "speculative.unknown"),
]
_names = itertools.count()


def _name() -> str:
    return f"fz{next(_names)}"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with ./playbooks/ and a one-host inventory (free variables)."""
    (tmp_path / "playbooks").mkdir()
    inv = tmp_path / "inventory.yaml"
    inv.write_text(
        yaml.safe_dump({"all": {"hosts": {"h1": {"address": "10.0.0.1", "models_dir": "/m"}}}})
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _show(workdir: Path, data: bytes, tally: Tally, category: str, what: str) -> Any:
    name = _name()
    (workdir / "playbooks" / f"{name}.yaml").write_bytes(data)
    args = ["--inventory", str(workdir / "inventory.yaml"), "profile", "show", name, "--host", "h1"]
    tally.attempt(category)
    try:
        run = within(HANG_SECONDS, lambda: run_fleet(args))
    except Hung as exc:
        tally.bad(category, "hangs", f"{what}: {exc}: {data[:200]!r}")
        raise
    if run.traceback:
        tally.bad(
            category, "tracebacks", f"{what}: {run.trace or run.stderr[-300:]}: {data[:200]!r}"
        )
    elif run.code == 2:
        if not one_line_error(run):
            tally.bad(category, "wrong exit", f"{what}: not one line: {run.stderr[:300]!r}")
    elif run.code == 0:
        _write_files(name, tally, category, what)
    else:
        tally.bad(category, "wrong exit", f"{what}: exit {run.code}: {run.stderr[-200:]!r}")
    return run


def _write_files(name: str, tally: Tally, category: str, what: str) -> None:
    """A profile that rendered must also be written: no exception but a refusal."""
    from fleet.inventory import HostSpec
    from fleet.serving import units
    from fleet.serving.profile import for_host

    host = HostSpec(name="h1", address="10.0.0.1", vars={"models_dir": "/m"})
    try:
        profile = for_host(name, host)
        layout = units.Layout(home="/home/u", profile=profile.name)
        units.launch_script(profile, layout, python="/env/bin/python")
        units.program_conf(profile, layout)
        units.systemd_unit(profile, layout, user_unit=True)
    except FleetError as exc:
        if "\n" in str(exc):
            tally.bad(category, "wrong exit", f"{what}: written: a refusal of several lines")
    except Exception as exc:
        tally.bad(category, "tracebacks", f"{what}: written: {type(exc).__name__}: {exc}")


def _set(doc: dict[str, Any], dotted: str, value: Any) -> None:
    head, _, key = dotted.rpartition(".")
    target = doc
    if head:
        if not isinstance(doc.get(head), dict):
            doc[head] = {}
        target = doc[head]
    target[key] = value


def _dump(doc: Any) -> bytes:
    try:
        return yaml.safe_dump(doc, allow_unicode=True).encode("utf-8", "surrogatepass")
    except (yaml.YAMLError, ValueError, OverflowError):
        return repr(doc).encode("utf-8", "surrogatepass")


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples * SCALE,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


def test_structured_profiles(workdir: Path, tally: Tally) -> None:
    category = "serve profiles (structured)"

    @_settings(200)
    @given(st.lists(st.tuples(st.sampled_from(KEYS), VALUE), min_size=1, max_size=4), st.booleans())
    def one(changes: list[tuple[str, Any]], drop: bool) -> None:
        doc = yaml.safe_load(SHIPPED)
        for key, value in changes:
            _set(doc, key, value)
        if drop:
            doc.pop(changes[0][0].split(".")[0], None)
        _show(workdir, _dump(doc), tally, category, f"{changes!r}"[:200])

    one()
    assert not tally.failures(category), tally.categories[category].examples


def test_inventory_variables_rendered_into_profiles(workdir: Path, tally: Tally) -> None:
    category = "serve profiles (inventory vars)"

    @_settings(100)
    @given(st.one_of(TEXT, NUMBER, st.booleans()))
    def one(value: Any) -> None:
        inv = {"all": {"hosts": {"h1": {"address": "10.0.0.1", "models_dir": value}}}}
        try:
            (workdir / "inventory.yaml").write_text(yaml.safe_dump(inv, allow_unicode=True))
        except (UnicodeEncodeError, yaml.YAMLError):
            return
        _show(workdir, SHIPPED, tally, category, repr(value)[:200])

    one()
    assert not tally.failures(category), tally.categories[category].examples


def test_mutated_profiles(workdir: Path, tally: Tally) -> None:
    category = "serve profiles (mutated bytes)"

    @_settings(200)
    @given(
        st.lists(
            st.tuples(
                st.integers(0, len(SHIPPED) - 1),
                st.sampled_from(["flip", "cut", "dup"]),
                st.binary(max_size=4),
            ),
            min_size=1,
            max_size=6,
        )
    )
    def one(edits: list[tuple[int, str, bytes]]) -> None:
        data = bytearray(SHIPPED)
        for at, how, junk in edits:
            at = min(at, max(len(data) - 1, 0))
            if how == "flip" and data:
                data[at] ^= 1 << (at % 8)
            elif how == "cut":
                del data[at : at + 1 + len(junk) * 8]
            else:
                data[at:at] = junk or data[at : at + 16]
        _show(workdir, bytes(data), tally, category, f"{edits!r}"[:200])

    one()
    assert not tally.failures(category), tally.categories[category].examples


def test_raw_byte_profiles(workdir: Path, tally: Tally) -> None:
    category = "serve profiles (raw bytes)"

    @_settings(200)
    @given(st.binary(max_size=300))
    def one(data: bytes) -> None:
        run = _show(workdir, data, tally, category, repr(data[:60]))
        if run.code == 0:
            tally.bad(category, "wrong exit", f"random bytes accepted: {data!r}")

    one()
    assert not tally.failures(category), tally.categories[category].examples


def _special(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero-device":
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 5))
    elif kind == "directory":
        path.mkdir()
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        cwd = os.getcwd()
        os.chdir(path.parent)
        try:
            sock.bind(path.name)
        finally:
            os.chdir(cwd)
            sock.close()
    elif kind == "symlink-to-fifo":
        os.mkfifo(path.with_suffix(".target"))
        path.symlink_to(path.with_suffix(".target"))
    elif kind == "huge":
        with open(path, "wb") as fh:
            fh.truncate(2**30)


@pytest.mark.parametrize(
    "kind", ["fifo", "zero-device", "directory", "socket", "symlink-to-fifo", "huge"]
)
def test_special_profile_and_secrets_files(workdir: Path, kind: str, tally: Tally) -> None:
    from fleet.serving.profile import ProfileError, read_secrets, render

    category = "serve profiles (special files)"
    name = _name()
    try:
        _special(workdir / "playbooks" / f"{name}.yaml", kind)
    except PermissionError:
        pytest.skip("mknod not permitted")
    args = ["--inventory", str(workdir / "inventory.yaml"), "profile", "show", name, "--host", "h1"]
    tally.attempt(category)
    try:
        run = within(HANG_SECONDS, lambda: run_fleet(args))
    except Hung as exc:
        tally.bad(category, "hangs", f"profile {kind}: {exc}")
        raise
    if run.traceback or run.code != 2 or not one_line_error(run):
        tally.bad(category, "wrong exit", f"profile {kind}: {run.code} {run.stderr[-200:]!r}")
    env_file = workdir / f"secrets-{kind}.env"
    _special(env_file, kind)
    raw = {**BASE, "secrets": {"env_file": str(env_file)}, "model": "/m/t", "port": 8000}
    raw["speculative"] = {**BASE["speculative"], "model": "/m/d"}
    profile = render(raw, {})
    tally.attempt(category)
    try:
        within(HANG_SECONDS, lambda: read_secrets(profile))
    except ProfileError as exc:
        assert "\n" not in str(exc)
    except Hung as exc:
        tally.bad(category, "hangs", f"secrets {kind}: {exc}")
        raise
    except Exception as exc:
        tally.bad(category, "tracebacks", f"secrets {kind}: {type(exc).__name__}: {exc}")
    else:
        tally.bad(category, "wrong exit", f"secrets {kind}: read")
    assert not tally.failures(category), tally.categories[category].examples
