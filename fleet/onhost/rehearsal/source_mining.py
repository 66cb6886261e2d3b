# The rehearsal vLLM reads the installed vLLM source (rehearsal only: never part of what
# fleet sends a real host; fleet/onhost/rehearsal/__init__.py).
#
# The simulated `vllm serve` prints each line with the format string and the call-start
# line number of the installed tree (so a patched or newer tree prints its own
# `[file.py:line]`), builds tracebacks from the real source lines, and decides what fails
# from the installed registry, config classes and proposer code. Everything below reads
# files with `ast`; parsed files are cached by (mtime, size).

import ast
import os
from typing import Any, Dict, List, Optional

from fleet.onhost._common import parse_python
from fleet.onhost.vllm_tree import dotted_name, module_class_nodes, short_name, string_list

LOG_METHODS = (
    "debug",
    "info",
    "warning",
    "error",
    "exception",
    "critical",
    "info_once",
    "warning_once",
    "debug_once",
)
LOG_LEVELS = {
    "debug": "DEBUG",
    "debug_once": "DEBUG",
    "info": "INFO",
    "info_once": "INFO",
    "warning": "WARNING",
    "warning_once": "WARNING",
    "error": "ERROR",
    "exception": "ERROR",
    "critical": "CRITICAL",
}

_TREE_CACHE: Dict[str, Any] = {}


