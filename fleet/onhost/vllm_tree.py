# fleet on-host module: what the installed vLLM source says about EAGLE-3, read with `ast`.
#
# Shipped inside bundles (facts, the serve helper, the rehearsal vLLM) and imported
# locally by the pure parsers (fleet/facts/parsers.py): one judgement of "does this class
# support EAGLE-3" and "does the config-time allowlist admit this model type" for fleet
# inspect, serve's preflight and the simulated vLLM. Python 3.8+, standard library only,
# never imports vLLM.
import ast
import os
from typing import Any, Callable, Dict, Iterator, List, Optional

from fleet.onhost._common import dumps, loads, parse_python
from fleet.onhost.files import replace_file

MODEL_FILES = ("model_executor/models/deepseek_v2.py", "model_executor/models/kimi_k25.py")
# where the config-time EAGLE-3 allowlist lived across versions (0.10-0.20)
ALLOWLIST_FILES = ("config/speculative.py", "config/__init__.py", "config.py")
ALLOWLIST_NAMES = ("eagle3_target_supported", "aux_hidden_states_supported")
EAGLE3_INTERFACE = "SupportsEagle3"
AUX_LAYERS_METHOD = "set_aux_hidden_state_layers"
EAGLE3_CLASSES = (
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "KimiK25ForConditionalGeneration",
)
# hf_text_config.model_type values checked against the allowlist
ALLOWLIST_MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_k25")


def dotted_name(node: ast.expr) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        left = dotted_name(node.value)
        return None if left is None else left + "." + node.attr
    if isinstance(node, ast.Subscript):  # Generic[T], Protocol[T]
        return dotted_name(node.value)
    return None


def module_class_nodes(body: List[ast.stmt]) -> Iterator[ast.ClassDef]:
    # classes at module level, including those inside module-level if/try blocks
    for node in body:
        if isinstance(node, ast.ClassDef):
            yield node
        elif isinstance(node, ast.If):
            for sub in module_class_nodes(node.body + node.orelse):
                yield sub
        elif isinstance(node, ast.Try):
            handlers: List[ast.stmt] = []
            for handler in node.handlers:
                handlers.extend(handler.body)
            for sub in module_class_nodes(node.body + handlers + node.orelse + node.finalbody):
                yield sub


def classes_of(source: str) -> Dict[str, Any]:
    """{class name: {"line", "bases", "methods", "attributes"}} of a module's source."""
    tree = parse_python(source)
    classes: Dict[str, Any] = {}
    for node in module_class_nodes(tree.body):
        methods: List[str] = []
        attributes: List[str] = []
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                methods.append(item.name)
            elif isinstance(item, ast.Assign):
                attributes.extend(t.id for t in item.targets if isinstance(t, ast.Name))
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                attributes.append(item.target.id)
        classes[node.name] = {
            "line": node.lineno,
            "bases": [dotted_name(b) or "<expr>" for b in node.bases],
            "methods": methods,
            "attributes": attributes,
        }
    return classes


# -- what is derived from a file, kept on the host ---------------------------------------
#
# Parsing deepseek_v2.py, kimi_k25.py and config/speculative.py (and hashing them) is most
# of what `fleet inspect` costs a host, and the files change only when vLLM is upgraded
# or patched. DerivedCache keeps each derived value in ~/.cache/fleet-onhost/derived.json
# keyed by the code that derived it (the bundle's digest) and the file's real path, size,
# mtime, ctime and inode: any write (an atomic rename makes a new inode) derives it again.
# The file is JSON (never code), mode 0600 in a 0700 directory, replaced atomically.
CACHE_DIR = os.path.join("~", ".cache", "fleet-onhost")
CACHE_FILE = "derived.json"
CACHE_ENTRIES = 64  # kept (the newest): a handful of vLLM environments and fleet versions


