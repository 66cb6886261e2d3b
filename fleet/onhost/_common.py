# fleet on-host runtime: bundled in front of every script fleet runs on a host.
#
# Runs ON THE HOST with the interpreter of the vLLM environment (the inventory's
# `python`), Python 3.8+, standard library only; it never imports vLLM or torch.
# `fleet.onhost.client.bundle()` writes, in this order: a two-line prologue that drops the
# working directory from sys.path before anything is imported (a `platform.py` or a
# `vllm/` package in the login directory must never be executed or found), this module,
# the modules a script imports from `fleet.onhost`, the script, and one call:
#
#     raise SystemExit(serve(OPS, "<base64 of zlib of the JSON request>"))
#
# fleet sends the bundle framed on stdin to `PY -c LOADER` (fleet.transport.shell.python:
# sys.path fixed first, then exactly the bundle read and run) and keeps stdin open while it
# waits: EOF on it means fleet is gone, and the watchdog (watch_fleet) ends the script and
# the tools it started, unless the operation holds (hold_on_hangup: a write in progress).
#
# A script in a conversation (`converse` instead of `serve`, fleet.onhost.client's
# Conversation) answers its first request, then reads further requests from the held stdin
# (each framed: its length, a newline, the encoded request; fleet sends one only after the
# answer to the last) and answers each the same way, until stdin ends.
#
# The script answers each request with ONE envelope on stdout (begin marker, base64 of zlib of JSON,
# end marker), so that a noisy shell start-up file cannot corrupt the answer:
#
#     {"schema": 1, "script": NAME, "result": {...}}              the operation ran
#     {"schema": 1, "script": NAME, "refused": MSG, "code": CODE}  a clean refusal
#     {"schema": 1, "script": NAME, "error": "Type: message"}      an unexpected fault
#
# No `from __future__` here or in any shipped module: that statement imports the module
# `__future__`, which the login directory could shadow before the prologue runs. The
# bundle's own first statement makes annotations strings (runner.PROLOGUE): `typing` is
# for mypy only, and the other standard modules imported here are imported on the host
# where the bundle first uses them (runner.EAGER_MODULES): what a run never uses costs it
# nothing (a short run's imports were most of its time on the host).
import _thread
import binascii
import json
import os
import signal
import sys
import zlib
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

SCHEMA = 1
BEGIN = "----- fleet answer begin -----"
END = "----- fleet answer end -----"


# CPython 3.11 can fail ``ast.parse`` run from several threads of one process at once
# ("SystemError: AST constructor recursion depth mismatch"): fleet parses from its fan-out
# threads, so every parse in fleet goes through this one lock.
_PARSE = _thread.allocate_lock()


def parse_python(source: Union[str, bytes], mode: str = "exec") -> Any:
    """``ast.parse`` of ``source``, one thread at a time (see ``_PARSE``)."""
    import ast

    with _PARSE:
        return ast.parse(source, mode=mode)


class Refused(Exception):
    """A request the host cannot serve, answered as {"refused", "code"} (not a crash)."""

    def __init__(self, message: str, code: str = "refused") -> None:
        Exception.__init__(self, message)
        self.message = message
        self.code = code


def installed_path() -> List[str]:
    """sys.path without the working directory ('' for `python -`, or '.')."""
    return [p for p in sys.path if p not in ("", ".")]


def find_vllm() -> Optional[str]:
    """The real path of the installed vllm package directory, or None.

    Asks each finder on sys.meta_path, as the import system does for a top-level name
    (importlib.util.find_spec without importing it: contextlib, collections... ~4 ms), so
    the package is never executed and the meta path finders of editable installs are
    honoured; the working directory is never searched."""
    saved = sys.path[:]
    sys.path[:] = installed_path()
    spec = None
    try:
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec("vllm", None) if find_spec is not None else None
            if spec is not None:
                break
    finally:
        sys.path[:] = saved
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if locations:
        return os.path.realpath(locations[0])
    if spec.origin:
        return os.path.realpath(os.path.dirname(spec.origin))
    return None


def version_from_file(package_dir: str) -> Optional[str]:
    """vllm/_version.py (setuptools-scm): `__version__ = version = '0.17.0'`."""
    import ast

    try:
        with open(os.path.join(package_dir, "_version.py"), "rb") as fh:
            tree = parse_python(fh.read())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if "__version__" in names or "version" in names:
                return str(node.value.value)
    return None


