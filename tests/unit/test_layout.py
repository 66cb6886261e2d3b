"""The rules of the layout (CONTRIBUTING.md), checked on the source itself.

- no import cycle between fleet's modules (imports under ``if TYPE_CHECKING`` excepted);
- shell text is quoted and assembled only in ``fleet/transport/shell.py``: no other module
  imports ``shlex``, makes a ``Command``/``Raw`` from anything but a constant, or passes an
  f-string, a concatenation or a literal string to ``run``/``stream``;
- code that runs on a host lives only in ``fleet/onhost/`` (only its client sends a Python
  script to a host);
- every module has its logger (``logging.getLogger(__name__)``) where it logs at all, and
  the CLI never calls the remote layer's private helpers.

``python -m tests.unit.test_layout`` prints the import graph's cycles (none) for the record.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "fleet"


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        name = ".".join(rel.parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                for sub in node.body:
                    skip |= {id(n) for n in ast.walk(sub)}
    return skip


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text())
    skip = _type_checking_nodes(tree)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _package_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Edges between modules, ignoring a package's own ``__init__`` re-exports."""
    return {
        name: {t for t in targets if not name.startswith(t + ".")}
        for name, targets in graph.items()
    }


def test_no_import_cycle() -> None:
    found = cycles(_package_edges(import_graph()))
    assert found == [], f"import cycles: {found}"


def _py_files(skip: tuple[str, ...] = ()) -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(ROOT.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel not in skip:
            yield path, ast.parse(path.read_text())


def _is_constant_text(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def test_shell_text_is_built_only_in_transport_shell() -> None:
    problems = []
    for path, tree in _py_files(skip=("transport/shell.py",)):
        rel = path.relative_to(ROOT)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names]
                module = getattr(node, "module", None) or ""
                if "shlex" in names or module == "shlex":
                    problems.append(f"{rel}:{node.lineno}: imports shlex")
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if fname in ("Command", "Raw") and not all(_is_constant_text(a) for a in node.args):
                problems.append(f"{rel}:{node.lineno}: {fname}() of a non-constant")
            if fname in ("run", "stream") and isinstance(func, ast.Attribute) and node.args:
                first = node.args[0]
                handmade = isinstance(first, ast.JoinedStr | ast.BinOp) or _is_constant_text(first)
                handmade |= (
                    isinstance(first, ast.Call)
                    and isinstance(first.func, ast.Attribute)
                    and first.func.attr in ("format", "join", "replace")
                    and not (
                        isinstance(first.func.value, ast.Name) and first.func.value.id == "shell"
                    )
                )
                if handmade and _receiver(func) in ("conn", "self", "gateway", "runner", "host"):
                    problems.append(
                        f"{rel}:{node.lineno}: a hand-built command passed to {fname}()"
                    )
    assert problems == []


def _receiver(func: ast.Attribute) -> str:
    value = func.value
    if isinstance(value, ast.Name):
        return value.id
    if isinstance(value, ast.Attribute):
        return value.attr
    return ""


def test_only_the_onhost_client_sends_python_to_a_host() -> None:
    offenders = []
    for path, tree in _py_files(skip=("transport/shell.py", "onhost/client.py")):
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "python"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "shell"
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []
    shipped = {p.stem for p in (ROOT / "onhost").glob("*.py")} - {"__init__", "client"}
    outside = [
        str(p.relative_to(ROOT))
        for p in ROOT.rglob("*.py")
        if "onhost" not in p.parts and "sys.path[:] = [p for p in sys.path" in p.read_text()
    ]
    assert shipped and outside == []


def test_python_is_parsed_only_through_the_one_parse_lock() -> None:
    """CPython 3.11 fails ``ast.parse`` run by several threads at once (SystemError: AST
    constructor recursion depth mismatch), and fleet parses from its fan-out and sandbox
    build threads: every parse goes through ``fleet.onhost._common.parse_python``."""
    offenders = []
    for path, tree in _py_files(skip=("onhost/_common.py",)):
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("parse", "literal_eval")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "ast"
                and not (node.args and isinstance(node.args[0], ast.Call))
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


def test_yaml_is_read_only_through_safeyaml() -> None:
    """Every YAML file fleet reads goes through ``fleet.safeyaml`` (bounded depth and
    aliases, duplicate keys refused, libyaml's parser): no other module calls PyYAML's
    loaders (``yaml.safe_load``, ``yaml.load``, ``yaml.full_load``...)."""
    offenders = []
    for path, tree in _py_files(skip=("safeyaml.py",)):
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "yaml"
                and "load" in node.attr
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: yaml.{node.attr}")
    assert offenders == []


def _logs(tree: ast.Module) -> bool:
    """Does the module call ``log.<level>(...)`` or ``logging.<level>(...)``?"""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("debug", "info", "warning", "error", "exception")
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in ("log", "logger", "logging")
        ):
            return True
    return False


