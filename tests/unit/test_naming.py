"""Names the agent gives stacks: Compose projects the engine accepts and finds back, and the provider's numeric id."""

from __future__ import annotations

from gpuhost_agent.core.stacks import naming


def test_project_name_is_compose_safe_unique_and_stable():
    a = naming.project_name("My GPU Stack!", "3F2B9C1D-aaaa")
    assert a == "my-gpu-stack-3f2b9c1d"
    assert naming.project_name("My GPU Stack!", "3F2B9C1D-aaaa") == a
    assert naming.project_name("web", "11111111-x") != naming.project_name("web", "22222222-x")
    assert naming.project_name("!!!", "abc") == "stack-abc"
    assert (
        naming.project_name("x" * 200, "abcdef12").endswith("-abcdef12")
        and len(naming.project_name("x" * 200, "a")) < 64
    )


def test_a_project_found_on_docker_gives_back_the_name_that_finds_it():
    """The reconciler removes a stack the marketplace no longer names by the
    name its project holds; an id with a '-' early must not cut the name short."""
    for name, stack_id in [("web", "stk-1"), ("my-web-ui", "a-b-c-d-e"), ("", "3f2b9c1d-aaaa"), ("x", "abc")]:
        project = naming.project_name(name, stack_id)
        assert naming.project_name(naming.stack_name_of(project, stack_id), stack_id) == project
    assert naming.stack_name_of("web-stk-1", "stk-1") == "web"


def test_provider_stack_id_is_stable_positive_int():
    first = naming.provider_stack_id("stack-1")
    assert first == naming.provider_stack_id("stack-1") and 0 < first < 2**31
    assert first != naming.provider_stack_id("stack-2")
