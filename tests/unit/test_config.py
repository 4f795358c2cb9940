"""Configuration loading: the sources' precedence, the defaults, the
messages that say what to fix, and the settings' one declaration
(service/settings_table.py) that the reader, the typed mode and doctor's view
are made from. (--help: tests/unit/test_cli_settings.py; the doc's table:
tests/unit/test_settings_doc.py.)"""

from __future__ import annotations

import dataclasses
import io
import json
from contextlib import redirect_stdout

import pytest

from gpuhost_agent.service import cli, config, daemon, host_check, settings_view, swarm_tls
from gpuhost_agent.service.settings import SwarmRole
from gpuhost_agent.service.settings_table import BY_FIELD, SETTINGS


def test_config_priority_flags_over_env_over_file(tmp_path):
    conf = tmp_path / "agent.conf"
    key_file = tmp_path / "key"
    key_file.write_text("from-file-key\n")
    conf.write_text(
        "# comment\nGPUHOST_MARKETPLACE_URL=https://m.example/v1\nGPUHOST_ENV_ID=file-env\n"
        f"GPUHOST_API_KEY_FILE={key_file}\nGPUHOST_LOG_LEVEL=debug\n"
    )
    loaded = config.load({"config": str(conf), "env_id": "flag-env"}, environ={"GPUHOST_LOG_LEVEL": "warning"})
    assert loaded.marketplace_url == "https://m.example/v1" and not loaded.uses_local_marketplace
    assert loaded.env_id == "flag-env" and loaded.api_key == "from-file-key" and loaded.log_level == "warning"


def test_config_defaults_to_local_marketplace(tmp_path):
    loaded = config.load({"config": None, "state_dir": str(tmp_path)}, environ={"GPUHOST_CONFIG": ""})
    assert loaded.uses_local_marketplace and loaded.local_listen == ("127.0.0.1", 8787)
    assert (loaded.log_max_size, loaded.log_max_files) == ("50m", 3)
    assert loaded.disk_floor_bytes == 20 * 1024**3
    assert config.load({"disk_floor": "0"}, environ={}).disk_floor_bytes == 0
    assert config.load({"disk_floor": "512m"}, environ={}).disk_floor_bytes == 512 * 1024**2
    assert loaded.deploy_concurrency == 8
    assert config.load({}, environ={"GPUHOST_DEPLOY_CONCURRENCY": "12"}).deploy_concurrency == 12
    assert loaded.swarm == "" and config.load({}, environ={"GPUHOST_SWARM": "off"}).swarm == ""
    assert config.load({}, environ={"GPUHOST_SWARM": "Leader"}).swarm == "leader"


def test_the_environments_key_is_read_from_its_file(tmp_path):
    """install.sh --swarm-key-file keeps the key in a root-only file, not in agent.conf."""
    key_file = tmp_path / "swarm-key"
    key_file.write_text("0123456789abcdef0123\n")
    worker = config.load({}, environ={"GPUHOST_SWARM": "worker", "GPUHOST_SWARM_KEY_FILE": str(key_file)})
    assert worker.swarm == "worker" and worker.swarm_key == "0123456789abcdef0123"
    with pytest.raises(config.ConfigError, match="cannot read the environment's key file"):
        config.load({}, environ={"GPUHOST_SWARM": "worker", "GPUHOST_SWARM_KEY_FILE": str(tmp_path / "none")})


