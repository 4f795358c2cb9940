"""One reading of a renter's Compose file (issue 31, finding 3).

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

from gpuhost_agent.core import compose_yaml
from gpuhost_agent.core.sandbox_raw import review

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
