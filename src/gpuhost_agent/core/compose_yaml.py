"""The renter's Compose file as YAML: a strict parse, and edits made on the
node tree so that what Compose then reads is the renter's file minus what
the agent took out. Pure.

Strict: duplicate keys and unknown tags are refused, so that this parser and
Compose's cannot be made to see two different files. A key given by a merge
(`<<: *defaults`) and then written again is not a duplicate: YAML says the
written one wins, and Compose agrees.

Edits are made on nodes and written back with the serializer, never by
loading and dumping values: a plain `yes`, `0755` or `1e3` stays the text the
renter wrote, which Compose (YAML 1.2) reads differently from PyYAML (1.1).
"""

from __future__ import annotations

from typing import Any

import yaml

# Compose's own tags for merging; anything else could mean something to one
# parser and another thing to the other.
COMPOSE_TAGS = ("!reset", "!override")
MERGE_TAG = "tag:yaml.org,2002:merge"


class _StrictLoader(yaml.SafeLoader):
    pass


def _mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:  # the keys written here, before any merge
        if key_node.tag == MERGE_TAG:
            continue
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}: the file must say each thing once", key_node.start_mark
            )
        seen.add(key)
    loader.flatten_mapping(node)  # merged keys first, so the written ones win
    return loader.construct_mapping(node, deep=deep)


def _compose_tag(loader: _StrictLoader, _suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return _mapping(loader, node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    assert isinstance(node, yaml.ScalarNode)  # the only other kind of YAML node
    return loader.construct_scalar(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
for _tag in COMPOSE_TAGS:
    _StrictLoader.add_multi_constructor(_tag, _compose_tag)


def _raise_readable(exc: yaml.YAMLError) -> None:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f" (line {mark.line + 1})" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    raise ValueError(f"not acceptable YAML{where}: {problem}") from None


def parse(text: str) -> Any:
    """The document, or ValueError naming the line (duplicate keys, unknown tags, bad YAML)."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        _raise_readable(exc)


def node_tree(text: str) -> yaml.Node | None:
    """The file's nodes, for editing (call parse first: it does the checks)."""
    try:
        return yaml.compose(text, Loader=_StrictLoader)  # noqa: S506
    except yaml.YAMLError as exc:
        _raise_readable(exc)
    return None


def write(root: yaml.Node) -> str:
    return yaml.serialize(root, Dumper=yaml.SafeDumper, allow_unicode=True, width=1 << 30)


def _merge_sources(node: yaml.MappingNode) -> list[yaml.MappingNode]:
    sources: list[yaml.MappingNode] = []
    for key_node, value in node.value:
        if key_node.tag == MERGE_TAG:
            items = value.value if isinstance(value, yaml.SequenceNode) else [value]
            sources += [item for item in items if isinstance(item, yaml.MappingNode)]
    return sources


def child(node: yaml.Node | None, key: str) -> yaml.Node | None:
    """The value node under `key`, written here or merged in (written wins)."""
    if not isinstance(node, yaml.MappingNode):
        return None
    for key_node, value in node.value:
        if key_node.tag != MERGE_TAG and key_node.value == key:
            return value
    for source in _merge_sources(node):
        found = child(source, key)
        if found is not None:
            return found
    return None


def pairs(node: yaml.Node | None) -> list[tuple[str, yaml.Node]]:
    """(key, value node) written in a mapping node, merges left out."""
    if not isinstance(node, yaml.MappingNode):
        return []
    return [(str(k.value), v) for k, v in node.value if k.tag != MERGE_TAG]


def remove(node: yaml.Node | None, key: str) -> None:
    """`key` out of the mapping, written or merged in (from a shared anchor too:
    what the agent takes out, it takes out everywhere)."""
    if not isinstance(node, yaml.MappingNode):
        return
    for source in _merge_sources(node):
        remove(source, key)
    node.value = [(k, v) for k, v in node.value if k.tag == MERGE_TAG or k.value != key]


def put(node: yaml.Node | None, key: str, value: str) -> None:
    """A plain string value under `key` (replacing one written here)."""
    if not isinstance(node, yaml.MappingNode):
        return
    remove(node, key)
    string = "tag:yaml.org,2002:str"
    node.value.append((yaml.ScalarNode(string, key), yaml.ScalarNode(string, value, style='"')))
