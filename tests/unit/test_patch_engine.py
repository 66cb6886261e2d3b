"""The pure patch engine on the REAL files of several vLLM versions (cached wheels)."""

from __future__ import annotations

import ast
import difflib
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from fleet.errors import UsageError
from fleet.patching.engine import HostPlan, closest_lines, plan_host, sha256_text
from fleet.patching.manifest import DEFAULT_PATCH_SET, PatchSet, load_patch_set
from fleet.patching.versions import Version, VersionRange
from fleet.sandbox.vllm_source import vllm_file
from tests.versions import PATCH_ENGINE, PATCHED

DS = "model_executor/models/deepseek_v2.py"
KIMI = "model_executor/models/kimi_k25.py"
EAGLE = "v1/spec_decode/eagle.py"
SPEC = "config/speculative.py"
CFG = "config/__init__.py"

VERSIONS = list(PATCH_ENGINE)

# What the patch set must do per version (from reading each version's source; see
# templates/patches/eagle3-deepseek/README.md): kimi_k25.py exists from 0.15, the
# EAGLE proposer needs the Kimi branch where Kimi exists, the allowlist lives in
# config/__init__.py before 0.11 and in config/speculative.py after; 0.18 has it all.
EXPECTED_TABLE = """
version   deepseek_v2.py  kimi_k25.py  eagle.py  speculative.py  config/__init__.py
0.10.2    apply           -            -         -               apply
0.11.0    apply           -            -         apply           -
0.13.0    apply           -            -         apply           -
0.15.0    apply           apply        apply     apply           -
0.16.0    apply           apply        apply     apply           -
0.17.0    apply           apply        apply     apply           -
0.18.0    -               -            -         -               -
"""
EXPECTED = {
    row.split()[0]: {
        path: ("would-apply" if cell == "apply" else "not-needed")
        for path, cell in zip([DS, KIMI, EAGLE, SPEC, CFG], row.split()[1:], strict=True)
    }
    for row in EXPECTED_TABLE.strip().splitlines()[1:]
}


@pytest.fixture(scope="module")
def patch_set() -> PatchSet:
    return load_patch_set(DEFAULT_PATCH_SET)


def real_texts(patch_set: PatchSet, version: str) -> dict[str, str | None]:
    texts: dict[str, str | None] = {}
    for spec in patch_set.manifest.files:
        path = vllm_file(version, spec.path)
        texts[spec.path] = path.read_text(encoding="utf-8") if path.exists() else None
    return texts


def applied(plan: HostPlan) -> dict[str, str | None]:
    return {f.path: (f.new_text if f.new_text is not None else f.original) for f in plan.files}


@pytest.mark.parametrize("version", VERSIONS)
def test_statuses_on_real_files(patch_set: PatchSet, version: str) -> None:
    plan = plan_host(patch_set, version, real_texts(patch_set, version))
    got = {f.path: f.status for f in plan.files}
    assert got == EXPECTED[version], [f.conflict.describe() for f in plan.files if f.conflict]
    assert plan.ok


@pytest.mark.parametrize("version", VERSIONS)
def test_apply_twice_is_identity_and_parses(patch_set: PatchSet, version: str) -> None:
    texts = real_texts(patch_set, version)
    first = plan_host(patch_set, version, texts)
    patched = applied(first)
    for f in first.files:
        if f.status == "would-apply":
            assert f.new_text is not None and f.new_text != f.original
            ast.parse(f.new_text, filename=f.path)
            # only the text matched by `replace` anchors is removed; everything else stays
            assert _removed_lines(f.original or "", f.new_text) <= _replaced_lines(
                patch_set, f.path, f.original or ""
            )
    second = plan_host(patch_set, version, patched)
    for f in second.files:
        before = next(x for x in first.files if x.path == f.path)
        want = "already-applied" if before.status == "would-apply" else before.status
        assert f.status == want, f.path
        assert f.new_text is None or f.new_text == f.original
        assert applied(second)[f.path] == patched[f.path]
    assert second.to_write == []


def _removed_lines(before: str, after: str) -> set[int]:
    matcher = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines(), autojunk=False)
    removed: set[int] = set()
    for tag, i1, i2, _j1, _j2 in matcher.get_opcodes():
        if tag in ("replace", "delete"):
            removed.update(range(i1 + 1, i2 + 1))
    return removed


def _replaced_lines(patch_set: PatchSet, path: str, text: str) -> set[int]:
    spec = next(s for s in patch_set.manifest.files if s.path == path)
    lines: set[int] = set()
    for edit in spec.edits:
        if edit.action != "replace":
            continue
        for m in re.finditer(edit.anchor, text, re.MULTILINE):
            first = text.count("\n", 0, m.start()) + 1
            last = text.count("\n", 0, m.end() - 1) + 1
            lines.update(range(first, last + 1))
    return lines