class DerivedCache:
    def __init__(self, code: str, directory: Optional[str] = None) -> None:
        self.code = code
        self.directory = os.path.expanduser(directory or CACHE_DIR)
        self.path = os.path.join(self.directory, CACHE_FILE)
        self.entries: Dict[str, Any] = {}
        self.dirty = False
        self.hits = 0
        try:
            with open(self.path, encoding="utf-8") as fh:
                doc = loads(fh.read())
            if isinstance(doc, dict) and isinstance(doc.get("entries"), dict):
                self.entries = doc["entries"]
        except (OSError, ValueError):
            pass

    def derive(self, kind: str, path: str, func: Callable[[str], Any]) -> Any:
        """func(path), or what it gave for this very file before."""
        st = os.stat(path)
        # the code is in the key too: two fleet versions used on one host keep one entry
        # each instead of deriving again in turn (and in the stamp: a hit is this code's)
        key = kind + ":" + self.code[:16] + ":" + os.path.realpath(path)
        stamp = [self.code, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        entry = self.entries.get(key)
        if isinstance(entry, dict) and entry.get("stamp") == stamp and "value" in entry:
            self.hits += 1
            return entry["value"]
        value = func(path)
        self.entries.pop(key, None)  # re-inserted last: the newest
        self.entries[key] = {"stamp": stamp, "value": value}
        self.dirty = True
        return value

    def save(self) -> None:
        if not self.dirty:
            return
        keys = list(self.entries)[-CACHE_ENTRIES:]
        doc = {"entries": {k: self.entries[k] for k in keys}}
        try:  # the one on-host writer: a unique temp (O_EXCL|O_NOFOLLOW), fsync, rename
            replace_file(self.path, dumps(doc).encode("utf-8"))
            self.dirty = False
        except OSError:  # no room or read-only home: the next run derives again
            pass


def _derive(cache: Optional[DerivedCache], kind: str, path: str, func: Callable[[str], Any]) -> Any:
    return cache.derive(kind, path, func) if cache is not None else func(path)


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def file_classes(path: str) -> Dict[str, Any]:
    return classes_of(_read_text(path))


def file_digest(path: str) -> Dict[str, Any]:
    """{"sha256", "size"} of a file's bytes."""
    import hashlib  # only when a file is hashed (not on a cache hit)

    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return {"sha256": digest.hexdigest(), "size": size}


def model_classes(package_dir: str, cache: Optional[DerivedCache] = None) -> Dict[str, Any]:
    """{"files": {relpath: {"classes": ...} | {"missing": true} | {"error": ...}}}."""
    files: Dict[str, Any] = {}
    for rel in MODEL_FILES:
        full = os.path.join(package_dir, rel)
        if not os.path.isfile(full):
            files[rel] = {"missing": True}
            continue
        try:
            files[rel] = {"classes": _derive(cache, "classes", full, file_classes)}
        except Exception as exc:
            files[rel] = {"error": type(exc).__name__ + ": " + str(exc)}
    return {"files": files}


def file_digests(package_dir: str, cache: Optional[DerivedCache] = None) -> Dict[str, Any]:
    """{relpath: {"sha256", "size"} | {"missing": true} | {"error": ...}} of the files
    the EAGLE-3 judgement reads (the model files and the allowlist's)."""
    out: Dict[str, Any] = {}
    for rel in MODEL_FILES + ALLOWLIST_FILES:
        full = os.path.join(package_dir, rel)
        if not os.path.isfile(full):
            if rel in MODEL_FILES:
                out[rel] = {"missing": True}
            continue
        try:
            out[rel] = _derive(cache, "sha256", full, file_digest)
        except Exception as exc:
            out[rel] = {"error": type(exc).__name__ + ": " + str(exc)}
    return out


def string_list(node: Optional[ast.expr]) -> Optional[List[str]]:
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = []
        for elt in node.elts:
            if not (isinstance(elt, ast.Constant) and isinstance(elt.value, str)):
                return None
            items.append(elt.value)
        return items
    return None


def file_allowlists(path: str) -> List[Dict[str, Any]]:
    """[{"name", "line", "entries"}]: every assignment of an allowlist name in a file."""
    found: List[Dict[str, Any]] = []
    for node in ast.walk(parse_python(_read_text(path))):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name) and target.id in ALLOWLIST_NAMES:
                found.append(
                    {"name": target.id, "line": node.lineno, "entries": string_list(node.value)}
                )
    return found


def allowlists(package_dir: str, cache: Optional[DerivedCache] = None) -> Dict[str, Any]:
    """{"searched": [relpath], "found": [{"file", "name", "line", "entries"}]}: every
    assignment of an allowlist name in the files where vLLM kept it."""
    searched: List[str] = []
    found: List[Dict[str, Any]] = []
    for rel in ALLOWLIST_FILES:
        full = os.path.join(package_dir, rel)
        if not os.path.isfile(full):
            continue
        searched.append(rel)
        for item in _derive(cache, "allowlists", full, file_allowlists):
            found.append({"file": rel, **item})
    return {"searched": searched, "found": found}


