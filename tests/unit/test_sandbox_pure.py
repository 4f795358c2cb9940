"""The sandbox's decisions as plain functions, without Docker or Compose:
rental shares, GPU allocation, the ledger, and what hardening writes."""

from __future__ import annotations

import pytest
from support.settings import stack_context

from gpuhost_agent.core.gpus.allocation import GpuSlot, NotEnoughGpus, allocate, slots_from_inventory
from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.sandbox.context import GIB, Machine, SandboxContext, rental_share
from gpuhost_agent.core.sandbox.harden import NO_EXTRA_DEVICES, TOOLKIT_RESOURCES, assigned_uuids, harden
from gpuhost_agent.core.sandbox.policy import policy_violations
from gpuhost_agent.storage.agent_db import AgentDB

UUIDS = [f"GPU-{i}" for i in range(8)]


def test_share_is_in_proportion_to_gpus() -> None:
    machine = Machine(cpus=129, memory_bytes=1026 * GIB, gpus=8)  # 1 CPU and 2 GiB kept for the host
    assert rental_share(machine, 2) == (32.0, 256 * GIB)
    assert rental_share(machine, 8) == (128.0, 1024 * GIB)
    assert rental_share(machine, 0) == (2.0, 4 * GIB)  # GPU-less: the fixed small share
    assert rental_share(Machine(cpus=2, memory_bytes=3 * GIB, gpus=0), 0) == (1.0, 1 * GIB)


def test_allocation_keeps_skips_and_never_shares() -> None:
    slots = [GpuSlot(u) for u in UUIDS[:4]]
    slots[1] = GpuSlot(UUIDS[1], healthy=False, reason="GPU is lost")
    assignments = {"rental-a": allocate(slots, {}, "rental-a", 2)}
    assert assignments["rental-a"] == [UUIDS[0], UUIDS[2]]  # the lost GPU is skipped
    assert allocate(slots, assignments, "rental-a", 1) == [UUIDS[0], UUIDS[2]]  # kept for the rental's life
    assignments["rental-b"] = allocate(slots, assignments, "rental-b", 1)
    assert assignments["rental-b"] == [UUIDS[3]]
    with pytest.raises(
        NotEnoughGpus,
        match=r"needs 1 GPU\(s\) but only 0 of the machine's 4 GPU\(s\) are free, "
        r"1 out of service",
    ):
        allocate(slots, assignments, "rental-c", 1)
    assert allocate(slots, assignments, "rental-d", 0) == []


def test_unhealthy_gpus_from_the_probe() -> None:
    slots = slots_from_inventory(
        {
            "gpus": [
                {"index": 0, "uuid": "GPU-0", "eccUncorrectedErrors": 0},
                {"index": 1, "uuid": "GPU-1", "eccUncorrectedErrors": 2},
                {"index": 2, "uuid": "GPU-2", "error": "GPU is lost"},
                {"index": 3, "error": "Unknown Error"},  # no UUID: cannot be handed out by UUID at all
            ]
        }
    )
    assert [(s.uuid, s.healthy) for s in slots] == [("GPU-0", True), ("GPU-1", False), ("GPU-2", False)]


def test_ledger_survives_a_restart_and_remembers_ended_rentals(tmp_path) -> None:
    path = tmp_path / "agent.db"
    ledger = GpuLedger(AgentDB(path))
    slots = [GpuSlot(u) for u in UUIDS[:2]]
    ledger.commit("rental-a", ledger.plan(slots, "rental-a", 2))
    assert path.stat().st_mode & 0o777 == 0o600
    again = GpuLedger(AgentDB(path))
    with pytest.raises(NotEnoughGpus):
        again.plan(slots, "rental-b", 1)
    assert again.release("rental-a") == UUIDS[:2]
    after = GpuLedger(AgentDB(path))
    assert after.has_ended("rental-a") and after.plan(slots, "rental-b", 1) == [UUIDS[0]]
    after.adopt("rental-a", [UUIDS[1]])  # an ended rental's label is not taken back
    assert "rental-a" not in after.assignments


def _ctx(gpus: int = 2) -> SandboxContext:
    return stack_context(
        project="p",
        gpu_uuids=tuple(UUIDS[:gpus]),
        cpus=4.0,
        memory_bytes=8 * GIB,
        pids_limit=1000,
        publish_address="10.0.0.5",
    )