def test_every_module_that_logs_has_its_own_logger() -> None:
    missing = []
    for path, tree in _py_files():
        if "onhost" in path.parts and path.stem != "client":
            continue  # runs on a host: answers, never logs
        if "in_env" in path.parts:
            continue  # run by the real vLLM's python on sandbox hosts: logs through vLLM's
            # own logger tree ("vllm.sandbox_testonly"), where vLLM's log shows it
        if _logs(tree) and "log = logging.getLogger(__name__)" not in path.read_text():
            missing.append(str(path.relative_to(ROOT)))
    assert missing == []
    remote_layers = (
        "transport/connection.py",
        "transport/runner.py",
        "transport/fanout.py",
        "onhost/client.py",
    )
    for rel in remote_layers:
        assert _logs(ast.parse((ROOT / rel).read_text())), f"{rel} must log what it does (-vv)"


def test_the_cli_uses_no_private_helper_of_another_package() -> None:
    offenders = []
    for path, tree in _py_files():
        if "cli" not in path.relative_to(ROOT).parts:
            continue
        for node in ast.walk(tree):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            if module and module.startswith("fleet") and not module.startswith("fleet.cli"):
                offenders += [
                    f"{path.name}: {module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert offenders == []


if __name__ == "__main__":
    graph = _package_edges(import_graph())
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} import edges")
    print("cycles:", cycles(graph) or "none")


# The packages of fleet, lowest first: a package imports only packages before it (no
# back-edge: the pure core never reaches up into serving or the CLI).
LAYERS = (
    "errors", "redact", "paths", "sizes", "localfiles", "safeyaml", "inventory", "transport",
    "onhost", "facts", "source", "patching", "diagnosis", "wheels", "serving", "sandbox",
    "cli", "console", "__main__",
)  # fmt: skip


def package_edges() -> set[tuple[str, str]]:
    def package(module: str) -> str:
        return module.split(".")[1] if module.count(".") >= 1 else module

    return {
        (package(a), package(b))
        for a, targets in import_graph().items()
        for b in targets
        if package(a) != package(b) and package(b) != "fleet"
    }


def test_no_package_imports_a_package_above_it() -> None:
    edges = package_edges()
    unknown = sorted({p for edge in edges for p in edge} - set(LAYERS))
    assert not unknown, f"add these packages to LAYERS: {unknown}"
    back = sorted((a, b) for a, b in edges if LAYERS.index(b) > LAYERS.index(a))
    assert not back, f"imports against the layers: {back}"