@pytest.mark.parametrize(
    "flags, fragment",
    [
        ({"marketplace_url": "https://m.example/v1"}, "GPUHOST_ENV_ID"),
        ({"marketplace_url": "ftp://m.example/v1", "env_id": "e", "api_key": "k"}, "must be http"),
        ({"local_listen": "8787"}, "HOST:PORT"),
        ({"config": "/no/such/file"}, "does not exist"),
        ({"api_key_file": "/no/such/key", "marketplace_url": "https://m/v1", "env_id": "e"}, "cannot read"),
        ({"log_max_size": "50 MB"}, "GPUHOST_LOG_MAX_SIZE '50 MB' must be a size such as 50m"),
        ({"log_max_files": "0"}, "GPUHOST_LOG_MAX_FILES must be at least 1"),
        ({"deploy_concurrency": "0"}, "GPUHOST_DEPLOY_CONCURRENCY must be at least 1"),
        ({"disk_floor": "20 GB"}, "GPUHOST_DISK_FLOOR '20 GB' must be a size such as 20g"),
        ({"swarm": "follower"}, "GPUHOST_SWARM must be leader or worker \\(or off, for one machine\\), not 'follower'"),
        ({"swarm": "worker"}, "GPUHOST_SWARM=worker needs GPUHOST_SWARM_KEY"),
        ({"swarm": "worker", "swarm_key": "short"}, "GPUHOST_SWARM_KEY must have at least 16 characters"),
        ({"swarm_workers": "n1"}, "GPUHOST_SWARM_WORKERS entry 'n1' must be <node id>=<host>:<port>"),
        ({"egress_allow": "10.0.0.5, proxy.lan"}, "GPUHOST_EGRESS_ALLOW: 'proxy.lan' is not an IPv4 address"),
        ({"egress_allow": "fd00::/8"}, "GPUHOST_EGRESS_ALLOW: 'fd00::/8' is IPv6"),
        (  # the key in clear on the network
            {"marketplace_url": "http://market.example/v1", "env_id": "e", "api_key": "k"},
            "GPUHOST_MARKETPLACE_URL 'http://market.example/v1' must be https://",
        ),
        ({"marketplace_url": "http://10.0.0.5:8787/v1", "env_id": "e", "api_key": "k"}, "must be https://"),
    ],
)
def test_config_errors_say_what_to_fix(flags, fragment):
    with pytest.raises(config.ConfigError, match=fragment):
        config.load(flags, environ={})


@pytest.fixture
def empty_conf(tmp_path):
    conf = tmp_path / "empty.conf"
    conf.write_text("")
    return conf


def test_every_agentconfig_field_has_exactly_one_declaration():
    fields = [field.name for field in dataclasses.fields(config.AgentConfig)]
    declared = [setting.field for setting in SETTINGS if setting.field]
    assert sorted(declared) == sorted(fields), "a field without a declaration, or one declared twice"
    for what in ("name", "env", "option"):
        values = [getattr(setting, what) for setting in SETTINGS]
        assert len(values) == len(set(values)), f"two settings share a {what}"
    sources = {setting.name for setting in SETTINGS if not setting.field}  # the file and key files: sources only
    assert sources == {"config", "api_key_file", "swarm_key_file"}


def test_agentconfigs_defaults_are_the_declared_ones(tmp_path, empty_conf):
    """AgentConfig holds no default of its own: each is its setting's, parsed as
    a host's text would be, and load() with nothing set gives the same."""
    loaded = config.load({"config": str(empty_conf), "state_dir": str(tmp_path)}, environ={})
    for field in dataclasses.fields(config.AgentConfig):
        setting = BY_FIELD[field.name]
        if field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING:
            default = field.default_factory() if field.default is dataclasses.MISSING else field.default
            assert default == setting.value_of(setting.default), field.name
        if setting.default is not None and field.name != "swarm_key":
            assert getattr(loaded, field.name) == setting.value_of(setting.default), field.name


def test_each_value_says_where_it_came_from(tmp_path, empty_conf):
    empty_conf.write_text("GPUHOST_PIDS_LIMIT=100\nGPUHOST_STOP_TIMEOUT=7\nGPUHOST_SETTLE_SECONDS=2\n")
    chosen = config.choose(
        {"config": str(empty_conf), "settle_seconds": "5", "log_level": ""},  # an empty flag counts as none
        environ={"GPUHOST_STOP_TIMEOUT": "9", "GPUHOST_SETTLE_SECONDS": "4", "GPUHOST_LOG_LEVEL": "debug"},
    )
    assert chosen["settle_seconds"] == config.Chosen("5", "flag")
    assert chosen["stop_timeout"] == config.Chosen("9", "environment")
    assert chosen["log_level"] == config.Chosen("debug", "environment")
    assert chosen["pids_limit"] == config.Chosen("100", "file")
    assert chosen["log_max_size"] == config.Chosen("50m", "default")
    assert chosen["location"] == config.Chosen(None, "unset")
    assert chosen["config"] == config.Chosen(str(empty_conf), "flag")
    built = config.build(chosen)
    assert (built.settle_seconds, built.stop_timeout, built.pids_limit) == (5.0, 9, 100)


