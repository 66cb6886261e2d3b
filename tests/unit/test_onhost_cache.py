"""The caches that make a second ``fleet inspect`` cheap: the host's cache of what is
derived from vLLM's files (fleet/onhost/vllm_tree.py DerivedCache), the local cache of
built bundles (fleet/onhost/client.py), and the version read from the dist-info without
importlib.metadata (fleet/onhost/_common.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from onhost_harness import answer, run_bundle

from fleet.onhost import _common, client
from fleet.onhost.vllm_tree import (
    DerivedCache,
    allowlists,
    file_digests,
    model_classes,
)

MODEL = "model_executor/models/deepseek_v2.py"
SPEC = "config/speculative.py"


def _tree(root: Path, *, supported: bool = False) -> Path:
    pkg = root / "vllm"
    (pkg / "model_executor" / "models").mkdir(parents=True)
    (pkg / "config").mkdir()
    bases = "nn.Module, SupportsEagle3" if supported else "nn.Module"
    (pkg / MODEL).write_text(f"class DeepseekV2ForCausalLM({bases}):\n    pass\n")
    (pkg / SPEC).write_text('eagle3_target_supported = ["llama"]\n')
    return pkg


def test_a_changed_file_is_derived_again(tmp_path: Path) -> None:
    pkg = _tree(tmp_path)
    cache = DerivedCache("code-1", str(tmp_path / "cache"))
    first = model_classes(str(pkg), cache)
    assert first["files"][MODEL]["classes"]["DeepseekV2ForCausalLM"]["bases"] == ["nn.Module"]
    cache.save()
    # a new process reads the cache: a hit, same answer
    again = DerivedCache("code-1", str(tmp_path / "cache"))
    assert model_classes(str(pkg), again) == first and again.hits == 1
    # the file is rewritten (atomically, as fleet patch does): derived again
    new = pkg / (MODEL + ".new")
    new.write_text("class DeepseekV2ForCausalLM(nn.Module, SupportsEagle3):\n    pass\n")
    os.replace(new, pkg / MODEL)
    third = DerivedCache("code-1", str(tmp_path / "cache"))
    bases = model_classes(str(pkg), third)["files"][MODEL]["classes"]["DeepseekV2ForCausalLM"]
    assert bases["bases"] == ["nn.Module", "SupportsEagle3"] and third.hits == 0


def test_the_cache_is_written_by_the_one_onhost_writer(tmp_path: Path) -> None:
    """A unique temp beside the file, never a guessable name that something planted there
    (a symlink) could redirect: ``fleet.onhost.files.replace_file``."""
    pkg = _tree(tmp_path)
    directory = tmp_path / "cache"
    directory.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    cache = DerivedCache("code-1", str(directory))
    (directory / f"derived.json.{os.getpid()}.tmp").symlink_to(victim)  # the old temp name
    model_classes(str(pkg), cache)
    cache.save()
    assert victim.read_text() == "keep me"
    assert json.loads((directory / "derived.json").read_text())["entries"]
    assert not [p.name for p in directory.iterdir() if "fleet-tmp" in p.name]


def test_two_fleet_versions_on_one_host_keep_their_own_entries(tmp_path: Path) -> None:
    pkg = _tree(tmp_path)
    for code in ("code-old", "code-new"):  # each derives once...
        cache = DerivedCache(code, str(tmp_path / "cache"))
        model_classes(str(pkg), cache)
        assert cache.hits == 0
        cache.save()
    for _round in range(2):  # ...then both hit, used in turn
        for code in ("code-old", "code-new"):
            cache = DerivedCache(code, str(tmp_path / "cache"))
            model_classes(str(pkg), cache)
            assert cache.hits == 1 and not cache.dirty
            cache.save()


def test_an_in_place_edit_of_the_same_size_is_seen(tmp_path: Path) -> None:
    pkg = _tree(tmp_path)
    cache = DerivedCache("c", str(tmp_path / "cache"))
    before = file_digests(str(pkg), cache)[SPEC]["sha256"]
    cache.save()
    path = pkg / SPEC
    st = path.stat()
    time.sleep(0.05)  # past the file system's timestamp tick (a few ms)
    path.write_text('eagle3_target_supported = ["qwen!"]\n')  # same length, same inode
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # even the mtime put back
    later = DerivedCache("c", str(tmp_path / "cache"))
    assert file_digests(str(pkg), later)[SPEC]["sha256"] != before  # the ctime moved


def test_new_code_does_not_trust_old_entries(tmp_path: Path) -> None:
    pkg = _tree(tmp_path)
    old = DerivedCache("old-bundle", str(tmp_path / "cache"))
    allowlists(str(pkg), old)
    old.save()
    new = DerivedCache("new-bundle", str(tmp_path / "cache"))
    assert allowlists(str(pkg), new)["found"][0]["entries"] == ["llama"]
    assert new.hits == 0


@pytest.mark.parametrize("garbage", ["", "{not json", '["a list"]', '{"entries": 3}'])
def test_a_damaged_cache_file_is_ignored(tmp_path: Path, garbage: str) -> None:
    pkg = _tree(tmp_path)
    cdir = tmp_path / "cache"
    cdir.mkdir()
    (cdir / "derived.json").write_text(garbage)
    cache = DerivedCache("c", str(cdir))
    assert allowlists(str(pkg), cache)["found"][0]["entries"] == ["llama"]
    cache.save()
    doc = json.loads((cdir / "derived.json").read_text())
    assert isinstance(doc["entries"], dict) and len(doc["entries"]) == 1
    assert (cdir / "derived.json").stat().st_mode & 0o777 == 0o600


def test_a_cache_that_cannot_be_written_changes_nothing(tmp_path: Path) -> None:
    pkg = _tree(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cache = DerivedCache("c", str(blocker / "cache"))
    assert file_digests(str(pkg), cache)[MODEL]["size"] == (pkg / MODEL).stat().st_size
    cache.save()  # no exception, nothing written
    assert cache.dirty


def _run_facts(home: Path, pkg_root: Path) -> dict[str, Any]:
    """The facts bundle run for real with HOME=home and the tree on its path."""
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(pkg_root)}
    proc = run_bundle("facts", {"op": "facts"}, cwd=home, env=env)
    return dict(answer(proc)["result"]["parts"])


def test_the_facts_bundle_keeps_its_cache_in_the_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    pkg = _tree(tmp_path / "site")
    first = _run_facts(home, tmp_path / "site")
    cached = home / ".cache" / "fleet-onhost" / "derived.json"
    assert cached.is_file()
    assert first["files"]["value"][MODEL]["size"] == (pkg / MODEL).stat().st_size
    (pkg / MODEL).write_text("class DeepseekV2ForCausalLM(nn.Module, SupportsEagle3):\n  x = 1\n")
    second = _run_facts(home, tmp_path / "site")
    classes = second["models"]["value"]["files"][MODEL]["classes"]
    assert "SupportsEagle3" in classes["DeepseekV2ForCausalLM"]["bases"]
    assert second["files"]["value"][MODEL] != first["files"]["value"][MODEL]


def test_bundle_digest_names_the_code(tmp_path: Path) -> None:
    text = client.bundle("facts").text
    line = next(x for x in text.splitlines() if x.startswith(client.DIGEST_NAME))
    digest = line.split("=", 1)[1].strip().strip("'")
    assert len(digest) == 64
    assert client.bundle("patch").text != text
    assert f"{client.DIGEST_NAME} = '{digest}'" not in client.bundle("patch").text


def test_bundle_cache_is_rebuilt_when_a_module_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    onhost = tmp_path / "onhost"
    onhost.mkdir()
    for name in ("_common", "probes"):
        (onhost / f"{name}.py").write_text((client.ONHOST_DIR / f"{name}.py").read_text())
    (onhost / "tiny.py").write_text(
        "from fleet.onhost.probes import disk_usage\n\nOPS = {'x': lambda r: 1}\n"
    )
    monkeypatch.setattr(client, "ONHOST_DIR", onhost)
    monkeypatch.setenv("FLEET_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(client, "_BUNDLES", {})
    first = client.bundle("tiny")
    assert first.modules == ("_common", "probes", "tiny")
    assert (tmp_path / "cache" / "bundles" / "tiny.json").is_file()
    monkeypatch.setattr(client, "_BUNDLES", {})
    assert client.bundle("tiny") == first  # read back from the cache
    (onhost / "tiny.py").write_text("OPS = {'y': lambda r: 2}\n")  # another size
    monkeypatch.setattr(client, "_BUNDLES", {})
    rebuilt = client.bundle("tiny")
    assert rebuilt.modules == ("_common", "tiny") and "'y'" in rebuilt.text


def test_version_from_dist_info_without_importlib_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    (site / "vllm_tools-9.9.dist-info").mkdir(parents=True)  # another project: skipped
    (site / "vllm_tools-9.9.dist-info" / "METADATA").write_text("Name: vllm-tools\nVersion: 9.9\n")
    (site / "vllm-0.17.0.dist-info").mkdir()
    (site / "vllm-0.17.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm\nVersion: 0.17.0\n\nVersion: 1.0 (in the body)\n"
    )
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(site)])
    assert _common.vllm_version(None) == ("0.17.0", "metadata")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing")])
    assert _common._dist_info_version("vllm") is None


def _run_loader(home: Path) -> subprocess.CompletedProcess[bytes]:
    return run_bundle("facts", {"op": "facts"}, cwd=home, env={**os.environ, "HOME": str(home)})


def test_the_hosts_keep_the_bundles_byte_code_and_distrust_a_foreign_file(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    first = _run_loader(home)
    codes = list((home / ".cache" / "fleet-onhost").glob("code-*.bin"))
    assert len(codes) == 1 and codes[0].stat().st_mode & 0o777 == 0o600
    assert client.split_answer(first.stdout)[0] is not None
    # a damaged file is compiled again (and replaced)
    codes[0].write_bytes(b"not marshal data")
    assert client.split_answer(_run_loader(home).stdout)[0] is not None
    assert codes[0].read_bytes() != b"not marshal data"
    # a file others may write is never loaded: a planted code object does not run
    import marshal

    codes[0].write_bytes(marshal.dumps(compile("print('PLANTED')", "x", "exec")))
    codes[0].chmod(0o666)
    third = _run_loader(home)
    assert b"PLANTED" not in third.stdout and client.split_answer(third.stdout)[0] is not None


def test_run_captured_is_subprocess_run_without_subprocess() -> None:
    from fleet.onhost.probes import run_captured

    assert run_captured(["/bin/sh", "-c", "echo out; echo err >&2; exit 3"], 5) == (
        3,
        b"out\n",
        b"err\n",
    )
    assert run_captured(["/bin/sh", "-c", "sleep 5"], 0.2) is None
    assert run_captured(["/bin/sh", "-c", "exec >&- 2>&-; sleep 5"], 0.2) is None
    code, _out, _err = run_captured(["/bin/sh", "-c", "kill -9 $$"], 5) or (0, b"", b"")
    assert code == -9
