"""The contract of every script fleet ships to a host (``fleet/onhost/``).

Each shipped module: Python 3.8 syntax and runtime (no builtin generics or ``X | Y`` at
runtime, no 3.9+ string/zip APIs, no ``from __future__``), standard-library imports only,
never vLLM or torch. Each script (a module with ``OPS``) is run for real, as a bundle, by the
interpreters on this machine (3.8 too when it is installed) from a working directory that
holds a decoy ``vllm/`` package and modules shadowing the standard library: its answer is
one envelope with the schema and the script's name, and names the installed vLLM.
"""

from __future__ import annotations

import ast
import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleet.inventory import HostSpec
from fleet.onhost import client
from fleet.sandbox.vllm_source import vllm_tree
from fleet.transport import LocalRunner, shell

ONHOST = Path(client.__file__).resolve().parent
LOCAL_ONLY = {"__init__", "client"}
# every module shipped to hosts: fleet/onhost/*.py and its rooms (rehearsal/*.py)
SHIPPED = sorted(
    p.relative_to(ONHOST).with_suffix("").as_posix().replace("/", ".")
    for p in ONHOST.rglob("*.py")
    if p.stem not in LOCAL_ONLY and "__pycache__" not in p.parts
)
SCRIPTS = sorted(
    m
    for m in SHIPPED
    if "OPS" in client.defined_names(ast.parse((ONHOST / client.module_file(m)).read_text()))
)

# One harmless request per script; a new script needs an entry (test_every_script_is_covered).
SAMPLE: dict[str, dict[str, Any]] = {
    "facts": {"op": "facts"},
    "patch": {
        "op": "fetch",
        "patch_set": "eagle3-deepseek",
        "files": ["model_executor/models/deepseek_v2.py"],
        "backup_root": "~/.fleet/patches",
    },
    "source": {"op": "show", "path": "_version.py", "start": 1, "end": 2, "time_limit": 30},
    "serve": {
        "op": "preflight",
        "profile": {
            "name": "p",
            "model": "/nonexistent/target",
            "drafter": "/nonexistent/drafter",
            "host": "127.0.0.1",
            "port": 0,
            "vllm": "/nonexistent/vllm",
        },
    },
}
SAMPLE["bench"] = {"op": "tools", "vllm": "/nonexistent/vllm"}
# Where each script's answer names the vLLM package directory.
PACKAGE_DIR_KEY = {
    "facts": "parts.vllm.value.path",
    "patch": "package_dir",
    "source": "vllm_dir",
    "serve": "vllm.path",
    "bench": "vllm_dir",
}
OPTIONAL_IMPORTS = {"rehearsal.vllm_sim_nodes": {"ray"}}
NEWER_APIS = ("removeprefix", "removesuffix", "strict=", "math.lcm", "str | ", "| None")


def _interpreters() -> list[str]:
    found = [sys.executable]
    for minor in (8, 9):
        for exe in [
            shutil.which(f"python3.{minor}"),
            *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/3.{minor}.*/bin/python3"))),
        ]:
            if exe and subprocess.run([exe, "-c", "pass"], capture_output=True).returncode == 0:
                found.append(exe)
                break
    return found


INTERPRETERS = _interpreters()


@pytest.mark.parametrize("module", SHIPPED)
def test_shipped_module_is_python38_and_stdlib_only(module: str) -> None:
    source = (ONHOST / client.module_file(module)).read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.module != "__future__", "a __future__ import can be shadowed on the host"
            if node.module and not node.module.startswith("fleet.onhost"):
                assert node.level == 0
                imported.add(node.module.split(".")[0])
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            # list[str] etc. are evaluated (def annotations too) and fail on 3.8
            assert node.value.id not in {"list", "dict", "tuple", "set", "type", "frozenset"}
    # the one import beyond the standard library: the rehearsal vLLM joins a real Ray
    # cluster (imported where the backend is ray, on sandbox hosts given Ray)
    optional = OPTIONAL_IMPORTS.get(module, set())
    assert imported - optional <= set(sys.stdlib_module_names)
    assert not imported & {"vllm", "torch"}
    for api in NEWER_APIS:
        assert api not in source, f"{module}.py uses {api!r} (newer than Python 3.8)"


