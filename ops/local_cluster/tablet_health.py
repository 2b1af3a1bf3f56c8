"""A tablet server's health, read from its Prometheus endpoint (the ``kvlease_tablet_*`` gauges).

The coordinator knows which buckets a server is *assigned*; only the server
knows which it *serves*. ``kvlease cluster status`` asks each running tablet
server of a local cluster (its ``metrics_address`` in cluster.json) with
:func:`read_health`.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from kvlease.common.errors import NetworkError

_GAUGES = {
    "buckets": "kvlease_tablet_buckets",
    "unserved": "kvlease_tablet_buckets_unserved",
    "capacity": "kvlease_tablet_buckets_max",
    "open_buckets": "kvlease_tablet_buckets_open",
    "max_open_buckets": "kvlease_tablet_buckets_open_max",
    "recovering": "kvlease_tablet_buckets_recovering",
    "open_fds": "kvlease_tablet_open_fds",
    "max_fds": "kvlease_tablet_max_fds",
    # replica rebuilds (tablet/replication/rebuild_progress.py)
    "rebuilding": "kvlease_tablet_rebuilds_in_progress",
    "rebuilt": "kvlease_tablet_rebuilds_total",
    "rebuild_bytes": "kvlease_tablet_rebuild_bytes_total",
    "offsets_behind": "kvlease_tablet_follower_offsets_behind",
    "offsets_behind_max": "kvlease_tablet_follower_offsets_behind_max",
    # leaderships given up because a bucket's local writes failed (tablet/replicas/step_down.py)
    "resignations": "kvlease_tablet_leader_resignations_total",
}
#: The rebuild fields ``kvlease cluster status`` shows (see :func:`status_fields`).
REBUILD_FIELDS = ("rebuilding", "rebuilt", "rebuild_bytes", "offsets_behind", "offsets_behind_max")


def read_health(metrics_address: str, timeout_s: float = 2.0) -> dict[str, Any]:
    """``{"healthy": bool, "problems": [str], "stepped_down": [{"table_id", "table", "bucket", "cause"}],
    "buckets", "unserved", "capacity", "open_buckets", "max_open_buckets", "recovering", "open_fds",
    "max_fds", "resignations", …}`` of the tablet server whose metrics endpoint is ``host:port``
    (``stepped_down``: the buckets that gave up their leadership because their local writes failed, not
    back in sync yet). Raises NetworkError if it does not answer or exports no health."""
    try:
        with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=timeout_s) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        raise NetworkError(f"no answer from the metrics endpoint {metrics_address}: "
                           f"{getattr(exc, 'reason', exc)}") from None
    values: dict[str, float] = {}
    problems: list[str] = []
    stepped_down: list[dict[str, Any]] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "kvlease_tablet_problem":
                problems.append(sample.labels.get("problem", ""))
            elif sample.name == "kvlease_tablet_bucket_stepped_down":
                labels = sample.labels
                stepped_down.append({"table_id": int(labels["table_id"]), "table": labels["table"],
                                     "bucket": int(labels["bucket"]), "cause": labels["cause"]})
            else:
                values[sample.name] = sample.value
    if "kvlease_tablet_healthy" not in values:
        raise NetworkError(f"the metrics endpoint {metrics_address} exports no tablet server health")
    health: dict[str, Any] = {"healthy": values["kvlease_tablet_healthy"] == 1, "problems": problems,
                              "stepped_down": stepped_down}
    health.update({key: int(values[name]) for key, name in _GAUGES.items() if name in values})
    return health


def status_fields(metrics_address: str | None, alive: bool, timeout_s: float = 2.0) -> dict[str, Any]:
    """A tablet server's health fields in ``kvlease cluster status``: ``healthy`` (None: not known:
    not running, no metrics endpoint, or no answer, then ``health_error`` says why), ``problems``,
    ``serving`` (buckets it leads and serves), ``stepped_down`` (buckets that gave up their leadership because
    their local writes failed: ``table_id``, ``table``, ``bucket``, ``cause``; only when there are some),
    ``capacity``, ``open_buckets``, ``open_fds``, ``max_fds``,
    and its replica rebuilds: ``rebuilding`` (buckets now), ``rebuilt``, ``rebuild_bytes`` (downloaded),
    ``offsets_behind`` (sum over the buckets it follows) and ``offsets_behind_max``."""
    if not alive or not metrics_address:
        return {"healthy": None}
    try:
        health = read_health(metrics_address, timeout_s)
    except NetworkError as exc:
        return {"healthy": None, "health_error": exc.message}
    fields = {"healthy": health["healthy"], "problems": health["problems"]}
    if health["stepped_down"]:
        fields["stepped_down"] = health["stepped_down"]
    if "buckets" in health and "unserved" in health:
        fields["serving"] = health["buckets"] - health["unserved"]
    fields.update({key: health[key] for key in ("capacity", "open_buckets", "open_fds", "max_fds", *REBUILD_FIELDS)
                   if key in health})
    return fields