class SourceFile:
    """One parsed source file: its text, lines, tree and the functions it defines."""

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.text = text
        self.lines = text.splitlines()
        self.tree = parse_python(text)
        self.functions: List[Any] = []  # (qualified name, node)
        self.log_cache: Optional[List[Dict[str, Any]]] = None
        self._walk(self.tree.body, "")

    def _walk(self, body: List[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + node.name
                self.functions.append((name, node))
                self._walk(node.body, name + ".")
            elif isinstance(node, ast.ClassDef):
                self._walk(node.body, prefix + node.name + ".")
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                inner: List[ast.stmt] = list(node.body)
                inner += list(getattr(node, "orelse", []) or [])
                for handler in getattr(node, "handlers", []) or []:
                    inner += list(handler.body)
                inner += list(getattr(node, "finalbody", []) or [])
                self._walk(inner, prefix)

    def function(self, name: str) -> Optional[Any]:
        """The first function whose qualified name is `name` or ends with `.name`."""
        for qual, node in self.functions:
            if qual == name or qual.endswith("." + name):
                return node
        return None

    def enclosing(self, line: int) -> str:
        """The qualified name of the innermost function holding `line` ('' at module level)."""
        best = ""
        best_span = None
        for qual, node in self.functions:
            end = getattr(node, "end_lineno", None) or node.lineno
            if node.lineno <= line <= end:
                span = end - node.lineno
                if best_span is None or span <= best_span:
                    best, best_span = qual, span
        return best

    def line(self, number: int) -> str:
        return self.lines[number - 1] if 0 < number <= len(self.lines) else ""

    def segment(self, node: ast.AST) -> str:
        """The source text of `node` (like ast.get_source_segment, without re-splitting
        the whole file on every call; offsets are UTF-8 byte columns)."""
        start = getattr(node, "lineno", None)
        end = getattr(node, "end_lineno", None)
        col = getattr(node, "col_offset", None)
        end_col = getattr(node, "end_col_offset", None)
        if start is None or end is None or col is None or end_col is None:
            return ""
        rows = [self.line(n).encode("utf-8") for n in range(start, end + 1)]
        if len(rows) == 1:
            return rows[0][col:end_col].decode("utf-8", "replace")
        rows[0] = rows[0][col:]
        rows[-1] = rows[-1][:end_col]
        return b"\n".join(rows).decode("utf-8", "replace")


def source_file(package_dir: str, rel: str) -> Optional[SourceFile]:
    """The parsed file `rel` of the vllm package, or None (missing or unparsable)."""
    path = os.path.join(package_dir, *rel.split("/"))
    try:
        stat = os.stat(path)
    except OSError:
        return None
    key = (stat.st_mtime_ns, stat.st_size)
    cached = _TREE_CACHE.get(path)
    if cached is not None and cached[0] == key:
        return cached[1]
    try:
        with open(path, encoding="utf-8") as fh:
            parsed: Optional[SourceFile] = SourceFile(path, fh.read())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        parsed = None
    _TREE_CACHE[path] = (key, parsed)
    return parsed


def literal_text(node: Optional[ast.expr]) -> Optional[str]:
    """The text of a string constant, or of an f-string with `{}` for each field."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        out = []
        for value in node.values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                out.append(value.value)
            else:
                out.append("{}")
        return "".join(out)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left = literal_text(node.left)
        right = literal_text(node.right)
        if left is not None and right is not None:
            return left + right
    return None


def log_calls(src: SourceFile) -> List[Dict[str, Any]]:
    """Every `<logger>.<level>("format", ...)` call: line (call start), level, format,
    the enclosing function and the expressions of the other arguments."""
    if src.log_cache is not None:
        return src.log_cache
    found: List[Dict[str, Any]] = []
    for node in ast.walk(src.tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in LOG_METHODS or not node.args:
            continue
        fmt = node.args[0]
        text = fmt.value if isinstance(fmt, ast.Constant) else None
        if not isinstance(text, str):
            text = None
        if isinstance(fmt, ast.Name):
            # `def f(..., message: str = "torch.compile took %.2f s in total")` then
            # `logger.info_once(message, ...)`: the parameter's default is the format
            text = _parameter_default(src, src.enclosing(node.lineno), fmt.id)
        found.append(
            {
                "line": node.lineno,
                "method": node.func.attr,
                "level": LOG_LEVELS[node.func.attr],
                "fmt": text,
                "fmt_is_name": isinstance(fmt, ast.Name),
                "func": src.enclosing(node.lineno),
                "node": node,
            }
        )
    found.sort(key=lambda c: c["line"])
    src.log_cache = found
    return found


def _parameter_default(src: SourceFile, qualname: str, name: str) -> Optional[str]:
    fn = src.function(qualname) if qualname else None
    if fn is None:
        return None
    args = fn.args
    positional = list(args.posonlyargs) + list(args.args)
    defaults: List[Any] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    pairs = [(positional[i], defaults[i]) for i in range(len(positional))]
    pairs += [(args.kwonlyargs[i], args.kw_defaults[i]) for i in range(len(args.kwonlyargs))]
    for arg, default in pairs:
        if arg.arg == name and isinstance(default, ast.Constant) and isinstance(default.value, str):
            return default.value
    return None


def _may_contain(text: str, needle: str) -> bool:
    """A cheap test before parsing: the longest word of `needle` is in the raw source
    (a literal may be split over implicitly concatenated strings, but not mid-word)."""
    words = [w for w in needle.replace("{}", " ").replace("%s", " ").split() if w]
    return not words or max(words, key=len) in text


def _func_matches(qual: str, func: Optional[str]) -> bool:
    if not func:
        return True
    return qual == func or qual.endswith("." + func)


def find_log_call(
    package_dir: str,
    files: List[str],
    needles: List[str],
    func: Optional[str] = None,
    exact: bool = False,
    skip_debug: bool = False,
) -> Optional[Dict[str, Any]]:
    """The first logger call (in the order of `files`, then by line) whose format string
    contains one of `needles` (equals one, with `exact`), optionally inside `func`, and
    not at DEBUG level with `skip_debug`.
    {"file", "basename", "line", "level", "method", "fmt", "func"}."""
    for rel in files:
        src = source_file(package_dir, rel)
        if src is None or not any(_may_contain(src.text, n) for n in needles):
            continue
        calls = log_calls(src)
        for needle in needles:
            for call in calls:
                fmt = call["fmt"]
                if fmt is None or not _func_matches(call["func"], func):
                    continue
                if skip_debug and call["level"] == "DEBUG":
                    continue
                if (fmt == needle) if exact else (needle in fmt):
                    return {
                        "file": rel,
                        "basename": rel.rsplit("/", 1)[-1],
                        "line": call["line"],
                        "level": call["level"],
                        "method": call["method"],
                        "fmt": fmt,
                        "func": call["func"],
                    }
    return None


def find_line(package_dir: str, rel: str, func: str, needle: str) -> Optional[Dict[str, Any]]:
    """The first line of function `func` in `rel` that contains `needle`:
    {"file", "line", "text" (stripped), "raw", "func" (the short name)}."""
    src = source_file(package_dir, rel)
    if src is None:
        return None
    for qual, node in src.functions:
        if not _func_matches(qual, func):
            continue
        end = getattr(node, "end_lineno", None) or node.lineno
        for number in range(node.lineno, end + 1):
            raw = src.line(number)
            if needle in raw:
                return {
                    "file": rel,
                    "line": number,
                    "text": raw.strip(),
                    "raw": raw,
                    "func": qual.rsplit(".", 1)[-1],
                }
    return None


def find_string(package_dir: str, rel: str, needle: str) -> Optional[Dict[str, Any]]:
    """The first string literal or f-string of `rel` whose text contains `needle`:
    {"line", "node", "text", "source", "func"} (`node` is the ast node)."""
    src = source_file(package_dir, rel)
    if src is None or not _may_contain(src.text, needle):
        return None
    best: Optional[Dict[str, Any]] = None
    for node in ast.walk(src.tree):
        if isinstance(node, (ast.JoinedStr, ast.Constant, ast.BinOp)):
            text = literal_text(node)
            if text is None or needle not in text:
                continue
            if (
                best is None
                or node.lineno < best["line"]
                or (node.lineno == best["line"] and len(text) > len(best["text"]))
            ):
                best = {
                    "line": node.lineno,
                    "node": node,
                    "text": text,
                    "source": src.text,
                    "func": src.enclosing(node.lineno),
                    "package_dir": package_dir,
                    "file": src,
                }
    return best


def _identifiers(node: ast.expr) -> List[str]:
    names: List[str] = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            names.append(sub.id)
        elif isinstance(sub, ast.Attribute):
            names.append(sub.attr)
    return names


_ARITHMETIC = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
}


def _imported_function(package_dir: str, src: Any, name: str) -> Optional[Any]:
    """The `def name` that `src` imports with `from vllm.x.y import name` (or defines),
    if its body is one `return` (after a docstring): vLLM's small formatting helpers,
    e.g. utils/mem_utils.py `format_gib(b)`: `return f"{round(b / GiB_bytes, 2)}"`."""
    fn = src.function(name) if src is not None else None
    if fn is None and src is not None:
        for node in ast.walk(src.tree):
            if (
                isinstance(node, ast.ImportFrom)
                and (node.module or "").startswith("vllm.")
                and any(alias.name == name and alias.asname is None for alias in node.names)
            ):
                rel = "/".join(str(node.module).split(".")[1:])
                other = source_file(package_dir, rel + ".py") or source_file(
                    package_dir, rel + "/__init__.py"
                )
                fn = other.function(name) if other is not None else None
                break
    if not isinstance(fn, ast.FunctionDef):
        return None
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        return None
    return fn


def _evaluate(node: ast.expr, values: Dict[str, Any], found: Dict[str, Any], depth: int = 0) -> Any:
    """The value of a replacement field's expression from `values` (a name or an
    attribute by its last part, numbers, arithmetic, `round()`, an f-string, a one-line
    helper vLLM imports): raises KeyError when something in it is not known."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return values[node.id]
    if isinstance(node, ast.Attribute):
        return values[node.attr]
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left = _evaluate(node.left, values, found, depth)
        right = _evaluate(node.right, values, found, depth)
        if not all(isinstance(v, (int, float)) for v in (left, right)):
            raise KeyError("not a number")
        try:
            return _ARITHMETIC[type(node.op)](left, right)
        except ZeroDivisionError:
            raise KeyError("division by zero") from None
    if isinstance(node, ast.JoinedStr):
        return _render_pieces(node.values, values, found, depth, raise_unknown=True)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        args = [_evaluate(a, values, found, depth) for a in node.args]
        if node.func.id == "round" and 1 <= len(args) <= 2:
            return round(*args)
        fn = None
        if depth < 2:
            fn = _imported_function(
                str(found.get("package_dir") or ""), found.get("file"), node.func.id
            )
        ret = fn.body[-1] if fn is not None else None
        if fn is not None and isinstance(ret, ast.Return) and len(fn.args.args) == len(args):
            bound = dict(values)
            bound.update({p.arg: a for p, a in zip(fn.args.args, args)})
            assert ret.value is not None
            return _evaluate(ret.value, bound, found, depth + 1)
    raise KeyError(type(node).__name__)


def _render_pieces(
    pieces: List[ast.expr],
    values: Dict[str, Any],
    found: Dict[str, Any],
    depth: int,
    raise_unknown: bool,
) -> str:
    out: List[str] = []
    for piece in pieces:
        if isinstance(piece, ast.Constant):
            out.append(str(piece.value))
            continue
        if not isinstance(piece, ast.FormattedValue):
            out.append("")
            continue
        value: Any = None
        known = False
        try:
            value, known = _evaluate(piece.value, values, found, depth), True
        except (KeyError, TypeError, ValueError):
            if raise_unknown:
                raise
            idents = _identifiers(piece.value)
            for ident in reversed(idents):
                if ident in values:
                    value, known = values[ident], True
                    break
        if not known:
            segment = ast.get_source_segment(found["source"], piece.value) or "?"
            out.append("{" + segment + "}")
            continue
        if piece.conversion == ord("r"):
            value = repr(value)
        elif piece.conversion == ord("s"):
            value = str(value)
        spec = ""
        if isinstance(piece.format_spec, ast.JoinedStr):
            spec = "".join(
                str(v.value) for v in piece.format_spec.values if isinstance(v, ast.Constant)
            )
        try:
            out.append(format(value, spec))
        except (TypeError, ValueError):
            out.append(str(value))
    return "".join(out)


def render_string(found: Dict[str, Any], values: Dict[str, Any]) -> str:
    """Fill an f-string found by :func:`find_string` with `values`.

    Each replacement field is evaluated from `values` (names and attributes by their last
    part, arithmetic, `round()`, the one-line helpers vLLM formats with, such as
    `format_gib`); otherwise it is replaced by the value of the most specific identifier
    it uses (its last attribute or name that `values` knows, e.g. ``max_model_len`` for
    ``{self.model_config.max_model_len}``). Then the field's conversion and format spec
    apply; a field nothing is known for prints its source text."""
    node = found["node"]
    if isinstance(node, ast.Constant):
        return str(node.value)
    pieces: List[ast.expr] = []

    def flatten(n: ast.expr) -> None:
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add):
            flatten(n.left)
            flatten(n.right)
        elif isinstance(n, ast.JoinedStr):
            pieces.extend(n.values)
        else:
            pieces.append(n)

    flatten(node)
    return _render_pieces(pieces, values, found, 0, raise_unknown=False)


