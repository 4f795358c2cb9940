"""A generator of hostile Compose files, for
tests/integration/test_sandbox_fuzz_engine.py and `make fuzz`.

A file is a base (a minimal service, or a file of tests/sandbox_corpus/legit
or published/) with one to three escapes injected into its first service or
at the top level: the keys that reach outside a container (privileged, host
namespaces, binds, devices, capabilities, the keys that make Compose read a
host file, addresses, NVIDIA_* variables, the agent's labels, runtime,
sysctls...). Each escape is written in one of many spellings: explicit tags
(`!!binary`, `!!str`, `!`, `!<...>`, custom and Python ones) on keys and
values, double-quoted `\\x`/`\\u` escapes, anchors and aliases (of keys and
values), merge keys (one, a list, nested), interpolation (defaults, nested
defaults, the template's variables carrying the value), odd scalars (`yes`,
`on`, `0x1`, `1e3`, `~`, `1:20`), and noise around them: a BOM, tabs, CRLF,
comments ending in a Unicode line break (U+0085, U+2028, U+2029).

The text is written by its own small emitter (not PyYAML's), so spellings
PyYAML would never produce reach the parsers. What the files plant is the
`Planted` secret: a fake agent.conf in a temporary directory and a host
environment variable, both holding a value no container may ever see.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from hypothesis import strategies as st

from support.sandbox_corpus import CORPUS, LEGIT
from support.stacks import TEST_IMAGE

PUBLISHED = sorted((CORPUS / "published").glob("[0-9]*.yaml"))
FOREIGN_GPU = "GPU-99999999-9999-9999-9999-999999999999"  # a GPU no rental of the tests holds


@dataclass(frozen=True)
class Planted:
    """A secret of the host that no container may hold."""

    secret: str
    conf: str  # a fake agent.conf: KEY=secret lines (so an env_file reads it)
    host_variable: str  # set in the agent's own environment

    @property
    def folder(self) -> str:
        return str(Path(self.conf).parent)


@dataclass(frozen=True)
class Hostile:
    text: str
    variables: dict[str, str]
    injected: tuple[str, ...]  # what the file tries, for the report
    labels: tuple[str, ...] = ()  # agent-namespace label keys the file writes

    def report(self) -> str:
        return f"injected: {list(self.injected)}\nvariables: {self.variables}\nfile (repr):\n{self.text!r}"


# ---- the text's tree and its emitter -------------------------------------------------


@dataclass
class Text:
    """A scalar already spelled (tag, quotes, escapes), or an alias `*a`."""

    src: str
    explicit: bool = False  # as a key: `? key` then `: value`


@dataclass
class Node:
    items: list  # a mapping's (key Text, value) pairs or a sequence's values; a mapping item may be a raw Line
    mapping: bool = True
    props: str = ""  # "&anchor !tag "
    flow: bool = False


@dataclass
class Line:
    src: str  # a raw line (a comment hiding a key behind a Unicode line break)


def _inline(value) -> str | None:
    if isinstance(value, Text):
        return value.src
    if not value.items:
        return value.props + ("{}" if value.mapping else "[]")
    if value.flow:
        if value.mapping:
            inner = ", ".join(f"{_key(k)}: {_one_line(v)}" for k, v in value.items if not isinstance(k, Line))
            return value.props + "{" + inner + "}"
        return value.props + "[" + ", ".join(_one_line(v) for v in value.items) + "]"
    return None


def _one_line(value) -> str:
    inline = _inline(value)
    return inline if inline is not None else _inline(Node(value.items, value.mapping, value.props, flow=True)) or ""


def _key(key: Text) -> str:
    return key.src + " " if key.src.startswith("*") else key.src  # `*a:` would name the alias `a:`


def emit(node: Node, indent: int = 0, sep: str = " ") -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    for item in node.items:
        if node.mapping and isinstance(item, Line):
            lines.append(pad + item.src)
            continue
        key, value = item if node.mapping else (None, item)
        lead = (f"{pad}? {key.src}" if key.explicit else f"{pad}{_key(key)}:") if key is not None else f"{pad}-"
        if key is not None and key.explicit:
            lines.append(lead)
            lead = f"{pad}:"
        inline = _inline(value)
        if inline is not None:
            lines.append(f"{lead}{sep}{inline}")
        else:
            lines.append(lead + (" " + value.props.rstrip() if value.props else ""))
            lines.extend(emit(value, indent + 2, sep))
    return lines


# ---- spellings ------------------------------------------------------------------------

_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./@-]*\Z")
_TYPED_WORDS = {"true", "false", "yes", "no", "on", "off", "y", "n", "null", "~"}
_CUSTOM_TAGS = ("!foo", "!env_file", "!!python/str", "!!python/object:os.system", "!!set", "!!omap", "!!timestamp")


def _plain_ok(text: str) -> bool:
    return bool(_PLAIN.match(text)) and text.lower() not in _TYPED_WORDS


def _dq(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


@st.composite
def _escaped(draw, text: str) -> str:
    """Double-quoted, each ASCII character as itself or as a \\x, \\u or \\U escape."""
    out = []
    for char in text:
        code = ord(char)
        form = draw(st.sampled_from(("", "x", "u", "U"))) if code < 128 else ""
        plain = "\\" + char if char in '"\\' else char
        out.append({"": plain, "x": f"\\x{code:02x}", "u": f"\\u{code:04x}", "U": f"\\U{code:08x}"}[form])
    return '"' + "".join(out) + '"'


# The families of tricks; each file draws the ones it uses, so that a file
# without tags or Unicode line breaks (which the raw pass refuses outright)
# still comes often enough to reach the policy and the engine.
TRICKS = ("quotes", "escapes", "tags", "interpolation", "aliases", "merges", "hidden", "odd", "noise")


def spelled(text: str, tricks: frozenset[str], *, key: bool = False) -> st.SearchStrategy[str]:
    """The source of one string scalar, spelled as a hostile file might."""
    quoted = st.sampled_from([_dq(text), "'" + text.replace("'", "''") + "'"])
    plain = st.just(text if _plain_ok(text) else _dq(text))
    b64 = base64.b64encode(text.encode()).decode()
    tagged = st.one_of(
        st.sampled_from((f"!!binary {b64}", f'!!binary "{b64}"')),  # PyYAML's bytes, Compose's string
        quoted.map(lambda q: f"!!str {q}"),
        quoted.map(lambda q: f"! {q}"),
        quoted.map(lambda q: f"!<tag:yaml.org,2002:str> {q}"),
        st.sampled_from(_CUSTOM_TAGS).flatmap(lambda tag: quoted.map(lambda q: f"{tag} {q}")),
    )
    forms = [plain]  # each trick the file uses is as likely as the plain spelling
    forms += [quoted] if "quotes" in tricks else []
    forms += [_escaped(text)] if "escapes" in tricks else []
    forms += [tagged] if "tags" in tricks else []
    forms += [quoted.map(lambda q: f"!override {q}")] if not key and "quotes" in tricks else []
    return st.one_of(*forms)


_BOOL_TRUE = ("true", "True", "TRUE", "yes", "Yes", "on", "ON", "y", "!!bool true", "!!bool yes", '"true"', "'1'", "1")
_ODD = ("0755", "0o755", "0x1F", "1e3", "~", "1:20", "190:20:30", ".inf", "-.nan", "2001-12-14", "0b1010", "+12")


@st.composite
def value_source(draw, value, tricks: frozenset[str]) -> tuple[str, dict[str, str]]:
    """(source of a scalar value, template variables it needs): spelled, or interpolated."""
    variables: dict[str, str] = {}
    if value is True:
        source = draw(st.sampled_from(_BOOL_TRUE)) if "odd" in tricks else "true"
        text = "true"
    elif isinstance(value, int) and not isinstance(value, bool):
        odd = (f"!!int {value}" if "tags" in tricks else str(value), hex(value)) if "odd" in tricks else ()
        source = draw(st.sampled_from((str(value), *odd)))
        text = str(value)
    else:
        text = str(value)
        source = draw(spelled(text, tricks))
    if (
        "interpolation" in tricks and draw(st.integers(0, 2)) == 0
    ):  # interpolated: the value only appears once Compose reads the variables
        name = draw(st.from_regex(r"FZ_[A-Z]{3}", fullmatch=True))
        inner = draw(st.from_regex(r"FZ_[A-Z]{3}", fullmatch=True))
        form = draw(st.integers(0, 4))
        if form == 0:
            source = _dq(f"${{{name}:-{text}}}")
        elif form == 1:
            source, variables = f"${{{name}}}", {name: text}
        elif form == 2:
            source = _dq(f"${{{name}:-${{{inner}:-{text}}}}}")
        elif form == 3:
            source, variables = _dq(f"${{{name}:+{text}}}"), {name: "x"}
        else:
            source = _dq(f"${{{name}-{text}}}")
    return source, variables


@st.composite
def tree(draw, value, variables: dict[str, str], tricks: frozenset[str] = frozenset(), *, plain: bool = False):
    """A Python value (from a base file or an escape) as a Text or Node."""
    if isinstance(value, dict):
        items = []
        for key, item in value.items():
            key_src = str(key) if _plain_ok(str(key)) else _dq(str(key))
            if not plain:
                key_src = draw(spelled(str(key), tricks, key=True)) if draw(st.integers(0, 2)) == 0 else key_src
            items.append((Text(key_src), draw(tree(item, variables, tricks, plain=plain))))
        return Node(items, True, flow=not plain and draw(st.booleans()))
    if isinstance(value, list):
        items = [draw(tree(item, variables, tricks, plain=plain)) for item in value]
        return Node(items, False, flow=plain or draw(st.booleans()))
    if value is None:
        return Text(draw(st.sampled_from(("null", "~", ""))) if "odd" in tricks else "null")
    if plain:
        if isinstance(value, bool):
            return Text("true" if value else "false")
        if isinstance(value, (int, float)):
            return Text(repr(value))
        return Text(str(value) if _plain_ok(str(value)) else _dq(str(value)))
    if value is False or isinstance(value, float):
        return Text(json.dumps(value))
    source, needed = draw(value_source(value, tricks))
    variables.update(needed)
    return Text(source)


# ---- the escapes ----------------------------------------------------------------------


def escapes(planted: Planted) -> list[tuple[str, str, object, dict]]:
    """(name, key, value, top-level keys it needs): keys of the first service,
    or of the file when the name starts with "top:"."""
    conf, folder, host = planted.conf, planted.folder, planted.host_variable
    nvidia_all = {
        "resources": {"reservations": {"devices": [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]}}
    }
    service = [
        ("privileged", "privileged", True),
        *((f"{key} host", key, "host") for key in ("network_mode", "pid", "ipc", "uts", "cgroup", "userns_mode")),
        ("bind /", "volumes", ["/:/host"]),
        ("bind conf folder", "volumes", [f"{folder}:/s:ro"]),
        ("bind docker.sock", "volumes", ["/var/run/docker.sock:/var/run/docker.sock"]),
        ("bind long", "volumes", [{"type": "bind", "source": folder, "target": "/s"}]),
        ("devices mem", "devices", ["/dev/mem:/dev/mem"]),
        ("devices nvidia0", "devices", ["/dev/nvidia0"]),
        ("device_cgroup_rules", "device_cgroup_rules", ["a *:* rwm"]),
        ("cap_add SYS_ADMIN", "cap_add", ["SYS_ADMIN"]),
        ("cap_add ALL", "cap_add", ["ALL"]),
        ("seccomp unconfined", "security_opt", ["seccomp:unconfined"]),
        ("apparmor unconfined", "security_opt", ["apparmor=unconfined"]),
        ("no-new-privileges false", "security_opt", ["no-new-privileges:false"]),
        ("systempaths unconfined", "security_opt", ["systempaths=unconfined"]),
        ("env_file", "env_file", conf),
        ("env_file list", "env_file", [conf]),
        ("env_file long", "env_file", [{"path": conf, "required": True}]),
        ("label_file", "label_file", conf),
        ("extends.file", "extends", {"file": conf, "service": "app"}),
        ("build context", "build", {"context": folder}),
        ("build short", "build", folder),
        ("provider", "provider", {"type": "model", "options": {"model": "ai/smollm2"}}),
        ("use_api_socket", "use_api_socket", True),
        ("ipv4_address", "networks", {"default": {"ipv4_address": "172.17.0.1"}}),
        ("link_local_ips", "networks", {"default": {"link_local_ips": ["169.254.169.254"]}}),
        ("mac_address", "mac_address", "02:42:ac:11:00:02"),
        ("NVIDIA_VISIBLE_DEVICES all", "environment", {"NVIDIA_VISIBLE_DEVICES": "all"}),
        ("NVIDIA_VISIBLE_DEVICES foreign", "environment", [f"NVIDIA_VISIBLE_DEVICES={FOREIGN_GPU}"]),
        ("NVIDIA_VISIBLE_DEVICES none", "environment", {"NVIDIA_VISIBLE_DEVICES": "none"}),
        (
            "NVIDIA_DRIVER_CAPABILITIES",
            "environment",
            {"NVIDIA_DRIVER_CAPABILITIES": "all", "NVIDIA_MIG_CONFIG_DEVICES": "all"},
        ),
        ("host variable", "environment", {"LEAK": f"${{{host}}}"}),
        ("label ssh", "labels", {"io.gpuhost.ssh": "true"}),
        ("label gpus", "labels", [f"io.gpuhost.rental-gpus={FOREIGN_GPU}"]),
        ("label managed", "labels", {"io.gpuhost.managed": "false", "io.gpuhost.fuzz": "x"}),
        ("runtime nvidia", "runtime", "nvidia"),
        ("sysctls", "sysctls", {"kernel.shm_rmid_forced": 1, "net.ipv4.ip_forward": 1}),
        ("cgroup_parent", "cgroup_parent", "/"),
        ("volumes_from", "volumes_from", ["container:gpuhost-agent"]),
        ("gpus all", "gpus", "all"),
        ("deploy nvidia all", "deploy", nvidia_all),
        ("logging syslog", "logging", {"driver": "syslog"}),
        ("logging huge", "logging", {"driver": "json-file", "options": {"max-size": "100g"}}),
        ("oom_score_adj", "oom_score_adj", -1000),
        ("pids_limit", "pids_limit", -1),
        ("mem_limit", "mem_limit", "1t"),
        ("ulimits memlock", "ulimits", {"memlock": -1}),
        ("ports 0.0.0.0", "ports", ["0.0.0.0:18999:80"]),
        ("secrets file", "secrets", ["s"]),
        ("configs file", "configs", ["c"]),
        ("models", "models", ["m"]),
        # What the sandbox accepts or rewrites: files that reach the engine, to check what runs.
        ("benign environment", "environment", {"MODEL": "small", "MODE": "on"}),
        ("benign labels", "labels", {"app": "fuzz"}),
        ("benign tmpfs", "tmpfs", ["/scratch"]),
        ("benign volume", "volumes", ["data:/data"]),
    ]
    needs = {
        "secrets file": {"secrets": {"s": {"file": conf}}},
        "configs file": {"configs": {"c": {"environment": host}}},
        "models": {"models": {"m": {"model": "ai/smollm2"}}},
        "top:volume bind": {"service:volumes": ["fv:/fv"]},
        "benign volume": {"volumes": {"data": {}}},
    }
    top = [
        ("top:include", "include", [conf]),
        ("top:include long", "include", [{"path": conf}]),
        ("top:network driver host", "networks", {"default": {"driver": "host"}}),
        ("top:ipam metadata", "networks", {"default": {"ipam": {"config": [{"subnet": "169.254.0.0/16"}]}}}),
        (
            "top:network driver_opts",
            "networks",
            {"default": {"driver_opts": {"com.docker.network.bridge.name": "docker0"}}},
        ),
        ("top:volume bind", "volumes", {"fv": {"driver_opts": {"type": "none", "o": "bind", "device": folder}}}),
        ("top:secret environment", "secrets", {"s": {"environment": host}}),
        ("top:config file", "configs", {"c": {"file": conf}}),
        ("top:name", "name", "otherproject"),
    ]
    return [(name, key, value, needs.get(name, {})) for name, key, value in service] + [
        (name, key, value, needs.get(name, {})) for name, key, value in top
    ]


# ---- a whole file ---------------------------------------------------------------------


# What the sandbox makes safe rather than refuses (tests/sandbox_corpus/README.md, outcome: rewritten).
_MADE_SAFE = {
    "ipc host",
    "NVIDIA_VISIBLE_DEVICES all",
    "NVIDIA_VISIBLE_DEVICES none",
    "NVIDIA_DRIVER_CAPABILITIES",
    "host variable",
    "gpus all",
    "deploy nvidia all",
    "ports 0.0.0.0",
    "mem_limit",
    "ulimits memlock",
    "logging huge",
    "models",
}
# What makes Compose read a host file or the host's environment, or mount a host path.
_HOST_READS = {
    "bind conf folder",
    "bind long",
    "env_file",
    "env_file list",
    "env_file long",
    "label_file",
    "extends.file",
    "build context",
    "host variable",
    "secrets file",
    "configs file",
    "top:include",
    "top:include long",
    "top:volume bind",
    "top:secret environment",
    "top:config file",
}
_MINIMAL = {"services": {"app": {"image": TEST_IMAGE, "command": ["sleep", "3600"], "stop_grace_period": "1s"}}}


class _BaseLoader(yaml.CSafeLoader):
    """Compose's own tags (`!override`, `!reset`) in a published base are read as the untagged value."""


