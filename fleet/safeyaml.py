"""YAML for fleet's input files (inventory, profiles): safe, bounded and strict.

:func:`load_yaml` is ``yaml.safe_load`` with the limits a hostile or careless file needs,
each refused as a one-line :class:`YamlError` carrying the line and column:

- nesting deeper than :data:`MAX_DEPTH` (PyYAML's composer recurses: 300 levels raised
  ``RecursionError``);
- an alias used inside its own anchor (a recursive structure), and aliases that expand the
  document by more than :data:`MAX_ALIAS_EXPANSION` nodes (an "alias bomb": a 1 KB file
  that walks like a billion nodes);
- duplicate keys in a mapping (PyYAML lets the last one win silently); keys merged in with
  ``<<`` may still be overridden, as YAML's merge key says;
- scalars that PyYAML's constructors crash on: ``!!int 0b2``, ``!!bool maybe``,
  ``!!timestamp 2001-02-30``, integers and floats longer than :data:`MAX_NUMBER_CHARS`
  (Python refuses to convert more than 4,300 digits, and sexagesimal ``1:2:3...`` grows
  quadratically), strings holding lone surrogates (``"\\ud800"``: not encodable text);
- dates are not guessed: ``2001-02-03`` stays a string (only ``!!timestamp`` builds one).

Work is linear in the size of the text: libyaml's parser when available (its events feed
the bounded composer below), PyYAML's pure-Python parser otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer, ComposerError
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, SequenceNode
from yaml.resolver import Resolver

MAX_DEPTH = 64
MAX_ALIAS_EXPANSION = 1_000_000
MAX_NUMBER_CHARS = 64

_MERGE_TAG = "tag:yaml.org,2002:merge"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_SATURATE = 1 << 62
_OWN_START = "fleet_own_start"  # index of a mapping's own pairs after its merged ones

# PyYAML's classes are mixins meant to be combined (a loader is parser + composer +
# constructor + resolver); typed as Any so that each mixin may use the others' methods.
_ComposerBase: Any = Composer
_ConstructorBase: Any = SafeConstructor
_ResolverBase: Any = Resolver


class YamlError(Exception):
    """A file is not acceptable YAML; ``str()`` is one line (with line and column)."""

    def __init__(self, problem: str, line: int | None = None, column: int | None = None) -> None:
        where = f" (line {line}, column {column})" if line is not None else ""
        super().__init__(f"invalid YAML{where}: {problem}")
        self.problem = problem
        self.line = line
        self.column = column


class _BoundedComposer(_ComposerBase):
    """PyYAML's composer with a depth limit, no recursive aliases, an expansion count,
    and merge keys flattened bottom-up (so no later step recurses along merge chains)."""

    def __init__(self) -> None:
        super().__init__()
        self._depth = 0
        self._open_anchors: set[str] = set()
        self._sizes: dict[int, int] = {}
        self._distinct = 0

    def _size(self, node: Any) -> int:
        return self._sizes.get(id(node), 1)

    def compose_document(self) -> Node:
        node: Any = super().compose_document()
        expanded = self._size(node)
        if expanded - self._distinct > MAX_ALIAS_EXPANSION:
            raise ComposerError(
                None,
                None,
                f"aliases expand the document by more than {MAX_ALIAS_EXPANSION:,} nodes "
                "(an alias bomb?)",
                node.start_mark,
            )
        return node

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        if self.check_event(AliasEvent):
            event = self.peek_event()
            if event.anchor in self._open_anchors:
                raise ComposerError(
                    None,
                    None,
                    f"recursive alias *{_short(event.anchor)} (used inside its own anchor)",
                    event.start_mark,
                )
            aliased: Node = super().compose_node(parent, index)
            return aliased
        event = self.peek_event()
        if self._depth >= MAX_DEPTH:
            raise ComposerError(
                None, None, f"nested deeper than {MAX_DEPTH} levels", event.start_mark
            )
        anchor = event.anchor
        self._depth += 1
        if anchor is not None:
            self._open_anchors.add(anchor)
        try:
            node: Any = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            if anchor is not None:
                self._open_anchors.discard(anchor)
        self._distinct += 1
        if isinstance(node, SequenceNode):
            size = 1 + sum(self._size(child) for child in node.value)
            self._sizes[id(node)] = min(size, _SATURATE)
        elif isinstance(node, MappingNode):
            size = 1 + sum(self._size(k) + self._size(v) for k, v in node.value)
            self._sizes[id(node)] = min(size, _SATURATE)
        return node

    def compose_mapping_node(self, anchor: str | None) -> MappingNode:
        node: MappingNode = super().compose_mapping_node(anchor)
        own = sum(1 for key, _ in node.value if key.tag != _MERGE_TAG)
        if own != len(node.value):
            # The merged mappings are complete (and already flat): one level of work.
            self.flatten_mapping(node)
        setattr(node, _OWN_START, len(node.value) - own)
        return node


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value) if not isinstance(value, str) else value
    text = text.encode("unicode_escape", "backslashreplace").decode("ascii")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bad(node: Any, problem: str) -> ConstructorError:
    return ConstructorError(None, None, problem, node.start_mark)


class _StrictConstructor(_ConstructorBase):
    """SafeConstructor whose scalar constructors fail as ConstructorError (with a mark)
    instead of ValueError/KeyError, and whose mappings refuse duplicate keys."""

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value[getattr(node, _OWN_START, 0) :]:
                key = self.construct_object(key_node, deep=deep)
                try:
                    duplicate = key in seen
                except TypeError:
                    raise ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        "found unhashable key",
                        key_node.start_mark,
                    ) from None
                if duplicate:
                    raise ConstructorError(
                        None,
                        None,
                        f"duplicate key '{_short(key)}' (each key may be given once)",
                        key_node.start_mark,
                    )
                seen.add(key)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping

    def construct_yaml_str(self, node: Any) -> str:
        value = self.construct_scalar(node)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _bad(node, "string holds a lone surrogate (not valid Unicode text)") from None
        return str(value)

    def _number_text(self, node: Any, what: str) -> str:
        value = str(self.construct_scalar(node))
        if len(value) > MAX_NUMBER_CHARS:
            raise _bad(node, f"{what} longer than {MAX_NUMBER_CHARS} characters")
        return value

    def construct_yaml_int(self, node: Any) -> int:
        value = self._number_text(node, "integer")
        try:
            return int(super().construct_yaml_int(node))
        except (ValueError, TypeError, IndexError):
            raise _bad(node, f"invalid integer '{_short(value)}'") from None

    def construct_yaml_float(self, node: Any) -> float:
        value = self._number_text(node, "number")
        try:
            return float(super().construct_yaml_float(node))
        except (ValueError, TypeError, OverflowError, IndexError):
            raise _bad(node, f"invalid number '{_short(value)}'") from None

    def construct_yaml_bool(self, node: Any) -> bool:
        value = str(self.construct_scalar(node))
        try:
            return bool(self.bool_values[value.lower()])
        except KeyError:
            raise _bad(node, f"invalid boolean '{_short(value)}' (use true or false)") from None

    def construct_yaml_timestamp(self, node: Any) -> Any:
        value = str(self.construct_scalar(node))
        try:
            return super().construct_yaml_timestamp(node)
        except (ValueError, TypeError, AttributeError, OverflowError):
            raise _bad(node, f"invalid timestamp '{_short(value)}'") from None

    def construct_yaml_binary(self, node: Any) -> Any:
        raise _bad(node, "binary values (!!binary) are not accepted")


for _tag, _fn in (
    ("tag:yaml.org,2002:str", _StrictConstructor.construct_yaml_str),
    ("tag:yaml.org,2002:int", _StrictConstructor.construct_yaml_int),
    ("tag:yaml.org,2002:float", _StrictConstructor.construct_yaml_float),
    ("tag:yaml.org,2002:bool", _StrictConstructor.construct_yaml_bool),
    (_TIMESTAMP_TAG, _StrictConstructor.construct_yaml_timestamp),
    ("tag:yaml.org,2002:binary", _StrictConstructor.construct_yaml_binary),
):
    _StrictConstructor.add_constructor(_tag, _fn)


class _NoDatesResolver(_ResolverBase):
    """YAML 1.1's implicit types without timestamps: a plain ``2001-02-03`` is a string."""

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP_TAG]
        for first, resolvers in Resolver.yaml_implicit_resolvers.items()
    }