def string_constant(package_dir: str, rel: str, name: str) -> Optional[str]:
    """The value of a module- or class-level `NAME = "text"` assignment in `rel`."""
    src = source_file(package_dir, rel)
    if src is None:
        return None
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            targets = [node.target.id]
        else:
            continue
        if name in targets:
            text = literal_text(getattr(node, "value", None))
            if text is not None:
                return text
    return None


def class_fields(package_dir: str, rel: str, cls: str) -> Optional[List[str]]:
    """The annotated fields of class `cls` in `rel` (a dataclass's init arguments)."""
    src = source_file(package_dir, rel)
    if src is None:
        return None
    for node in module_class_nodes(src.tree.body):
        if node.name == cls:
            fields: List[str] = []
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    annotation = src.segment(item.annotation)
                    if "ClassVar" not in annotation:
                        fields.append(item.target.id)
            return fields
    return None


def class_defined_in(package_dir: str, rels: List[str], cls: str) -> Optional[str]:
    for rel in rels:
        src = source_file(package_dir, rel)
        if src is not None and any(n.name == cls for n in module_class_nodes(src.tree.body)):
            return rel
    return None


def class_decorators(package_dir: str, rel: str, qualname: str) -> List[str]:
    """Decorator names of function `qualname` (e.g. ``WorkerProc.__init__``) in `rel`."""
    src = source_file(package_dir, rel)
    node = src.function(qualname) if src is not None else None
    if node is None:
        return []
    names = []
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        names.append(dotted_name(target) or "")
    return names