def _dist_info_version(name: str) -> Optional[str]:
    """The version in the first ``NAME-*.dist-info/METADATA`` of sys.path (the working
    directory excluded), as importlib.metadata finds it for a plain installed wheel, without
    importing importlib.metadata (a third of a small script's start-up). None when not
    found that way (egg-info, zips, custom finders: the caller asks importlib.metadata)."""
    prefix = name.lower() + "-"
    for entry in installed_path():
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for item in sorted(names):
            low = item.lower()
            if not (low.startswith(prefix) and low.endswith(".dist-info")):
                continue
            if low[len(prefix) : -len(".dist-info")].count("-"):
                continue  # another project whose name starts with NAME-
            try:
                with open(os.path.join(entry, item, "METADATA"), "rb") as fh:
                    head = fh.read(65536).decode("utf-8", "replace")
            except OSError:
                return None
            for line in head.splitlines():
                if not line.strip():
                    break  # end of the headers
                key, _, value = line.partition(":")
                if key.strip().lower() == "version" and value.strip():
                    return value.strip()
            return None
    return None


def vllm_version(package_dir: Optional[str]) -> Tuple[Optional[str], Optional[str]]:
    """(version, source): the installed distribution's metadata, else _version.py."""
    version = _dist_info_version("vllm")
    if version:
        return version, "metadata"
    saved = sys.path[:]
    sys.path[:] = installed_path()
    try:
        from importlib import metadata

        return metadata.version("vllm"), "metadata"
    except Exception:
        pass
    finally:
        sys.path[:] = saved
    if package_dir:
        version = version_from_file(package_dir)
        if version:
            return version, "_version.py"
    return None, None


def require_vllm() -> str:
    """The installed vllm package directory; Refused("vllm-not-found") without one."""
    package_dir = find_vllm()
    if package_dir is None:
        raise Refused("vLLM is not installed for " + sys.executable, "vllm-not-found")
    return package_dir


def locate_vllm() -> Dict[str, Any]:
    """{"package_dir", "version", "version_source", "python", "python_version"};
    Refused("vllm-not-found") when this interpreter has no vLLM."""
    package_dir = require_vllm()
    version, source = vllm_version(package_dir)
    if not version:
        raise Refused("cannot tell the vLLM version of " + package_dir, "vllm-version-unknown")
    return {
        "package_dir": package_dir,
        "version": version,
        "version_source": source,
        "python": sys.executable,
        "python_version": ".".join(str(n) for n in sys.version_info[:3]),
    }


def inside(root: str, relpath: str) -> str:
    """The path of `relpath` under `root`, refusing absolute paths, '..' and symlinks that
    resolve outside `root` (Refused "path-escapes-tree")."""
    parts = relpath.split("/")
    if not relpath or relpath.startswith("/") or ".." in parts or "\0" in relpath:
        raise Refused("bad path " + repr(relpath), "path-escapes-tree")
    path = os.path.join(root, *parts)
    real = os.path.realpath(path)
    top = os.path.realpath(root)
    if real != top and not real.startswith(top.rstrip(os.sep) + os.sep):
        raise Refused(relpath + " resolves outside " + top, "path-escapes-tree")
    return path


class _CJson:
    """``json.dumps(obj)`` and ``json.loads(text)`` through CPython's C accelerator
    ``_json`` alone, as the json module itself runs them for these calls (its default
    options), without importing json, which imports re, enum, functools and collections:
    ~8 ms of CPU in every run on the host, most of a short run's own work."""

    CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}

    def __init__(self, c: Any) -> None:
        self.c = c
        # the scanner reads its options from these attributes (json.decoder.JSONDecoder)
        self.strict = True
        self.object_hook = None
        self.object_pairs_hook = None
        self.parse_float = float
        self.parse_int = int
        self.parse_constant = self.CONSTANTS.__getitem__
        self.scan = c.make_scanner(self)

    @staticmethod
    def _default(obj: Any) -> Any:
        raise TypeError("Object of type " + type(obj).__name__ + " is not JSON serializable")

    def dumps(self, obj: Any) -> str:
        # a new encoder per call: its dict of markers (circular references) starts empty
        enc = self.c.make_encoder(
            {}, self._default, self.c.encode_basestring_ascii, None, ": ", ", ", False, False, True
        )
        return "".join(enc(obj, 0))

    def loads(self, text: Union[str, bytes]) -> Any:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        start = len(text) - len(text.lstrip(" \t\n\r"))
        try:
            obj, end = self.scan(text, start)
        except StopIteration as exc:
            raise ValueError("Expecting value: char " + str(exc.value)) from None
        if text[end:].strip(" \t\n\r"):
            raise ValueError("Extra data: char " + str(end))
        return obj


_JSON: List[Any] = []  # the codec chosen on first use: a _CJson, or the json module