for _tag in ("!override", "!reset"):
    _BaseLoader.add_constructor(
        _tag,
        lambda loader, node: (
            loader.construct_mapping(node, deep=True)
            if isinstance(node, yaml.MappingNode)
            else loader.construct_sequence(node, deep=True)
            if isinstance(node, yaml.SequenceNode)
            else loader.construct_scalar(node)
        ),
    )
_BASES = {path: yaml.load(path.read_text(), _BaseLoader) for path in LEGIT + PUBLISHED}  # noqa: S506 - read at import


def _base(path: Path | None, *, deployable: bool) -> dict:
    document = copy.deepcopy(_BASES[path] if path is not None else _MINIMAL)
    if deployable:  # offline: every image is the test image, nothing is built
        for service in document["services"].values():
            service["image"] = TEST_IMAGE
            service.pop("build", None)
    return document


def _merged(old, new):
    """An injected mapping keeps what the base had under the same key (its volumes, its environment)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return {**old, **new}
    return new


@st.composite
def hostile_file(draw, planted: Planted, *, deployable: bool = False) -> Hostile:
    """One hostile file. `deployable`: only bases whose images are the local test image."""
    path = draw(st.one_of(st.sampled_from([None, *LEGIT]), st.sampled_from([None, *LEGIT, *PUBLISHED])))
    path = path if path in LEGIT or not deployable else None
    document = _base(path, deployable=deployable)
    catalogue = escapes(planted)
    accepted = [escape for escape in catalogue if escape[0] in _MADE_SAFE or escape[0].startswith("benign")]
    reads = [escape for escape in catalogue if escape[0] in _HOST_READS]
    # One escape (half the time one that makes Compose read the host) beside what the sandbox lets
    # through, so that the escape alone decides whether the file is refused.
    chosen = [draw(st.one_of(st.sampled_from(catalogue), st.sampled_from(reads)))]
    chosen += [escape for escape in draw(st.lists(st.sampled_from(accepted), max_size=2)) if escape not in chosen]
    tricks = frozenset(draw(st.lists(st.sampled_from(TRICKS), max_size=4)))
    variables: dict[str, str] = {}
    services = document.pop("services")
    first = next(iter(services))
    target = services[first] = services[first] or {}
    for _name, _key, _value, needs in chosen:
        for key, value in needs.items():
            if key.startswith("service:"):
                target[key.removeprefix("service:")] = value
            else:
                document[key] = _merged(document.get(key), value)
    root = Node([(Text(key), draw(tree(value, variables, plain=True))) for key, value in document.items()])
    service_nodes = Node([])
    for name, service in services.items():
        node = draw(tree(service, variables, plain=True))
        node.flow = False
        service_nodes.items.append((Text(name if _plain_ok(name) else _dq(name)), node))
    x_items: list = []
    labels: list[str] = []
    for number, (name, key, value, _needs) in enumerate(chosen):
        if key == "labels":
            labels.extend(value if isinstance(value, dict) else [item.split("=")[0] for item in value])
        top = name.startswith("top:")
        where = root if top else service_nodes.items[0][1]
        value = _merged((document if top else target).get(key), value)
        _deliver(draw, where, x_items, number, key, value, variables, tricks)
    root.items.append((Text("services"), service_nodes))
    root.items[:0] = x_items
    if "odd" in tricks:
        odd = Node([Text(draw(st.sampled_from(_ODD))) for _ in range(3)], False, "&odd ")
        root.items.insert(0, (Text("x-odd"), odd))
    sep = draw(st.sampled_from((" ", " ", "\t", " \t"))) if "noise" in tricks else " "
    text = "\n".join(emit(root, 0, sep)) + "\n"
    if "noise" in tricks and draw(st.booleans()):
        text = "\ufeff" + text
    if "noise" in tricks and draw(st.booleans()):
        text = text.replace("\n", "\r\n")
    injected = (*(name for name, *_ in chosen), f"base {path.name if path else 'minimal'}", *sorted(tricks))
    return Hostile(text, variables, injected, tuple(labels))


def _replace(mapping: Node, key: str, value) -> None:
    mapping.items = [item for item in mapping.items if isinstance(item, Line) or item[0].src != key]
    mapping.items.append((Text(key), value))


def _deliver(draw, where: Node, x_items: list, number: int, key: str, value, variables: dict, tricks) -> None:
    """Put `key: value` into `where`, written one of several ways."""
    node = draw(tree(value, variables, tricks))
    key_src = draw(spelled(key, tricks, key=True))
    if "tags" in tricks and draw(st.booleans()):  # the differential that matters most: bytes to PyYAML
        key_src = "!!binary " + base64.b64encode(key.encode()).decode()
    forms = ["direct", "direct"]
    forms += ["explicit"] if "quotes" in tricks else []
    forms += ["merge", "merge list", "nested merge"] if "merges" in tricks else []
    forms += ["value alias", "key alias"] if "aliases" in tricks else []
    forms += ["hidden"] if "hidden" in tricks else []
    form = draw(st.sampled_from(forms))
    mapping_items = [item for item in where.items if isinstance(item, Line) or item[0].src != key]
    if form in ("direct", "explicit"):
        where.items = [*mapping_items, (Text(key_src, explicit=form == "explicit"), node)]
    elif form.endswith("merge") or form == "merge list":
        anchor = f"m{number}"
        x_items.append(
            (Text(f"x-m{number}"), Node([(Text(key_src), node)], True, f"&{anchor} ", flow=draw(st.booleans())))
        )
        if form == "nested merge":
            x_items.append((Text(f"x-n{number}"), Node([(Text("<<"), Text(f"*{anchor}"))], True, f"&n{number} ")))
            anchor = f"n{number}"
        merged = Text(f"*{anchor}") if form == "merge" else Node([Text(f"*{anchor}")], False, flow=True)
        for item in mapping_items:  # one `<<` per mapping: a second merge joins the first one's list
            if not isinstance(item, Line) and item[0].src == "<<":
                earlier = item[1].items if isinstance(item[1], Node) else [item[1]]
                merged = Node([*earlier, Text(f"*{anchor}")], False, flow=True)
        mapping_items = [item for item in mapping_items if isinstance(item, Line) or item[0].src != "<<"]
        where.items = (
            [(Text("<<"), merged), *mapping_items] if draw(st.booleans()) else [*mapping_items, (Text("<<"), merged)]
        )
    elif form == "value alias":
        if isinstance(node, Text):
            node = Text(f"&v{number} {node.src}")
        else:
            node.props = f"&v{number} "
        x_items.append((Text(f"x-v{number}"), node))
        where.items = [*mapping_items, (Text(key_src), Text(f"*v{number}"))]
    elif form == "key alias":
        x_items.append((Text(f"x-k{number}"), Node([Text(f"&k{number} {key_src}")], False, flow=False)))
        where.items = [*mapping_items, (Text(f"*k{number}"), node)]
    else:  # a comment that a Unicode line break ends for one parser and not for another
        brk = draw(st.sampled_from(("\u0085", "\u2028", "\u2029")))
        inline = _one_line(node)
        where.items = [*mapping_items, Line(f"# note{brk}{key_src}: {inline}")]