REGISTRY_FILE = "model_executor/models/registry.py"
CONFIG_REGISTRY_FILE = "transformers_utils/config.py"


def registry_architectures(package_dir: str) -> Optional[List[str]]:
    """Architecture names the installed model registry knows (the string keys of its
    module-level dicts of `(module, class)` tuples), in source order; None without a
    registry file."""
    src = source_file(package_dir, REGISTRY_FILE)
    if src is None:
        return None
    names: List[str] = []
    for node in src.tree.body:
        value = getattr(node, "value", None)
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or not isinstance(value, ast.Dict):
            continue
        for index, key in enumerate(value.keys):
            item = value.values[index]
            if (
                isinstance(key, ast.Constant)
                and isinstance(key.value, str)
                and isinstance(item, ast.Tuple)
                and key.value not in names
            ):
                names.append(key.value)
    return names


def config_registry(package_dir: str) -> Dict[str, str]:
    """vLLM's own config classes per HF model_type (`_CONFIG_REGISTRY`)."""
    src = source_file(package_dir, CONFIG_REGISTRY_FILE)
    out: Dict[str, str] = {}
    if src is None:
        return out
    for node in src.tree.body:
        targets: List[str] = []
        if isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            targets = [node.target.id]
        value = getattr(node, "value", None)
        if "_CONFIG_REGISTRY" not in targets or value is None:
            continue
        if isinstance(value, ast.Call):
            for kw in value.keywords:
                if kw.arg and isinstance(kw.value, ast.Constant):
                    out[kw.arg] = str(kw.value.value)
            for arg in value.args:
                if isinstance(arg, ast.Dict):
                    value = arg
        if isinstance(value, ast.Dict):
            for index, key in enumerate(value.keys):
                item = value.values[index]
                if isinstance(key, ast.Constant) and isinstance(item, (ast.Constant, ast.Name)):
                    out[str(key.value)] = (
                        str(item.value) if isinstance(item, ast.Constant) else item.id
                    )
    return out