def _json_codec() -> Any:
    if not _JSON:
        codec: Any = json
        try:
            import _json

            fast = _CJson(_json)
            sample = {"a": [1, -2.5, None, True, "\u00e9\n\ud83d"], "": {}}
            shown = '{"a": [1, -2.5, null, true, "\\u00e9\\n\\ud83d"], "": {}}'
            if fast.dumps(sample) == shown and fast.loads(" " + shown + "\n") == sample:
                codec = fast
        except Exception:  # no accelerator (PyPy), or one that differs: the json module
            pass
        _JSON.append(codec)
    return _JSON[0]


def dumps(obj: Any) -> str:
    """``json.dumps(obj)`` (see ``_CJson``)."""
    return _json_codec().dumps(obj)


def loads(text: Union[str, bytes]) -> Any:
    """``json.loads(text)`` (see ``_CJson``); a malformed text raises ValueError."""
    return _json_codec().loads(text)


def encode(obj: Any) -> str:
    return encode_json(dumps(obj).encode("utf-8"))


def encode_json(text: bytes) -> str:
    """``encode`` of an object already dumped to JSON ``text``. zlib's fastest level: on
    vLLM's sources it takes a third of level 6's time (0.8 against 2.6 ms for the 121 KB
    of an apply request) for 27 % more bytes (31 against 25 KB: 6 KB, which a 100 Mb/s
    link moves in 0.5 ms). Both ends pay it per host: the client for each request, the
    host for each answer (a fetch answers with the files it read)."""
    return binascii.b2a_base64(zlib.compress(text, 1), newline=False).decode("ascii")


def decode(text: str) -> Any:
    return loads(zlib.decompress(binascii.a2b_base64(text)).decode("utf-8"))


