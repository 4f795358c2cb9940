"""What happens to the file before Compose reads it at all. Pure.

`docker compose config` itself opens files the Compose file names: `include`,
`extends.file`, `env_file`, `label_file`, file-based secrets and configs, and
build contexts. Run on a renter's file, it would read the host's files (an
`env_file: /proc/1/environ` would land in the container's environment) before
any check on its output could object. So every one of those keys is taken out
of the file here, on the raw YAML, before Compose runs: where the renter's
intent is safe it is a notice (an `env_file: .env` beside the file, which the
host does not have; a `build:` next to an `image:`, which is pulled), otherwise
a problem. Either way Compose still normalises the rest, so the renter hears
every problem of the file in one message (core/sandbox/apply.py).

Compose reads the agent's own serialisation of the node tree checked here,
never the renter's bytes: whatever the two YAML parsers might make of odd
spellings, the one Compose reads is what this parser saw
(core/sandbox/compose_yaml.py refuses what could be read two ways). Its
variable references are renamed so that only the template's variables fill
them (core/sandbox/interpolation.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from gpuhost_agent.core.sandbox import compose_yaml, interpolation

NO_IMAGE = "gpuhost-agent.invalid/add-an-image"  # stands in so that Compose reads the rest


@dataclass
class RawReview:
    text: str  # what Compose reads
    notices: list[str] = field(default_factory=list)  # what was changed, for the renter
    problems: list[str] = field(default_factory=list)  # what must change before it can run
    profiled: list[str] = field(default_factory=list)  # services that only start with a profile
    # What Compose warned of while it read the file (a variable not set), for
    # the renter: runtime/compose.py compose_warnings, set by the backend.
    compose_warnings: list[str] = field(default_factory=list)


def review(text: str, profiles: str = "") -> RawReview:
    """Raises ValueError when the text is not YAML this parser and Compose agree on.
    `profiles`: the template's COMPOSE_PROFILES (Compose reads it too)."""
    document = compose_yaml.parse(text)
    if not isinstance(document, dict):
        raise ValueError("the file must be a mapping (services: and the rest), not a list, text or nothing")
    result = RawReview(text)
    root = compose_yaml.node_tree(text)
    if "include" in document:
        result.problems.append("include is not allowed: it reads other files of the host; put everything in one file")
        compose_yaml.remove(root, "include")
    if "models" in document:  # Compose's JSON model leaves it out: judged here or never
        result.problems.append("models is not allowed: it runs a model runner on the host")
        compose_yaml.remove(root, "models")
    for section in ("secrets", "configs"):
        section_node = compose_yaml.child(root, section)
        for name, spec in _items(document.get(section)):
            for key in ("file", "environment"):
                if isinstance(spec, dict) and key in spec:
                    source = "files" if key == "file" else "environment"
                    result.problems.append(
                        f'{section} "{name}": {key} is not allowed (it reads the host\'s {source}); '
                        "use content: instead"
                    )
                    _neutralise(compose_yaml.child(section_node, name), section)
    services_node = compose_yaml.child(root, "services")
    for name, service in _items(document.get("services")):
        if isinstance(service, dict):
            _service(result, name, service, compose_yaml.child(services_node, name))
    _profiles(result, document.get("services"), {p.strip() for p in profiles.split(",") if p.strip()})
    interpolation.confine(root)  # the template's variables only, never the agent's environment
    result.text = compose_yaml.write(root)  # type: ignore[arg-type]
    return result


def _neutralise(node: yaml.Node | None, section: str) -> None:
    """A secret or config without its host source, so Compose reads on."""
    for key in ("file", "environment"):
        compose_yaml.remove(node, key)
    if section == "configs":
        compose_yaml.put(node, "content", "")
    else:  # a variable Compose's clean environment never has: refused anyway
        compose_yaml.put(node, "environment", "GPUHOST_REFUSED_SECRET")


def _service(result: RawReview, name: str, service: dict, node: yaml.Node | None) -> None:
    where = f'service "{name}"'
    extended = False
    extends = service.get("extends")
    if isinstance(extends, dict) and "file" in extends:
        result.problems.append(
            f"{where}: extends.file is not allowed (it reads another file of the host); "
            "extend a service of this file instead"
        )
        compose_yaml.remove(node, "extends")
        extended = True
    elif isinstance(extends, str) and "/" in extends:
        result.problems.append(f"{where}: extends must name a service of this file")
        compose_yaml.remove(node, "extends")
        extended = True
    if extended and not service.get("image") and "build" not in service:
        compose_yaml.put(node, "image", NO_IMAGE)  # what it extended gave the image: Compose reads on
    if "models" in service:
        result.problems.append(f"{where}: models is not allowed: it runs a model runner on the host")
        compose_yaml.remove(node, "models")
    if "label_file" in service:
        result.problems.append(f"{where}: label_file is not allowed (it reads a file of the host)")
        compose_yaml.remove(node, "label_file")
    if "env_file" in service:
        _env_file(result, where, service["env_file"])
        compose_yaml.remove(node, "env_file")
    if "build" in service:
        image = service.get("image")
        if isinstance(image, str) and image.strip():
            result.notices.append(f"{where}: build dropped: the image {image!r} is pulled, not built on the host")
        else:
            result.problems.append(
                f"{where}: build is not allowed: images are pulled, not built on the host; "
                "add image: with a registry reference"
            )
            compose_yaml.put(node, "image", NO_IMAGE)
        compose_yaml.remove(node, "build")


def _env_file(result: RawReview, where: str, value: object) -> None:
    """A file named relative to the Compose file (`.env`, `speech.env`, or
    `../../.env` above it, as a project's own tree has it) is one the host
    does not have: dropped, with a notice; Compose never reads it either way.
    An absolute path, `~` or a variable names a file of the host's: a problem."""
    items = value if isinstance(value, list) else [value]
    paths = [str(item.get("path", "")) if isinstance(item, dict) else str(item) for item in items]
    for path in paths:
        if not path.strip() or path.startswith(("/", "~")) or "$" in path:
            result.problems.append(
                f"{where}: env_file {path!r} is not allowed (it reads a file of the host); "
                "set the variables in environment: or in the template's environmentVariables"
            )
        else:
            result.notices.append(
                f"{where}: env_file {path!r} dropped: the host has no such file; "
                "set its variables as the template's environmentVariables"
            )


def _profiles(result: RawReview, services: object, active: set[str]) -> None:
    """Compose starts only services without profiles, and those of the
    profiles the template's COMPOSE_PROFILES names ("*": all)."""
    all_services = _items(services)
    profiled = [
        name
        for name, spec in all_services
        if _profile_names(spec) and "*" not in active and not active & set(_profile_names(spec))
    ]
    result.profiled = profiled
    if not profiled:
        return
    if len(profiled) == len(all_services):
        names = sorted({name for _, spec in all_services for name in _profile_names(spec) if name})
        result.problems.append(
            f"every service has profiles ({', '.join(profiled)}): services with profiles are not started; "
            f"set the template variable COMPOSE_PROFILES to the profiles to start ({', '.join(names)}, or *), "
            "or remove profiles: from the services to run"
        )
    else:
        result.notices.append(f"not started, they have profiles: {', '.join(profiled)}")


def _profile_names(spec: object) -> list[str]:
    """A service's profiles, when they are a list (anything else is Compose's to refuse)."""
    profiles = spec.get("profiles") if isinstance(spec, dict) else None
    return [str(name) for name in profiles] if isinstance(profiles, list) else []


def _items(section: object) -> list[tuple]:
    return list(section.items()) if isinstance(section, dict) else []
