"""The deployment examples in deploy/ (docs/operations.md) stay valid: every config file loads with kvlease's
own parser (no unknown key, no bad value), each systemd unit starts a real entry point with a config file
that exists, and the metrics ports the configs give are the ones Prometheus scrapes."""

from __future__ import annotations

import configparser
import importlib
import re
import shlex
from pathlib import Path

import pytest
import yaml

from kvlease.common import config as cfg
from kvlease.common.config import Config
from tests.support.paths import REPO

pytestmark = pytest.mark.unit

DEPLOY = REPO / "deploy"
CONFIGS = sorted((DEPLOY / "config").glob("*.toml"))
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
GUIDE = REPO / "docs" / "operations.md"


def load(*names: str) -> Config:
    values: dict = {}
    for name in names:
        values.update(cfg.read_file(DEPLOY / "config" / name))
    return Config(values, env={})


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_example_config_loads(path: Path):
    Config.load(path, env={})


def test_the_process_configs_are_for_several_machines():
    for name, host_key, port_key in (("coordinator.toml", cfg.COORDINATOR_HOST, cfg.COORDINATOR_PORT),
                                     ("tablet.toml", cfg.TABLET_HOST, cfg.TABLET_PORT)):
        config = load(name)
        assert config[host_key] not in ("127.0.0.1", "localhost", "0.0.0.0"), name
        assert config[port_key] > 0 and config[cfg.METRICS_PORT] > 0, f"{name}: fixed ports"
        assert len(config[cfg.ZK_ADDRESS].split(",")) == 3, f"{name}: a ZooKeeper ensemble"
        assert config[cfg.REMOTE_DATA_DIR].startswith("s3://"), name
    shared = (cfg.ZK_ADDRESS, cfg.ZK_ROOT, cfg.REMOTE_DATA_DIR, cfg.S3_REGION, cfg.S3_ENDPOINT)
    assert [load("coordinator.toml")[k] for k in shared] == [load("tablet.toml")[k] for k in shared]
    secure = load("tablet.toml", "secure.toml")
    assert secure[cfg.SECURITY_ENABLED] and not secure[cfg.INTERNAL_PASSWORD], "passwords go in secrets.env"


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_every_unit_runs_a_server_module_with_an_example_config(path: Path):
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read_string(path.read_text())
    argv = shlex.split(unit["Service"]["ExecStart"])
    assert argv[1:3] == ["-m", argv[2]] and argv[3] == "--config", argv
    module = importlib.import_module(f"{argv[2]}.__main__")
    assert callable(module.main)
    with pytest.raises(SystemExit) as exit_info:  # the entry point takes --config
        module.main(["--help"])
    assert exit_info.value.code == 0
    assert (DEPLOY / "config" / Path(argv[4]).name).exists(), f"no deploy/config/{Path(argv[4]).name}"
    assert unit["Service"]["User"] != "root" and int(unit["Service"]["LimitNOFILE"]) >= 65536
    assert unit["Service"]["RestartPreventExitStatus"] == "2", "a bad config (exit 2) is not restarted"


def test_prometheus_scrapes_the_metrics_ports_the_configs_give():
    scrape = yaml.safe_load((DEPLOY / "monitoring" / "prometheus-scrape.yml").read_text())
    ports = {job["job_name"]: {t.rsplit(":", 1)[1] for c in job["static_configs"] for t in c["targets"]}
             for job in scrape["scrape_configs"]}
    assert ports == {"kvlease-coordinator": {str(load("coordinator.toml")[cfg.METRICS_PORT])},
                     "kvlease-tablet": {str(load("tablet.toml")[cfg.METRICS_PORT])}}


def test_the_guide_names_every_deploy_file():
    guide = GUIDE.read_text()
    files = [p.relative_to(DEPLOY.parent) for p in DEPLOY.rglob("*") if p.is_file()]
    missing = [str(f) for f in files if f"`{f}`" not in guide]
    assert not missing, f"docs/operations.md does not mention {missing}"
    for key in re.findall(r'^"([a-z0-9.\-]+)" =', guide, re.M):  # the keys its TOML snippets show are real
        assert key in cfg.KEYS, key
