"""Behavioural test: run the PATCHED vLLM code itself, with stand-ins instead of torch.

``DeepseekV2Model.forward``, the ``self.aux_hidden_state_layers`` line of its
``__init__``, ``DeepseekV2ForCausalLM``'s new methods and forward,
``KimiK25ForConditionalGeneration``'s new methods and forward, and the Kimi-K2.5 part
of the EAGLE proposer's ``load_model`` are taken from the patched source with ``ast``,
compiled on their own and executed with plain Python objects:

- "tensors" are :class:`Val` objects whose value is a readable name (``h4``, ``h4+r4``),
- decoder layers record their input and return ``(h<i>, r<i>)``,
- ``get_pp_group()`` says which pipeline rank this is (first/last),
- layers outside ``start_layer .. end_layer - 1`` explode when called (PPMissingLayer).

Each scenario checks that what the patched forward captured (read from its frame when it
returns) are exactly the inputs of the requested GLOBAL layers owned by the rank, and what
it returns (``(hidden, aux)`` only on the last rank and only when aux layers are set).
A negative control runs the same checks on the hand-made variant without
``start=self.start_layer`` and shows that they catch it. ``pytest -s`` prints the traces.
"""

from __future__ import annotations
import __future__

import ast
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import pytest

from fleet.onhost.families import version_tuple
from fleet.patching.engine import plan_host
from fleet.patching.manifest import load_patch_set
from fleet.sandbox.vllm_source import vllm_file
from tests.versions import KIMI_K25_SINCE, PATCHED, PATCHED_KIMI_K25

PATCHED_VERSIONS = list(PATCHED)
DS = "model_executor/models/deepseek_v2.py"
KIMI = "model_executor/models/kimi_k25.py"
EAGLE = "v1/spec_decode/eagle.py"
IFACES = "model_executor/models/interfaces.py"


# -- sources ----------------------------------------------------------------------------

_SOURCES: dict[str, dict[str, str | None]] = {}


def patched_sources(version: str) -> dict[str, str | None]:
    if version not in _SOURCES:
        ps = load_patch_set()
        texts: dict[str, str | None] = {}
        for spec in ps.manifest.files:
            path = vllm_file(version, spec.path)
            texts[spec.path] = path.read_text(encoding="utf-8") if path.exists() else None
        plan = plan_host(ps, version, texts)
        assert plan.ok, [c.describe() for c in plan.conflicts]
        _SOURCES[version] = {
            f.path: f.new_text if f.new_text is not None else f.original for f in plan.files
        }
    return _SOURCES[version]


def original_source(version: str, relpath: str) -> str:
    return vllm_file(version, relpath).read_text(encoding="utf-8")


def find_def(tree: ast.Module, dotted: str) -> ast.FunctionDef | ast.ClassDef:
    body: list[ast.stmt] = tree.body
    node: ast.FunctionDef | ast.ClassDef | None = None
    for part in dotted.split("."):
        node = next(
            (n for n in body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == part),
            None,
        )
        assert node is not None, f"{dotted}: {part} not found"
        body = node.body
    assert node is not None
    return node


def compile_nodes(nodes: list[ast.stmt], namespace: dict[str, Any], filename: str) -> None:
    """Compile statements on their own (annotations stay unevaluated: no torch needed)."""
    module = ast.Module(body=nodes, type_ignores=[])
    ast.fix_missing_locations(module)
    code = compile(
        module, filename, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True
    )
    exec(code, namespace)


def load_function(source: str, dotted: str, namespace: dict[str, Any], filename: str) -> Any:
    node = find_def(ast.parse(source), dotted)
    assert isinstance(node, ast.FunctionDef)
    node.decorator_list = []
    compile_nodes([node], namespace, filename)
    return namespace[node.name]