def test_gpu_asks_resolve_to_the_rentals_uuids() -> None:
    ctx = _ctx(2)
    assert assigned_uuids({"gpus": [{"count": -1}]}, ctx) == UUIDS[:2]
    assert assigned_uuids({"deploy": {"resources": {"reservations": {"devices": [{"count": 1}]}}}}, ctx) == UUIDS[:1]
    assert assigned_uuids({"gpus": [{"device_ids": ["1"]}]}, ctx) == [UUIDS[1]]
    assert assigned_uuids({"gpus": [{"device_ids": [UUIDS[1], "0"]}]}, ctx) == UUIDS[:2]
    assert assigned_uuids({}, ctx) == []


def test_hardening_writes_everything_explicitly() -> None:
    model = {
        "services": {
            "gpu": {
                "image": "x",
                "gpus": [{"count": -1}],
                "mem_limit": "1073741824",
                "shm_size": str(64 * GIB),
                "ports": [{"target": 8080, "published": "18080", "host_ip": "0.0.0.0", "protocol": "tcp"}],
            },
            "plain": {
                "image": "x",
                "cap_drop": ["CHOWN"],
                "environment": ["A=1"],
                "labels": ["team=ml"],
                "deploy": {"resources": {"limits": {"cpus": 0.5, "pids": 50}}},
            },
        }
    }
    ctx = _ctx(2)
    assert policy_violations(model, ctx) == [
        'service "gpu": shm_size 68719476736 is beyond the rental\'s share of 8.0 GiB'
    ]
    model["services"]["gpu"]["shm_size"] = str(GIB)
    hardened = harden(model, ctx)
    gpu, plain = hardened["services"]["gpu"], hardened["services"]["plain"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "device_ids": UUIDS[:2], "capabilities": ["gpu"]}
    ]
    assert "gpus" not in gpu and gpu["environment"]["NVIDIA_VISIBLE_DEVICES"] == "GPU-0,GPU-1"
    assert gpu["labels"]["io.gpuhost.gpus"] == "GPU-0,GPU-1"
    assert (gpu["mem_limit"], gpu["memswap_limit"], gpu["cpus"], gpu["pids_limit"]) == (str(GIB), str(GIB), 4.0, 1000)
    assert gpu["ports"] == [{"target": 8080, "host_ip": "10.0.0.5", "protocol": "tcp"}]
    assert plain["environment"] == {"A": "1", "NVIDIA_VISIBLE_DEVICES": "void", **NO_EXTRA_DEVICES} | {
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"
    } | dict.fromkeys(TOOLKIT_RESOURCES, "void")
    assert plain["labels"] == {"team": "ml", "io.gpuhost.gpus": ""}
    assert (plain["cpus"], plain["pids_limit"], plain["mem_limit"]) == (0.5, 50, str(8 * GIB))
    assert "limits" not in plain["deploy"]["resources"]
    assert {"CHOWN", "MKNOD", "NET_RAW", "SYS_ADMIN"} <= set(plain["cap_drop"])
    assert all(
        s["security_opt"] == ["no-new-privileges:true"] and s["privileged"] is False and s["cgroup"] == "private"
        for s in hardened["services"].values()
    )
    assert model["services"]["plain"]["environment"] == ["A=1"]  # the input is left alone


@pytest.mark.parametrize(
    "service, allowed",
    [
        ({"network_mode": "service:db"}, True),
        ({"network_mode": "none"}, True),
        ({"network_mode": "service:elsewhere"}, False),
        ({"ipc": "shareable"}, True),
        ({"pid": "service:db"}, True),
        ({"security_opt": ["no-new-privileges:true"]}, True),
        ({"volumes": [{"type": "tmpfs", "target": "/t"}]}, True),
        ({"volumes": [{"type": "npipe", "source": "x", "target": "/t"}]}, False),
        ({"ulimits": {"rtprio": 99}}, False),
        ({"ulimits": {"nofile": {"soft": 1024, "hard": 65536}}}, True),
        ({"oom_score_adj": 500}, True),
        ({"volumes_from": ["db:ro"]}, True),
    ],
)
def test_policy_edges(service, allowed) -> None:
    model = {"services": {"app": {"image": "x", **service}, "db": {"image": "x"}}}
    assert (policy_violations(model, _ctx()) == []) is allowed


