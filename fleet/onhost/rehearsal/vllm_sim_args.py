# fleet on-host module: `vllm serve`'s command line, parsed as the installed vLLM does.
#
# Part of the simulated `vllm serve` (vllm_sim.py). Python 3.8+, standard library only.
#
# The flags a version accepts are read from its own parser code: every option string of an
# `add_argument(...)` call in entrypoints/openai/cli_args.py and engine/arg_utils.py, and
# the fields of FrontendArgs / EngineArgs (whose flags vLLM generates as `--field-name`,
# booleans with a `--no-` form). Underscores in flag names are accepted as dashes
# (FlexibleArgumentParser). An unknown flag or a bad value is refused as argparse does:
# the usage line and `vllm serve: error: ...` on stderr, exit 2.
import ast
import json
from typing import Any, Dict, List, Optional, Tuple

from fleet.onhost.rehearsal.source_mining import (
    class_defined_in,
    class_fields,
    source_file,
)

SIM_USAGE = "usage: vllm serve [model_tag] [options]"
ARG_FILES = (
    "entrypoints/openai/cli_args.py",
    "entrypoints/common/cli_args.py",
    "engine/arg_utils.py",
    "entrypoints/cli/serve.py",
)
ARG_CLASSES = ("BaseFrontendArgs", "FrontendArgs", "EngineArgs", "AsyncEngineArgs")

# what the simulator itself uses, with vLLM's types (engine/arg_utils.py, cli_args.py)
SIM_TYPED = {
    "tensor_parallel_size": "int",
    "pipeline_parallel_size": "int",
    "data_parallel_size": "int",
    "port": "int",
    "max_model_len": "human_int",
    "max_num_seqs": "int",
    "max_num_batched_tokens": "int",
    "gpu_memory_utilization": "float",
    "speculative_config": "json",
    "limit_mm_per_prompt": "json",
    "served_model_name": "list",
    "seed": "int",
    "shutdown_timeout": "int",
}