def make_function(name: str, params: list[str], body: list[ast.stmt]) -> ast.FunctionDef:
    """A new ``def name(params): body`` around statements taken from a real file."""
    node = ast.FunctionDef(
        name=name,
        args=ast.arguments(
            posonlyargs=[],
            args=[ast.arg(p) for p in params],
            kwonlyargs=[],
            kw_defaults=[],
            defaults=[],
        ),
        body=body,
        decorator_list=[],
        returns=None,
    )
    node.type_params = []  # type: ignore[attr-defined]
    node.lineno, node.col_offset = body[0].lineno, 0
    node.end_lineno, node.end_col_offset = body[-1].end_lineno, 0
    for arg in node.args.args:
        ast.copy_location(arg, node)
    return node


# -- stand-ins --------------------------------------------------------------------------


class Val:
    """A stand-in tensor: its value is the name of what produced it."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __add__(self, other: Val) -> Val:
        assert isinstance(other, Val), f"adding {other!r} to {self!r}"
        return Val(f"{self.name}+{other.name}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Val) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return self.name


def input_of(g: int) -> Val:
    """What a decoder layer at global index g receives as hidden_states + residual."""
    return Val("emb") if g == 0 else Val(f"h{g - 1}+r{g - 1}")


class IntermediateTensors:
    def __init__(self, tensors: dict[str, Any]) -> None:
        self.tensors = tensors

    def __getitem__(self, key: str) -> Any:
        return self.tensors[key]


@dataclass
class PPGroup:
    is_first_rank: bool
    is_last_rank: bool
    world_size: int = 1


class Layer:
    def __init__(self, index: int, log: list[tuple[int, Any, Any]]) -> None:
        self.index, self.log = index, log

    def __call__(
        self, positions: Any, hidden_states: Val, residual: Val | None, *extra: Any
    ) -> tuple[Val, Val]:
        self.log.append((self.index, hidden_states, residual))
        return Val(f"h{self.index}"), Val(f"r{self.index}")


class MissingLayer:
    """vLLM's PPMissingLayer: a layer of another pipeline rank; must never be called."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("called a layer owned by another pipeline rank")


class Norm:
    def __call__(self, hidden_states: Val, residual: Val) -> tuple[Val, Val]:
        return Val(f"norm({hidden_states.name}+{residual.name})"), residual


class FakeDeepseekV2Model:
    """The attributes DeepseekV2Model.forward reads; forward itself is the patched one."""

    def __init__(self, num_layers: int, start: int, end: int) -> None:
        self.log: list[tuple[int, Any, Any]] = []
        self.layers = [
            Layer(i, self.log) if start <= i < end else MissingLayer() for i in range(num_layers)
        ]
        self.start_layer, self.end_layer = start, end
        self.norm = Norm()
        self.config = types.SimpleNamespace()  # no llama_4_scaling

    def get_input_embeddings(self, input_ids: Any) -> Val:  # vLLM <= 0.11
        return Val("emb")

    def embed_input_ids(self, input_ids: Any) -> Val:  # vLLM >= 0.12
        return Val("emb")


