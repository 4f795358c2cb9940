"""One reading of a renter's Compose file.

The raw checks read the file with PyYAML (YAML 1.1), Compose with Go's
parser (YAML 1.2). The audit made them disagree: `!!binary ZW52X2ZpbGU=` is
the key b'env_file' to PyYAML, so no check saw it, and `env_file` to Compose,
which read the agent's own config into the container's environment. The
class held here: a file is refused unless every explicit tag is Compose's own
(never on a key), it has no directive, every key is a plain scalar read as
its text, and no character is a line break to one YAML version only; and
Compose reads the agent's serialisation of what was checked, never the
renter's bytes. The hostile corpus (files 100-109) holds the spellings; here,
the rule on variants; in tests/integration/test_compose_one_reading_corpus.py,
the real Compose reading the agent's serialisation of every published and
legitimate file exactly as it read the original.
"""

from __future__ import annotations

import base64

import pytest

from gpuhost_agent.core.sandbox import compose_yaml
from gpuhost_agent.core.sandbox.raw import review

READS_FILES = ("env_file", "include", "label_file", "file", "extends")
BASE = "services:\n  app:\n    image: busybox\n"


def _binary(word: str) -> str:
    return "!!binary " + base64.b64encode(word.encode()).decode()


@pytest.mark.parametrize("key", READS_FILES)
@pytest.mark.parametrize(
    "spelling",
    [
        _binary,
        lambda key: f"!!str {key}",
        lambda key: f"! {key}",
        lambda key: f"!reset {key}",
        lambda key: f"!override {key}",
        lambda key: f"!<tag:yaml.org,2002:str> {key}",
        lambda key: f"!custom {key}",
        lambda key: f"? {_binary(key)}\n    ",
    ],
    ids=["binary", "str", "nonspecific", "reset", "override", "verbatim", "custom", "explicit-key"],
)
def test_a_tagged_key_is_refused_whatever_the_tag(key: str, spelling) -> None:
    text = BASE + f"    {spelling(key)}: /etc/gpuhost-agent/agent.conf\n"
    with pytest.raises(ValueError, match="tag|plain string"):
        review(text)


@pytest.mark.parametrize(
    "text",
    [
        BASE + "    image: " + _binary("busybox") + "\n",
        BASE + "    command: !!python/tuple [a]\n",
        BASE + "    environment: !!omap [{A: b}]\n",
        BASE + "    labels: !!set {a}\n",
        "%TAG !x! tag:yaml.org,2002:\n---\n" + BASE + "    labels: {a: !x!str b}\n",
        "%YAML 1.1\n---\n" + BASE,
        BASE + "    labels: {a: b}\u0085    privileged: true\n",
        BASE + "    labels: {a: b}\u2029    privileged: true\n",
        BASE + "    labels: {a: \ufeffb}\n",
        BASE + "    ? - env_file\n    : /etc/passwd\n",
        BASE + "    ? {a: b}\n    : c\n",
        BASE + "    on: 1\n    'on': 2\n",
        "- services\n",
        "",
    ],
)
def test_what_two_parsers_could_read_apart_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        review(text)


def test_keys_are_their_text_and_compose_tags_stay_on_values() -> None:
    text = BASE + "    labels:\n      on: a\n      1: b\n      ~: c\n    command: !reset null\n"
    service = compose_yaml.parse(text)["services"]["app"]
    assert service["labels"] == {"on": "a", "1": "b", "~": "c"}  # strings, as Compose reads them
    assert "!reset" in review(text).text  # Compose's own tag reaches Compose


def _merge_bomb(levels: int) -> str:
    """Each anchor merges the one before twice: a kilobyte that stands for 2**levels mappings."""
    lines = ["x-0: &m0 {a: 1}"]
    lines += [f"x-{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}]}}" for i in range(1, levels + 1)]
    return "\n".join(lines) + f"\n<<: *m{levels}\n" + BASE


def _alias_tree(levels: int) -> str:
    lines = ["x-0: &a0 [aaaaaaaaaaaaaaaa]"] + [f"x-{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n" + BASE


@pytest.mark.parametrize(
    "text",
    [_merge_bomb(18), _merge_bomb(40), _alias_tree(20), "x: &a [1, *a]\n" + BASE, "x: " + "[" * 5000 + "]" * 5000],
    ids=["merges-18", "merges-40", "aliases-20", "recursive", "deep"],
)
def test_a_file_that_expands_past_the_bound_is_refused_before_any_walk(text: str) -> None:
    """A merge bomb: 18 levels of merges kept the event loop for 1.6 s
    (40 would be years) in the raw pass's merge walks, and an alias tree
    without merges cost Compose minutes of CPU; both were accepted. Now the
    expanded size is counted once per node and bounded (compose_yaml.MAX_EXPANDED_NODES)."""
    with pytest.raises(ValueError, match="expand|refers to|nest|depth"):
        review(text)


def test_a_mapping_merged_along_many_paths_is_edited_once() -> None:
    """Within the bound, the merge walks look at each mapping once: a shared
    base reached by many merges still loses its env_file everywhere."""
    text = "x-0: &m0 {env_file: /etc/passwd}\n" + "".join(
        f"x-{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}]}}\n" for i in range(1, 12)
    )
    text += "services:\n  app:\n    image: busybox\n    <<: *m11\n"
    reviewed = review(text)
    assert any("env_file" in problem for problem in reviewed.problems)
    assert "env_file" not in reviewed.text


def test_a_value_of_the_wrong_kind_is_left_to_compose_not_a_crash() -> None:
    """`profiles: 5` raised TypeError in the raw pass ("internal agent error")."""
    assert review(BASE + "    profiles: 5\n").problems == []


def test_a_long_text_behind_many_aliases_is_refused() -> None:
    """2,000 nodes, but 800 MB once Compose writes its model out, which the agent
    reads; the same text once is a plain file."""
    big = "n" * 400_000
    once = f'x-big: &big "{big}"\n' + BASE
    assert review(once).problems == []
    many = once + "".join(f"x-{i}: *big\n" for i in range(20))
    with pytest.raises(ValueError, match="expand to more than 4 MiB of text"):
        review(many)
    with pytest.raises(ValueError) as refused:
        review("services: !" + "t" * 100_000 + " {}\n")
    assert len(str(refused.value)) < 300