def test_the_swarm_mode_is_typed_once_and_still_reads_as_its_text():
    leader = config.load({"swarm": "Leader"}, environ={})
    assert leader.swarm is SwarmRole.LEADER and leader.swarm == "leader"
    one = config.load({}, environ={"GPUHOST_SWARM": "off"})
    assert one.swarm is SwarmRole.ONE_MACHINE and one.swarm == "" and not one.swarm
    made = dataclasses.replace(leader, swarm="worker")  # a config made by hand is typed all the same
    assert made.swarm is SwarmRole.WORKER and str(made.swarm) == "worker"


SWARM_KEY = "swarm-key-0123456789-secret"
API_KEY = "api-key-very-secret"


def _doctor(monkeypatch, argv: list[str]) -> str:
    async def no_probe(_config):
        return {"compliance": {"isCompliant": True, "checks": []}}

    monkeypatch.setattr(host_check, "machine_report", no_probe)
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(argv) == 0
    return out.getvalue()


def test_doctor_shows_each_settings_value_and_source_and_never_a_key(tmp_path, monkeypatch, empty_conf):
    key_file = tmp_path / "swarm-key"
    key_file.write_text(SWARM_KEY + "\n")
    empty_conf.write_text(f"GPUHOST_SWARM_KEY_FILE={key_file}\nGPUHOST_DISK_FLOOR=5g\n")
    monkeypatch.setenv("GPUHOST_API_KEY", API_KEY)
    monkeypatch.setenv("GPUHOST_SWARM", "leader")
    swarm_tls.install_leader(tmp_path / "tls")  # doctor watches the leader's certificate too
    monkeypatch.setenv("GPUHOST_SWARM_TLS_DIR", str(tmp_path / "tls"))
    argv = ["doctor", "--config", str(empty_conf), "--state-dir", str(tmp_path), "--marketplace-url", "https://m/v1"]
    text = _doctor(monkeypatch, [*argv, "--env-id", "e1", "--pids-limit", "99"])
    assert API_KEY not in text and SWARM_KEY not in text
    rows = {line.split()[0]: line.split(None, 1)[1] for line in text.splitlines() if line.startswith("  GPUHOST_")}
    assert set(rows) == {setting.env for setting in SETTINGS}
    assert rows["GPUHOST_API_KEY"] == "***  (environment)"
    assert rows["GPUHOST_SWARM_KEY"] == "***  (key file)"
    assert rows["GPUHOST_SWARM_KEY_FILE"] == f"{key_file}  (file)"
    assert rows["GPUHOST_PIDS_LIMIT"] == "99  (flag)" and rows["GPUHOST_DISK_FLOOR"] == "5g  (file)"
    assert rows["GPUHOST_SWARM"] == "leader  (environment)" and rows["GPUHOST_LOG_MAX_SIZE"] == "50m  (default)"
    assert rows["GPUHOST_STATUS_SOCKET"] == f"{tmp_path / 'agent.sock'}  (default)"
    assert rows["GPUHOST_LOCAL_API_KEY"] == "unset"
    printed = _doctor(monkeypatch, [*argv, "--env-id", "e1", "--json", "--swarm-key", SWARM_KEY])
    assert API_KEY not in printed and SWARM_KEY not in printed
    settings = {row["setting"]: row for row in json.loads(printed)["settings"]}
    assert settings["GPUHOST_SWARM_KEY"] == {"setting": "GPUHOST_SWARM_KEY", "value": "***", "source": "flag"}
    assert json.loads(printed)["isCompliant"] is True  # the compliance's keys as before
    (watched,) = [check for check in json.loads(printed)["checks"] if check["id"] == "swarm-certificate"]
    assert watched["ok"] and "valid until" in watched["summary"]


def test_no_key_is_logged_or_shown_by_any_view():
    secret = {setting.field for setting in SETTINGS if setting.secret}
    assert secret == {"api_key", "local_api_key", "swarm_key"} == daemon.SECRET_FIELDS
    loaded = config.load({"swarm": "worker", "swarm_key": SWARM_KEY, "local_api_key": API_KEY}, environ={})
    shown = json.dumps(settings_view.effective(config.choose({"swarm_key": SWARM_KEY}, environ={}), loaded))
    assert SWARM_KEY not in shown and API_KEY not in shown


def test_plain_http_is_for_a_marketplace_on_this_machine_alone():
    for url in ("http://127.0.0.1:8787/v1", "http://[::1]:8787/v1", "http://localhost/v1", "https://m.example/v1"):
        assert config.load({"marketplace_url": url, "env_id": "e", "api_key": "k"}, environ={}).marketplace_url == url