def emit(doc: Dict[str, Any]) -> None:
    """Write one answer envelope (and flush); a vanished reader is ignored."""
    try:
        sys.stdout.write(BEGIN + "\n" + encode(doc) + "\n" + END + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


HOLDING = [False]  # set by hold_on_hangup(): the operation finishes even without fleet
IDLE = [False]  # a conversation waits for fleet's next request: EOF just ends it
GRACE_S = 5.0


def hold_on_hangup() -> None:
    """Finish this operation even if fleet goes away (a write in progress is never cut):
    SIGHUP ignored, and the watchdog (watch_fleet) lets the script run to its end."""
    HOLDING[0] = True
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    except (AttributeError, ValueError):
        pass


# The process groups a script starts for its tools (start_group). When fleet goes away
# they end with the script, even when it cannot run its own clean-up in time.
CHILDREN: List[Any] = []
_SPAWNING = [False]
_DEFERRED = [0]  # a SIGTERM that arrived while a child was being started


def start_group(argv: List[str], **kwargs: Any) -> Any:
    """``subprocess.Popen(argv, start_new_session=True, **kwargs)``, registered in CHILDREN
    before fleet's SIGTERM can interrupt: a signal that arrives while the child is started
    takes effect once it is registered (so it is ended too, never orphaned)."""
    import subprocess

    _SPAWNING[0] = True
    try:
        proc = subprocess.Popen(argv, start_new_session=True, **kwargs)
        CHILDREN.append(proc)
    finally:
        _SPAWNING[0] = False
    if _DEFERRED[0]:
        _terminated(_DEFERRED[0], None)
    return proc


def end_children() -> None:
    """SIGKILL every registered process group that has not been reaped."""
    for proc in list(CHILDREN):
        if getattr(proc, "returncode", None) is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass


def _terminated(signum: int, frame: Any) -> None:
    if _SPAWNING[0]:
        _DEFERRED[0] = signum
        return
    end_children()
    raise SystemExit(128 + signum)


class Frames:
    """The requests the watchdog reads from stdin, handed to the main thread: a one-reader
    ``queue.Queue`` (put, blocking get) without threading and queue (~5 ms of imports).
    ``ready`` is held exactly while nothing is waiting; only ``put`` and ``get`` change
    it, under ``guard``, and only ``get`` waits for it."""

    def __init__(self) -> None:
        self.items: List[Optional[str]] = []
        self.guard = _thread.allocate_lock()
        self.ready = _thread.allocate_lock()
        self.ready.acquire()

    def put(self, item: Optional[str]) -> None:
        with self.guard:
            self.items.append(item)
            if self.ready.locked():
                self.ready.release()

    def get(self) -> Optional[str]:
        self.ready.acquire()
        with self.guard:
            item = self.items.pop(0)
            if self.items and self.ready.locked():
                self.ready.release()
            return item


def watch_fleet(requests: Optional[Frames] = None) -> bool:
    """End this script when fleet goes away, unless it holds (hold_on_hangup).

    With ``requests`` (``Frames``: a conversation), the frames read from stdin are put on it,
    then None at its end; the script is not ended when it is idle (waiting for one).

    fleet's loader (fleet.transport.shell.python) leaves stdin open as `_fleet_stdin`
    while fleet waits for the answer: EOF on it means fleet is gone (its timeout, Ctrl-C,
    an error, a dropped connection). Then the script gets SIGTERM, raised as SystemExit
    in the main thread, so `finally` blocks end the tools it started (their process
    groups); if it is still alive after a grace period, it exits. False: nobody watches
    (no held stdin)."""
    held = globals().get("_fleet_stdin")
    if held is None:  # run some other way (python -): nobody to watch
        return False
    main = _thread.get_ident()  # called by serve/converse, in the main thread
    try:
        signal.signal(signal.SIGTERM, _terminated)
    except (AttributeError, ValueError):
        return False

    try:
        fd = held.fileno()
    except (OSError, ValueError, AttributeError):
        return False

    def wait() -> None:
        # the raw descriptor, never the buffered reader: its lock, held by a blocked
        # daemon thread, would stall the interpreter's shutdown
        pending = b""
        try:
            while True:
                data = os.read(fd, 65536)
                if not data:
                    break
                if requests is None:
                    continue
                pending += data
                while b"\n" in pending:
                    head, rest = pending.split(b"\n", 1)
                    size = int(head)  # not a number: a broken frame ends the conversation
                    if len(rest) < size:
                        break
                    requests.put(rest[:size].decode("ascii"))
                    pending = rest[size:]
        except (OSError, ValueError):
            pass
        if requests is not None:
            requests.put(None)
        if HOLDING[0] or IDLE[0]:
            return
        # to the main thread itself: Python runs the handler there, and a process-wide
        # signal could land in this thread while the main thread sleeps in a wait
        try:
            signal.pthread_kill(main, signal.SIGTERM)
        except (AttributeError, OSError, ValueError):
            os.kill(os.getpid(), signal.SIGTERM)
        import time

        time.sleep(GRACE_S)
        end_children()  # its clean-up did not run in time: end its tools all the same
        os._exit(143)

    # a bare thread: it never delays the interpreter's exit (and threading is not imported)
    _thread.start_new_thread(wait, ())
    return True


class Then:
    """An operation's answer followed by raw output: serve() emits `result`, then calls
    `then()` (which writes to stdout) and exits with the status it returns."""

    def __init__(self, result: Dict[str, Any], then: Callable[[], int]) -> None:
        self.result = result
        self.then = then


def serve(
    ops: Dict[str, Callable[[Dict[str, Any]], Any]], encoded: str, script: str = "script"
) -> int:
    """Decode the request, run ops[request["op"]], answer with one envelope.

    Exit status: 0 when an answer was given (result or refusal), 1 on an unexpected fault,
    or the status of a `Then` operation's output step."""
    watch_fleet()
    return _answer(ops, encoded, script, then=True)


def converse(
    ops: Dict[str, Callable[[Dict[str, Any]], Any]], encoded: str, script: str = "script"
) -> int:
    """``serve`` the first request, then every request fleet sends on stdin, until its end.

    Exit status: that of the last answer (see ``serve``)."""
    requests = Frames()
    watched = watch_fleet(requests)
    status = _answer(ops, encoded, script, then=False)
    while watched:
        IDLE[0] = True
        following = requests.get()
        IDLE[0] = False
        if following is None:
            return status
        status = _answer(ops, following, script, then=False)
    return status


def _answer(
    ops: Dict[str, Callable[[Dict[str, Any]], Any]], encoded: str, script: str, then: bool
) -> int:
    doc: Dict[str, Any] = {"schema": SCHEMA, "script": script}
    try:
        request = decode(encoded)
        if not isinstance(request, dict):
            raise Refused("the request is not an object", "bad-request")
        op = ops.get(request.get("op", ""))
        if op is None:
            raise Refused("unknown operation " + repr(request.get("op")), "bad-request")
        out = op(request)
        if isinstance(out, Then) and not then:
            raise Refused("this operation cannot answer in a conversation", "bad-request")
        if isinstance(out, Then):
            doc["result"] = out.result
            emit(doc)
            return out.then()
        doc["result"] = out
        emit(doc)
        return 0
    except Refused as exc:
        doc["refused"] = exc.message
        doc["code"] = exc.code
        emit(doc)
        return 0
    except Exception as exc:
        doc["error"] = type(exc).__name__ + ": " + str(exc)
        emit(doc)
        return 1
