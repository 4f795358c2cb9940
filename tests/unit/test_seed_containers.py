"""The container list as the marketplace reads it (its Seed shape), from the engine's list."""

from __future__ import annotations

from gpuhost_agent.core.stacks.container_list import failed_containers, seed_containers, to_seed_container


def test_seed_container_shape():
    raw = {
        "Id": "abc",
        "Names": ["/p-web-1"],
        "Created": 1700000000,
        "State": "running",
        "Status": "Up 1s",
        "Labels": {"b": "2", "a": "1"},
        "Ports": [
            {"PrivatePort": 80, "Type": "tcp"},
            {"IP": "0.0.0.0", "PrivatePort": 8080, "PublicPort": 32768, "Type": "tcp"},
        ],
    }
    shaped = to_seed_container(raw)
    assert shaped == {
        "Name": "p-web-1",
        "Id": "abc",
        "Created": 1700000000,
        "Labels": ["a=1", "b=2"],
        "Ports": [
            {"PrivatePort": 80, "Type": "tcp"},
            {"PrivatePort": 8080, "Type": "tcp", "IP": "0.0.0.0", "PublicPort": 32768},
        ],
        "State": "running",
    }
    assert [c["Name"] for c in seed_containers([{**raw, "Names": ["/z"]}, {**raw, "Names": ["/a"]}])] == ["a", "z"]
    assert failed_containers([{"State": "running"}, {"State": "exited"}, {"State": "dead"}]) == [
        {"State": "exited"},
        {"State": "dead"},
    ]