@pytest.mark.parametrize("version", PATCHED)
def test_patched_source_has_the_interface(patch_set: PatchSet, version: str) -> None:
    """Structure, read with ast: bases, imports, methods, the enumerate(start=...) loop."""
    new = applied(plan_host(patch_set, version, real_texts(patch_set, version)))
    tree = ast.parse(new[DS] or "")
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    bases = [ast.unparse(b) for b in classes["DeepseekV2ForCausalLM"].bases]
    assert bases[-1] == "SupportsEagle3" and bases[0] == "nn.Module"
    methods = {
        n.name for n in classes["DeepseekV2ForCausalLM"].body if isinstance(n, ast.FunctionDef)
    }
    assert {"set_aux_hidden_state_layers", "get_eagle3_aux_hidden_state_layers"} <= methods
    imported = {a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert "SupportsEagle3" in imported
    forward = next(
        n
        for n in classes["DeepseekV2Model"].body
        if isinstance(n, ast.FunctionDef) and n.name == "forward"
    )
    loops = [n for n in ast.walk(forward) if isinstance(n, ast.For)]
    assert len(loops) == 1
    call = loops[0].iter
    assert isinstance(call, ast.Call) and ast.unparse(call.func) == "enumerate"
    assert [ast.unparse(k.value) for k in call.keywords if k.arg == "start"] == ["self.start_layer"]
    if new[KIMI] is not None:
        kimi = next(
            n
            for n in ast.parse(new[KIMI]).body
            if isinstance(n, ast.ClassDef) and n.name == "KimiK25ForConditionalGeneration"
        )
        assert ast.unparse(kimi.bases[-1]) == "SupportsEagle3"
    allowlist_file = SPEC if Version(version) >= Version("0.11") else CFG
    allow = re.search(
        r"(?:eagle3_target_supported|aux_hidden_states_supported) = (\[[^\]]*\])",
        new[allowlist_file] or "",
    )
    assert allow is not None
    entries = ast.literal_eval(allow.group(1))
    for model_type in ("deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_k25"):
        assert any(e in model_type for e in entries), model_type
    assert "llama" in entries  # nothing removed


def test_kimi_shapes_are_facts(patch_set: PatchSet) -> None:
    p15 = plan_host(patch_set, "0.15.0", real_texts(patch_set, "0.15.0"))
    p17 = plan_host(patch_set, "0.17.0", real_texts(patch_set, "0.17.0"))
    assert p15.facts["kimi_language_model"] == "bare_model"
    assert p17.facts["kimi_language_model"] == "causal_lm"
    k15 = next(f for f in p15.files if f.path == KIMI).new_text or ""
    k17 = next(f for f in p17.files if f.path == KIMI).new_text or ""
    assert "self.language_model.aux_hidden_state_layers = tuple(layers)" in k15
    assert "self.language_model.set_aux_hidden_state_layers(layers)" in k17
    e15 = next(f for f in p15.files if f.path == EAGLE)
    e17 = next(f for f in p17.files if f.path == EAGLE)
    assert e15.edits == ["kimi-image-token", "kimi-language-model-view"]
    assert e17.edits == ["kimi-image-token"]


def test_hand_edited_file_is_a_conflict_with_candidates(patch_set: PatchSet) -> None:
    """The hand-made patch of the story: enumerate over the slice, without start=."""
    texts = real_texts(patch_set, "0.17.0")
    original = texts[DS] or ""
    hand = original.replace(
        "for layer in islice(self.layers, self.start_layer, self.end_layer):",
        "for i, layer in enumerate(islice(self.layers, self.start_layer, self.end_layer)):",
    )
    assert hand != original
    texts[DS] = hand
    plan = plan_host(patch_set, "0.17.0", texts)
    assert not plan.ok
    ds = next(f for f in plan.files if f.path == DS)
    assert ds.status == "conflict" and ds.new_text is None
    assert ds.conflict is not None
    assert ds.conflict.edit == "model-loop" and ds.conflict.matches == 0
    assert ds.conflict.scope == "DeepseekV2Model.forward"
    assert "anchor not found" in ds.conflict.describe()
    best = ds.conflict.candidates[0]
    assert "enumerate(islice(self.layers" in best.text
    assert (hand.splitlines()[best.line - 1]).rstrip() == best.text
    # the other files are still planned, but the host is not ok: nothing may be written
    assert any(f.status == "would-apply" for f in plan.files)


def test_duplicate_anchor_is_a_conflict(patch_set: PatchSet) -> None:
    texts = real_texts(patch_set, "0.13.0")
    text = texts[DS] or ""
    line = "        hidden_states, _ = self.norm(hidden_states, residual)\n"
    assert text.count(line) == 1
    texts[DS] = text.replace(line, line + line)
    plan = plan_host(patch_set, "0.13.0", texts)
    ds = next(f for f in plan.files if f.path == DS)
    assert ds.status == "conflict" and ds.conflict is not None
    assert ds.conflict.edit == "model-return" and ds.conflict.matches == 2
    assert len(ds.conflict.candidates) == 2
    assert "matched 2 times" in ds.conflict.reason


def test_partially_applied_file_is_a_conflict(patch_set: PatchSet) -> None:
    texts = real_texts(patch_set, "0.16.0")
    new = applied(plan_host(patch_set, "0.16.0", texts))
    ds = new[DS] or ""
    # drop the import edit only
    ds = "\n".join(ln for ln in ds.splitlines() if "eagle3-deepseek/import" not in ln) + "\n"
    new[DS] = ds
    plan = plan_host(patch_set, "0.16.0", new)
    f = next(f for f in plan.files if f.path == DS)
    assert f.status == "conflict" and f.conflict is not None
    assert "partially applied" in f.conflict.reason and f.conflict.edit == "import"


def test_missing_scope_is_a_conflict(patch_set: PatchSet) -> None:
    texts = real_texts(patch_set, "0.11.0")
    texts[DS] = (texts[DS] or "").replace("class DeepseekV2Model(", "class DeepseekV2ModelX(")
    f = next(f for f in plan_host(patch_set, "0.11.0", texts).files if f.path == DS)
    assert f.status == "conflict" and f.conflict is not None
    assert "scope DeepseekV2Model.__init__ not found" in f.conflict.reason
    assert any("DeepseekV2ModelX" in c.text for c in f.conflict.candidates)


def test_unknown_kimi_shape_is_a_conflict(patch_set: PatchSet) -> None:
    texts = real_texts(patch_set, "0.16.0")
    texts[KIMI] = (texts[KIMI] or "").replace('"DeepseekV2ForCausalLM"', '"SomethingElse"')
    plan = plan_host(patch_set, "0.16.0", texts)
    f = next(f for f in plan.files if f.path == KIMI)
    assert f.status == "conflict" and f.conflict is not None
    assert "kimi_language_model" in f.conflict.reason
    assert not plan.ok


def test_versions_outside_the_range(patch_set: PatchSet) -> None:
    texts = real_texts(patch_set, "0.11.0")
    old = plan_host(patch_set, "0.9.2", texts)
    assert {f.status for f in old.files} == {"conflict"} and not old.ok
    assert "outside the versions" in (old.files[0].conflict.reason if old.files[0].conflict else "")
    assert {f.status for f in plan_host(patch_set, "0.18.0rc1", texts).files} == {"not-needed"}
    assert {f.status for f in plan_host(patch_set, "0.33.0", texts).files} == {"not-needed"}
    bad = plan_host(patch_set, "not-a-version", texts)
    assert {f.status for f in bad.files} == {"conflict"}
    # a local build label does not matter
    assert plan_host(patch_set, "0.11.0+cu128", texts).ok


def test_missing_required_file_is_a_conflict(patch_set: PatchSet) -> None:
    texts = real_texts(patch_set, "0.13.0")
    texts[DS] = None
    f = next(f for f in plan_host(patch_set, "0.13.0", texts).files if f.path == DS)
    assert f.status == "conflict" and f.conflict is not None
    assert f.conflict.reason == "file not found"


def test_diff_is_unified_and_names_the_file(patch_set: PatchSet) -> None:
    plan = plan_host(patch_set, "0.15.0", real_texts(patch_set, "0.15.0"))
    f = next(f for f in plan.files if f.path == EAGLE)
    diff = f.diff()
    assert diff.startswith(f"--- a/vllm/{EAGLE}\n+++ b/vllm/{EAGLE}\n@@ ")
    added = [ln[1:] for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert any("media_placeholder_token_id" in ln for ln in added)
    assert not [ln for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    assert f.sha256_before == sha256_text(f.original or "")
    assert f.sha256_after == sha256_text(f.new_text or "")


def test_closest_lines_ranks_by_similarity() -> None:
    text = "alpha = 1\nfor layer in range(3):\n    pass\nfor x in islice(a, b, c):\n"
    best = closest_lines(text, "for layer in islice(a, b, c):", n=2)
    assert [c.line for c in best] == [4, 2]


# -- manifests --------------------------------------------------------------------------


def _write_set(root: Path, manifest: str, templates: dict[str, str]) -> None:
    d = root / "demo"
    d.mkdir(parents=True)
    (d / "manifest.yaml").write_text(textwrap.dedent(manifest))
    for name, body in templates.items():
        (d / name).write_text(body)


MINI = """
    name: demo
    description: test
    versions: ">=1.0,<2"
    files:
      - path: pkg/mod.py
        edits:
          - id: hello
            scope: Greeter.greet
            anchor: '^(?P<indent>[ ]+)return "hi"\\n'
            action: insert_before
            template: hello.j2
"""

GREETER = 'class Greeter:\n    def greet(self):\n        return "hi"\n'


def test_a_small_patch_set_end_to_end(tmp_path: Path) -> None:
    template = '{{ m.indent }}print("v{{ version }}")  # {{ marker }}\n'
    _write_set(tmp_path, MINI, {"hello.j2": template})
    ps = load_patch_set("demo", root=tmp_path)
    src = GREETER + '\ndef greet():\n    return "hi"\n'
    plan = plan_host(ps, "1.2", {"pkg/mod.py": src})
    f = plan.files[0]
    assert f.status == "would-apply"
    assert f.new_text == src.replace(
        '        return "hi"', '        print("v1.2")  # fleet: demo/hello\n        return "hi"', 1
    )
    again = plan_host(ps, "1.2", {"pkg/mod.py": f.new_text})
    assert again.files[0].status == "already-applied"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(name="Bad Name"), "bad patch set name"),
        (lambda d: d.update(versions=">=banana"), "bad version range"),
        (lambda d: d["files"][0].update(path="../etc/passwd.py"), "bad vLLM file path"),
        (lambda d: d["files"][0]["edits"][0].update(anchor="(unclosed"), "bad regular expression"),
        (lambda d: d["files"][0]["edits"][0].update(action="explode"), "action"),
        (lambda d: d["files"][0]["edits"][0].update(template="nope.j2"), "not found"),
        (lambda d: d.update(surprise=1), "surprise"),
    ],
)
def test_bad_manifests_are_usage_errors(tmp_path: Path, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    data = yaml.safe_load(textwrap.dedent(MINI))
    mutate(data)
    _write_set(tmp_path, yaml.safe_dump(data), {"hello.j2": "# {{ marker }}\n"})
    with pytest.raises(UsageError, match=message):
        load_patch_set("demo", root=tmp_path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # PyYAML's safe_load lets the second `versions` win without a word
        (MINI + '    versions: ">=0"\n', r"manifest.yaml: invalid YAML \(line \d+, column \d+\)"),
        (MINI.replace("name: demo", "name: &a [*a]"), "invalid YAML"),
        ("x: " + "[" * 100 + "]" * 100 + "\n", "invalid YAML"),
    ],
)
def test_manifests_are_read_by_the_bounded_yaml_loader(
    tmp_path: Path, text: str, message: str
) -> None:
    _write_set(tmp_path, textwrap.dedent(text), {"hello.j2": "# {{ marker }}\n"})
    with pytest.raises(UsageError, match=message) as err:
        load_patch_set("demo", root=tmp_path)
    assert "\n" not in str(err.value)