def test_every_script_is_covered() -> None:
    assert set(SCRIPTS) == set(SAMPLE), "add a sample request for each on-host script"
    assert {"facts", "patch", "source", "serve"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_bundle_has_each_module_once_and_no_name_clash(script: str) -> None:
    bundle = client.bundle(script)
    assert bundle.modules[0] == "_common" and bundle.modules[-1] == script
    assert len(set(bundle.modules)) == len(bundle.modules)
    assert bundle.text.startswith(client.PROLOGUE)
    assert "from fleet.onhost" not in bundle.text  # the imports were resolved by bundling
    ast.parse(bundle.text, feature_version=(3, 8))


def _hostile_cwd(where: Path) -> Path:
    """A login directory holding a decoy vllm/ package and stdlib look-alikes."""
    where.mkdir(parents=True, exist_ok=True)
    decoy = where / "vllm"
    (decoy / "model_executor" / "models").mkdir(parents=True)
    (decoy / "__init__.py").write_text("")
    (decoy / "_version.py").write_text("__version__ = version = '6.6.6'\n")
    for name in ("platform", "json", "zlib", "base64", "typing", "ast", "__future__"):
        (where / f"{name}.py").write_text(
            f"open({str(where / 'SHADOWED')!r}, 'a').write({name!r} + '\\n')\n"
            "raise SystemExit(99)\n"
        )
    return decoy


@pytest.mark.parametrize("python", INTERPRETERS, ids=lambda p: Path(p).parent.parent.name)
@pytest.mark.parametrize("script", SCRIPTS)
def test_script_answers_one_envelope_and_ignores_the_working_directory(
    script: str, python: str, tmp_path: Path
) -> None:
    tree = vllm_tree("0.17.0")
    home = tmp_path / "home"
    decoy = _hostile_cwd(home)
    # the interpreter as a "~/" path: the host's home, expanded by the remote shell
    (home / "env").mkdir()
    (home / "env" / "python").symlink_to(python)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": str(tree)}
    conn = LocalRunner(HostSpec(name="h", python="~/env/python"), cwd=home, env=env)
    raw = client.run_raw(conn, script, SAMPLE[script], timeout=60)
    assert not (home / "SHADOWED").exists()
    installed = str((tree / "vllm").resolve())
    found: Any = raw.result
    for key in PACKAGE_DIR_KEY[script].split("."):
        found = found[key]
    assert found == installed
    assert installed != str(decoy.resolve())


@pytest.mark.parametrize("script", SCRIPTS)
def test_unknown_operation_is_a_clean_refusal(script: str) -> None:
    conn = LocalRunner(HostSpec(name="h", python=sys.executable))
    with pytest.raises(client.HostRefusal) as info:
        client.run_raw(conn, script, {"op": "no-such-op"}, timeout=60)
    assert info.value.code == "bad-request" and "unknown operation" in info.value.message


def test_envelope_with_noise_around_it_and_schema_checks() -> None:
    from fleet.onhost import _common

    doc = {"schema": _common.SCHEMA, "script": "facts", "result": {"x": 1}}
    noisy = f"motd\n{_common.BEGIN}\n{_common.encode(doc)}\n{_common.END}\nbye\n".encode()
    assert client.split_answer(noisy) == (doc, b"bye\n")
    assert client.split_answer(b"no answer here") == (None, b"")
    with pytest.raises(client.OnhostError):
        client.split_answer(f"{_common.BEGIN}\n!!!\n{_common.END}\n".encode())


@pytest.mark.parametrize(
    ("stdout", "exit_code", "match"),
    [
        (b"", 1, "without an answer"),
        (b"Traceback (most recent call last):\nSyntaxError: x\n", 1, "without an answer"),
        (None, 0, "schema 99"),  # a wrong schema
        (b"", 127, "not found on the host"),
        (b"", 126, "not executable"),
    ],
)
def test_answers_that_are_not_understood(stdout: bytes | None, exit_code: int, match: str) -> None:
    from fleet.onhost import _common
    from fleet.transport import Result

    if stdout is None:
        bad = {"schema": 99, "script": "facts", "result": {}}
        stdout = f"{_common.BEGIN}\n{_common.encode(bad)}\n{_common.END}\n".encode()
    res = Result("h", "cmd", exit_code, stdout, b"", 0.0)
    with pytest.raises(Exception, match=match):
        client.answer_of("h", "facts", res, "/py")


def test_python_command_quotes_the_interpreter_for_any_shell() -> None:
    assert shell.python("/env/bin/python").startswith(
        "sh -c 'exec '\\''/env/bin/python'\\'' -c '\\''import sys;"
    )
    assert shell.python("~/env/bin/python").startswith('sh -c \'exec "$HOME"/')


def test_a_large_request_sent_to_many_hosts_is_compressed_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fleet.onhost import _common

    calls: list[int] = []
    real = _common.encode_json

    def counted(text: bytes) -> str:
        calls.append(len(text))
        return real(text)

    monkeypatch.setattr(_common, "encode_json", counted)
    big = {"op": "apply", "files": [{"path": "a.py", "text_after": "x = 1\n" * 20_000}]}
    first = [client.encoded(dict(big)) for _ in range(5)]
    assert len(calls) == 1 and len(set(first)) == 1
    assert _common.decode(first[0]) == big
    other = dict(big, op="revert")  # another request is encoded on its own
    assert _common.decode(client.encoded(other)) == other and len(calls) == 2
    small = {"op": "fetch"}  # small ones are not kept
    assert client.encoded(small) == client.encoded(small) and len(calls) == 4
    assert client.encoded(big) == first[0] and len(calls) == 4
