"""The on-host facts script, run LOCALLY (a ``LocalRunner``) against the real vLLM source.

``vllm_tree(version)`` holds the real wheel's ``vllm/`` and ``.dist-info``; putting it on
PYTHONPATH is what a host's site-packages looks like to the script. The command is the
one ``gather_facts`` sends over SSH (``sh -c 'exec PY -'``, the bundle on stdin).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.errors import OperationFailed
from fleet.facts import gather_facts
from fleet.facts.models import EAGLE3_CLASSES, HostFacts
from fleet.facts.parsers import parse_facts
from fleet.inventory import HostSpec
from fleet.sandbox.vllm_source import vllm_tree
from fleet.transport import LocalRunner
from tests.versions import EAGLE3_BOUNDARY, needs_patch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"


def runner(
    pythonpath: Path | None,
    tmp_path: Path,
    *,
    path_dirs: tuple[Path, ...] = (),
    python: str = sys.executable,
) -> LocalRunner:
    env = {
        "PATH": os.pathsep.join([*(str(p) for p in path_dirs), "/usr/bin", "/bin"]),
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
    }
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return LocalRunner(HostSpec(name="local", python=python), cwd=tmp_path, env=env)


def run_facts(
    pythonpath: Path | None,
    tmp_path: Path,
    *,
    path_dirs: tuple[Path, ...] = (),
    python: str = sys.executable,
) -> HostFacts:
    return gather_facts(runner(pythonpath, tmp_path, path_dirs=path_dirs, python=python))


def fake_nvidia_smi(bin_dir: Path, csv_fixture: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "nvidia-smi"
    data = (FIXTURES / "nvidia-smi" / csv_fixture).read_text()
    exe.write_text(f"#!/bin/sh\ncat <<'EOF'\n{data}EOF\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize("version", EAGLE3_BOUNDARY)
def test_real_vllm_tree(version: str, tmp_path: Path) -> None:
    tree = vllm_tree(version)
    fake_nvidia_smi(tmp_path / "bin", "b200x8-idle.csv")
    facts = run_facts(tree, tmp_path, path_dirs=(tmp_path / "bin",))
    assert facts.errors == {}
    assert facts.vllm.installed and facts.vllm.version == version
    assert facts.vllm.version_source == "metadata"
    assert Path(facts.vllm.path or "") == (tree / "vllm").resolve()
    expected = not needs_patch(version)  # upstream gained SupportsEagle3 in 0.18.0
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
    facts = run_facts(vllm_tree(version), tmp_path)
    allow = facts.vllm.eagle3_allowlist
    assert allow is not None and allow.present and allow.name == name
    assert allow.deepseek is deepseek and allow.kimi is deepseek
    assert "llama" in (allow.entries or [])


def test_allowlist_gone_in_025(tmp_path: Path) -> None:
    facts = run_facts(vllm_tree("0.25.0"), tmp_path)
    allow = facts.vllm.eagle3_allowlist
    assert allow is not None and not allow.present and allow.deepseek and allow.kimi
    assert all(facts.vllm.eagle3.values())


def test_kimi_k25_absent_before_015(tmp_path: Path) -> None:
    facts = run_facts(vllm_tree("0.14.0"), tmp_path)
    assert facts.vllm.eagle3["KimiK25ForConditionalGeneration"] is None
    assert facts.vllm.eagle3["DeepseekV3ForCausalLM"] is False


def test_no_nvidia_smi_means_no_gpus_not_an_error(tmp_path: Path) -> None:
    facts = run_facts(vllm_tree("0.17.0"), tmp_path)
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
    facts = run_facts(site, tmp_path)
    assert not marker.exists()
    assert facts.vllm.path == str(pkg.resolve())
    # no .dist-info here: the version falls back to vllm/_version.py, read with ast
    assert (facts.vllm.version, facts.vllm.version_source) == ("0.99.0", "_version.py")
    assert facts.vllm.eagle3["DeepseekV2ForCausalLM"] is True
    assert facts.vllm.eagle3["KimiK25ForConditionalGeneration"] is None


def test_vllm_not_installed(tmp_path: Path) -> None:
    facts = run_facts(None, tmp_path)
    assert not facts.vllm.installed and facts.vllm.eagle3 == {}
    assert "home" in facts.disk and "vllm" not in facts.disk


def test_a_failing_part_does_not_break_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The on-host modules are importable here: run the facts operation in-process."""

    from fleet.onhost import facts as script

    monkeypatch.setattr(sys, "path", [str(vllm_tree("0.18.0")), *sys.path])

    def boom(path: str) -> object:
        raise OSError("disk probe exploded")

    monkeypatch.setattr(os, "statvfs", boom)  # what disk_usage reads
    facts = parse_facts(script.op_facts({}))
    assert facts.errors == {
        "disk:home": "OSError: disk probe exploded",
        "disk:vllm": "OSError: disk probe exploded",
    }
    assert facts.vllm.eagle3["DeepseekV3ForCausalLM"] is True
    monkeypatch.undo()
    monkeypatch.setattr(sys, "path", [str(vllm_tree("0.18.0")), *sys.path])

    def no_name() -> os.uname_result:
        raise RuntimeError("no hostname")

    monkeypatch.setattr(os, "uname", no_name)  # the host name comes from uname()
    facts = parse_facts(script.op_facts({}))
    assert facts.errors == {"host": "RuntimeError: no hostname"} and facts.hostname is None
    assert facts.vllm.version == "0.18.0"


