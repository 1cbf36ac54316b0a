"""Reading the files a user hands to fusekit (YAML, JSON) safely, with one-line errors.

Every loader of a user file goes through here, so that a careless or hostile file fails fast
with one :class:`~fusekit.errors.ConfigError` line ``"file: problem"`` instead of hanging,
exhausting memory or ending in a traceback:

* the file is read as bytes, at most :data:`MAX_FILE_BYTES`, and decoded as UTF-8;
* YAML is composed with :class:`yaml.SafeLoader` (no Python objects), nesting is bounded by
  :data:`MAX_DEPTH` while composing, and the composed graph is checked before it is built:
  a self-referencing (recursive) alias is rejected, and aliases may add at most
  :data:`MAX_ALIAS_NODES` nodes to those written in the file (a "billion laughs" file is
  rejected after reading its few lines, not after expanding 10**9 nodes);
* numbers must be finite (``.inf``, ``.nan``, ``1e400``, JSON ``NaN`` are rejected) and integers
  must fit in 64 bits;
* whatever is echoed from the file is cut to :data:`PREVIEW_CHARS` characters (:func:`short`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor

from fusekit.errors import ConfigError

#: Largest file read (bytes); hardware, problem and mapping files are a few KB.
MAX_FILE_BYTES = 16 * 2**20
#: Deepest nesting of lists and mappings, aliases expanded.
MAX_DEPTH = 64
#: Most nodes that aliases may add to those written in the file.
MAX_ALIAS_NODES = 10_000
#: Longest excerpt of a file's content echoed in an error message.
PREVIEW_CHARS = 80

_INT64 = 2**63


def short(value: Any, limit: int = PREVIEW_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters (``...`` marks the cut).

    Args:
        value: anything read from a file.
        limit: the longest result.

    Returns:
        The repr, at most ``limit`` characters long.
    """
    text = repr(value)
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


def read_text(path: str | Path, max_bytes: int = MAX_FILE_BYTES) -> str:
    """The file's text, decoded as UTF-8.

    Args:
        path: the file.
        max_bytes: the largest size accepted.

    Returns:
        The text.

    Raises:
        ConfigError: the file cannot be read, is larger than ``max_bytes``, or is not UTF-8.
    """
    source = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise ConfigError(
            source, "", f"cannot read file ({e.strerror or type(e).__name__})"
        ) from None
    if len(data) > max_bytes:
        raise ConfigError(source, "", f"larger than the limit of {max_bytes:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            source, "", f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})"
        ) from None


def clip(message: str) -> str:
    """``message`` on one line, cut to twice :data:`PREVIEW_CHARS` characters.

    Args:
        message: an error message that may echo a file's content (a library's, or a parser's).

    Returns:
        The message with its whitespace runs made single spaces, ``...`` marking a cut.
    """
    text = " ".join(message.split())
    limit = 2 * PREVIEW_CHARS
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- YAML -------------------------------------------------------------------------------------


class _Reject(Exception):
    """A bound broken while reading the document; carries the problem and where it is."""

    def __init__(self, problem: str, mark: yaml.Mark | None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.mark = mark


def _at(mark: yaml.Mark | None) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


class _Loader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no types
    """SafeLoader that bounds nesting while composing and accepts finite numbers only."""

    def __init__(self, stream: str, max_depth: int) -> None:
        super().__init__(stream)
        self.max_depth = max_depth
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        """Compose one node, refusing to go deeper than ``max_depth`` (before recursing)."""
        if self.depth >= self.max_depth:
            mark = self.peek_event().start_mark
            raise _Reject(f"nested deeper than {self.max_depth} levels", mark)
        self.depth += 1
        try:
            node: yaml.Node = super().compose_node(parent, index)
            return node
        finally:
            self.depth -= 1

    def fetch_flow_collection_start(self, token_class: Any) -> None:
        """Refuse a ``[`` or ``{`` past ``max_depth`` while scanning.

        The scanner looks ahead up to 1,024 characters for a possible simple key at every open
        flow collection, which is quadratic in the flow nesting: stop before it matters.
        """
        if self.flow_level >= self.max_depth:
            raise _Reject(f"nested deeper than {self.max_depth} levels", self.get_mark())
        super().fetch_flow_collection_start(token_class)

    def construct_finite_float(self, node: yaml.ScalarNode) -> float:
        """A YAML float, refused when infinite or NaN."""
        value = float(SafeConstructor.construct_yaml_float(self, node))
        if not math.isfinite(value):
            raise _Reject(f"non-finite number {short(node.value)}", node.start_mark)
        return value

    def construct_int64(self, node: yaml.ScalarNode) -> int:
        """A YAML int, refused outside the signed 64-bit range."""
        if len(node.value) > 40:  # long before int() meets Python's 4,300-digit limit
            raise _Reject("integer out of the 64-bit range", node.start_mark)
        value = int(SafeConstructor.construct_yaml_int(self, node))
        if not -_INT64 <= value < _INT64:
            raise _Reject("integer out of the 64-bit range", node.start_mark)
        return value


_Loader.add_constructor("tag:yaml.org,2002:float", _Loader.construct_finite_float)
_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_int64)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_graph(root: yaml.Node, max_depth: int, max_alias_nodes: int) -> None:
    """Refuse recursive aliases, nesting past ``max_depth`` and alias expansion past the limit.

    Aliases make the composed document a graph whose nodes can be shared: the walk memoises
    each node's expanded size and height, so it costs one visit per written node whatever the
    expansion.
    """
    size: dict[int, int] = {}
    height: dict[int, int] = {}
    open_: set[int] = set()
    merge = "tag:yaml.org,2002:merge"

    def visit(node: yaml.Node, depth: int) -> None:
        key = id(node)
        if key in size:
            if depth - 1 + height[key] > max_depth:
                raise _Reject(f"nested deeper than {max_depth} levels", node.start_mark)
            return
        if key in open_:
            raise _Reject("recursive alias (a node that contains itself)", node.start_mark)
        if depth > max_depth:
            raise _Reject(f"nested deeper than {max_depth} levels", node.start_mark)
        open_.add(key)
        if isinstance(node, yaml.MappingNode):
            seen: set[tuple[str, str]] = set()
            for k, _ in node.value:
                if isinstance(k, yaml.ScalarNode) and k.tag != merge:
                    if (k.tag, k.value) in seen:
                        raise _Reject(f"duplicate key {short(k.value)}", k.start_mark)
                    seen.add((k.tag, k.value))
        total, tallest = 1, 0
        for child in _children(node):
            visit(child, depth + 1)
            total += size[id(child)]
            tallest = max(tallest, height[id(child)])
        open_.discard(key)
        size[key], height[key] = total, tallest + 1

    visit(root, 1)
    added = size[id(root)] - len(size)
    if added > max_alias_nodes:
        raise _Reject(f"aliases expand to {added:,} more nodes (limit {max_alias_nodes:,})", None)


