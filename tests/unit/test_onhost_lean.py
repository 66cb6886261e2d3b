"""The on-host runtime imports only what a run uses (fleet/onhost/client.py bundling,
fleet/onhost/_common.py): annotations are never evaluated (no typing), the standard
modules a shipped module imports are stand-ins until first used, and JSON goes through
the C accelerator without the json module (which imports re, enum, collections...).

A short run's imports were most of its own time on a host: ~20 ms of CPU per host and per
``fleet inspect`` before (benchmarks/peers.py measures the hosts' CPU)."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from onhost_harness import answer, run_bundle

from fleet.onhost import _common, client
from fleet.sandbox.vllm_source import vllm_tree

# What a warm facts run imported before, and must not import now: each one costs its own
# module and what it pulls in (json -> re -> enum, functools, collections).
HEAVY = {
    "json",
    "re",
    "enum",
    "typing",
    "shutil",
    "importlib.util",
    "threading",
    "ast",
    "hashlib",
    "base64",
    "signal",
    "subprocess",
    "contextlib",
}

VALUES: list[Any] = [
    {},
    [],
    "",
    0,
    -1,
    10**40,
    1.5,
    -0.0,
    1e300,
    float("inf"),
    float("-inf"),
    float("nan"),
    True,
    False,
    None,
    "plain",
    "é ü 漢字 \U0001f600",
    "\ud83d lone surrogate",
    'quote " backslash \\ slash / controls \x00\x01\n\t\x7f',
    {"nested": [{"a": [1, [2, [3, {"b": None}]]]}], "k": "v", "": ""},
    [1, "two", 3.0, [None, True], {"x": []}],
    {"1": 1, "keys": ["order", "is", "kept"], "z": 0, "a": 1},
]


def _same(a: Any, b: Any) -> bool:
    return repr(a) == repr(b) or (
        isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    )


def test_the_codec_is_the_c_accelerator_on_cpython() -> None:
    if sys.implementation.name != "cpython":
        pytest.skip("the C accelerator is CPython's")
    assert isinstance(_common._json_codec(), _common._CJson)


@pytest.mark.parametrize("value", VALUES, ids=lambda v: repr(v)[:30])
def test_dumps_and_loads_are_the_json_modules(value: Any) -> None:
    text = _common.dumps(value)
    assert text == json.dumps(value)
    assert _same(_common.loads(text), json.loads(text))
    assert _same(_common.loads(text.encode("utf-8")), value)
    assert _same(_common.decode(_common.encode(value)), value)


@pytest.mark.parametrize(
    "text",
    ["", "   ", "{", '{"a": 1} x', "[1,]", '"unterminated', '"raw\ncontrol"', "nul", "01"],
)
def test_malformed_json_is_a_value_error_as_in_the_json_module(text: str) -> None:
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        _common.loads(text)


def test_what_json_cannot_hold_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        _common.dumps({"a": {1, 2}})
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match=r"[Cc]ircular"):
        _common.dumps(loop)
    assert _common.dumps([1]) == "[1]"  # the failed call left nothing behind


def _facts_run(home: Path) -> tuple[dict[str, Any], set[str]]:
    """One real run of the facts bundle on vLLM 0.17.0's real source (its loader, byte-code
    cache and derived cache in ``home``): the answer and the modules it imported."""
    env = {
        **os.environ,
        "HOME": str(home),
        "PYTHONPATH": str(vllm_tree("0.17.0")),
        "PYTHONPROFILEIMPORTTIME": "1",
    }
    proc = run_bundle("facts", {"op": "facts"}, cwd=home, env=env)
    doc = answer(proc)
    assert "result" in doc, doc
    imported = set()
    for line in proc.stderr.decode().splitlines():
        if line.startswith("import time:") and "|" in line:
            imported.add(line.rsplit("|", 1)[1].strip())
    return doc["result"], imported


def test_a_warm_facts_run_imports_only_what_it_uses(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    cold, cold_imports = _facts_run(home)
    warm, warm_imports = _facts_run(home)
    assert "ast" in cold_imports  # the first run parses vLLM's files: the stand-in worked
    assert warm_imports, "no import profile: the test would prove nothing"
    assert not warm_imports & HEAVY, sorted(warm_imports & HEAVY)
    assert warm["parts"].keys() == cold["parts"].keys()
    assert warm["parts"]["vllm"] == cold["parts"]["vllm"]
    assert warm["parts"]["vllm"]["value"]["version"] == "0.17.0"
    assert warm["parts"]["models"]["value"] == cold["parts"]["models"]["value"]


def _tiny_onhost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> None:
    onhost = tmp_path / "onhost"
    onhost.mkdir()
    (onhost / "_common.py").write_text((client.ONHOST_DIR / "_common.py").read_text())
    (onhost / "tiny.py").write_text(source)
    monkeypatch.setattr(client, "ONHOST_DIR", onhost)
    monkeypatch.setenv("FLEET_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(client, "_BUNDLES", {})


def test_a_typing_name_used_outside_an_annotation_is_refused_when_bundling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tiny_onhost(
        tmp_path,
        monkeypatch,
        "from typing import Dict, cast\n\n"
        "def op(request: Dict[str, int]) -> Dict[str, int]:\n"
        "    return cast(Dict[str, int], request)\n\n"
        "OPS = {'x': op}\n",
    )
    with pytest.raises(RuntimeError, match=r"tiny\.py:4: 'cast' from typing is used outside"):
        client.bundle("tiny")


def test_a_standard_module_is_imported_where_it_is_first_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tiny_onhost(
        tmp_path,
        monkeypatch,
        "import colorsys\nimport sys\nfrom typing import Any, Dict\n\n"
        "def op(request: Dict[str, Any]) -> Dict[str, Any]:\n"
        "    before = 'colorsys' in sys.modules\n"
        "    return {'before': before, 'hsv': list(colorsys.rgb_to_hsv(1.0, 0.0, 0.0)),\n"
        "            'after': 'colorsys' in sys.modules}\n\n"
        "OPS = {'x': op}\n",
    )
    text = client.bundle("tiny").text
    assert "colorsys = _FleetModule('colorsys')" in text and "\nimport colorsys" not in text
    doc = answer(run_bundle("tiny", {"op": "x"}, cwd=tmp_path))
    assert doc["result"] == {"before": False, "hsv": [0.0, 1.0, 1.0], "after": True}


def test_frames_hand_every_request_over_in_order() -> None:
    """The conversation's hand-over (a queue without threading): one thread puts, one
    gets; nothing is lost, duplicated or reordered, whether the getter waits or not."""
    import random
    import threading
    import time

    frames = _common.Frames()
    sent = [str(i) for i in range(3000)]

    def producer() -> None:
        rng = random.Random(7)
        for item in sent:
            frames.put(item)
            if rng.random() < 0.01:
                time.sleep(0.001)  # let the getter catch up and wait
        frames.put(None)

    thread = threading.Thread(target=producer)
    thread.start()
    got = []
    while (item := frames.get()) is not None:
        got.append(item)
        if len(got) % 500 == 0:
            time.sleep(0.01)  # let several pile up
    thread.join()
    assert got == sent and frames.items == [] and frames.ready.locked()


def test_a_name_that_shadows_a_lazy_module_is_refused_when_bundling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tiny_onhost(
        tmp_path,
        monkeypatch,
        "def signal(request):\n    return {}\n\nOPS = {'x': signal}\n",  # _common imports signal
    )
    with pytest.raises(RuntimeError, match=r"tiny\.py defines 'signal', the name of a standard"):
        client.bundle("tiny")
