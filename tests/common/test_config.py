"""Typed configuration: defaults, TOML files, environment overrides, parsing errors."""

from __future__ import annotations

import pytest

from kvlease.common import config as cfg
from kvlease.common.config import Config, ConfigError, parse_duration_ms, parse_size, to_toml

pytestmark = pytest.mark.unit


def test_defaults():
    config = Config(env={})
    assert config[cfg.ZK_ADDRESS] == "127.0.0.1:2181"
    assert config[cfg.ZK_ROOT] == "/kvlease"
    assert config[cfg.ZK_SESSION_TIMEOUT] == 6_000
    assert config[cfg.REMOTE_FSYNC] is True
    assert config[cfg.COORDINATOR_PORT] == 9123
    assert config[cfg.SCANNER_TTL] == 600_000
    assert config[cfg.SCANNER_MAX_BATCH_SIZE] == 10 * 1024**2
    assert config[cfg.LEASE_CHECK_INTERVAL] == 1_000
    assert config[cfg.LEASE_MAX_DURATION] == 7 * 86_400_000
    # every key parses its own default, and lookups work by Key or by name
    for key in cfg.KEYS.values():
        assert config[key] == key.parse(key.default) == config.get(key.name)


def test_env_var_names():
    assert cfg.LEASE_FAILOVER_GRACE.env_var == "KVLEASE_KV_SNAPSHOT_LEASE_FAILOVER_GRACE"
    assert cfg.ZK_ROOT.env_var == "KVLEASE_ZOOKEEPER_PATH_ROOT"
    assert cfg.S3_ACCESS_KEY.env_var == "KVLEASE_REMOTE_S3_ACCESS_KEY"


TOML = """
"kv.scanner.ttl" = "1m"
"remote.file.fsync" = false

[zookeeper]
address = "zk1:2181,zk2:2181"
"session-timeout" = "10s"
path.root = "/prod"

[kv.snapshot.lease]
"expiration-check-interval" = "250ms"

[kv.scanner]
"max-batch-size" = "4mb"
"max-per-bucket" = 3
"""


def test_toml_file_with_nested_tables_and_quoted_dotted_keys(tmp_path):
    path = tmp_path / "kvlease.toml"
    path.write_text(TOML)
    config = Config.load(path, env={})
    assert config[cfg.SCANNER_TTL] == 60_000
    assert config[cfg.REMOTE_FSYNC] is False
    assert config[cfg.ZK_ADDRESS] == "zk1:2181,zk2:2181"
    assert config[cfg.ZK_SESSION_TIMEOUT] == 10_000
    assert config[cfg.ZK_ROOT] == "/prod"
    assert config[cfg.LEASE_CHECK_INTERVAL] == 250
    assert config[cfg.SCANNER_MAX_BATCH_SIZE] == 4 * 1024**2
    assert config[cfg.SCANNER_MAX_PER_BUCKET] == 3
    assert config[cfg.SCANNER_MAX_PER_SERVER] == 200  # untouched keys keep their defaults


def test_precedence_is_file_then_overrides_then_env(tmp_path):
    path = tmp_path / "kvlease.toml"
    path.write_text('"kv.scanner.ttl" = "1m"\n"kv.scanner.max-per-bucket" = 3\n"coordinator.port" = 1\n')
    env = {"KVLEASE_KV_SCANNER_TTL": "5s"}
    config = Config.load(path, {"kv.scanner.ttl": "2m", "kv.scanner.max-per-bucket": 4}, env=env)
    assert config[cfg.SCANNER_TTL] == 5_000  # env beats the override and the file
    assert config[cfg.SCANNER_MAX_PER_BUCKET] == 4  # the override beats the file
    assert config[cfg.COORDINATOR_PORT] == 1  # the file beats the default


def test_env_override_from_the_process_environment(monkeypatch):
    monkeypatch.setenv("KVLEASE_KV_SNAPSHOT_LEASE_FAILOVER_GRACE", "45s")
    monkeypatch.setenv("KVLEASE_REMOTE_FILE_FSYNC", "off")
    config = Config()
    assert config[cfg.LEASE_FAILOVER_GRACE] == 45_000
    assert config[cfg.REMOTE_FSYNC] is False
    assert Config(env={})[cfg.LEASE_FAILOVER_GRACE] == 30_000  # an explicit env ignores the process's


@pytest.mark.parametrize("name, value", [
    ("kv.scanner.ttl", "soon"),
    ("kv.scanner.ttl", "1.5s"),
    ("kv.scanner.ttl", True),
    ("kv.scanner.max-batch-size", "1tb"),
    ("coordinator.port", "http"),
    ("remote.file.fsync", "maybe"),
    ("kv.snapshot.num-retained", False),
    ("leader.imbalance.per-server.percentage", 101),
    ("leader.imbalance.per-server.percentage", -1),
    ("auto.leader-rebalance.enabled", "sometimes"),
])
def test_a_bad_value_names_the_key(name, value):
    with pytest.raises(ConfigError, match=repr(name)) as info:
        Config({name: value}, env={})
    assert info.value.details["key"] == name


