"""The renter's Compose file as YAML: a strict parse, and edits made on the
node tree so that what Compose then reads is the renter's file minus what
the agent took out. Pure.

One reading: this parser (PyYAML, YAML 1.1) and Compose's (Go, YAML 1.2)
must never see two different files, or a key the checks do not see can
still make Compose read a host file (`!!binary ZW52X2ZpbGU=: /etc/...` is the
bytes b'env_file' here and `env_file` to Compose). So the file is refused
unless every explicit tag is one of Compose's own (`!reset`, `!override`,
and never on a key), it has no %TAG or %YAML directive, every key is a plain
scalar taken as its text (`on:` is the key "on", as for Compose, not True),
no key is written twice, and no character is one the two YAML versions
break lines on differently (U+0085, U+2028, U+2029, a BOM past the start).
A key given by a merge (`<<: *defaults`) and then written again is not a
duplicate: YAML says the written one wins, and Compose agrees. Compose then
reads the agent's own serialisation of the checked node tree
(sandbox_raw.review), never the renter's bytes.

Edits are made on nodes and written back with the serializer, never by
loading and dumping values: a plain `yes`, `0755` or `1e3` stays the text the
renter wrote, which Compose (YAML 1.2) reads differently from PyYAML (1.1).
"""

from __future__ import annotations

from typing import Any

import yaml

from gpuhost_agent.protocol.wire_values import clipped

# Compose's own tags for merging; anything else could mean something to one
# parser and another thing to the other.
COMPOSE_TAGS = ("!reset", "!override")
MERGE_TAG = "tag:yaml.org,2002:merge"


class _StrictLoader(yaml.SafeLoader):
    pass


def _key_text(key_node: yaml.Node) -> str:
    """A key as Compose reads it: a scalar's text."""
    if not isinstance(key_node, yaml.ScalarNode) or key_node.tag in COMPOSE_TAGS:
        raise yaml.constructor.ConstructorError(
            None, None, "a key must be a plain string (no list, mapping or tag as a key)", key_node.start_mark
        )
    return str(key_node.value)


def _mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[str] = set()
    for key_node, _ in node.value:  # the keys written here, before any merge
        if key_node.tag == MERGE_TAG:
            continue
        key = _key_text(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}: the file must say each thing once", key_node.start_mark
            )
        seen.add(key)
    loader.flatten_mapping(node)  # merged keys first, so the written ones win
    return {_key_text(key): loader.construct_object(value, deep=deep) for key, value in node.value}


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


# Line breaks in YAML 1.1 and not in 1.2, and a BOM that is not the first character.
_AMBIGUOUS = {"\x85": "U+0085 (NEL)", "\u2028": "U+2028", "\u2029": "U+2029", "\ufeff": "a byte order mark"}


def _check_characters(text: str) -> None:
    for char, name in _AMBIGUOUS.items():
        at = text.find(char, 1 if char == "\ufeff" else 0)
        if at >= 0:
            line = text.count("\n", 0, at) + 1
            raise ValueError(f"not acceptable YAML (line {line}): {name} is read differently by YAML 1.1 and 1.2")


def _check_tags(text: str) -> None:
    """No explicit tag but Compose's own, no directive: what the events say
    before any tag is resolved into a value."""
    for event in yaml.parse(text, Loader=_StrictLoader):  # noqa: S506
        line = event.start_mark.line + 1 if event.start_mark is not None else "?"
        if isinstance(event, yaml.DocumentStartEvent) and (event.tags or event.version):
            raise ValueError(f"not acceptable YAML (line {line}): no %TAG or %YAML directive")
        tag = getattr(event, "tag", None)
        if isinstance(event, yaml.NodeEvent) and tag is not None and tag not in COMPOSE_TAGS:
            raise ValueError(
                f"not acceptable YAML (line {line}): the tag {clipped(tag, 61)!r} is not allowed "
                f"(only Compose's {' and '.join(COMPOSE_TAGS)}): it can make Compose read another file than this one"
            )


# Nodes of the file with every alias and merge written out. Anchors let a
# file of a kilobyte stand for billions of nodes ("billion laughs"): every
# walk over it, here or in Compose, would take hours while the renter waits
# for nothing. Real Compose files are a few thousand nodes at most.
MAX_EXPANDED_NODES = 50_000
# And bytes: one scalar of 400 KiB behind 2,000 aliases is 2,000 nodes but
# 800 MB once Compose writes its model out, which the agent reads.
MAX_EXPANDED_BYTES = 4 * 1024 * 1024


MAX_DEPTH = 64  # collections inside collections; a Compose file needs about ten