def test_template_without_marker_is_refused(tmp_path: Path) -> None:
    _write_set(tmp_path, MINI, {"hello.j2": "{{ m.indent }}pass\n"})
    ps = load_patch_set("demo", root=tmp_path)
    with pytest.raises(UsageError, match="marker"):
        plan_host(ps, "1.0", {"pkg/mod.py": GREETER})


def test_unknown_patch_set_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match=r"unknown patch set 'nope' \(available: .*eagle3-deep"):
        load_patch_set("nope")
    with pytest.raises(UsageError):
        load_patch_set("../eagle3-deepseek")


# -- versions ---------------------------------------------------------------------------


def test_version_ordering() -> None:
    order = [
        "0.10.2",
        "0.11.0rc1",
        "0.11.0",
        "0.11.0.post1",
        "0.11.1.dev3",
        "0.11.1",
        "0.17.9",
        "0.18.0.dev1",
        "0.18.0rc1",
        "0.18.0",
        "1.0",
    ]
    parsed = [Version(v) for v in order]
    assert parsed == sorted(parsed)
    assert Version("0.11") == Version("0.11.0") == Version("0.11.0+cu128")
    with pytest.raises(ValueError):
        Version("x.y")


@pytest.mark.parametrize(
    ("version", "inside"),
    [
        ("0.10.1", False),
        ("0.10.2", True),
        ("0.11.0+cu128", True),
        ("0.17.1", True),
        ("0.17.9rc2", True),
        ("0.18.0rc1", False),
        ("0.18.0.dev5", False),
        ("0.18.0", False),
    ],
)
def test_version_range(version: str, inside: bool) -> None:
    assert (version in VersionRange(">=0.10.2,<0.18")) is inside
