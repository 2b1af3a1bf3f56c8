"""The Grafana dashboard and Prometheus alert rules in deploy/monitoring/ name only metrics a running
coordinator and tablet server export, and the dashboard's legends only labels those metrics carry: a real
coordinator and tablet server (real ZooKeeper, gRPC and RocksDB) are started, given some traffic (a lease
of a table and of a partition, a scan), and their /metrics endpoints scraped."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kvlease.client.table import TableClient
from kvlease.common.model import TableBucket
from kvlease.common.tables import Column
from kvlease.ops.wait import wait_until
from tests.support.local_cluster import LocalCluster
from tests.support.paths import REPO

MONITORING = REPO / "deploy" / "monitoring"
DASHBOARD = MONITORING / "grafana-dashboard.json"
RULES = MONITORING / "kvlease-alerts.yml"
SCRAPE = MONITORING / "prometheus-scrape.yml"

#: Series Prometheus makes itself for every target (not exported by a server).
PROMETHEUS_SERIES = frozenset({"up"})
#: Words of PromQL that look like a metric name but are not one.
KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and",
                      "or", "unless", "atan2", "inf", "nan"})
#: The sample names a metric family of each type exports.
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("", "_sum", "_count", "_created"), "info": ("_info",), "stateset": ("",),
            "gaugehistogram": ("_bucket", "_gsum", "_gcount"), "unknown": ("",)}


# -- what the files reference ------------------------------------------------------------------------


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, labels, strings and Grafana
    variables left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # string literals
    text = re.sub(r"\$\{?\w+\}?", " ", text)  # Grafana variables: $__range, ${datasource}
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges, subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)  # label lists
    names = set()
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        name, call = m.group(1), m.group(2)
        if not call and name.lower() not in KEYWORDS:
            names.add(name)
    return names


def dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in doc["annotations"]["list"] if "expr" in a]
    for var in doc["templating"]["list"]:
        if var["type"] == "query":  # label_values(METRIC{…}, label): the metric is the first argument
            m = re.fullmatch(r"label_values\((.+),\s*\w+\)", var["query"])
            assert m, f"dashboard variable {var['name']}: not label_values(metric, label): {var['query']}"
            exprs.append(m.group(1))
    return exprs


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def referenced() -> dict[str, set[str]]:
    """Every metric name the files use -> where: in expressions, and any ``kvlease_*`` word in their text
    (descriptions that tell an operator which metric to look at)."""
    where: dict[str, set[str]] = {}
    for source, exprs in (("dashboard", dashboard_exprs()), ("rules", [r["expr"] for r in rules()])):
        for expr in exprs:
            for name in metric_names(expr):
                where.setdefault(name, set()).add(source)
    for path in (DASHBOARD, RULES):
        for name in re.findall(r"\bkvlease_[a-z0-9_]+", path.read_text()):
            where.setdefault(name, set()).add(path.name)
    return where


# -- what the servers export --------------------------------------------------------------------------


def scrape(metrics_port: int) -> list:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        return list(text_string_to_metric_families(response.read().decode()))


def exported(metrics_port: int) -> set[str]:
    """The sample names one server's /metrics exports: every sample, and for every declared family the
    names its type makes (a labelled family with no series yet is declared, with no samples)."""
    names = set()
    for family in scrape(metrics_port):
        names |= {sample.name for sample in family.samples}
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
    return names


def labels_of(metrics_port: int) -> dict[str, set[str]]:
    """Sample name -> the labels its series carry (only names with a series)."""
    labels: dict[str, set[str]] = {}
    for family in scrape(metrics_port):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    return labels


def unknown_legend_labels(labels: dict[str, set[str]]) -> dict[str, set[str]]:
    """Dashboard legends naming a label that none of their expression's metrics carries: legend -> labels.
    Only expressions whose metrics all have a series in ``labels`` are checked; ``instance`` and ``job`` are
    Prometheus's own, and ``label_replace`` may make one."""
    doc = json.loads(DASHBOARD.read_text())
    unknown = {}
    for target in (t for p in doc["panels"] for t in p.get("targets", []) if t.get("legendFormat")):
        names = metric_names(target["expr"])
        if not names or not names <= labels.keys():
            continue
        known = {"instance", "job"} | set().union(*(labels[n] for n in names))
        known |= set(re.findall(r'label_replace\(.*?,\s*"(\w+)"', target["expr"]))
        named = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target["legendFormat"]))
        if named - known:
            unknown[target["legendFormat"]] = named - known
    return unknown


@pytest.fixture
def cluster(make_config, tmp_path):
    def with_metrics(overrides=None, /, **more):
        # snapshots only when a test triggers one: the snapshot lag it reads does not move under it
        return make_config({"metrics.port": 0, "kv.snapshot.interval": "1h", **(overrides or {})}, **more)

    c = LocalCluster(with_metrics, tmp_path, 1)
    yield c
    c.close()


def lease_a_partition(cluster) -> None:
    """A partitioned table's partition written, snapshotted and leased: its per-partition series."""
    info = cluster.admin.create_table("db.p", [Column("day", "STRING"), Column("id", "BIGINT")], ["day", "id"], 1,
                                      partition_key=["day"])
    with TableClient(cluster.admin, "db.p", retry_total_s=10) as table:
        table.upsert([{"day": "20261129", "id": i} for i in range(10)])
    with TableClient(cluster.admin, "db.p", partition="20261129", retry_total_s=10) as partition:
        partition.trigger_snapshot(wait=True)
        latest = cluster.admin.get_latest_kv_snapshots(info.table_id, partition.table.partition_id)
    cluster.admin.acquire_lease("monitoring-partition", {tb: s.snapshot_id for tb, s in latest.items()}, 60_000)