def test_a_bad_env_value_names_the_key():
    with pytest.raises(ConfigError, match="'kv.scanner.ttl'"):
        Config(env={"KVLEASE_KV_SCANNER_TTL": "forever"})


def test_a_bad_value_in_a_file_names_the_key(tmp_path):
    path = tmp_path / "kvlease.toml"
    path.write_text('[kv.scanner]\n"max-per-bucket" = "many"\n')
    with pytest.raises(ConfigError, match="'kv.scanner.max-per-bucket'"):
        Config.load(path, env={})


def test_unknown_keys_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown config key 'kv.scanner.tll'") as info:
        Config({"kv.scanner.tll": "1s"}, env={})
    assert info.value.details["key"] == "kv.scanner.tll"
    path = tmp_path / "kvlease.toml"
    path.write_text('[zookeeper]\nadress = "x:1"\n')
    with pytest.raises(ConfigError, match="zookeeper.adress"):
        Config.load(path, env={})


def test_unreadable_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        Config.load(tmp_path / "missing.toml", env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("this is = = not toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Config.load(bad, env={})


@pytest.mark.parametrize("text, ms", [
    ("500ms", 500), ("1s", 1_000), ("10m", 600_000), ("3min", 180_000), ("2h", 7_200_000),
    ("1d", 86_400_000), ("250ms", 250), (" 5 s ", 5_000), ("1S", 1_000), ("0s", 0),
])
def test_durations(text, ms):
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "1.5s", "-1s", "1w", "s", "1 s s", True, None, "1s\nx"])
def test_bad_durations(text):
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration_ms(text)


@pytest.mark.parametrize("value", ["5", " 5 ", 5, "0"])
def test_a_duration_without_a_unit_is_an_error_not_milliseconds(value):
    n = str(value).strip()
    with pytest.raises(ValueError, match=f"'{n}' has no unit: write {n}ms, {n}s, {n}m, {n}h or {n}d"):
        parse_duration_ms(value)


def test_a_duration_beyond_int64_milliseconds_is_an_error():
    assert parse_duration_ms(f"{(1 << 63) - 1}ms") == (1 << 63) - 1
    with pytest.raises(ValueError, match="'99999999999999999999d' is out of range: a duration is at most 106751991167d"
                       ):
        parse_duration_ms("99999999999999999999d")


def test_a_config_file_or_env_duration_without_a_unit_names_the_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('"kv.snapshot.interval" = 100\n')
    with pytest.raises(ConfigError, match="'kv.snapshot.interval'.*'100' has no unit"):
        Config.load(path, env={})
    with pytest.raises(ConfigError, match="'kv.scanner.ttl'.*'5' has no unit"):
        Config(env={"KVLEASE_KV_SCANNER_TTL": "5"})


def test_to_toml_writes_parsed_durations_with_their_unit(tmp_path):
    config = Config({"kv.snapshot.interval": "2s", "log.retention": "1d"}, env={})
    text = to_toml({"kv.snapshot.interval": config[cfg.SNAPSHOT_INTERVAL], "log.segment.bytes": 1024})
    assert '"kv.snapshot.interval" = "2000ms"' in text and '"log.segment.bytes" = 1024' in text
    path = tmp_path / "c.toml"
    path.write_text(text)
    assert Config.load(path, env={})[cfg.SNAPSHOT_INTERVAL] == 2_000


@pytest.mark.parametrize("text, size", [
    ("512", 512), (512, 512), ("10b", 10), ("64kb", 64 * 1024), ("4mb", 4 * 1024**2),
    ("1gb", 1024**3), ("1KB", 1024), (" 2 mb ", 2 * 1024**2),
])
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "1tb", "1.5mb", "-1kb", "mb", False])
def test_bad_sizes(text):
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_with_overrides_keeps_the_rest_and_validates():
    base = Config({"kv.scanner.ttl": "1m"}, env={})
    changed = base.with_overrides({"kv.scanner.max-per-bucket": 2})
    assert changed[cfg.SCANNER_TTL] == 60_000 and changed[cfg.SCANNER_MAX_PER_BUCKET] == 2
    assert base[cfg.SCANNER_MAX_PER_BUCKET] == 8  # the original is unchanged
    with pytest.raises(ConfigError, match="'kv.scanner.ttl'"):
        base.with_overrides({"kv.scanner.ttl": "never"})
    assert base.with_overrides({})[cfg.SCANNER_TTL] == 60_000  # parsed ms are not re-read as unitless


def test_to_toml_round_trips(tmp_path):
    config = Config({"zookeeper.address": 'a"b\\c', "remote.file.fsync": False, "kv.scanner.ttl": "1s"}, env={})
    path = tmp_path / "generated.toml"
    path.write_text(to_toml(config.as_dict()))
    assert Config.load(path, env={}).as_dict() == config.as_dict()