def _parser_bases() -> tuple[type, ...]:
    try:
        from yaml._yaml import CParser
    except ImportError:  # PyYAML built without libyaml
        from yaml.parser import Parser
        from yaml.reader import Reader
        from yaml.scanner import Scanner

        return (Reader, Scanner, Parser)
    return (CParser,)


_PARSER_BASES = _parser_bases()


def _loader_init(self: Any, stream: str) -> None:
    bases: tuple[Any, ...] = _PARSER_BASES
    for base in bases:
        if base.__name__ in ("CParser", "Reader"):
            base.__init__(self, stream)
        else:
            base.__init__(self)
    _BoundedComposer.__init__(self)
    _StrictConstructor.__init__(self)
    _NoDatesResolver.__init__(self)


_Loader: Any = type(
    "_Loader",
    (_BoundedComposer, *_PARSER_BASES, _StrictConstructor, _NoDatesResolver),
    {"__init__": _loader_init},
)


def load_yaml(text: str) -> Any:
    """One YAML document -> Python data (dicts, lists, str, int, float, bool, None).

    Raises :class:`YamlError` (one line) for anything unacceptable."""
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        raise _one_line(exc) from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise YamlError(_short(first, 200)) from None
    finally:
        loader.dispose()


class InputFileError(Exception):
    """An input file that cannot be read as one (one line)."""