def test_every_metric_the_dashboard_and_rules_name_is_exported_by_a_running_server(cluster):
    info = cluster.create_table("db.t", [Column("id", "BIGINT"), Column("v", "STRING")], ["id"], 2)
    with TableClient(cluster.admin, "db.t", retry_total_s=10) as table:
        table.upsert([{"id": i, "v": str(i)} for i in range(100)])
        table.trigger_snapshot(wait=True)
        latest = cluster.admin.get_latest_kv_snapshots(info.table_id)
        cluster.admin.acquire_lease("monitoring", {tb: s.snapshot_id for tb, s in latest.items()}, 60_000)
        assert len(table.scan().rows) == 100
    lease_a_partition(cluster)
    port = cluster.coordinator.metrics_port
    labels = wait_until(lambda: "kvlease_partition_leases" in (found := labels_of(port)) and found, 10,
                        "the per-partition lease gauges refreshed")  # on the coordinator's expiry tick
    assert labels["kvlease_partition_leases"] == {"table_id", "partition_id", "partition"}
    coordinator = exported(port)
    tablet = exported(cluster.tablets[1].metrics_port)
    assert {"kvlease_leases", "kvlease_table_leases"} <= coordinator  # the traffic made its series
    assert {"kvlease_tablet_healthy", "kvlease_scanners_opened_total"} <= tablet
    assert TableBucket(info.table_id, 0) in latest

    where = referenced()
    unknown = {name: sorted(sources) for name, sources in where.items()
               if name not in coordinator | tablet | PROMETHEUS_SERIES}
    assert not unknown, f"named in deploy/monitoring/ but exported by no server: {unknown}"
    # the files cover what operators asked for: leases, failovers, tablet health, scanner sessions, replication
    for name in ("kvlease_leases", "kvlease_leases_expired_total", "kvlease_coordinator_failovers_total",
                 "kvlease_tablet_healthy", "kvlease_scanners_open", "kvlease_tablet_snapshot_lag_records",
                 "kvlease_coordinator_offline_buckets", "kvlease_coordinator_under_replicated_buckets",
                 "kvlease_coordinator_unclean_elections_total", "kvlease_coordinator_data_losses_total",
                 "kvlease_tablet_follower_offsets_behind_max", "kvlease_tablet_rebuilds_in_progress",
                 "kvlease_partition_leases", "kvlease_partition_leased_snapshots",
                 "kvlease_tablet_bucket_stepped_down", "kvlease_coordinator_table_offline_buckets",
                 "kvlease_coordinator_table_under_replicated_buckets"):
        assert name in where, f"{name} is in neither the dashboard nor the rules"
    unknown = unknown_legend_labels({**labels, **labels_of(cluster.tablets[1].metrics_port)})
    assert not unknown, f"dashboard legends naming labels their metrics do not carry: {unknown}"


def gauge(metrics_port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def test_the_snapshot_lag_counts_the_records_of_a_bucket_not_yet_in_a_snapshot(cluster):
    cluster.create_table("db.lag", [Column("id", "BIGINT")], ["id"], 2)
    port = cluster.tablets[1].metrics_port
    with TableClient(cluster.admin, "db.lag", retry_total_s=10) as table:
        table.upsert([{"id": i} for i in range(40)])
        table.trigger_snapshot(wait=True)
        assert gauge(port, "kvlease_tablet_snapshot_lag_records") == 0
        table.upsert([{"id": i} for i in range(30)])  # one changelog record per row, spread over 2 buckets
        ends = table.list_offsets()
        snapshotted = {tb.bucket: s.log_offset for tb, s in
                       cluster.admin.get_latest_kv_snapshots(table.table.table_id).items()}
        assert gauge(port, "kvlease_tablet_snapshot_lag_records") == max(
            end - snapshotted[b] for b, (_start, end) in ends.items())
        table.trigger_snapshot(wait=True)
        assert gauge(port, "kvlease_tablet_snapshot_lag_records") == 0


# -- the files' own shape (no servers) ----------------------------------------------------------------


@pytest.mark.unit
def test_metric_names_are_found_in_promql_and_nothing_else_is():
    expr = ('sum by (instance) (rate(kvlease_a_total{job="x", code=~"TOO_.*"}[5m])) / on(instance) group_left() '
            "kvlease_b > 0.9 and max(kvlease_c * on(instance) (up == 1)) or absent(kvlease_d) or vector(0) "
            "unless increase(kvlease_e[$__range]) offset 1h")
    assert metric_names(expr) == {"kvlease_a_total", "kvlease_b", "kvlease_c", "up", "kvlease_d", "kvlease_e"}
    assert metric_names('topk(10, kvlease_bucket_scanners_open{job=~"$tablet_job"})') == {
        "kvlease_bucket_scanners_open"}


@pytest.mark.unit
def test_every_alert_rule_is_complete():
    names = [rule["alert"] for rule in rules()]
    assert len(names) == len(set(names)), "alert names repeat"
    for rule in rules():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        assert metric_names(rule["expr"]), f"{rule['alert']}: its expression names no metric"
        if "for" in rule:
            assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]


@pytest.mark.unit
def test_the_dashboard_is_well_formed_and_its_jobs_are_the_scrape_configs():
    doc = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in doc["panels"]:
        if panel["type"] != "row":
            assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
    jobs = {job["job_name"] for job in yaml.safe_load(SCRAPE.read_text())["scrape_configs"]}
    assert jobs == {"kvlease-coordinator", "kvlease-tablet"}
    for rule in rules():  # the rules select the scrape config's jobs
        selected = set(re.findall(r'job=~?"([^"]+)"', rule["expr"]))
        assert selected and all(set(s.split("|")) <= jobs for s in selected), rule["alert"]