def test_unparsable_model_file_is_reported(tmp_path: Path) -> None:
    site = tmp_path / "site"
    models = site / "vllm" / "model_executor" / "models"
    models.mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (models / "deepseek_v2.py").write_text("class DeepseekV2ForCausalLM(:\n")
    facts = run_facts(site, tmp_path)
    assert "models:model_executor/models/deepseek_v2.py" in facts.errors
    assert facts.vllm.eagle3["DeepseekV2ForCausalLM"] is None


def test_interpreter_path_with_spaces_and_home(tmp_path: Path) -> None:
    odd = tmp_path / "my env's bin" / "py $(touch PWNED) `x`"
    odd.parent.mkdir()
    odd.symlink_to(sys.executable)
    facts = run_facts(vllm_tree("0.17.0"), tmp_path, python=str(odd))
    assert facts.vllm.version == "0.17.0"
    assert not (tmp_path / "PWNED").exists()
    # "~/..." names a path on the host, expanded by the remote shell
    rel = "~/" + str(odd.relative_to(tmp_path))
    facts = run_facts(vllm_tree("0.17.0"), tmp_path, python=rel)
    assert facts.vllm.version == "0.17.0"
    assert not (tmp_path / "PWNED").exists()


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
                capture_output=True,
                text=True,
                timeout=30,
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
    facts = run_facts(vllm_tree("0.18.0"), tmp_path, python=exe)
    assert facts.errors == {}
    assert facts.python is not None and facts.python.startswith(f"3.{minor}.")
    assert facts.vllm.version == "0.18.0"
    assert facts.vllm.eagle3 == {cls: True for cls in EAGLE3_CLASSES}


def _gather(python: str, tmp_path: Path, pythonpath: Path | None = None) -> HostFacts:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return gather_facts(LocalRunner(HostSpec(name="local", python=python), env=env))


def test_gather_facts_locally(tmp_path: Path) -> None:
    facts = _gather(sys.executable, tmp_path, vllm_tree("0.17.0"))
    assert facts.vllm.version == "0.17.0" and facts.vllm.eagle3["DeepseekV2ForCausalLM"] is False


def test_gather_facts_errors_name_the_problem(tmp_path: Path) -> None:
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
    with pytest.raises(OperationFailed, match=r"without an answer \(exit 1\): SyntaxError"):
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
    facts = run_facts(vllm_tree("0.17.0"), tmp_path)
    assert facts.vllm.path == str((vllm_tree("0.17.0") / "vllm").resolve())
    assert facts.vllm.path != str(decoy.resolve()) and facts.vllm.version == "0.17.0"
    # without an installed vLLM the decoy is not taken for one either
    facts = run_facts(None, tmp_path)
    assert not facts.vllm.installed and facts.vllm.path is None
