"""A template's variables that would steer Compose are refused; the agent's labels on every service are its own."""

from __future__ import annotations

import pytest

from gpuhost_agent.core.stack_errors import StackRejected
from gpuhost_agent.core.stacks.project_input import check_variables, label_services
from gpuhost_agent.protocol import wire


@pytest.mark.parametrize("name", ["COMPOSE_PROJECT_NAME", "COMPOSE_FILE", "DOCKER_HOST", "PATH", "HOME", "BUILDKIT_X"])
def test_variables_that_steer_compose_are_refused(name):
    with pytest.raises(StackRejected, match=name):
        check_variables({name: "x"})


@pytest.mark.parametrize("name", ["1ABC", "A-B", "", "A B"])
def test_invalid_variable_names_are_refused(name):
    with pytest.raises(StackRejected, match="invalid"):
        check_variables({name: "x"})


def test_label_services_adds_agent_labels_and_drops_project_name():
    model = {
        "name": "theirs",
        "services": {
            "a": {"image": "x", "labels": {"keep": "1", wire.LABEL_STACK: "forged"}},
            "b": {"image": "y", "labels": ["k=v", "flag"]},
        },
    }
    out = label_services(model, "s1", "r1", "e1")
    assert "name" not in out and model["name"] == "theirs", "input must not be mutated"
    assert out["services"]["a"]["labels"] == {
        "keep": "1",
        wire.LABEL_MANAGED: "true",
        wire.LABEL_STACK: "s1",
        wire.LABEL_RENTAL: "r1",
        wire.LABEL_ENV: "e1",
        wire.LABEL_GPUS: "",  # every label of the agent's namespace is said, "no" too
        wire.LABEL_SSH: "",
        wire.LABEL_EXPOSED_PORTS: "",  # filled by the Swarm rewrite alone
    }
    assert out["services"]["b"]["labels"]["k"] == "v" and out["services"]["b"]["labels"]["flag"] == ""
    with pytest.raises(StackRejected, match="no services"):
        label_services({"services": {}}, "s", "r", "e")