@dataclass
class Harness:
    """The patched pieces of one vLLM version, compiled against the stand-ins."""

    version: str
    pp: PPGroup = field(default_factory=lambda: PPGroup(True, True))
    model_cls: type = FakeDeepseekV2Model
    causal_lm_cls: type = object
    kimi_cls: type | None = None
    supports_eagle3: Callable[[object], bool] = lambda m: False
    protocol: type | None = None

    @classmethod
    def build(cls, version: str, deepseek_source: str | None = None) -> Harness:
        src = patched_sources(version)
        ds = deepseek_source if deepseek_source is not None else src[DS] or ""
        h = cls(version)
        ns: dict[str, Any] = {
            "get_pp_group": lambda: h.pp,
            "IntermediateTensors": IntermediateTensors,
            "islice": islice,
            "_get_llama_4_scaling": None,
        }
        fname = f"vllm-{version}/{DS}"
        forward = load_function(ds, "DeepseekV2Model.forward", ns, fname)
        init = find_def(ast.parse(ds), "DeepseekV2Model.__init__")
        init_lines = [
            s
            for s in init.body
            if isinstance(s, ast.Assign)
            and any(
                isinstance(t, ast.Attribute) and t.attr == "aux_hidden_state_layers"
                for t in s.targets
            )
        ]
        assert len(init_lines) == 1, "DeepseekV2Model.__init__ must set aux_hidden_state_layers"
        compile_nodes([make_function("_init_aux", ["self"], list(init_lines))], ns, fname)
        init_aux = ns["_init_aux"]

        def model_init(self: FakeDeepseekV2Model, num_layers: int, start: int, end: int) -> None:
            FakeDeepseekV2Model.__init__(self, num_layers, start, end)
            init_aux(self)  # the patched line of DeepseekV2Model.__init__

        h.model_cls = type(
            "DeepseekV2Model",
            (FakeDeepseekV2Model,),
            {
                "__init__": model_init,
                "forward": forward,
                "__call__": lambda self, *a, **k: self.forward(*a, **k),
            },
        )

        # the real interface classes of this version (SupportsEagle3, SupportsPP,
        # SupportsMultiModal, ...), so that the patched class statements are built with
        # their real bases (a consistent MRO) and checked with vLLM's supports_eagle3()
        interfaces = Interfaces(version)
        protocol = interfaces.get("SupportsEagle3")
        assert protocol is not None
        h.protocol = protocol
        h.supports_eagle3 = lambda m: isinstance(m, protocol)

        def class_from(source: str, name: str, methods: list[str], base_ns: dict[str, Any]) -> type:
            node = find_def(ast.parse(source), name)
            assert isinstance(node, ast.ClassDef)
            bases: list[type] = []
            for b in node.bases:
                text = ast.unparse(b)
                real = interfaces.get(text)
                bases.append(real or type(text.replace(".", "_"), (), {}))
            body: dict[str, Any] = {}
            for meth in methods:
                body[meth] = load_function(
                    source, f"{name}.{meth}", base_ns, f"vllm-{version}/{name}"
                )
            body["__call__"] = lambda self, *a, **k: self.forward(*a, **k)
            return type(name, tuple(bases), body)

        h.causal_lm_cls = class_from(
            ds,
            "DeepseekV2ForCausalLM",
            ["set_aux_hidden_state_layers", "get_eagle3_aux_hidden_state_layers", "forward"],
            ns,
        )
        if src[KIMI] is not None:
            h.kimi_cls = class_from(
                src[KIMI] or "",
                "KimiK25ForConditionalGeneration",
                ["set_aux_hidden_state_layers", "get_eagle3_aux_hidden_state_layers", "forward"],
                dict(ns),
            )
        return h

    def deepseek(self, num_layers: int, start: int, end: int) -> Any:
        lm = object.__new__(self.causal_lm_cls)  # no __init__ (and no SupportsQuant.__new__)
        lm.model = self.model_cls(num_layers, start, end)
        return lm


class _Anything:
    """A permissive stand-in for torch & co. inside class bodies of interfaces.py."""

    def __getattr__(self, name: str) -> _Anything:
        return _Anything()

    def __call__(self, *args: Any, **kwargs: Any) -> _Anything:
        return _Anything()

    def __getitem__(self, key: Any) -> _Anything:
        return _Anything()


class Interfaces:
    """Classes of ``model_executor/models/interfaces.py``, compiled on demand."""

    def __init__(self, version: str) -> None:
        import contextlib
        import typing

        self.version = version
        tree = ast.parse(original_source(version, IFACES))
        self.nodes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        self.ns: dict[str, Any] = {k: getattr(typing, k) for k in typing.__all__}
        self.ns.update(
            contextmanager=contextlib.contextmanager,
            nullcontext=contextlib.nullcontext,
            torch=_Anything(),
            logger=_Anything(),
        )

    def get(self, name: str) -> type | None:
        if name not in self.nodes:
            return None
        if name not in self.ns:
            for base in self.nodes[name].bases:
                self.get(ast.unparse(base))
            compile_nodes([self.nodes[name]], self.ns, f"vllm-{self.version}/{IFACES}")
        found = self.ns[name]
        assert isinstance(found, type)
        return found