class SimArgError(Exception):
    """A command line argparse refuses (message without the `vllm serve: error: `)."""


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def sim_flags(package_dir: str) -> Dict[str, Dict[str, Any]]:
    """{option string: {"dest", "kind": "bool" | "value" | "list"}} of this vLLM."""
    flags: Dict[str, Dict[str, Any]] = {}
    annotations: Dict[str, str] = {}
    for rel in ARG_FILES:
        src = source_file(package_dir, rel)
        if src is None:
            continue
        for node in ast.walk(src.tree):
            if isinstance(node, ast.ClassDef) and node.name in ARG_CLASSES:
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        text = src.segment(item.annotation)
                        annotations.setdefault(item.target.id, text)
        for node in ast.walk(src.tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr != "add_argument":
                continue
            names = [
                a.value
                for a in node.args
                if isinstance(a, ast.Constant)
                and isinstance(a.value, str)
                and a.value.startswith("-")
            ]
            if not names:
                continue
            long_names = [n for n in names if n.startswith("--")]
            dest = _dest(long_names[0] if long_names else names[0])
            kind = "value"
            for kw in node.keywords:
                value = src.segment(kw.value)
                if kw.arg == "action" and (
                    "store_true" in value or "store_false" in value or "BooleanOptional" in value
                ):
                    kind = "bool"
                if kw.arg == "nargs" and ("+" in value or "*" in value):
                    kind = "list"
            for name in names:
                flags[name] = {"dest": dest, "kind": kind}
    for field, annotation in annotations.items():
        flag = "--" + field.replace("_", "-")
        kind = "value"
        bare = annotation.replace(" ", "")
        if bare in ("bool", "Optional[bool]", "bool|None"):
            kind = "bool"
        elif bare.startswith(("list[", "List[", "Optional[list", "Optional[List", "list[str]|")):
            kind = "list"
        entry = flags.get(flag)
        if entry is None or entry["kind"] == "value":
            # an `add_argument("--x", **kwargs["x"])` takes its action from the field type
            flags[flag] = {"dest": field, "kind": kind}
        if flags[flag]["kind"] == "bool":
            flags.setdefault("--no-" + field.replace("_", "-"), {"dest": field, "kind": "nobool"})
    for name in list(flags):
        if name.startswith("--") and flags[name]["kind"] == "bool":
            flags.setdefault("--no-" + name[2:], {"dest": flags[name]["dest"], "kind": "nobool"})
    return flags


def sim_field_order(package_dir: str) -> List[str]:
    """Destinations in the order vLLM's parser registers them (model_tag, the frontend's,
    the engine's), which is the order of its `non-default args` dict."""
    order = ["model_tag"]
    for rel, classes in (
        ("entrypoints/openai/cli_args.py", ("BaseFrontendArgs", "FrontendArgs")),
        ("entrypoints/common/cli_args.py", ("BaseFrontendArgs", "FrontendArgs")),
        ("engine/arg_utils.py", ("EngineArgs",)),
    ):
        src = source_file(package_dir, rel)
        if src is None:
            continue
        for node in src.tree.body:
            if isinstance(node, ast.ClassDef) and node.name in classes:
                for item in node.body:
                    if (
                        isinstance(item, ast.AnnAssign)
                        and isinstance(item.target, ast.Name)
                        and item.target.id not in order
                    ):
                        order.append(item.target.id)
    return order


def _convert(dest: str, raw: str, flag: str) -> Any:
    kind = SIM_TYPED.get(dest)
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "human_int":
            return _human_int(raw)
    except ValueError:
        shown = {"int": "int", "float": "float", "human_int": "human_readable_int"}[kind or "int"]
        raise SimArgError("argument %s: invalid %s value: %r" % (flag, shown, raw)) from None
    if kind == "json":
        try:
            return json.loads(raw)
        except ValueError:
            raise SimArgError("argument %s: invalid loads value: %r" % (flag, raw)) from None
    return raw


def _human_int(raw: str) -> int:
    """vLLM's human_readable_int: 32k, 1M, 25.6k (decimal), 2Ki (binary)."""
    text = raw.strip()
    units = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
    binary = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
    low = text.lower()
    for suffix, mult in binary.items():
        if low.endswith(suffix):
            return int(float(text[: -len(suffix)]) * mult)
    if low and low[-1] in units:
        return int(float(text[:-1]) * units[low[-1]])
    return int(text)


def sim_parse(package_dir: str, argv: List[str]) -> Tuple[Dict[str, Any], List[str]]:
    """(values by destination, the destinations given, in command-line order)."""
    flags = sim_flags(package_dir)
    values: Dict[str, Any] = {}
    given: List[str] = []
    unknown: List[str] = []
    positional: List[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and len(arg) > 2:
            key, eq, inline = arg.partition("=")
            key = (
                "--"
                + key[2:].split(".", 1)[0].replace("_", "-")
                + ("." + key[2:].split(".", 1)[1] if "." in key[2:] else "")
            )
            spec = flags.get(key)
            if spec is None:
                unknown.append(arg)
                if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                    unknown.append(argv[i + 1])
                    i += 1
                i += 1
                continue
        elif arg.startswith("-") and len(arg) > 1 and not _is_number(arg):
            key, eq, inline = arg.partition("=")
            spec = flags.get(key)
            if spec is None:
                unknown.append(arg)
                i += 1
                continue
        else:
            positional.append(arg)
            i += 1
            continue
        dest = spec["dest"]
        kind = spec["kind"]
        if kind in ("bool", "nobool"):
            if eq:
                raise SimArgError("argument %s: ignored explicit argument %r" % (key, inline))
            values[dest] = kind == "bool"
            i += 1
        elif kind == "list" or SIM_TYPED.get(dest) == "list":
            items = [inline] if eq else []
            j = i + 1
            if not eq:
                while j < len(argv) and not (argv[j].startswith("-") and not _is_number(argv[j])):
                    items.append(argv[j])
                    j += 1
            if not items:
                raise SimArgError("argument %s: expected at least one argument" % key)
            values[dest] = items
            i = j
        else:
            if eq:
                raw = inline
                i += 1
            else:
                if i + 1 >= len(argv) or (
                    argv[i + 1].startswith("-") and not _is_number(argv[i + 1])
                ):
                    raise SimArgError("argument %s: expected one argument" % key)
                raw = argv[i + 1]
                i += 2
            values[dest] = _convert(dest, raw, key)
        if dest not in given:
            given.append(dest)
    if len(positional) > 1:
        unknown = positional[1:] + unknown
    if unknown:
        raise SimArgError("unrecognized arguments: " + " ".join(unknown))
    if positional:
        values["model_tag"] = positional[0]
        given.insert(0, "model_tag")
    return values, given


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def sim_spec_fields(package_dir: str) -> Optional[List[str]]:
    """The init arguments of SpeculativeConfig (a pydantic dataclass: unknown keys are
    rejected as `Unexpected keyword argument`)."""
    rel = class_defined_in(
        package_dir,
        ["config/speculative.py", "config/__init__.py", "config.py"],
        "SpeculativeConfig",
    )
    if rel is None:
        return None
    return class_fields(package_dir, rel, "SpeculativeConfig")
