"""Every parser of host output, fed arbitrary JSON-shaped values: it never raises, returns
its model, and one odd part never changes what the other parts say.

A host's user controls what the facts script sees (process command lines, model files,
tool paths), so every ``parse_*`` function of ``fleet.facts.parsers`` is property-tested
with values of any JSON shape, plus near-valid shapes with odd leaves (``--port ²``,
``"line": "x"``, ``Infinity``), plus the recorded sandbox documents with one part replaced.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hostile_support import SCALE, Tally
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.facts import parsers
from fleet.facts.models import (
    DiskUsage,
    Eagle3Allowlist,
    Eagle3ClassInfo,
    GpuInfo,
    HostFacts,
    Supervisors,
    VllmFacts,
    VllmServer,
)

DOCUMENTS = Path(__file__).resolve().parents[1] / "fixtures" / "facts" / "documents"
CATEGORY = "host-output parsers"

ODD_TEXT = ["²", "٣", "１２", "8000²", "-1", "99999", "1e400", "nan", "inf", "0x1f", " 80 "]
ODD_TEXT += ["\x1b[2J", "a\x00b", "\ud800", "x" * 5000, "--api-key", "sk-" + "a" * 30, ""]

leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(ODD_TEXT),
)
KEYS = [
    "pid",
    "ppid",
    "uid",
    "argv",
    "path",
    "version",
    "version_source",
    "files",
    "classes",
    "bases",
    "methods",
    "line",
    "found",
    "entries",
    "file",
    "name",
    "stdout",
    "stderr",
    "exit_code",
    "missing",
    "timeout",
    "tools",
    "pid1",
    "systemd_booted",
    "systemctl",
    "supervisord",
    "supervisorctl",
    "processes",
    "total",
    "used",
    "free",
    "error",
    "value",
    "home",
    "vllm",
    "hostname",
    "executable",
    "SupportsEagle3",
    "DeepseekV2ForCausalLM",
]
json_value = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(
            st.one_of(
                st.text(max_size=8),
                st.sampled_from(KEYS),
            ),
            inner,
            max_size=6,
        ),
    ),
    max_leaves=30,
)


def argv_like() -> st.SearchStrategy[list[Any]]:
    word = st.one_of(
        st.sampled_from(
            [
                "vllm",
                "/env/bin/vllm",
                "serve",
                "-m",
                "vllm.entrypoints.openai",
                "--port",
                "--host",
                "--model",
                "--api-key",
                "M",
                "--port=8000",
            ]
        ),
        st.sampled_from(ODD_TEXT),
        st.text(max_size=10),
        leaf,
    )
    return st.lists(word, max_size=10)


process = st.fixed_dictionaries(
    {},
    optional={"pid": leaf, "ppid": leaf, "uid": leaf, "argv": st.one_of(argv_like(), leaf)},
)
processes = st.lists(st.one_of(process, process, process, json_value), max_size=8)

classes = st.dictionaries(
    st.sampled_from(["DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "Base", "Mid", "X"]),
    st.one_of(
        st.fixed_dictionaries(
            {},
            optional={
                "bases": st.one_of(
                    st.lists(
                        st.sampled_from(
                            ["Base", "Mid", "SupportsEagle3", "interfaces.SupportsEagle3", "X"]
                        )
                    ),
                    leaf,
                ),
                "methods": st.one_of(
                    st.lists(st.sampled_from(["set_aux_hidden_state_layers", "forward"])),
                    leaf,
                ),
                "line": leaf,
            },
        ),
        json_value,
    ),
)
files = st.dictionaries(
    st.text(max_size=10),
    st.one_of(st.fixed_dictionaries({"classes": classes}), json_value),
    max_size=3,
)


def _json_ok(model: Any) -> None:
    text = json.dumps(model.model_dump(mode="json"), allow_nan=False, ensure_ascii=False)
    text.encode("utf-8")  # printable: no lone surrogates


class Check:
    def __init__(self, tally: Tally) -> None:
        self.tally = tally

    def __call__(self, name: str, fn: Any, *args: Any, allowed: tuple[type, ...] = ()) -> Any:
        self.tally.attempt(CATEGORY)
        try:
            return fn(*args)
        except allowed:
            return None
        except Exception as exc:
            self.tally.bad(CATEGORY, "tracebacks", f"{name}: {type(exc).__name__}: {exc}")
            raise


PROPS = settings(
    max_examples=150 * SCALE,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture
def check(tally: Tally) -> Check:
    return Check(tally)


def test_parse_servers_any_processes(check: Check) -> None:
    @settings(PROPS, max_examples=400 * SCALE)
    @given(st.one_of(processes, json_value))
    def one(raw: Any) -> None:
        errors: dict[str, str] = {}
        servers = check("parse_servers", parsers.parse_servers, raw, errors)
        for server in servers:
            assert isinstance(server, VllmServer)
            assert server.port is None or 1 <= server.port <= 65535
            _json_ok(server)
        assert all(isinstance(v, str) for v in errors.values())

    one()


def test_port_unicode_digits_never_fail_the_host(check: Check) -> None:
    for odd in ODD_TEXT:
        raw = [{"pid": 1, "ppid": 0, "uid": 0, "argv": ["vllm", "serve", "M", "--port", odd]}]
        (server,) = check("parse_servers", parsers.parse_servers, raw)
        assert server.port is None or (odd.strip().isascii() and server.port == int(odd))


def test_parse_vllm_and_eagle3_any_values(check: Check) -> None:
    @PROPS
    @given(
        st.one_of(st.fixed_dictionaries({"path": leaf, "version": leaf}), json_value),
        st.one_of(st.fixed_dictionaries({"files": files}), json_value),
        st.one_of(
            st.fixed_dictionaries(
                {
                    "found": st.lists(
                        st.one_of(
                            st.fixed_dictionaries(
                                {},
                                optional={
                                    "entries": st.one_of(st.lists(leaf), leaf),
                                    "file": leaf,
                                    "name": leaf,
                                    "line": leaf,
                                },
                            ),
                            json_value,
                        )
                    )
                }
            ),
            json_value,
        ),
    )
    def one(vllm: Any, models: Any, allowlist: Any) -> None:
        facts = check("parse_vllm", parsers.parse_vllm, vllm, models, allowlist)
        assert isinstance(facts, VllmFacts)
        _json_ok(facts)
        lst = check("parse_allowlist", parsers.parse_allowlist, allowlist)
        assert isinstance(lst, Eagle3Allowlist)
        _json_ok(lst)
        for cls in ("DeepseekV2ForCausalLM", "X"):
            info = check("find_eagle3_class", parsers.find_eagle3_class, models, cls)
            assert info is None or isinstance(info, Eagle3ClassInfo)
            table = models.get("files") if isinstance(models, dict) else None
            for entry in (table or {}).values() if isinstance(table, dict) else []:
                if isinstance(entry, dict) and isinstance(entry.get("classes"), dict):
                    judged = check("eagle3_support", parsers.eagle3_support, entry["classes"], cls)
                    _json_ok(judged)

    one()


def test_inheritance_chains_of_any_length(check: Check) -> None:
    n = 5000  # a recursive walk raised RecursionError here
    table = {f"C{i}": {"bases": [f"C{i + 1}"]} for i in range(n)}
    table[f"C{n}"] = {"bases": ["SupportsEagle3"], "methods": ["set_aux_hidden_state_layers"]}
    info = check("eagle3_support", parsers.eagle3_support, table, "C0")
    assert info.supported and info.forwards_aux_hidden_state_layers
    table[f"C{n}"] = {"bases": ["C0"]}  # a cycle
    assert not check("eagle3_support", parsers.eagle3_support, table, "C0").supported


def test_gpu_parsers_any_values(check: Check) -> None:
    csv_line = st.lists(
        st.one_of(
            st.sampled_from(ODD_TEXT),
            st.text(max_size=8),
            st.sampled_from(["0", "NVIDIA B200", "183359", "[N/A]", "570.1", "1.5", " MiB"]),
        ),
        max_size=7,
    ).map(", ".join)
    csv_text = st.lists(csv_line, max_size=5).map("\n".join)

    @settings(PROPS, max_examples=300 * SCALE)
    @given(
        st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "stdout": st.one_of(csv_text, leaf),
                    "stderr": leaf,
                    "exit_code": leaf,
                    "missing": leaf,
                    "timeout": leaf,
                },
            ),
            json_value,
        ),
        csv_text,
    )
    def one(raw: Any, text: str) -> None:
        gpus, status, error = check("parse_gpu_part", parsers.parse_gpu_part, raw)
        assert status in ("ok", "missing", "failed")
        assert error is None or isinstance(error, str)
        for gpu in gpus:
            assert isinstance(gpu, GpuInfo)
            _json_ok(gpu)
        out = check(
            "parse_nvidia_smi", parsers.parse_nvidia_smi, text, allowed=(parsers.FactsError,)
        )
        for gpu in out or []:
            assert gpu.memory_total_mib is None or math.isfinite(gpu.memory_total_mib)
        check("gpu_summary", parsers.gpu_summary, out or [])
        check("driver_of", parsers.driver_of, out or [])

    one()


def test_supervisors_and_disk_any_values(check: Check) -> None:
    @PROPS
    @given(json_value, json_value)
    def one(sup_raw: Any, disk_raw: Any) -> None:
        sup = check("parse_supervisors", parsers.parse_supervisors, sup_raw)
        assert isinstance(sup, Supervisors)
        _json_ok(sup)
        disk, errors = check("parse_disk", parsers.parse_disk, disk_raw)
        assert all(isinstance(d, DiskUsage) for d in disk.values())
        assert all(isinstance(e, str) for e in errors.values())

    one()
    disk, errors = parsers.parse_disk({"home": {"path": "/h", "total": "x", "used": 1, "free": 2}})
    assert disk == {} and errors == {"disk:home": "unexpected disk usage data from the host"}


def _recorded(version: str) -> dict[str, Any]:
    return json.loads((DOCUMENTS / f"sandbox-{version}.json").read_text())


PART_FIELDS = {
    "host": ["hostname"],
    "python": ["python", "python_executable"],
    "vllm": ["vllm"],
    "models": ["vllm"],
    "allowlist": ["vllm"],
    "gpus": ["gpus", "driver", "nvidia_smi"],
    "supervisors": ["supervisors"],
    "processes": ["servers"],
    "disk": ["disk"],
}


def test_one_odd_part_changes_only_its_own_facts(check: Check) -> None:
    base_doc = _recorded("0.18.0")
    base = parsers.parse_facts(base_doc)

    @settings(PROPS, max_examples=300 * SCALE)
    @given(st.sampled_from(sorted(PART_FIELDS)), json_value, st.booleans())
    def one(part: str, value: Any, as_value: bool) -> None:
        doc = json.loads(json.dumps(base_doc))
        doc["parts"][part] = {"value": value} if as_value else value
        facts = check("parse_facts", parsers.parse_facts, doc)
        assert isinstance(facts, HostFacts)
        _json_ok(facts)
        mine = set(PART_FIELDS[part])
        for field in HostFacts.model_fields:
            if field in mine or field == "errors":
                continue
            assert getattr(facts, field) == getattr(base, field), (part, field)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in facts.errors.items())

    one()


def test_whole_documents_of_any_shape(check: Check) -> None:
    @PROPS
    @given(st.one_of(st.fixed_dictionaries({"parts": json_value}), json_value))
    def one(doc: Any) -> None:
        facts = check("parse_facts", parsers.parse_facts, doc)
        assert isinstance(facts, HostFacts)
        _json_ok(facts)

    one()