@contextmanager
def capture_locals(func_name: str, varname: str) -> Iterator[list[Any]]:
    """Read ``varname`` from the frame of ``func_name`` when it returns."""
    seen: list[Any] = []

    def tracer(frame: types.FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_name != func_name or "aux_hidden_state_layers" not in str(
            frame.f_code.co_names
        ):
            return None

        def local(frame: types.FrameType, event: str, arg: Any) -> Any:
            if event == "return" and varname in frame.f_locals:
                seen.append(list(frame.f_locals[varname]))
            return local

        return local

    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        yield seen
    finally:
        sys.settrace(old)


# -- scenarios --------------------------------------------------------------------------


@dataclass
class Rank:
    label: str
    num_layers: int
    start: int
    end: int
    first: bool
    last: bool
    aux: tuple[int, ...] | None  # None: the model's default layers


N = 20  # default aux layers (2, 10, 17); stages below avoid start + 2 landing on one of them
RANKS = [
    Rank("single GPU (pp=1)", N, 0, N, True, True, None),
    Rank("pp=3 rank 0 (first)", N, 0, 7, True, False, None),
    Rank("pp=3 rank 1 (mid-model)", N, 7, 14, False, False, None),
    Rank("pp=3 rank 2 (last)", N, 14, N, False, True, None),
    Rank("pp=2 rank 1 (last, mid-model start)", N, 10, N, False, True, (3, 12, 16)),
    Rank("layer 0 requested (no residual yet)", N, 0, N, True, True, (0, 1, N - 1)),
]


def run_rank(h: Harness, rank: Rank, *, set_layers: bool = True) -> dict[str, Any]:
    h.pp = PPGroup(rank.first, rank.last)
    lm = h.deepseek(rank.num_layers, rank.start, rank.end)
    model = lm.model
    assert model.aux_hidden_state_layers == ()
    default = lm.get_eagle3_aux_hidden_state_layers()
    layers = rank.aux if rank.aux is not None else default
    if set_layers:
        lm.set_aux_hidden_state_layers(layers)
    inter = None
    if not rank.first:
        prev = rank.start - 1
        inter = IntermediateTensors({"hidden_states": Val(f"h{prev}"), "residual": Val(f"r{prev}")})
    with capture_locals("forward", "aux_hidden_states") as seen:
        out = lm(
            input_ids=[1, 2, 3], positions=[0, 1, 2], intermediate_tensors=inter, inputs_embeds=None
        )
    captured = seen[-1] if seen else []
    return {
        "lm": lm,
        "default": default,
        "layers": layers,
        "out": out,
        "captured": captured,
        "log": list(model.log),
    }


def check_rank(rank: Rank, r: dict[str, Any], *, set_layers: bool = True) -> list[str]:
    """Every way the result can be wrong, as messages (empty: correct)."""
    errors: list[str] = []
    owned = list(range(rank.start, rank.end))
    called = [i for i, _, _ in r["log"]]
    if called != owned:
        errors.append(f"layers run {called}, expected {owned}")
    for i, hs, res in r["log"]:
        want_h = Val("emb") if i == 0 else Val(f"h{i - 1}")
        want_r = None if i == 0 else Val(f"r{i - 1}")
        if hs != want_h or res != want_r:
            errors.append(f"layer {i} got ({hs}, {res}), expected ({want_h}, {want_r})")
    wanted = [input_of(g) for g in owned if set_layers and g in r["layers"]]
    if r["captured"] != wanted:
        errors.append(
            f"captured {r['captured']}, expected inputs of global layers "
            f"{[g for g in owned if set_layers and g in r['layers']]} = {wanted}"
        )
    out = r["out"]
    last = owned[-1]
    if not rank.last:
        if not isinstance(out, IntermediateTensors):
            errors.append(f"a non-last rank returned {out!r}, expected IntermediateTensors")
        elif (out["hidden_states"], out["residual"]) != (Val(f"h{last}"), Val(f"r{last}")):
            errors.append("wrong intermediate tensors")
    else:
        final = Val(f"norm(h{last}+r{last})")
        if set_layers:
            if not (
                isinstance(out, tuple) and len(out) == 2 and out[0] == final and out[1] == wanted
            ):
                errors.append(f"last rank returned {out!r}, expected ({final}, {wanted})")
        elif out != final:
            errors.append(f"without aux layers the last rank returned {out!r}, expected {final}")
    return errors


def trace(version: str, rank: Rank, r: dict[str, Any]) -> str:
    lines = [
        f"vLLM {version} | {rank.label}: layers {rank.start}..{rank.end - 1} of {rank.num_layers}"
        f" | first={rank.first} last={rank.last}",
        f"  get_eagle3_aux_hidden_state_layers() -> {r['default']};"
        f" set_aux_hidden_state_layers({r['layers']})",
    ]
    for i, hs, res in r["log"]:
        mark = "  <- aux captured" if i in r["layers"] else ""
        lines.append(f"  global layer {i:2d}: input hidden={hs!s:>5} residual={res!s:>5}{mark}")
    lines.append(f"  captured aux_hidden_states = {r['captured']}")
    out = r["out"]
    shown = (
        f"IntermediateTensors(hidden_states={out['hidden_states']}, residual={out['residual']})"
        if isinstance(out, IntermediateTensors)
        else repr(out)
    )
    lines.append(f"  forward returned {shown}")
    return "\n".join(lines)


@pytest.mark.parametrize("version", PATCHED_VERSIONS)
@pytest.mark.parametrize("rank", RANKS, ids=[r.label for r in RANKS])
def test_aux_states_are_inputs_of_global_layers(version: str, rank: Rank) -> None:
    h = Harness.build(version)
    r = run_rank(h, rank)
    print("\n" + trace(version, rank, r))
    assert r["default"] == (2, rank.num_layers // 2, rank.num_layers - 3)
    assert check_rank(rank, r) == []


@pytest.mark.parametrize("version", PATCHED_VERSIONS)
def test_without_aux_layers_forward_is_unchanged(version: str) -> None:
    h = Harness.build(version)
    for rank in RANKS:
        r = run_rank(h, rank, set_layers=False)
        assert check_rank(rank, r, set_layers=False) == [], rank.label


@pytest.mark.parametrize("version", [PATCHED[0], PATCHED[-1]])  # the first and last shape
def test_negative_control_hand_made_patch_is_caught(version: str) -> None:
    """The same checks fail on the hand-made variant that enumerates the slice alone."""
    ds = patched_sources(version)[DS] or ""
    bad = ds.replace("            start=self.start_layer,\n", "", 1)
    assert bad != ds
    h = Harness.build(version, deepseek_source=bad)
    mid = RANKS[2]
    errors = check_rank(mid, run_rank(h, mid))
    assert errors and "captured" in errors[0]
    assert check_rank(RANKS[0], run_rank(h, RANKS[0])) == []  # pp=1 cannot tell them apart


@pytest.mark.parametrize("version", PATCHED_VERSIONS)
def test_runner_flow_on_the_outer_models(version: str) -> None:
    """What GPUModelRunner.load_model does: supports_eagle3(model), default layers, set."""
    h = Harness.build(version)
    h.pp = PPGroup(True, True)
    lm = h.deepseek(61, 0, 61)  # Kimi-K2 / DeepSeek-V3: 61 layers
    assert h.protocol in type(lm).__mro__  # built with the real interface bases
    assert h.supports_eagle3(lm)
    layers = lm.get_eagle3_aux_hidden_state_layers()
    assert layers == (2, 30, 58)
    lm.set_aux_hidden_state_layers(layers)
    hidden, aux = lm(None, [0], None, None)
    assert aux == [input_of(2), input_of(30), input_of(58)] and hidden == Val("norm(h60+r60)")

    if h.kimi_cls is None:
        assert version_tuple(version)[:2] < KIMI_K25_SINCE
        return
    kimi = object.__new__(h.kimi_cls)
    inner = h.deepseek(61, 0, 61)
    bare = "= DeepseekV2Model(" in (patched_sources(version)[KIMI] or "")
    kimi.language_model = inner.model if bare else inner
    assert h.supports_eagle3(kimi)
    layers = kimi.get_eagle3_aux_hidden_state_layers()
    assert layers == (2, 30, 58)
    kimi.set_aux_hidden_state_layers(layers)
    assert inner.model.aux_hidden_state_layers == (2, 30, 58)
    hidden, aux = kimi(input_ids=None, positions=[0], intermediate_tensors=None, inputs_embeds=None)
    assert aux == [input_of(2), input_of(30), input_of(58)]


@pytest.mark.parametrize("version", PATCHED_KIMI_K25)
def test_unpatched_kimi_fails_the_runner_check(version: str) -> None:
    """Negative control: the ORIGINAL wrapper class, built with its real interface bases,
    is rejected by supports_eagle3() - the runner's "does not support EAGLE3 interface"."""
    h = Harness.build(version)
    interfaces = Interfaces(version)
    for source, ok in (
        (original_source(version, KIMI), False),
        (patched_sources(version)[KIMI] or "", True),
    ):
        node = find_def(ast.parse(source), "KimiK25ForConditionalGeneration")
        assert isinstance(node, ast.ClassDef)
        bases = tuple(
            interfaces.get(ast.unparse(b)) or type(ast.unparse(b).replace(".", "_"), (), {})
            for b in node.bases
        )
        cls = type("KimiK25ForConditionalGeneration", bases, {})
        assert h.supports_eagle3(object.__new__(cls)) is ok


# -- the EAGLE proposer's load_model, Kimi-K2.5 part --------------------------------------


class Logger:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, msg: str, *args: Any) -> None:
        self.lines.append(msg % args if args else msg)

    warning = info


def load_model_tail(source: str, version: str) -> Callable[[Any, Any], None]:
    """SpecDecodeBaseProposer.load_model from ``if supports_multimodal(...)`` to its end,
    plus the embedding/lm_head sharing helpers it calls (0.16+), compiled on their own."""
    tree = ast.parse(source)
    cls = find_def(tree, "SpecDecodeBaseProposer")
    load = find_def(tree, "SpecDecodeBaseProposer.load_model")
    assert isinstance(cls, ast.ClassDef) and isinstance(load, ast.FunctionDef)
    start = next(
        i
        for i, s in enumerate(load.body)
        if isinstance(s, ast.If) and ast.unparse(s.test) == "supports_multimodal(target_model)"
    )
    logger = Logger()
    ns: dict[str, Any] = {
        "supports_multimodal": lambda m: True,
        "get_pp_group": lambda: PPGroup(True, True, world_size=1),
        "logger": logger,
        "torch": types.SimpleNamespace(Tensor=type("Tensor", (), {}), equal=lambda a, b: False),
        "cast": lambda t, v: v,
        "SupportsMultiModal": object,
        "nn": types.SimpleNamespace(ModuleDict=dict),
    }
    tail = make_function("_load_tail", ["self", "target_model"], load.body[start:])
    nodes: list[ast.stmt] = [tail]
    for helper in ("_maybe_share_embeddings", "_maybe_share_lm_head"):
        found = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == helper]
        nodes.extend(found)
    compile_nodes(nodes, ns, f"vllm-{version}/{EAGLE}")
    for helper in ("_maybe_share_embeddings", "_maybe_share_lm_head"):
        ns.setdefault(helper, None)
    return ns["_load_tail"], ns  # type: ignore[return-value]