def read_regular(path: Path, *, max_bytes: int, what: str) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (a FIFO, a device or a
    directory is refused without being opened for long): fleet's input files."""
    import os
    import stat

    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise InputFileError(f"{what} {path} is {kind}")
        if st.st_size > max_bytes:
            raise InputFileError(f"{what} {path} is larger than {max_bytes} bytes")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise InputFileError(f"{what} {path} is not a regular file")
            data = os.read(fd, max_bytes + 1)
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise InputFileError(f"{what} {path} not found") from None
    except OSError as exc:
        raise InputFileError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise InputFileError(f"{what} {path} is larger than {max_bytes} bytes")
    return data


def load_yaml_file(path: Path, *, max_bytes: int, what: str = "file") -> Any:
    """:func:`load_yaml` of a regular UTF-8 file (see :func:`read_regular`); every
    problem is an :class:`InputFileError`."""
    data = read_regular(path, max_bytes=max_bytes, what=what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{what} {path} is not UTF-8 text ({exc.reason})") from None
    try:
        return load_yaml(text)
    except YamlError as exc:
        raise InputFileError(f"{path}: {exc}") from None


def _one_line(exc: yaml.MarkedYAMLError) -> YamlError:
    mark = exc.problem_mark or exc.context_mark
    problem = exc.problem or exc.context or type(exc).__name__
    if exc.context and exc.problem and exc.context not in problem:
        problem = f"{exc.problem} ({exc.context})"
    problem = " ".join(str(problem).split())
    if mark is None:
        return YamlError(_short(problem, 200))
    return YamlError(_short(problem, 200), mark.line + 1, mark.column + 1)


__all__ = [
    "MAX_ALIAS_EXPANSION",
    "MAX_DEPTH",
    "MAX_NUMBER_CHARS",
    "InputFileError",
    "YamlError",
    "load_yaml",
    "load_yaml_file",
    "read_regular",
]