PROPOSER_FILES = ("v1/spec_decode/eagle.py", "v1/spec_decode/llm_base_proposer.py")


def _attribute_chain(node: ast.expr) -> Optional[List[str]]:
    chain: List[str] = []
    while isinstance(node, ast.Attribute):
        chain.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        chain.append(node.id)
        return list(reversed(chain))
    return None


def _names_tested(test: ast.expr) -> Optional[List[str]]:
    """The model names an `if self.get_model_name(target_model) in [...]` / `== "..."`
    test selects, or None when the test is something else."""
    if not isinstance(test, ast.Compare) or len(test.comparators) != 1:
        return None
    left = test.left
    if not (isinstance(left, ast.Call) and isinstance(left.func, ast.Attribute)):
        return None
    if left.func.attr != "get_model_name":
        return None
    right = test.comparators[0]
    if isinstance(test.ops[0], ast.In):
        return string_list(right)
    if isinstance(test.ops[0], ast.Eq) and isinstance(right, ast.Constant):
        return [str(right.value)]
    return None


def multimodal_image_token(package_dir: str, model_name: str) -> Optional[Dict[str, Any]]:
    """What the EAGLE proposer's `load_model` reads for a multimodal target named
    `model_name`: the `if supports_multimodal(target_model):` branch chain is followed
    as Python would, and the attribute path of `target_model.config...` assigned to
    `self.model.config.image_token_index` is returned with its line:
    {"file", "line", "path": ["image_token_index"], "func"}; None when the proposer has
    no such branch (before 0.12, or nothing read)."""
    for rel in PROPOSER_FILES:
        src = source_file(package_dir, rel)
        if src is None or "supports_multimodal(target_model)" not in src.text:
            continue
        for qual, fn in src.functions:
            if not qual.endswith("load_model"):
                continue
            for node in ast.walk(fn):
                if not (
                    isinstance(node, ast.If) and "supports_multimodal" in src.segment(node.test)
                ):
                    continue
                chosen = _choose_branch(node.body, model_name)
                if chosen is None:
                    continue
                path, line = chosen
                return {"file": rel, "line": line, "path": path, "func": qual}
    return None