def short_name(base: str) -> str:
    return base.rsplit(".", 1)[-1]


def _names(value: Any) -> List[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def eagle3_support(classes: Dict[str, Any], name: str, file: str = "") -> Dict[str, Any]:
    """How class `name` is judged: does it list SupportsEagle3 among its bases, directly
    or through a base class defined in the same file (``interfaces.SupportsEagle3``
    counts), and does it (or an in-file base) define set_aux_hidden_state_layers?

    Both walks are iterative (an inheritance chain of any length, cycles included) and
    take any JSON-shaped table (the local parsers feed it what a host answered)."""
    table = classes if isinstance(classes, dict) else {}

    def entry(cls: str) -> Dict[str, Any]:
        found = table.get(cls)
        return found if isinstance(found, dict) else {}

    def bases_of(cls: str) -> List[str]:
        return _names(entry(cls).get("bases"))

    # depth-first, bases in order: the first chain found
    chain: Optional[List[str]] = None
    seen: set = set()
    stack = [(name, [])]  # type: List[Any]
    while stack:
        cls, path = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        path = [*path, cls] if len(path) < 64 else [*path[:63], "...", cls]
        bases = bases_of(cls)
        if any(short_name(b) == EAGLE3_INTERFACE for b in bases):
            chain = path
            break
        stack.extend((b, path) for b in reversed(bases) if "." not in b and b in table)

    ancestry: List[str] = []
    visited: set = set()
    todo = [name]
    while todo:
        cls = todo.pop()
        if cls in visited or cls not in table:
            continue
        visited.add(cls)
        ancestry.append(cls)
        todo.extend(b for b in reversed(bases_of(cls)) if "." not in b)
    forwards = any(AUX_LAYERS_METHOD in _names(entry(c).get("methods")) for c in ancestry)
    line = entry(name).get("line")
    ok_line = isinstance(line, int) and not isinstance(line, bool) and 0 <= line < 1 << 31
    return {
        "file": file,
        "line": line if ok_line else 0,
        "supported": chain is not None,
        "via": chain or [],
        "bases": bases_of(name),
        "methods": _names(entry(name).get("methods")),
        "forwards_aux_hidden_state_layers": forwards,
    }


def find_class(files: Dict[str, Any], name: str) -> Optional[Dict[str, Any]]:
    """`eagle3_support` of `name`, judged within the file that defines it, or None."""
    for rel, entry in sorted(files.items()):
        classes = entry.get("classes") if isinstance(entry, dict) else None
        if isinstance(classes, dict) and name in classes:
            return eagle3_support(classes, name, rel)
    return None


def judge_allowlist(raw: Dict[str, Any]) -> Dict[str, Any]:
    """vLLM's test ``any(entry in hf_text_config.model_type for entry in allowlist)`` for
    each of ALLOWLIST_MODEL_TYPES; ``present`` false: no allowlist (nothing refused).
    Takes any JSON-shaped value (what a host answered)."""
    found_raw = raw.get("found") if isinstance(raw, dict) else None
    found = [f for f in found_raw if isinstance(f, dict)] if isinstance(found_raw, list) else []
    if not found:
        return {"present": False, "admits": {t: True for t in ALLOWLIST_MODEL_TYPES}}
    chosen = next((f for f in found if isinstance(f.get("entries"), list)), found[0])
    raw_entries = chosen.get("entries")
    entries = (
        [str(e) for e in raw_entries if isinstance(e, (str, int, float))]
        if isinstance(raw_entries, list)
        else None
    )
    line = chosen.get("line")
    return {
        "present": True,
        "file": chosen.get("file") if isinstance(chosen.get("file"), str) else None,
        "name": chosen.get("name") if isinstance(chosen.get("name"), str) else None,
        "line": line if isinstance(line, int) and not isinstance(line, bool) else None,
        "entries": entries,
        "admits": {t: admits(entries, t) for t in ALLOWLIST_MODEL_TYPES},
    }


def admits(entries: Optional[List[str]], model_type: str) -> bool:
    """Whether an allowlist lets `model_type` through (vLLM's substring test)."""
    return bool(entries) and any(str(e) in model_type for e in entries or [])
