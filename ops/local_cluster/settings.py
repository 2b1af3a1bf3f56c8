"""Config settings a local cluster gives every coordinator and tablet server (``cluster start --set KEY=VALUE``).

They are checked as a config file's are (:mod:`kvlease.common.config`): a key of the registry (an unknown
one is named, with the closest known key when one is close) and a value its parser takes (a bad one is
named with the parser's reason). The keys ``cluster start`` sets for each process itself (ids, addresses,
ports, data dirs, ZooKeeper, remote storage: ``--remote``) and the security keys (``--secure``) are
refused: a value given for them would be overwritten or would half-configure TLS.

A start records its settings in cluster.json (``settings``, the values as written), and a later start of
the same directory keeps them: what it gives replaces the recorded value of the same key
(:func:`merged`). ``cluster restart`` starts a process with its own config file, which holds them.
"""

from __future__ import annotations

from typing import Any, Mapping

from kvlease.common import config as cfg
from kvlease.common.errors import did_you_mean, show
from kvlease.ops.local_cluster.processes import ClusterError

#: cluster.json's key of the settings.
KEY = "settings"

#: The keys ``cluster start`` sets for each process; ``--set`` of one is refused (which option sets it instead).
OWN_KEYS = {
    **{key.name: "cluster start gives each server its own" for key in (
        cfg.COORDINATOR_HOST, cfg.COORDINATOR_PORT, cfg.COORDINATOR_ID, cfg.TABLET_ID, cfg.TABLET_HOST,
        cfg.TABLET_PORT, cfg.TABLET_DATA_DIR, cfg.METRICS_PORT, cfg.ZK_ADDRESS, cfg.ZK_ROOT)},
    cfg.REMOTE_DATA_DIR.name: "use --remote URI",
}


def parse_setting(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` -> ``(KEY, VALUE)``; ClusterError unless it has that shape."""
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise ClusterError(f"{show(text)} is not KEY=VALUE (e.g. auto-partition.check-interval=1s)")
    return key.strip(), value.strip()


def check_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (config key -> value as written) if every key may be set and every value parses; else
    ClusterError naming the first key that may not, or whose value is bad, and why."""
    for key in values:
        if key not in cfg.KEYS:
            hint = did_you_mean(key, cfg.KEYS)
            raise ClusterError(f"unknown config key {show(key)}" + (f": {hint}" if hint else ""))
        if key in OWN_KEYS:
            raise ClusterError(f"config key {show(key)} cannot be --set: {OWN_KEYS[key]}")
        if key.startswith("security."):
            raise ClusterError(f"config key {show(key)} cannot be --set: security is --secure's")
    try:
        cfg.Config(dict(values), env={})
    except cfg.ConfigError as exc:
        raise ClusterError(exc.message) from None
    return dict(values)


def merged(previous: Mapping[str, Any], given: Mapping[str, Any] | None) -> dict[str, Any]:
    """The settings of a start: those ``previous`` (a stopped cluster's cluster.json) records, each key ``given``
    replaced; checked (:func:`check_settings`)."""
    recorded = previous.get(KEY) or {}
    if not isinstance(recorded, Mapping):
        raise ClusterError(f"cluster.json's {KEY!r} is not an object")
    return check_settings({**recorded, **(given or {})})