def _choose_branch(body: List[ast.stmt], model_name: str) -> Optional[Any]:
    for stmt in body:
        if isinstance(stmt, ast.If):
            names = _names_tested(stmt.test)
            if names is None:
                continue
            branch: List[ast.stmt] = stmt.body if model_name in names else stmt.orelse
            while True:
                found = _image_token_read(branch)
                if found is not None:
                    return found
                nested = [s for s in branch if isinstance(s, ast.If)]
                if not nested:
                    return None
                inner = nested[0]
                inner_names = _names_tested(inner.test)
                if inner_names is None:
                    return None
                branch = inner.body if model_name in inner_names else inner.orelse
    return None


def _image_token_read(branch: List[ast.stmt]) -> Optional[Any]:
    for stmt in branch:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target = _attribute_chain(stmt.targets[0])
            if target and target[-1] == "image_token_index":
                chain = _attribute_chain(stmt.value)
                if chain and chain[:2] == ["target_model", "config"]:
                    return chain[2:], stmt.lineno
    return None


def supports_multimodal(files: Dict[str, Any], name: str) -> bool:
    """Whether class `name` lists SupportsMultiModal among its bases (in-file chain)."""
    for entry in files.values():
        classes = entry.get("classes") if isinstance(entry, dict) else None
        if isinstance(classes, dict) and name in classes:
            seen = set()
            todo = [name]
            while todo:
                cls = todo.pop()
                if cls in seen or cls not in classes:
                    continue
                seen.add(cls)
                bases = [str(b) for b in classes[cls].get("bases") or []]
                if any(short_name(b) == "SupportsMultiModal" for b in bases):
                    return True
                todo.extend(b for b in bases if "." not in b)
    return False


def find_raise(
    package_dir: str, rel: str, needle: str, func: Optional[str] = None
) -> Optional[Dict[str, Any]]:
    """The first `raise X(...)` of `rel` (inside `func`) whose message literal contains
    `needle`: {"file", "line" (the statement's first line), "text", "exc", "message"
    (the string found, for :func:`render_string`), "func"}."""
    src = source_file(package_dir, rel)
    if src is None or not _may_contain(src.text, needle):
        return None
    for node in ast.walk(src.tree):
        if not isinstance(node, ast.Raise) or node.exc is None:
            continue
        qual = src.enclosing(node.lineno)
        if not _func_matches(qual, func):
            continue
        for sub in ast.walk(node.exc):
            text = literal_text(sub) if isinstance(sub, (ast.JoinedStr, ast.Constant)) else None
            if text is not None and needle in text:
                exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                return {
                    "file": rel,
                    "line": node.lineno,
                    "text": src.line(node.lineno),
                    "exc": dotted_name(exc) or "Exception",
                    "message": {
                        "node": sub,
                        "source": src.text,
                        "line": node.lineno,
                        "package_dir": package_dir,
                        "file": src,
                    },
                    "func": qual.rsplit(".", 1)[-1],
                }
    return None