def _check_depth(text: str) -> None:
    """Refuses collections nested past MAX_DEPTH, with libyaml's parser: the
    pure-Python scanner takes time quadratic in the nesting of `[[[[...` (14 s
    for 5,000 levels, years for a file at the size limit) before its first
    event, so the depth must be known before it reads the file. libyaml
    comes with PyYAML's wheels; without it the pure-Python parser reads on."""
    if not getattr(yaml, "__with_libyaml__", False):
        return
    depth = 0
    for event in yaml.parse(text, Loader=yaml.CSafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark is not None else "?"
                raise ValueError(f"not acceptable YAML (line {line}): collections nested more than {MAX_DEPTH} deep")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _check_expanded_size(root: yaml.Node) -> None:
    """Refuses a file whose aliases expand past MAX_EXPANDED_NODES, or refer
    to themselves. Each node is sized once (iteratively: a deep file cannot
    exhaust the stack)."""
    sizes: dict[int, int] = {}
    weights: dict[int, int] = {}  # characters of the scalars, aliases written out
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_sized = stack.pop()
        if children_sized:
            open_.discard(id(node))
            parts = _children(node)
            sizes[id(node)] = 1 + sum(sizes[id(part)] for part in parts)
            own = len(node.value) if isinstance(node, yaml.ScalarNode) else 0
            weights[id(node)] = own + sum(weights[id(part)] for part in parts)
            if sizes[id(node)] > MAX_EXPANDED_NODES:
                raise ValueError(
                    f"not acceptable YAML: its anchors and aliases expand to more than {MAX_EXPANDED_NODES} nodes"
                )
            if weights[id(node)] > MAX_EXPANDED_BYTES:
                raise ValueError(
                    "not acceptable YAML: its anchors and aliases expand to more than "
                    f"{MAX_EXPANDED_BYTES // (1024 * 1024)} MiB of text"
                )
            continue
        if id(node) in sizes:
            continue
        if id(node) in open_:
            raise ValueError("not acceptable YAML: an alias refers to the node it is in")
        open_.add(id(node))
        stack.append((node, True))
        stack.extend((part, False) for part in _children(node) if id(part) not in sizes)


def parse(text: str) -> Any:
    """The document, or ValueError naming the line (tags, directives, keys,
    duplicate keys, characters, expansion, bad YAML: see the module's docstring)."""
    try:
        _check_characters(text)
        _check_depth(text)
        _check_tags(text)
        loader = _StrictLoader(text)
        try:
            root = loader.get_single_node()
            if root is None:
                return None
            _check_expanded_size(root)
            return loader.construct_document(root)
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        _raise_readable(exc)
    except RecursionError:
        raise ValueError("not acceptable YAML: it is nested too deeply") from None


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


def child(node: yaml.Node | None, key: str, _seen: set[int] | None = None) -> yaml.Node | None:
    """The value node under `key`, written here or merged in (written wins).
    A mapping merged in along several paths is looked in once."""
    if not isinstance(node, yaml.MappingNode):
        return None
    seen = set() if _seen is None else _seen
    seen.add(id(node))
    for key_node, value in node.value:
        if key_node.tag != MERGE_TAG and key_node.value == key:
            return value
    for source in _merge_sources(node):
        found = child(source, key, seen) if id(source) not in seen else None
        if found is not None:
            return found
    return None


def pairs(node: yaml.Node | None) -> list[tuple[str, yaml.Node]]:
    """(key, value node) written in a mapping node, merges left out."""
    if not isinstance(node, yaml.MappingNode):
        return []
    return [(str(k.value), v) for k, v in node.value if k.tag != MERGE_TAG]


def remove(node: yaml.Node | None, key: str, _seen: set[int] | None = None) -> None:
    """`key` out of the mapping, written or merged in (from a shared anchor too:
    what the agent takes out, it takes out everywhere), each mapping once."""
    if not isinstance(node, yaml.MappingNode):
        return
    seen = set() if _seen is None else _seen
    seen.add(id(node))
    for source in _merge_sources(node):
        if id(source) not in seen:
            remove(source, key, seen)
    node.value = [(k, v) for k, v in node.value if k.tag == MERGE_TAG or k.value != key]


def put(node: yaml.Node | None, key: str, value: str) -> None:
    """A plain string value under `key` (replacing one written here)."""
    if not isinstance(node, yaml.MappingNode):
        return
    remove(node, key)
    string = "tag:yaml.org,2002:str"
    node.value.append((yaml.ScalarNode(string, key), yaml.ScalarNode(string, value, style='"')))