def test_the_disk_floor_problem_names_the_disk_and_the_floor() -> None:
    from gpuhost_agent.core.sandbox.context import disk_floor_problem

    gib = 1024**3
    low = {"path": "/var/lib/docker", "freeBytes": 5 * gib}
    assert disk_floor_problem(low, 20 * gib) == (
        "the host's disk is nearly full: 5.0 GiB free on /var/lib/docker, below the host's floor of 20.0 GiB "
        "(GPUHOST_DISK_FLOOR); no stack starts until the host frees space"
    )
    assert disk_floor_problem(low, 0) is None  # no floor
    assert disk_floor_problem({"path": "/x", "freeBytes": 30 * gib}, 20 * gib) is None
    assert disk_floor_problem({"path": "/x", "freeBytes": None, "error": "remote engine"}, 20 * gib) is None


def test_a_stack_may_not_take_more_than_its_share_of_the_address_pools() -> None:
    """One rental's stacks, each with networks, used up
    Docker's address pools and every other renter's deploy failed."""
    from gpuhost_agent.core.sandbox.policy import MAX_NETWORKS_PER_STACK

    def model(networks: int) -> dict:
        return {"services": {"app": {"image": "x"}}, "networks": {f"n{i}": {} for i in range(networks)}}

    assert policy_violations(model(MAX_NETWORKS_PER_STACK), _ctx()) == []
    (problem,) = policy_violations(model(MAX_NETWORKS_PER_STACK + 1), _ctx())
    assert f"at most {MAX_NETWORKS_PER_STACK} per stack" in problem


def test_a_rental_may_have_so_many_stacks_on_the_host() -> None:
    from gpuhost_agent.core.sandbox.context import crowded_rental_problem

    stacks = {f"s{i}": {"rental_id": "r1"} for i in range(3)} | {"o1": {"rental_id": "r2"}}
    assert crowded_rental_problem(stacks, "r1", "new", 4) is None
    assert crowded_rental_problem(stacks, "r1", "s0", 3) is None  # a stack deployed again is not one more
    problem = crowded_rental_problem(stacks, "r1", "new", 3)
    assert problem is not None and "already has 3 stacks" in problem and "GPUHOST_STACKS_PER_RENTAL" in problem
    assert crowded_rental_problem(stacks, "r2", "new", 3) is None  # another renter is not held back