def find_assert(package_dir: str, rel: str, func: str, needle: str) -> Optional[Dict[str, Any]]:
    """The first check of function `func` in `rel` whose condition's source contains
    `needle`: an `assert` statement, or a call `torch._assert(condition, "message")`:
    {"line" (the statement's or the call's first line), "raw" (that source line),
    "func" (the short name), "message" (the literal message or None), "call" (True for
    torch._assert)}."""
    src = source_file(package_dir, rel)
    if src is None or not _may_contain(src.text, needle):
        return None
    for qual, fn in src.functions:
        if not _func_matches(qual, func):
            continue
        for node in ast.walk(fn):
            test: Optional[ast.expr] = None
            msg: Optional[ast.expr] = None
            call = False
            if isinstance(node, ast.Assert):
                test, msg = node.test, node.msg
            elif (
                isinstance(node, ast.Call)
                and dotted_name(node.func) in ("torch._assert", "_assert")
                and node.args
            ):
                test = node.args[0]
                msg = node.args[1] if len(node.args) > 1 else None
                call = True
            if test is None or needle not in src.segment(test):
                continue
            line = int(getattr(node, "lineno", 0))
            return {
                "line": line,
                "raw": src.line(line),
                "func": qual.rsplit(".", 1)[-1],
                "message": literal_text(msg) if msg is not None else None,
                "call": call,
            }
    return None


def supported_modalities(package_dir: str, rel: str) -> Optional[List[str]]:
    """The modalities `get_supported_mm_limits` returns in model file `rel` (the keys of
    its `return {"image": None, ...}`), or None."""
    src = source_file(package_dir, rel)
    if src is None:
        return None
    out: List[str] = []
    for qual, fn in src.functions:
        if not _func_matches(qual, "get_supported_mm_limits"):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Return) and isinstance(node.value, ast.Dict):
                for key in node.value.keys:
                    text = literal_text(key)
                    if text is not None and text not in out:
                        out.append(text)
    return out or None


def metric_definitions(package_dir: str, rel: str) -> List[Dict[str, Any]]:
    """Prometheus metrics a vLLM module defines: every call with `name="vllm:..."` and
    `documentation=...` keywords: {"name", "documentation", "kind" (counter, gauge,
    histogram), "extra_labels"} in source order."""
    src = source_file(package_dir, rel)
    if src is None:
        return []
    out: List[Dict[str, Any]] = []
    for node in ast.walk(src.tree):
        if not isinstance(node, ast.Call):
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        name = literal_text(kw.get("name"))
        doc = literal_text(kw.get("documentation"))
        if not name or not name.startswith("vllm:") or doc is None:
            continue
        callee = (dotted_name(node.func) or "").lower()
        kind = (
            "counter"
            if "counter" in callee
            else "gauge"
            if "gauge" in callee
            else ("histogram" if "histogram" in callee else "other")
        )
        extra: List[str] = []
        labels = kw.get("labelnames")
        if isinstance(labels, ast.Name):
            fn = src.function(src.enclosing(node.lineno)) if src.enclosing(node.lineno) else None
            for sub in ast.walk(fn) if fn is not None else []:
                if isinstance(sub, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == labels.id for t in sub.targets
                ):
                    labels = sub.value
                    break
        for sub in ast.walk(labels) if labels is not None else []:
            if isinstance(sub, ast.List):
                extra += [str(e.value) for e in sub.elts if isinstance(e, ast.Constant)]
        out.append(
            {
                "name": name,
                "documentation": doc,
                "kind": kind,
                "extra_labels": extra,
                "line": node.lineno,
            }
        )
    out.sort(key=lambda m: m["line"])
    return out