def parse_yaml(
    text: str,
    source: str,
    max_depth: int = MAX_DEPTH,
    max_alias_nodes: int = MAX_ALIAS_NODES,
) -> Any:
    """Parse one YAML document safely.

    Args:
        text: the document.
        source: the file name used in error messages.
        max_depth: the deepest nesting of lists and mappings, aliases expanded.
        max_alias_nodes: the most nodes aliases may add to those written.

    Returns:
        Plain data (dict, list, str, int, float, bool, None, dates); ``None`` for an empty
        document.

    Raises:
        ConfigError: ``"source: problem"`` on invalid YAML or a broken bound.
    """
    loader = _Loader(text, max_depth)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_graph(node, max_depth, max_alias_nodes)
        return loader.construct_document(node)
    except _Reject as e:
        raise ConfigError(source, "", f"{e.problem}{_at(e.mark)}") from None
    except yaml.MarkedYAMLError as e:
        problem = clip(str(e.problem or e.context or "syntax error"))
        raise ConfigError(source, "", f"not valid YAML: {problem}{_at(e.problem_mark)}") from None
    except (yaml.YAMLError, ValueError, TypeError) as e:  # e.g. a malformed timestamp
        raise ConfigError(source, "", f"not valid YAML: {clip(str(e))}") from None
    finally:
        loader.dispose()


def load_yaml(path: str | Path, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """Read and parse a YAML file with the bounds of :func:`parse_yaml`.

    Raises:
        ConfigError: unreadable, too large, not UTF-8, not valid YAML, or a bound broken.
    """
    return parse_yaml(read_text(path, max_bytes), str(path))


def load_yaml_mapping(path: str | Path, max_bytes: int = MAX_FILE_BYTES) -> dict[str, Any]:
    """Like :func:`load_yaml`, for a file whose top level must be a mapping.

    Raises:
        ConfigError: as :func:`load_yaml`, or the file is empty or not a mapping.
    """
    data = load_yaml(path, max_bytes)
    return top_mapping(data, str(path))


def top_mapping(data: Any, source: str) -> dict[str, Any]:
    """``data`` when it is a mapping; else a :class:`ConfigError` naming ``source``."""
    if data is None:
        raise ConfigError(source, "", "empty file (expected a mapping at top level)")
    if not isinstance(data, dict):
        raise ConfigError(
            source, "", f"expected a mapping at top level (got {type(data).__name__})"
        )
    return data


# --- JSON -------------------------------------------------------------------------------------


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"non-finite number {short(text)}")
    return value


def _int64(text: str) -> int:
    value = int(text) if len(text) <= 40 else _INT64
    if not -_INT64 <= value < _INT64:
        raise ValueError("integer out of the 64-bit range")
    return value


def _no_constant(text: str) -> Any:
    raise ValueError(f"non-finite number {text}")


def _json_depth(data: Any) -> int:
    """Deepest nesting of lists and objects, walked without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            stack.extend(
                (v, depth + 1) for v in (item.values() if isinstance(item, dict) else item)
            )
    return deepest


def parse_json(text: str, source: str, max_depth: int = MAX_DEPTH) -> Any:
    """Parse a JSON document: finite numbers only, nesting bounded by ``max_depth``.

    Raises:
        ConfigError: ``"source: problem"``.
    """
    try:
        data = json.loads(text, parse_float=_finite, parse_int=_int64, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ConfigError(source, "", f"not valid JSON: {e.msg} at line {e.lineno}") from None
    except RecursionError:
        raise ConfigError(source, "", f"nested deeper than {max_depth} levels") from None
    except ValueError as e:  # a non-finite number, or an int past Python's digit limit
        raise ConfigError(source, "", f"not valid JSON: {clip(str(e))}") from None
    if _json_depth(data) > max_depth:
        raise ConfigError(source, "", f"nested deeper than {max_depth} levels")
    return data


def load_json(path: str | Path, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """Read and parse a JSON file with the bounds of :func:`parse_json`.

    Raises:
        ConfigError: unreadable, too large, not UTF-8, not valid JSON, or too deep.
    """
    return parse_json(read_text(path, max_bytes), str(path))
