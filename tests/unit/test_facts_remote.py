"""The remote facts script, run LOCALLY in a subprocess against the real vLLM source.

``vllm_tree(version)`` holds the real wheel's ``vllm/`` and ``.dist-info``; putting it on
PYTHONPATH is what a host's site-packages looks like to the script. The command is the
one ``gather_facts`` sends (``sh -c 'exec PY -'``, script on stdin).
"""

from __future__ import annotations

import ast
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.facts.gather import facts_command, facts_script, python_word
from fleet.facts.models import EAGLE3_CLASSES, HostFacts
from fleet.facts.parsers import BEGIN, END, parse_facts_output
from fleet.sandbox.vllm_source import vllm_tree

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"
REMOTE = Path(__file__).resolve().parents[2] / "fleet" / "facts" / "remote_facts.py"


def run_facts(
    pythonpath: Path | None,
    tmp_path: Path,
    *,
    path_dirs: tuple[Path, ...] = (),
    prelude: bytes = b"",
    python: str = sys.executable,
) -> tuple[subprocess.CompletedProcess[bytes], HostFacts]:
    env = {
        "PATH": os.pathsep.join([*(str(p) for p in path_dirs), "/usr/bin", "/bin"]),
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
    }
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    script = facts_script()
    if prelude:  # test-only monkeypatching, placed after the __future__ import
        future = b"from __future__ import annotations\n"
        assert future in script
        script = script.replace(future, future + prelude, 1)
    proc = subprocess.run(
        ["sh", "-c", facts_command(python)],
        input=script,
        capture_output=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return proc, parse_facts_output(proc.stdout.decode())


def fake_nvidia_smi(bin_dir: Path, csv_fixture: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "nvidia-smi"
    data = (FIXTURES / "nvidia-smi" / csv_fixture).read_text()
    exe.write_text(f"#!/bin/sh\ncat <<'EOF'\n{data}EOF\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize("version", ["0.17.0", "0.18.0"])
def test_real_vllm_tree(version: str, tmp_path: Path) -> None:
    tree = vllm_tree(version)
    fake_nvidia_smi(tmp_path / "bin", "b200x8-idle.csv")
    _, facts = run_facts(tree, tmp_path, path_dirs=(tmp_path / "bin",))
    assert facts.errors == {}
    assert facts.vllm.installed and facts.vllm.version == version
    assert facts.vllm.version_source == "metadata"
    assert Path(facts.vllm.path or "") == (tree / "vllm").resolve()
    expected = version == "0.18.0"  # upstream gained SupportsEagle3 in 0.18.0
    assert facts.vllm.eagle3 == {cls: expected for cls in EAGLE3_CLASSES}
    v3 = facts.vllm.eagle3_classes["DeepseekV3ForCausalLM"]
    assert v3.file == "model_executor/models/deepseek_v2.py"
    if expected:
        assert v3.via == ["DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM"]
    kimi = facts.vllm.eagle3_classes["KimiK25ForConditionalGeneration"]
    assert kimi.file == "model_executor/models/kimi_k25.py"
    assert kimi.supported == expected
    assert kimi.via == (["KimiK25ForConditionalGeneration"] if expected else [])
    # 0.18's wrapper forwards the aux-layer setter to its language model; 0.17's does not
    assert kimi.forwards_aux_hidden_state_layers == expected
    allow = facts.vllm.eagle3_allowlist
    assert allow is not None and allow.present
    assert allow.name == "aux_hidden_states_supported" and allow.file == "config/speculative.py"
    assert (allow.deepseek, allow.kimi) == (expected, expected)
    assert len(facts.gpus) == 8 and facts.gpus[0].name == "NVIDIA B200"
    assert facts.nvidia_smi == "ok" and facts.driver == "570.133.20"
    assert facts.python == ".".join(map(str, sys.version_info[:3]))
    assert set(facts.disk) == {"home", "vllm"}


@pytest.mark.parametrize(
    ("version", "name", "deepseek"),
    [
        ("0.10.2", "eagle3_target_supported", False),  # in config/__init__.py then
        ("0.11.0", "eagle3_target_supported", False),
        ("0.20.0", "aux_hidden_states_supported", True),
    ],
)
def test_allowlist_shapes_across_versions(
    version: str, name: str, deepseek: bool, tmp_path: Path
) -> None:
    _, facts = run_facts(vllm_tree(version), tmp_path)
    allow = facts.vllm.eagle3_allowlist
    assert allow is not None and allow.present and allow.name == name
    assert allow.deepseek is deepseek and allow.kimi is deepseek
    assert "llama" in (allow.entries or [])


def test_allowlist_gone_in_025(tmp_path: Path) -> None:
    _, facts = run_facts(vllm_tree("0.25.0"), tmp_path)
    allow = facts.vllm.eagle3_allowlist
    assert allow is not None and not allow.present and allow.deepseek and allow.kimi
    assert all(facts.vllm.eagle3.values())


def test_kimi_k25_absent_before_015(tmp_path: Path) -> None:
    _, facts = run_facts(vllm_tree("0.14.0"), tmp_path)
    assert facts.vllm.eagle3["KimiK25ForConditionalGeneration"] is None
    assert facts.vllm.eagle3["DeepseekV3ForCausalLM"] is False


def test_no_nvidia_smi_means_no_gpus_not_an_error(tmp_path: Path) -> None:
    _, facts = run_facts(vllm_tree("0.17.0"), tmp_path)
    assert facts.gpus == [] and facts.nvidia_smi == "missing" and "gpus" not in facts.errors


def test_vllm_is_located_without_being_imported(tmp_path: Path) -> None:
    # a vLLM whose __init__ would leave a marker (and fail) if it were executed
    site = tmp_path / "site"
    pkg = site / "vllm"
    (pkg / "model_executor" / "models").mkdir(parents=True)
    marker = tmp_path / "IMPORTED"
    (pkg / "__init__.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nimport torch\nraise SystemExit(3)\n"
    )
    (pkg / "_version.py").write_text("__version__ = version = '0.99.0'\n")
    shutil.copy(
        vllm_tree("0.18.0") / "vllm" / "model_executor" / "models" / "deepseek_v2.py",
        pkg / "model_executor" / "models" / "deepseek_v2.py",
    )
    _, facts = run_facts(site, tmp_path)
    assert not marker.exists()
    assert facts.vllm.path == str(pkg.resolve())
    # no .dist-info here: the version falls back to vllm/_version.py, read with ast
    assert (facts.vllm.version, facts.vllm.version_source) == ("0.99.0", "_version.py")
    assert facts.vllm.eagle3["DeepseekV2ForCausalLM"] is True
    assert facts.vllm.eagle3["KimiK25ForConditionalGeneration"] is None


def test_vllm_not_installed(tmp_path: Path) -> None:
    _, facts = run_facts(None, tmp_path)
    assert not facts.vllm.installed and facts.vllm.eagle3 == {}
    assert "home" in facts.disk and "vllm" not in facts.disk


def test_a_failing_part_does_not_break_the_others(tmp_path: Path) -> None:
    prelude = b"import shutil\ndef _boom(path):\n    raise OSError('disk probe exploded')\n"
    prelude += b"shutil.disk_usage = _boom\n"
    _, facts = run_facts(vllm_tree("0.18.0"), tmp_path, prelude=prelude)
    assert facts.errors == {
        "disk:home": "OSError: disk probe exploded",
        "disk:vllm": "OSError: disk probe exploded",
    }
    assert facts.vllm.eagle3["DeepseekV3ForCausalLM"] is True

    prelude = b"import socket\ndef _boom():\n    raise RuntimeError('no hostname')\n"
    prelude += b"socket.gethostname = _boom\n"
    _, facts = run_facts(vllm_tree("0.18.0"), tmp_path, prelude=prelude)
    assert facts.errors == {"host": "RuntimeError: no hostname"} and facts.hostname is None
    assert facts.vllm.version == "0.18.0"


def test_unparsable_model_file_is_reported(tmp_path: Path) -> None:
    site = tmp_path / "site"
    models = site / "vllm" / "model_executor" / "models"
    models.mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (models / "deepseek_v2.py").write_text("class DeepseekV2ForCausalLM(:\n")
    _, facts = run_facts(site, tmp_path)
    assert "models:model_executor/models/deepseek_v2.py" in facts.errors
    assert facts.vllm.eagle3["DeepseekV2ForCausalLM"] is None


def test_output_is_one_marked_document(tmp_path: Path) -> None:
    proc, _ = run_facts(vllm_tree("0.17.0"), tmp_path)
    lines = proc.stdout.decode().splitlines()
    assert lines[0] == BEGIN and lines[-1] == END and len(lines) == 3


def test_interpreter_path_with_spaces_and_home(tmp_path: Path) -> None:
    odd = tmp_path / "my env's bin" / "py $(touch PWNED) `x`"
    odd.parent.mkdir()
    odd.symlink_to(sys.executable)
    _, facts = run_facts(vllm_tree("0.17.0"), tmp_path, python=str(odd))
    assert facts.vllm.version == "0.17.0"
    assert not (tmp_path / "PWNED").exists()
    # "~/..." names a path on the host, expanded by the remote shell
    rel = "~/" + str(odd.relative_to(tmp_path))
    assert python_word(rel).startswith('"$HOME"/')
    _, facts = run_facts(vllm_tree("0.17.0"), tmp_path, python=rel)
    assert facts.vllm.version == "0.17.0"
    assert not (tmp_path / "PWNED").exists()


def test_script_is_python38_compatible_and_stdlib_only() -> None:
    source = REMOTE.read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    assert facts_script() == REMOTE.read_bytes()
    # annotations are never evaluated (PEP 563), so builtin generics in them are fine
    first = tree.body[0]
    assert isinstance(first, ast.ImportFrom) and first.module == "__future__"
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}
    assert not imported & {"vllm", "torch"}
    # APIs newer than 3.8
    for name in ("removeprefix", "removesuffix", "unparse", "zip(strict"):
        assert name not in source
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            # a runtime (non-annotation) list[...] / dict[...] would fail on 3.8
            assert node.value.id not in {"list", "dict", "tuple", "set"} or _in_annotation(
                tree, node
            )


def _in_annotation(tree: ast.AST, target: ast.AST) -> bool:
    for node in ast.walk(tree):
        annotations: list[ast.expr | None] = []
        if isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        elif isinstance(node, ast.FunctionDef):
            annotations.append(node.returns)
            annotations += [a.annotation for a in node.args.args + node.args.kwonlyargs]
            if node.args.vararg:
                annotations.append(node.args.vararg.annotation)
        for ann in annotations:
            if ann is not None and any(n is target for n in ast.walk(ann)):
                return True
    return False


def _old_interpreter(minor: int) -> str | None:
    """A Python 3.<minor> on this machine (PATH or pyenv), verified to run, else None."""
    import glob

    candidates = [shutil.which(f"python3.{minor}")]
    pyenv = os.path.expanduser(f"~/.pyenv/versions/3.{minor}.*/bin/python3")
    candidates += sorted(glob.glob(pyenv))
    for exe in filter(None, candidates):
        try:
            out = subprocess.run(
                [exe, "-c", "import sys; print(sys.version_info[1])"],
                capture_output=True, text=True, timeout=30,
            )
        except OSError:
            continue
        if out.returncode == 0 and out.stdout.strip() == str(minor):
            return exe
    return None


@pytest.mark.parametrize("minor", [8, 9])
def test_runs_on_old_host_pythons(minor: int, tmp_path: Path) -> None:
    exe = _old_interpreter(minor)
    if exe is None:
        pytest.skip(f"no Python 3.{minor} on this machine")
    _, facts = run_facts(vllm_tree("0.18.0"), tmp_path, python=exe)
    assert facts.errors == {}
    assert facts.python is not None and facts.python.startswith(f"3.{minor}.")
    assert facts.vllm.version == "0.18.0"
    assert facts.vllm.eagle3 == {cls: True for cls in EAGLE3_CLASSES}


class LocalConnection:
    """Runs commands with the local ``sh`` (the host is this machine): a real executor
    with HostConnection's run() signature, for gather_facts' error mapping."""

    def __init__(self, python: str, env: dict[str, str]) -> None:
        from fleet.inventory import HostSpec

        self.host = HostSpec(name="local", address="127.0.0.1", python=python)
        self.env = env

    def run(self, command: str, *, stdin: bytes | None = None, timeout: float | None = None
            ) -> object:
        from fleet.transport import Result

        proc = subprocess.run(
            ["sh", "-c", command], input=stdin, capture_output=True, env=self.env,
            timeout=timeout,
        )
        return Result("local", command, proc.returncode, proc.stdout, proc.stderr, 0.0)


def _gather(python: str, tmp_path: Path, pythonpath: Path | None = None) -> HostFacts:
    from fleet.facts import gather_facts

    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return gather_facts(LocalConnection(python, env))  # type: ignore[arg-type]


def test_gather_facts_locally(tmp_path: Path) -> None:
    facts = _gather(sys.executable, tmp_path, vllm_tree("0.17.0"))
    assert facts.vllm.version == "0.17.0" and facts.vllm.eagle3["DeepseekV2ForCausalLM"] is False


def test_gather_facts_errors_name_the_problem(tmp_path: Path) -> None:
    from fleet.errors import OperationFailed

    with pytest.raises(OperationFailed, match="'/no/such/python' not found"):
        _gather("/no/such/python", tmp_path)
    not_exec = tmp_path / "python"
    not_exec.write_text("")
    with pytest.raises(OperationFailed, match="not executable"):
        _gather(str(not_exec), tmp_path)
    # an interpreter that is not Python 3 (here: a shell script) prints no document
    fake = tmp_path / "fakepy"
    fake.write_text("#!/bin/sh\necho 'SyntaxError: invalid syntax' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(OperationFailed, match=r"no facts document.*exit 1: SyntaxError"):
        _gather(str(fake), tmp_path)


def _decoy(where: Path) -> Path:
    """A ``vllm/`` package in the login directory, as a user's checkout might be."""
    pkg = where / "vllm"
    (pkg / "model_executor" / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_version.py").write_text("__version__ = version = '6.6.6'\n")
    return pkg


def test_vllm_dir_in_the_login_directory_does_not_shadow_the_installed_one(
    tmp_path: Path,
) -> None:
    decoy = _decoy(tmp_path)  # run_facts runs the script with cwd=tmp_path
    _, facts = run_facts(vllm_tree("0.17.0"), tmp_path)
    assert facts.vllm.path == str((vllm_tree("0.17.0") / "vllm").resolve())
    assert facts.vllm.path != str(decoy.resolve()) and facts.vllm.version == "0.17.0"
    # without an installed vLLM the decoy is not taken for one either
    _, facts = run_facts(None, tmp_path)
    assert not facts.vllm.installed and facts.vllm.path is None


def test_vllm_dir_ignores_the_current_directory_on_its_own(tmp_path: Path) -> None:
    """``_vllm_dir`` itself skips "" and "." (not only ``main``): the same rule as
    fleet.source.FIND_VLLM wherever the function is used."""
    _decoy(tmp_path)
    probe = (
        "import sys\n"
        "sys.path[:0] = ['', '.']\n"
        f"ns = {{'__name__': 'remote_facts'}}\n"
        f"exec(compile(open({str(REMOTE)!r}).read(), 'remote_facts', 'exec'), ns)\n"
        "print(ns['_vllm_dir']())\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(vllm_tree("0.17.0"))}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=60, check=True).stdout.strip()
    assert out == str((vllm_tree("0.17.0") / "vllm").resolve())