def make_kimi_target(version: str) -> Any:
    embed, head = object(), object()
    src = patched_sources(version)[KIMI] or ""
    inner: Any
    if "= DeepseekV2Model(" in src:  # 0.15: bare model; the lm_head is on the wrapper
        inner = types.SimpleNamespace(embed_tokens=embed, layers=[])
        target = type("KimiK25ForConditionalGeneration", (), {})()
        target.lm_head = head
    else:  # 0.16+: a DeepseekV2ForCausalLM
        inner = types.SimpleNamespace(model=types.SimpleNamespace(embed_tokens=embed), lm_head=head)
        target = type("KimiK25ForConditionalGeneration", (), {})()
    target.config = types.SimpleNamespace(media_placeholder_token_id=163605)
    target.get_language_model = lambda: inner
    return target, embed, head


def make_proposer(tail_ns: dict[str, Any]) -> Any:
    drafter = types.SimpleNamespace(
        config=types.SimpleNamespace(),
        has_own_embed_tokens=False,
        has_own_lm_head=False,
        model=types.SimpleNamespace(embed_tokens=object()),
        lm_head=object(),
    )
    proposer = types.SimpleNamespace(
        model=drafter,
        parallel_drafting=False,
        pass_hidden_states_to_model=False,
        use_local_argmax_reduction=False,
        get_model_name=lambda m: type(m).__name__,
    )
    for helper in ("_maybe_share_embeddings", "_maybe_share_lm_head"):
        if tail_ns.get(helper):
            setattr(proposer, helper, types.MethodType(tail_ns[helper], proposer))
    return proposer