def test_a_service_may_carry_so_many_bytes_of_labels() -> None:
    """Every event and container list of the engine carries a container's labels,
    for all renters, and the agent keeps and sends them (core/sandbox/label_size.py)."""
    from gpuhost_agent.core.sandbox.label_size import MAX_LABEL_BYTES, oversized_container

    def model(labels: dict | list) -> dict:
        return {"services": {"app": {"image": "x", "labels": labels}}}

    half = "v" * (MAX_LABEL_BYTES // 2 - 10)
    assert policy_violations(model({"a": half, "b": half}), _ctx()) == []
    (problem,) = policy_violations(model({"a": half, "b": half, "c": "v" * 100}), _ctx())
    assert problem == (
        'service "app": labels are 65,619 bytes in all, at most 65,536 bytes (64 KiB) a service: '
        "every event and container list of the engine carries them"
    )
    (problem,) = policy_violations(model([f"a={half}", f"b={half}", "c=" + "é" * 60]), _ctx())  # bytes, not characters
    assert "at most 65,536 bytes (64 KiB) a service" in problem

    fine = {"Names": ["/p-app-1"], "Labels": {"a": half}}
    heavy = {"Names": ["/p-web-1"], "Labels": {"a": half, "b": half, "from-the-image": "x" * 200}}
    assert oversized_container([fine]) is None
    message = oversized_container([fine, heavy])
    assert message is not None and message.startswith("deploy failed: container p-web-1 carries 65,732 bytes of labels")


def test_labels_count_as_the_engines_json_writes_them_and_networks_and_volumes_share_a_stacks_limit() -> None:
    """300 volumes sharing one 400 KiB label by YAML alias made
    `GET /volumes` 123 MB for every renter's deploy; `<` is six bytes in the engine's JSON;
    an image's command is in every container list."""
    from gpuhost_agent.core.sandbox.label_size import MAX_LABEL_BYTES, json_bytes, oversized_container

    assert (json_bytes("a<é\n"), json_bytes("plain")) == (1 + 6 + 2 + 6, 5)
    escaped = {"services": {"app": {"image": "x", "labels": {"notes": "<" * 12_000}}}}
    (problem,) = policy_violations(escaped, _ctx())
    assert "labels are 72,005 bytes in all" in problem

    label = {"notes": "n" * 20_000}
    for section in ("volumes", "networks"):
        three = {"services": {"app": {"image": "x"}}, section: {f"data-{i}": {"labels": label} for i in range(3)}}
        assert policy_violations(three, _ctx()) == []
        four = {"services": {"app": {"image": "x"}}, section: {f"data-{i}": {"labels": label} for i in range(4)}}
        (problem,) = policy_violations(four, _ctx())
        assert problem.startswith("networks and volumes: their labels are 80,020 bytes in all, at most 65,536")
        one = {"services": {"app": {"image": "x"}}, section: {"big": {"labels": {"n": "n" * MAX_LABEL_BYTES}}}}
        problems = policy_violations(one, _ctx())
        assert f'{section[:-1]} "big": labels are 65,537 bytes in all' in problems[0], problems
        assert f"a {section[:-1]}: every {section[:-1]} list of the engine carries them" in problems[0]

    script = {"Names": ["/p-app-1"], "Labels": {}, "Command": "sh -c '" + "echo x; " * 9000 + "'"}
    message = oversized_container([script])
    assert message is not None and message.startswith("deploy failed: container p-app-1's command is 72,008 bytes")
    assert oversized_container([{**script, "Command": "sh -c 'echo x'"}]) is None


def test_a_refusal_names_a_dozen_problems_then_how_many_more() -> None:
    """A file of a thousand forbidden volumes must not make an errorMsg (and a log
    line) of megabytes (35 problems were 14 KB)."""
    from gpuhost_agent.core.compose_values import MAX_PROBLEMS_SAID, problems_said
    from gpuhost_agent.core.sandbox.apply import POLICY_PREFIX
    from gpuhost_agent.core.sandbox.raw import review
    from gpuhost_agent.core.stack_errors import StackRejected

    assert problems_said(["a", "b"]) == "a; b"
    assert problems_said(["x" * 10_000]) == "x" * 397 + "..."
    many = [f"volume v{i}: driver_opts is not allowed" for i in range(1000)]
    said = problems_said(many)
    assert said.endswith(f"; and {1000 - MAX_PROBLEMS_SAID} more") and len(said) < 1000
    assert said.count("driver_opts") == MAX_PROBLEMS_SAID

    from gpuhost_agent.core.sandbox.apply import decide

    model = {
        "services": {"app": {"image": "x"}},
        "volumes": {f"v{i}": {"driver_opts": {"o": "bind"}} for i in range(50)},
    }
    with pytest.raises(StackRejected) as refused:
        decide(model, review("services: {app: {image: x}}\n"), _ctx())
    message = str(refused.value)
    assert message.startswith(POLICY_PREFIX) and message.endswith(f"and {50 - MAX_PROBLEMS_SAID} more")


def test_a_healthcheck_probes_at_most_once_a_second_with_a_short_command() -> None:
    """Each probe is an exec the host's engine runs outside the rental's share, and
    its events carry the command (1 ms and 500 KiB were accepted)."""
    from gpuhost_agent.core.sandbox.healthcheck import duration_seconds

    assert [duration_seconds(v) for v in ("1m30s", "1.5s", "500ms", "0s", "1h", "10", "x", "1s2")] == [
        90.0,
        1.5,
        0.5,
        0.0,
        3600.0,
        None,
        None,
        None,
    ]

    def model(check: dict) -> dict:
        return {"services": {"app": {"image": "x", "healthcheck": {"test": ["CMD", "true"], **check}}}}

    assert policy_violations(model({"interval": "1s", "start_interval": "5s", "timeout": "100ms"}), _ctx()) == []
    assert policy_violations(model({"interval": "1ms", "disable": True}), _ctx()) == []
    (problem,) = policy_violations(model({"interval": "1ms"}), _ctx())
    assert problem == (
        "service \"app\": healthcheck interval '1ms' is below 1 s: each probe is an exec the host's engine runs, "
        "outside the rental's share"
    )
    (problem,) = policy_violations(model({"start_interval": "999ms"}), _ctx())
    assert "healthcheck start_interval '999ms' is below 1 s" in problem
    (problem,) = policy_violations(model({"test": ["CMD-SHELL", "x" * 5000]}), _ctx())
    assert "healthcheck test is 5,010 bytes, at most 4,096" in problem


def test_a_started_containers_healthcheck_is_judged_with_its_images() -> None:
    """The engine merges an image's HEALTHCHECK into the container field by field
    (a file's `test` alone keeps the image's 1 ms interval); an image may carry a
    negative interval, which the engine takes from it and probes back to back."""
    from gpuhost_agent.core.sandbox.healthcheck import file_over_image, started_healthcheck_problem

    probe = ["CMD-SHELL", "true"]
    for within in (None, {}, {"Test": ["NONE"], "Interval": 1_000_000}, {"Test": probe, "Interval": 0}):
        assert started_healthcheck_problem("container app-1", within) is None, within
    assert started_healthcheck_problem("container app-1", {"Test": probe, "Interval": 1_000_000_000}) is None
    assert started_healthcheck_problem("container app-1", {"Test": probe, "Interval": 1_000_000}) == (
        "container app-1 probes its health every 1 ms (its image's HEALTHCHECK), at least 1 s: "
        "each probe is an exec the host's engine runs, outside the rental's share; set healthcheck.interval "
        "in the file, or healthcheck.disable"
    )
    for negative in (-1, -(2**63)):
        said = started_healthcheck_problem("container app-1", {"Test": probe, "Interval": negative})
        assert said is not None and f"back to back (Interval {negative})" in said
    slow_start = started_healthcheck_problem(
        "container app-1", {"Test": probe, "Interval": 0, "StartInterval": 999_000_000}
    )
    assert slow_start is not None and "every 999 ms" in slow_start and "healthcheck.start_interval" in slow_start
    long_test = started_healthcheck_problem("container app-1", {"Test": ["CMD-SHELL", "x" * 5000]})
    assert long_test is not None and "test is 5,010 bytes" in long_test

    image = {"Test": probe, "Interval": 1_000_000}
    assert file_over_image(None, image) == image
    assert file_over_image({"disable": True}, image) == {"Test": ["NONE"]}
    assert file_over_image({"test": ["CMD", "true"]}, image) == {
        "Test": ["CMD", "true"],
        "Interval": 1_000_000,
        "StartInterval": 0,
    }
    assert file_over_image({"interval": "0s"}, image)["Interval"] == 1_000_000  # zero takes the image's
    assert file_over_image({"interval": "2s"}, image) == {"Test": probe, "Interval": 2_000_000_000, "StartInterval": 0}


def test_an_images_configuration_is_judged_before_its_start() -> None:
    """Copied into every container: 20 MB of STOPSIGNAL made every container list of the
    engine take seconds."""
    from gpuhost_agent.core.sandbox.image_config import service_image_problem

    service = {"image": "x", "healthcheck": {"interval": "2s"}}
    slow = {"Cmd": ["sleep", "1"], "Healthcheck": {"Test": ["CMD", "true"], "Interval": -1}}
    assert service_image_problem("app", service, slow) is None  # the file's interval is what runs
    said = service_image_problem("app", {"image": "x"}, slow)
    assert said is not None and said.startswith('service "app" probes its health back to back')
    big = {"StopSignal": "SIG" + "T" * 300_000}
    said = service_image_problem("app", service, big)
    assert said is not None and said.startswith("service \"app\" (image 'x')'s configuration is 293 KiB")
    assert service_image_problem("app", service, {"StopSignal": "SIG" + "T" * 200_000}) is None
    volumes = {f"/v{i}": {} for i in range(33)}
    said = service_image_problem("app", service, {"Volumes": volumes})
    assert said is not None and "declares 33 VOLUME paths" in said and "at most 32" in said
    ports = {f"{port}/tcp": {} for port in range(1000, 1257)}
    said = service_image_problem("app", service, {"ExposedPorts": ports})
    assert said is not None and "declares 257 EXPOSE ports" in said
    assert service_image_problem("app", service, {"Volumes": dict(list(volumes.items())[:32])}) is None


def test_a_stack_declares_so_many_ports_counted_port_by_port() -> None:
    """`expose: ["1-65535"]` made one container's list entry 7.7 MB and 2.7 s of the
    agent's CPU to shape; an image's EXPOSE is judged once the
    container runs."""
    from gpuhost_agent.core.sandbox.host_network import MAX_EXPOSED_PORTS, exposed_count
    from gpuhost_agent.core.sandbox.label_size import MAX_LISTED_PORTS, oversized_container

    assert [exposed_count(e) for e in ("8080", "8000-8009/udp", 9000, "1-65535", "x")] == [1, 10, 1, 65535, 1]

    def model(expose: list, replicas: int = 1) -> dict:
        return {"services": {"app": {"image": "x", "expose": expose, "deploy": {"replicas": replicas}}}}

    assert policy_violations(model(["8080", f"9000-{9000 + MAX_EXPOSED_PORTS - 2}"]), _ctx()) == []
    (problem,) = policy_violations(model(["1-65535", "1-65535/udp"]), _ctx())
    assert problem.startswith("expose: the stack would declare 131070 ports, more than the 256 one stack may")
    (problem,) = policy_violations(model(["8000-8099"], replicas=3), _ctx())
    assert "would declare 300 ports" in problem

    listed = {"Names": ["/p-app-1"], "Labels": {}, "Command": "x", "Ports": [{"PrivatePort": p} for p in range(600)]}
    message = oversized_container([listed])
    assert message is not None and message.startswith("deploy failed: container p-app-1 declares 600 ports")
    assert oversized_container([{**listed, "Ports": listed["Ports"][:MAX_LISTED_PORTS]}]) is None


def test_what_a_file_or_template_multiplies_is_bounded() -> None:
    """2,000 services by one YAML alias (replicas: 0 runs none,
    the Swarm's lists carry them all), 100,000 variables (each looked for in every
    log line), a variable name of 200 KB and an APPLIED notice of 705 KB in an errorMsg."""
    from gpuhost_agent.core.sandbox.apply import CHANGES_PREFIX, notices_message
    from gpuhost_agent.core.sandbox.policy import MAX_SERVICES_PER_STACK
    from gpuhost_agent.core.stack_errors import StackRejected
    from gpuhost_agent.core.stacks.project_input import MAX_VARIABLES, check_variables

    def services(count: int) -> dict:
        return {"services": {f"s{i}": {"image": "x", "deploy": {"replicas": 0}} for i in range(count)}}

    assert policy_violations(services(MAX_SERVICES_PER_STACK), _ctx()) == []
    assert f"services: 65 are defined, at most {MAX_SERVICES_PER_STACK} per stack" in policy_violations(
        services(65), _ctx()
    )
    check_variables({f"V{i}": "x" for i in range(MAX_VARIABLES)})
    with pytest.raises(StackRejected, match="sets 257 variables, at most 256"):
        check_variables({f"V{i}": "x" for i in range(MAX_VARIABLES + 1)})
    with pytest.raises(StackRejected) as refused:
        check_variables({"-" * 200_000: "x"})
    assert len(str(refused.value)) < 200
    said = notices_message([f"container_name of s{i} dropped" for i in range(2000)])
    assert said.startswith(CHANGES_PREFIX) and said.endswith("and 1980 more") and len(said) < 2000


def test_an_applied_stack_tells_the_sandboxs_changes_from_composes_warnings() -> None:
    """A stack whose variable was undefined said 'deployed with changes by the sandbox:
    Compose warns: ...' although the sandbox changed nothing."""
    from gpuhost_agent.core.sandbox.apply import CHANGES_PREFIX, WARNINGS_PREFIX, kept_notes, notices_message

    warned = notices_message(['Compose warns: The "TOKEN" variable is not set. Defaulting to a blank string.'])
    assert warned == WARNINGS_PREFIX + 'The "TOKEN" variable is not set. Defaulting to a blank string.'
    both = notices_message(["ipc host became private", "Compose warns: x is not set"])
    assert both == f"{CHANGES_PREFIX}ipc host became private; {WARNINGS_PREFIX}x is not set"
    assert kept_notes("1 container stopped; " + warned) == warned and notices_message([]) == ""