def test_one_diagnosis_factory() -> None:
    """Every Diagnosis is built by fleet.diagnosis.factory (the engine's findings and
    fleet's own observations alike)."""
    makers = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("diagnosis/factory.py", "diagnosis/models.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                if name == "Diagnosis":
                    makers.append(f"{rel}:{node.lineno}")
    assert not makers, f"Diagnosis built outside fleet/diagnosis/factory.py: {makers}"


PRODUCTION_SCRIPTS = ("facts", "patch", "source", "serve")


def test_no_rehearsal_code_rides_in_a_production_bundle() -> None:
    """What fleet sends a real GPU host holds nothing of the rehearsal room (the
    simulated vLLM, its source mining, the nvidia-smi stand-in)."""
    from fleet.onhost.client import bundle

    for name in PRODUCTION_SCRIPTS:
        found = bundle(name)
        rehearsal = [m for m in found.modules if m.startswith("rehearsal.")]
        assert not rehearsal, f"the {name} bundle holds rehearsal modules: {rehearsal}"
        assert "vllm_sim" not in found.text and "SimSource" not in found.text, name
    # and the rehearsal vLLM is bundled from that room
    assert any(m.startswith("rehearsal.") for m in bundle("rehearsal.vllm_sim").modules)


# The longest a class in fleet/ may be, from its `class` line to its last (ast). The aim is
# 400; three classes outside the rehearsal room are longer today (diagnosis/engine.py
# Engine 567, sandbox/core.py Sandbox 500, serving/group.py _GroupServe 447), so the limit
# stands above them until they are split too.
MAX_CLASS_LINES = 600


def class_lengths() -> list[tuple[int, str]]:
    """(lines, "path::Class") of every class in fleet/, longest first."""
    found = []
    for path, tree in _py_files():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                found.append((lines, f"{path.relative_to(ROOT)}::{node.name}"))
    return sorted(found, reverse=True)


def test_no_class_is_longer_than_the_limit() -> None:
    """A class that outgrows the limit does several jobs: split it along them (as the
    rehearsal vLLM's Sim was: vllm_sim_config/load/kv/faults.py over one SimState)."""
    longer = [
        f"{name} ({lines} lines)" for lines, name in class_lengths() if lines > MAX_CLASS_LINES
    ]
    assert not longer, f"classes longer than {MAX_CLASS_LINES} lines: {longer}"


# One home per concept (issue 20). Each rule takes a checkout's top directory, so that it
# can be run on an older tree (one_home_report(root), at the end) and seen to fail there.

# Every FLEET_* variable fleet reads is a setting a user may set (README), none a test knob.
ENV_SETTINGS = frozenset({
    "FLEET_CACHE", "FLEET_CONNECT_ATTEMPTS", "FLEET_INVENTORY", "FLEET_SSH_CONFIG",
    "FLEET_SANDBOX_BACKEND",
})  # fmt: skip
KNOB_WORDS = ("FAULT", "TEST", "KNOB", "INJECT")


def _module_strings(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "text"`` constants (an env name is often one)."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and _is_constant_text(node.value):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = str(node.value.value)  # type: ignore[attr-defined]
    return out


def _is_environ(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def env_reads(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of every environment variable read by a constant name: os.environ.get /
    [] / pop / setdefault / ``in``, os.getenv."""
    names = _module_strings(tree)

    def name_of(node: ast.expr) -> str | None:
        if _is_constant_text(node):
            return str(node.value)  # type: ignore[attr-defined]
        return names.get(node.id) if isinstance(node, ast.Name) else None

    found = []
    for node in ast.walk(tree):
        arg: ast.expr | None = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            func = node.func
            environ = func.attr in ("get", "pop", "setdefault") and _is_environ(func.value)
            if environ or func.attr == "getenv":
                arg = node.args[0]
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            arg = node.slice
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            arg = node.left
        name = name_of(arg) if arg is not None else None
        if name is not None:
            found.append((node.lineno, name))
    return found


def env_knob_reads(root: Path) -> list[str]:
    out = []
    for path in sorted((root / "fleet").rglob("*.py")):
        rel = path.relative_to(root / "fleet")
        for line, name in env_reads(ast.parse(path.read_text())):
            knob = any(word in name.upper() for word in KNOB_WORDS)
            if knob or (name.startswith("FLEET_") and name not in ENV_SETTINGS):
                out.append(f"{rel}:{line}: reads ${name}")
    return out


def test_no_module_of_fleet_reads_a_test_knob_from_the_environment() -> None:
    """A fault or test switch is never read from the environment by fleet's own code (the
    tests rebind a bundle's named points instead: tests/faults.py); a FLEET_* variable fleet
    reads is a documented setting (ENV_SETTINGS)."""
    assert env_knob_reads(ROOT.parent) == []


def file_primitives(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, what) of each rename-over and each flock: os.replace / os.rename,
    ``<path>.replace(target)`` / ``.rename(target)`` (one argument: not str.replace), and
    any use of fcntl."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            module = getattr(node, "module", None) or ""
            if module == "fcntl" or any(a.name == "fcntl" for a in node.names):
                found.append((node.lineno, "import fcntl"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            owner = func.value.id if isinstance(func.value, ast.Name) else None
            if owner == "os" and func.attr in ("replace", "rename"):
                found.append((node.lineno, f"os.{func.attr}"))
            elif owner == "fcntl":
                found.append((node.lineno, f"fcntl.{func.attr}"))
            elif (
                func.attr in ("replace", "rename")
                and owner != "os"
                and len(node.args) == 1
                and not node.keywords
            ):
                found.append((node.lineno, f".{func.attr}()"))
    return found


# What may rename over a file or take a flock besides the one home, and why.
ONHOST_FILE_EXCEPTIONS = {
    # a log set aside before a launch (a rename of a whole file, no content written)
    ("serve.py", "os.replace"),
}
LOCAL_FILE_EXCEPTIONS = {
    # known_hosts is locked and appended to in place, as OpenSSH writes it (not a lock file)
    ("transport/hostkeys.py", "import fcntl"),
    ("transport/hostkeys.py", "fcntl.flock"),
    # a whole unpacked tree, built beside its place and renamed into it (a directory)
    ("sandbox/vllm_source.py", "os.replace"),
}
# the sandbox's own writers and lock, still to move to fleet.localfiles (issue 20)
LOCAL_FILE_PENDING: set[tuple[str, str]] = set()


def onhost_file_writers(root: Path) -> list[str]:
    """Within the shipped on-host modules, renames and flocks outside files.py."""
    out = []
    for path in sorted((root / "fleet" / "onhost").glob("*.py")):
        if path.name == "files.py":
            continue
        for line, what in file_primitives(ast.parse(path.read_text())):
            if (path.name, what) not in ONHOST_FILE_EXCEPTIONS:
                out.append(f"onhost/{path.name}:{line}: {what}")
    return out


def local_file_writers(root: Path) -> list[str]:
    """Outside fleet/onhost/ (the host's room has its own home), renames and flocks outside
    fleet/localfiles.py."""
    out = []
    allowed = LOCAL_FILE_EXCEPTIONS | LOCAL_FILE_PENDING
    for path in sorted((root / "fleet").rglob("*.py")):
        rel = path.relative_to(root / "fleet").as_posix()
        if rel.startswith("onhost/") or rel == "localfiles.py":
            continue
        for line, what in file_primitives(ast.parse(path.read_text())):
            if (rel, what) not in allowed:
                out.append(f"{rel}:{line}: {what}")
    return out


def test_onhost_files_are_written_and_locked_only_by_files_py() -> None:
    """On a host, one atomic writer and one lock (fleet/onhost/files.py: replace_file,
    rename_temp, FileLock): no shipped module renames over a file or takes a flock itself.
    (The rehearsal room runs on sandbox hosts only and is not held to it.)"""
    assert onhost_file_writers(ROOT.parent) == []


def test_local_files_are_written_and_locked_only_by_localfiles() -> None:
    """On the control machine, one atomic writer and one lock (fleet/localfiles.py:
    atomic_write, locked)."""
    assert local_file_writers(ROOT.parent) == []
    # and the exceptions still exist (an entry that no longer matches is removed)
    present = {
        (path.relative_to(ROOT).as_posix(), what)
        for path in ROOT.rglob("*.py")
        for _line, what in file_primitives(ast.parse(path.read_text()))
    }
    assert present >= LOCAL_FILE_EXCEPTIONS | LOCAL_FILE_PENDING
    assert present >= {("onhost/" + f, w) for f, w in ONHOST_FILE_EXCEPTIONS}


_TYPE_MAKERS = ("Literal", "Union", "Optional", "Callable", "Annotated", "NewType",
                "NamedTuple", "TypedDict")  # fmt: skip


def public_type_names(tree: ast.Module) -> list[str]:
    """The public types a module defines at its top: classes and type aliases (``X =
    Literal[...]``, ``Callable[...]``, ``A | B``, ``X: TypeAlias = ...``); a TypeVar is a
    parameter, not a type of its own."""
    names = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names.append(node.name)
            continue
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            alias = False
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
            alias = ast.unparse(node.annotation).endswith("TypeAlias")
        else:
            continue
        if isinstance(value, ast.Subscript | ast.Call):
            head = value.value if isinstance(value, ast.Subscript) else value.func
            alias |= ast.unparse(head).rsplit(".", 1)[-1] in _TYPE_MAKERS
        alias |= isinstance(value, ast.BinOp) and isinstance(value.op, ast.BitOr)
        if alias and isinstance(target, ast.Name):
            names.append(target.id)
    return [n for n in names if not n.startswith("_")]


# Type names that two modules may define, and why.
SHARED_TYPE_NAMES: dict[str, str] = {}
# to be renamed in the files of the serve session (issue 20): the same callback type three
# times, and names that another package defines first
SHARED_TYPE_NAMES_PENDING: dict[str, str] = {}


def shared_type_names(root: Path) -> dict[str, list[str]]:
    where: dict[str, list[str]] = {}
    for path in sorted((root / "fleet").rglob("*.py")):
        rel = path.relative_to(root / "fleet").as_posix()
        for name in public_type_names(ast.parse(path.read_text())):
            where.setdefault(name, []).append(rel)
    allowed = SHARED_TYPE_NAMES.keys() | SHARED_TYPE_NAMES_PENDING.keys()
    return {n: ps for n, ps in where.items() if len(ps) > 1 and n not in allowed}


def test_no_two_modules_define_the_same_public_type_name() -> None:
    """A name a newcomer reads (``Backend``, ``Verdict``, ``Status``) means one thing in
    fleet: no two modules define a public class or type alias of the same name."""
    assert shared_type_names(ROOT.parent) == {}
    every = {
        name
        for path in ROOT.rglob("*.py")
        for name in public_type_names(ast.parse(path.read_text()))
    }
    assert set(SHARED_TYPE_NAMES_PENDING) <= every, "remove the entries renamed"


ONE_HOME_RULES = {
    "env knobs": env_knob_reads,
    "on-host writers": onhost_file_writers,
    "local writers": local_file_writers,
    "type names": shared_type_names,
}


def one_home_report(root: Path) -> dict[str, object]:
    """What each one-home rule finds in the tree at ``root`` (a checkout's top)."""
    return {name: rule(root) for name, rule in ONE_HOME_RULES.items()}