@pytest.mark.parametrize("version", PATCHED_KIMI_K25)
def test_eagle_proposer_loads_a_drafter_for_kimi_k25(version: str) -> None:
    tail, ns = load_model_tail(patched_sources(version)[EAGLE] or "", version)
    proposer = make_proposer(ns)
    target, embed, head = make_kimi_target(version)
    tail(proposer, target)
    assert proposer.model.config.image_token_index == 163605
    assert proposer.model.model.embed_tokens is embed  # shared with the target
    assert proposer.model.lm_head is head
    print(
        f"\nvLLM {version}: drafter image_token_index=163605, embed_tokens and lm_head shared;"
        f" log: {ns['logger'].lines}"
    )


@pytest.mark.parametrize("version", PATCHED_KIMI_K25)
def test_unpatched_eagle_proposer_fails_for_kimi_k25(version: str) -> None:
    """Negative control: the original load_model raises on Kimi-K2.5's config."""
    tail, ns = load_model_tail(original_source(version, EAGLE), version)
    proposer = make_proposer(ns)
    target, _, _ = make_kimi_target(version)
    with pytest.raises(AttributeError, match="image_token_index"):
        tail(proposer, target)


def test_kimi_view_is_needed_on_0_15() -> None:
    """Negative control: with only the image-token edit, 0.15's load_model still fails,
    because get_language_model() is a bare DeepseekV2Model without ``.model``."""
    import re

    patched = patched_sources("0.15.0")[EAGLE] or ""
    without_view = re.sub(
        r"[ \t]*# fleet: eagle3-deepseek/kimi-language-model-view\n.*?"
        r"lm_head=target_model\.lm_head\n[ \t]*\)\n",
        "",
        patched,
        count=1,
        flags=re.DOTALL,
    )
    assert without_view != patched and "media_placeholder_token_id" in without_view
    tail, ns = load_model_tail(without_view, "0.15.0")
    target, _, _ = make_kimi_target("0.15.0")
    with pytest.raises(AttributeError, match="model"):
        tail(make_proposer(ns), target)


@pytest.mark.parametrize("rank", RANKS, ids=[r.label for r in RANKS])
def test_upstream_0_18_parity(rank: Rank) -> None:
    """The same scenarios on vLLM 0.18's own (unpatched) code: the patch captures exactly
    what upstream captures; only upstream crashes when layer 0 is requested (no guard
    for ``residual is None``)."""
    upstream = Harness.build("0.18.0")
    ours = Harness.build("0.17.0")
    mine = run_rank(ours, rank)
    if 0 in (rank.aux or ()) and rank.first:
        with pytest.raises(AssertionError, match="adding None"):
            run_rank(upstream, rank)
        return
    theirs = run_rank(upstream, rank)
    assert check_rank(rank, theirs) == []
    assert theirs["captured"] == mine["captured"]
    assert repr(theirs["out"]) == repr(mine["out"]) or not rank.last
