"""The checks that must happen before Compose reads the file at all.

`docker compose config` itself opens files the Compose file names: `include`,
`extends.file`, `env_file`, `label_file`, file-based secrets and configs, and
build contexts. Run on a renter's file, it would read the host's files (an
`env_file: /proc/1/environ` would land in the container's environment) before
any check on its output could object. So those keys are refused here, on the
raw YAML. The parse refuses duplicate keys and unknown tags, so that this
parser and Compose's cannot be made to see two different files.
"""

from __future__ import annotations

from typing import Any

import yaml

# Compose's own tags for merging; anything else could mean something to one
# parser and another thing to the other.
COMPOSE_TAGS = ("!reset", "!override")


class _StrictLoader(yaml.SafeLoader):
    pass


def _mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)  # merge keys (<<) first, as Compose does
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}: the file must say each thing once", key_node.start_mark
            )
        seen.add(key)
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


def parse(text: str) -> Any:
    """The document, or ValueError naming the line (duplicate keys, unknown tags, bad YAML)."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ValueError(f"not acceptable YAML{where}: {problem}") from None


def raw_violations(text: str) -> list[str]:
    """What in the file would make Compose read a file of the host. Raises
    ValueError when the text is not YAML this parser and Compose agree on."""
    document = parse(text)
    if not isinstance(document, dict):
        return []  # Compose will say what is wrong with it
    problems = []
    if "include" in document:
        problems.append("include is not allowed: it reads other files of the host; put everything in one file")
    for section in ("secrets", "configs"):
        for name, spec in _items(document.get(section)):
            for key in ("file", "environment"):
                if isinstance(spec, dict) and key in spec:
                    problems.append(
                        f'{section} "{name}": {key} is not allowed (it reads the host\'s '
                        f"{'files' if key == 'file' else 'environment'}); use content: instead"
                    )
    for name, service in _items(document.get("services")):
        if not isinstance(service, dict):
            continue
        extends = service.get("extends")
        if isinstance(extends, dict) and "file" in extends:
            problems.append(
                f'service "{name}": extends.file is not allowed (it reads another file of the host); '
                "extend a service of this file instead"
            )
        elif isinstance(extends, str) and "/" in extends:
            problems.append(f'service "{name}": extends must name a service of this file')
        for key, why in (
            ("env_file", "it reads a file of the host into the environment; use environment: instead"),
            ("label_file", "it reads a file of the host"),
            ("build", "images are pulled, not built on the host"),
        ):
            if key in service:
                problems.append(f'service "{name}": {key} is not allowed ({why})')
    return problems


def _items(section: object) -> list[tuple]:
    return list(section.items()) if isinstance(section, dict) else []
