"""Typed configuration: named keys with defaults, a TOML file, then env overrides.

A key such as ``kv.snapshot.lease.failover-grace`` is overridden by the
environment variable ``KVLEASE_KV_SNAPSHOT_LEASE_FAILOVER_GRACE`` (upper case,
``.`` and ``-`` become ``_``). A TOML file may nest tables or use dotted keys
quoted as strings; both flatten to the same key. A bad value raises
:class:`ConfigError` naming the key.

Durations are written ``500ms``, ``1s``, ``10m``, ``2h``, ``1d`` and read as
integer milliseconds; a number without a unit (``"5"`` or a TOML integer) is
rejected, never taken as milliseconds. Sizes are written
``512``, ``64kb``, ``4mb``, ``1gb`` and read as bytes.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from kvlease.common.errors import KvLeaseError, show
from kvlease.common.limits import MAX_ROW_SIZE_BOUND


class ConfigError(KvLeaseError):
    """A configuration value is missing or malformed; the message names the key."""


_DURATION = re.compile(r"\s*(\d+)\s*(ms|s|m|min|h|d)?\s*", re.IGNORECASE)
#: The longest duration: what an int64 of milliseconds (the wire type) holds.
MAX_DURATION_MS = (1 << 63) - 1
_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
_SIZE = re.compile(r"\s*(\d+)\s*(b|kb|mb|gb)?\s*", re.IGNORECASE)
_SIZE_BYTES = {None: 1, "b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3}


def parse_duration_ms(value: Any) -> int:
    """``'10m'`` -> 600000. Raises ValueError on anything else, a number without a unit included."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"not a duration: {show(value)} (use e.g. 500ms, 1s, 10m, 2h, 1d)")
    m = _DURATION.fullmatch(str(value))
    if not m:
        raise ValueError(f"not a duration: {show(value)} (use e.g. 500ms, 1s, 10m, 2h, 1d)")
    if m.group(2) is None:
        n = m.group(1)
        raise ValueError(f"{show(str(value).strip())} has no unit: write {n}ms, {n}s, {n}m, {n}h or {n}d")
    ms = int(m.group(1)) * _DURATION_MS[m.group(2).lower()]
    if ms > MAX_DURATION_MS:
        raise ValueError(f"{show(str(value).strip())} is out of range: a duration is at most "
                         f"{MAX_DURATION_MS // _DURATION_MS['d']}d ({MAX_DURATION_MS}ms)")
    return ms


def parse_size(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"not a size: {show(value)}")
    if isinstance(value, int):
        return value
    m = _SIZE.fullmatch(str(value))
    if not m:
        raise ValueError(f"not a size: {show(value)} (use e.g. 512, 64kb, 4mb)")
    unit = m.group(2).lower() if m.group(2) else None
    return int(m.group(1)) * _SIZE_BYTES[unit]


def _parse_row_size(value: Any) -> int:
    size = parse_size(value)
    if not 1 <= size <= MAX_ROW_SIZE_BOUND:
        raise ValueError(f"{size} bytes is not between 1 and {MAX_ROW_SIZE_BOUND} (an update's changelog entry "
                         "holds the row twice and must fit one gRPC message)")
    return size


def _parse_positive_duration(value: Any) -> int:
    ms = parse_duration_ms(value)
    if ms <= 0:
        raise ValueError(f"{show(str(value).strip())} is not above zero")
    return ms


def _parse_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"not an integer: {show(value)}")
    return int(value)


def _parse_positive_int(value: Any) -> int:
    number = _parse_int(value)
    if number <= 0:
        raise ValueError(f"{number} is not above zero")
    return number


def _parse_percent(value: Any) -> int:
    number = _parse_int(value)
    if not 0 <= number <= 100:
        raise ValueError(f"{number} is not a percentage between 0 and 100")
    return number


def _parse_digest(value: Any) -> str:
    """``user:password`` or empty; the message of a bad value does not show it (it is a credential)."""
    text = str(value)
    user, colon, _password = text.partition(":")
    if text and (not colon or not user):
        raise ValueError("expected user:password (a user name, a colon, then the password); the value is not shown")
    return text


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {show(value)}")


@dataclass(frozen=True)
class Key:
    name: str
    default: Any
    parse: Callable[[Any], Any]
    doc: str = ""
    secret: bool = False  # a credential: its parser's errors must not show it; Config.redacted() hides it

    @property
    def env_var(self) -> str:
        return "KVLEASE_" + re.sub(r"[.\-]", "_", self.name).upper()


KEYS: dict[str, Key] = {}


def _key(name: str, default: Any, parse: Callable[[Any], Any], doc: str = "", *, secret: bool = False) -> Key:
    key = Key(name, default, parse, doc, secret)
    KEYS[name] = key
    return key


# --- ZooKeeper ---------------------------------------------------------------
ZK_ADDRESS = _key("zookeeper.address", "127.0.0.1:2181", str, "ZooKeeper connect string")
ZK_ROOT = _key("zookeeper.path.root", "/kvlease", str, "chroot of all kvlease nodes")
ZK_SESSION_TIMEOUT = _key("zookeeper.session-timeout", "6s", parse_duration_ms,
                         "ZooKeeper session timeout; also bounds how long a failover takes")

# --- remote storage ------------------------------------------------------------
REMOTE_DATA_DIR = _key("remote.data.dir", "file:///tmp/kvlease/remote", str, "file:///path or s3://bucket/prefix")
S3_ENDPOINT = _key("remote.s3.endpoint", "", str, "S3 endpoint URL (empty: AWS default)")
S3_REGION = _key("remote.s3.region", "us-east-1", str, "S3 region")
S3_ACCESS_KEY = _key("remote.s3.access-key", "", str, "S3 access key (empty: boto3's default credential chain)",
                     secret=True)
S3_SECRET_KEY = _key("remote.s3.secret-key", "", str, "S3 secret key (empty: boto3's default credential chain)",
                     secret=True)
REMOTE_FSYNC = _key("remote.file.fsync", True, _parse_bool, "fsync file:// writes before publishing them")

# --- coordinator ---------------------------------------------------------------
COORDINATOR_HOST = _key("coordinator.host", "127.0.0.1", str, "address the coordinator's gRPC server binds and advertises")
COORDINATOR_PORT = _key("coordinator.port", 9123, _parse_int, "gRPC port (0: pick a free one)")
COORDINATOR_ID = _key("coordinator.id", "", str, "defaults to host:port")
COORDINATOR_RPC_THREADS = _key("coordinator.rpc.threads", 64, _parse_int, "gRPC handler threads (they only enqueue work for the event loop)")
METRICS_PORT = _key("metrics.port", 0, _parse_int, "Prometheus port (0: pick a free one, -1: off)")
LOOP_MAX_BATCH = _key("coordinator.event-loop.max-batch", 256, _parse_int, "requests the event loop takes as one batch")

# --- snapshots and leases ------------------------------------------------------
SNAPSHOT_NUM_RETAINED = _key("kv.snapshot.num-retained", 2, _parse_int,
                            "newest snapshots kept per bucket (leased ones are kept besides)")
SNAPSHOT_INTERVAL = _key("kv.snapshot.interval", "30s", parse_duration_ms,
                        "how often a tablet server snapshots its changed buckets")
LEASE_CHECK_INTERVAL = _key("kv.snapshot.lease.expiration-check-interval", "1s", parse_duration_ms,
                           "how often the coordinator drops expired leases")
LEASE_FAILOVER_GRACE = _key("kv.snapshot.lease.failover-grace", "30s", parse_duration_ms,
                           "extra time for leases that expired while no coordinator was active (granted once)")
LEASE_MAX_DURATION = _key("kv.snapshot.lease.max-duration", "7d", parse_duration_ms,
                         "longest lease duration an acquire or renew may ask for")
SNAPSHOT_ORPHAN_GRACE = _key("kv.snapshot.orphan-grace", "1h", _parse_positive_duration,
                             "a remote snapshot file no stored snapshot names is deleted by the coordinator once "
                             "it is this old: longer than any upload takes (a tablet server reuses its own "
                             "uncommitted uploads for half of it); docs/snapshots.md")
SNAPSHOT_ORPHAN_CHECK_INTERVAL = _key("kv.snapshot.orphan-check-interval", "1h", _parse_positive_duration,
                                      "how often the coordinator lists each table's remote snapshot files (one "
                                      "listing per table) to delete orphans and dropped tables' leftovers")
AUTO_PARTITION_CHECK_INTERVAL = _key("auto-partition.check-interval", "10m", _parse_positive_duration,
                                     "how often the coordinator makes auto-partitioned tables' upcoming partitions "
                                     "and drops those past retention (docs/partitions.md); also at every failover")

# --- tablet servers --------------------------------------------------------------------
TABLET_ID = _key("tablet.id", 0, _parse_int, "this tablet server's id (unique in the cluster)")
TABLET_HOST = _key("tablet.host", "127.0.0.1", str, "address the tablet server's gRPC server binds and advertises")
TABLET_PORT = _key("tablet.port", 9124, _parse_int, "gRPC port (0: pick a free one)")
TABLET_DATA_DIR = _key("tablet.data-dir", "/tmp/kvlease/tablet", str, "local directory of the buckets' RocksDB + changelog")
TABLET_RPC_THREADS = _key("tablet.rpc.threads", 32, _parse_int, "gRPC handler threads of a tablet server")
TABLET_LOOKUP_PORT = _key("tablet.lookup.port", 0, _parse_int, "plain-TCP port of Lookup calls beside gRPC (0: pick a "
                        "free one, -1: off; off with security.enabled: it has no TLS and no users)")
TABLET_LOOKUP_CONNECTIONS = _key("tablet.lookup.max-connections", 256, _parse_positive_int,
                               "connections the lookup port serves at once (one thread each)")
TABLET_MALLOC_ARENA_MAX = _key("tablet.malloc.arena-max", 2, _parse_int,
                               "glibc malloc arenas the tablet server's threads share (0: glibc's default, 8 per "
                               "core): few, so freed scan batches are reused by every thread, not parked per thread")
TABLET_MAX_BUCKETS = _key("tablet.buckets.max", 20_000, _parse_int,
                          "most buckets this tablet server leads; the coordinator places no more on it and a "
                          "table create that cannot be placed is refused (registered in its ZooKeeper node)")
TABLET_MAX_OPEN_BUCKETS = _key("tablet.buckets.max-open", 0, _parse_int,
                               "most buckets with open files (RocksDB + changelog, up to 20 file descriptors "
                               "each); idle ones beyond it are closed and reopened on demand (0: as many as "
                               "three quarters of the open-file limit hold, at most 1000)")
BUCKET_REOPEN_BACKOFF = _key("tablet.bucket.reopen-backoff", "1s", parse_duration_ms,
                             "a bucket whose local write or open failed (a full disk) is reopened after this "
                             "long, doubled for each failure in a row")
BUCKET_REOPEN_BACKOFF_MAX = _key("tablet.bucket.reopen-backoff.max", "30s", parse_duration_ms,
                                 "longest wait before a failed bucket is reopened")
SNAPSHOT_UPLOAD_THREADS = _key("kv.snapshot.upload-threads", 8, _parse_int, "parallel file uploads per snapshot")

# --- tablet servers: changelog ------------------------------------------------------
LOG_FLUSH_FSYNC = _key("log.flush.fsync", True, _parse_bool, "fsync the changelog once per write batch")
LOG_SEGMENT_BYTES = _key("log.segment.bytes", "64mb", parse_size, "roll a changelog segment past this size")
MAX_ROW_SIZE = _key("table.max-row-size", "8mb", _parse_row_size,
                    "largest row (encoded key + value) a write may carry; a bigger one is refused with "
                    "RECORD_TOO_LARGE (at most 127mb: an update's changelog entry holds the row twice)")
LOG_RETENTION = _key("log.retention", "7d", parse_duration_ms,
                     "keep changelog this long beyond what kept snapshots need")
LOG_RETENTION_CHECK_INTERVAL = _key("log.retention.check-interval", "5m", parse_duration_ms,
                                    "how often every bucket's changelog is checked against its kept snapshots "
                                    "(a leader's bucket is also checked after each snapshot it commits)")
WRITER_ID_EXPIRATION = _key("writer.id.expiration", "1d", parse_duration_ms,
                            "how long a bucket remembers an idempotent writer after its last write (a write resent "
                            "later than that is taken for a new one)")


# --- row TTL (docs/changelog.md, "Row TTL") ------------------------------------------------------
ROW_TTL_CHECK_INTERVAL = _key("row-ttl.check-interval", "10s", _parse_positive_duration,
                              "how often a tablet server looks for expired rows in the buckets it leads of tables "
                              "with a row TTL (and deletes them)")
ROW_TTL_MAX_ROWS = _key("row-ttl.max-rows-per-check", 10000, _parse_positive_int,
                        "the most rows one such check reads (and so deletes), over all those buckets, each from "
                        "where the last check stopped: at most this many per check-interval")

# --- replication (docs/bucket-store.md, "Replication") ------------------------------------------
DEFAULT_REPLICATION_FACTOR = _key("default.replication-factor", 1, _parse_int,
                                  "replicas per bucket of a table created without --replication-factor")
DEFAULT_MIN_INSYNC_REPLICAS = _key("min.insync-replicas", 1, _parse_int,
                                   "in-sync replicas a write needs, for a table created without its own "
                                   "(fewer: NOT_ENOUGH_REPLICAS, nothing appended)")
REPLICA_FETCH_WAIT_MAX = _key("replica.fetch.wait-max", "500ms", parse_duration_ms,
                              "longest a follower's fetch waits at the leader for new entries (it returns as "
                              "soon as there are some)")
REPLICA_FETCH_MAX_BYTES = _key("replica.fetch.max-bytes", "4mb", parse_size,
                               "changelog bytes one follower fetch asks for")
REPLICA_MAX_LAG = _key("replica.max-lag", "10s", parse_duration_ms,
                       "a follower not caught up to the leader's log end for this long leaves the ISR")
REPLICA_LEADER_FAILURE_TIMEOUT = _key("replica.leader.failure-timeout", "3s", parse_duration_ms,
                                      "a leader whose local writes or opens of a replicated bucket have failed "
                                      "this long (a full disk, EIO, a read-only remount) gives its leadership to "
                                      "another in-sync replica")
REPLICA_REBUILD_MAX_BYTES_PER_S = _key("replica.rebuild.max-bytes-per-s", 104857600, parse_size,
                                       "download bandwidth of a tablet server's replica rebuilds from remote "
                                       "snapshots, shared by them all (bytes per second, e.g. 100mb; 0: unlimited)")
REPLICA_REBASE_INTERVAL = _key("replica.rebase.interval", "30s", parse_duration_ms,
                               "a follower re-bases its RocksDB on each followed bucket's latest remote snapshot "
                               "(its leader names it in fetch answers; the follower downloads the snapshot's new SST "
                               "files, reopens, replays its changelog since) at most about once per bucket per this "
                               "interval, looking every 5s or this if shorter, so its first snapshot as leader after "
                               "a failover stays incremental (0: never)")
UNCLEAN_LEADER_ELECTION = _key("unclean.leader-election", False, _parse_bool,
                               "with no live in-sync replica, let an out-of-sync one lead (its missing writes "
                               "are lost: logged and counted)")
CONTROLLED_SHUTDOWN_TIMEOUT = _key("tablet.controlled-shutdown.timeout", "30s", parse_duration_ms,
                                   "how long a stopping tablet server waits for its leaderships to move away")
AUTO_LEADER_REBALANCE = _key("auto.leader-rebalance.enabled", True, _parse_bool,
                             "the coordinator gives leadership back to a bucket's preferred replica (its first) by "
                             "itself: once that replica is back in the ISR, and at every "
                             "leader.imbalance.check-interval for the servers over "
                             "leader.imbalance.per-server.percentage")
LEADER_IMBALANCE_CHECK_INTERVAL = _key("leader.imbalance.check-interval", "30s", parse_duration_ms,
                                       "how often the coordinator checks the servers' leader imbalance "
                                       "(auto.leader-rebalance.enabled)")
LEADER_IMBALANCE_PER_SERVER_PERCENTAGE = _key(
    "leader.imbalance.per-server.percentage", 10, _parse_percent,
    "a server whose share of the buckets it is the preferred leader of that another server leads exceeds this "
    "(0-100) gets them back at the next check (Kafka's leader.imbalance.per.broker.percentage)")

# --- live scans (tablet servers) -------------------------------------------------
SCANNER_TTL = _key("kv.scanner.ttl", "10m", parse_duration_ms, "an idle scanner session is closed after this long")
SCANNER_EXPIRATION_INTERVAL = _key("kv.scanner.expiration-interval", "30s", parse_duration_ms,
                                  "how often idle scanner sessions are looked for")
SCANNER_MAX_PER_BUCKET = _key("kv.scanner.max-per-bucket", 8, _parse_int, "open scanner sessions per bucket")
SCANNER_MAX_PER_SERVER = _key("kv.scanner.max-per-server", 200, _parse_int, "open scanner sessions per tablet server")
SCANNER_MAX_BATCH_SIZE = _key("kv.scanner.max-batch-size", "10mb", parse_size,
                             "largest scan batch a server returns, whatever the client asks for")

# --- security: TLS ----------------------------------------------------------------
SECURITY_ENABLED = _key("security.enabled", False, _parse_bool,
                        "TLS, authentication and ACL checks on every gRPC port of coordinators and tablet "
                        "servers, and TLS and credentials in every client (the security.tls.* files must then be set)")
TLS_CERT_FILE = _key("security.tls.cert-file", "", str,
                     "PEM certificate this process presents (a server's; a client's under mutual TLS)")
TLS_KEY_FILE = _key("security.tls.key-file", "", str, "PEM private key of security.tls.cert-file")
TLS_CA_FILE = _key("security.tls.ca-file", "", str,
                   "PEM CA certificates a server's (and, under mutual TLS, a client's) certificate is verified against")
TLS_CLIENT_AUTH = _key("security.tls.client-auth", False, _parse_bool,
                       "mutual TLS: servers require a client certificate signed by security.tls.ca-file")

# --- security: users, the cluster principal, ACLs, ZooKeeper ------------------------
SECURITY_USERNAME = _key("security.username", "", str,
                         "user a client authenticates as (with security.password) when security.enabled; empty: "
                         "the mutual-TLS client certificate's common name")
SECURITY_PASSWORD = _key("security.password", "", str, "password of security.username (never logged)",
                         secret=True)
INTERNAL_USERNAME = _key("security.internal.username", "kvlease", str,
                         "the cluster's own principal (User:<name>): coordinators and tablet servers authenticate "
                         "their calls to each other as it; only it may make internal calls")
INTERNAL_PASSWORD = _key("security.internal.password", "", str,
                         "password of security.internal.username, the same in every cluster process (under mutual "
                         "TLS it may be empty: a node certificate whose common name is that user then authenticates)",
                         secret=True)
SUPER_USERS = _key("security.super-users", "", str,
                   "comma-separated principals (User:admin) or user names allowed every operation without ACLs")
ZK_DIGEST = _key("security.zookeeper.digest", "", _parse_digest,
                 "user:password of a ZooKeeper digest identity; when set, kvlease's nodes carry an ACL that lets "
                 "only this identity change them (the same in every cluster process and admin tool)", secret=True)
#: Keys whose values are credentials.
SECRET_KEYS: frozenset[str] = frozenset(name for name, key in KEYS.items() if key.secret)
REDACTED = "<redacted>"

# --- clients ---------------------------------------------------------------------
CLIENT_REQUEST_TIMEOUT = _key("client.request-timeout", "30s", parse_duration_ms, "deadline of one client request")
CLIENT_RETRY_MAX_WAIT = _key("client.retry.max-wait", "2s", parse_duration_ms, "longest backoff between client retries")
CLIENT_LOOKUP_PORT = _key("client.lookup-port", True, _parse_bool, "send lookups to a tablet server's lookup port "
                          "when it names one (off: gRPC only; never with TLS or a user: docs/architecture.md)")
CLIENT_SCANNER_FETCH_MAX_BYTES = _key("client.scanner.kv.fetch.max-bytes", "4mb", parse_size,
                                      "batch size a KV scanner asks for per ScanKv call")
CLIENT_RETRY_TOTAL = _key("client.retry.total-timeout", "60s", parse_duration_ms,
                         "how long a client retries a failing call before raising its error")


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for name, value in data.items():
        full = f"{prefix}{name}"
        if isinstance(value, Mapping) and full not in KEYS:
            flat.update(_flatten(value, full + "."))
        else:
            flat[full] = value
    return flat


class Config:
    """An immutable set of parsed values; ``config[KEY]`` or ``config.get('name')``."""

    def __init__(self, values: Mapping[str, Any] | None = None, *, env: Mapping[str, str] | None = None) -> None:
        raw: dict[str, Any] = {}
        for name, value in _flatten(values or {}).items():
            if name not in KEYS:
                raise ConfigError(f"unknown config key {show(name)}", key=name)
            raw[name] = value
        environ = os.environ if env is None else env
        for key in KEYS.values():
            if key.env_var in environ:
                raw[key.name] = environ[key.env_var]
        self._raw = raw
        self._values: dict[str, Any] = {}
        for key in KEYS.values():
            value = raw.get(key.name, key.default)
            try:
                self._values[key.name] = key.parse(value)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"bad value for config key {key.name!r}: {exc}", key=key.name) from None

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None, overrides: Mapping[str, Any] | None = None,
             *, env: Mapping[str, str] | None = None) -> "Config":
        """Values from the TOML file at ``path`` (if given), then ``overrides``, then env."""
        values = read_file(path) if path is not None else {}
        values.update(_flatten(overrides or {}))
        return cls(values, env=env)

    def __getitem__(self, key: Key | str) -> Any:
        return self._values[key.name if isinstance(key, Key) else key]

    def get(self, key: Key | str) -> Any:
        return self[key]

    def with_overrides(self, overrides: Mapping[str, Any]) -> "Config":
        merged = dict(self._raw)  # the written values: a parsed duration (ms) has no unit any more
        merged.update(_flatten(overrides))
        return Config(merged, env={})

    def as_dict(self) -> dict[str, Any]:
        """Every value, credentials included: for building processes, never for printing (see :meth:`redacted`)."""
        return dict(self._values)

    def redacted(self) -> dict[str, Any]:
        """Every value, with each set credential (:data:`SECRET_KEYS`) replaced by :data:`REDACTED`: safe to log."""
        return {name: REDACTED if name in SECRET_KEYS and value else value for name, value in self._values.items()}

    def secrets(self) -> list[str]:
        """The set credential values (for :mod:`kvlease.common.redaction`), the digest's password on its own too."""
        values = [self._values[name] for name in sorted(SECRET_KEYS) if self._values[name]]
        digest = self._values[ZK_DIGEST.name]
        return values + ([digest.partition(":")[2]] if digest.partition(":")[2] else [])

    def __repr__(self) -> str:
        changed = {k: v for k, v in self.redacted().items() if v != KEYS[k].parse(KEYS[k].default)}
        return f"Config({changed!r})"


def read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The flat ``{dotted key: raw value}`` a TOML config file sets (not parsed, not checked)."""
    try:
        with open(path, "rb") as fh:
            return _flatten(tomllib.load(fh))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def write_file(path: str | os.PathLike[str], values: Mapping[str, Any]) -> None:
    """Write flat ``{key: value}`` as a TOML config file (:func:`to_toml`) only its owner may read (mode 0600):
    a config may hold credentials (:data:`SECRET_KEYS`)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
    with os.fdopen(fd, "w") as fh:
        fh.write(to_toml(values))


def to_toml(values: Mapping[str, Any]) -> str:
    """Render flat ``{key: value}`` as TOML with quoted dotted keys (for generated configs).

    An integer value of a duration key is milliseconds (what :class:`Config` holds): it is written ``"Nms"``.
    """
    lines = []
    for name, value in values.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int) and name in KEYS and KEYS[name].parse in (parse_duration_ms, _parse_positive_duration):
            text = f'"{value}ms"'  # a parsed duration; a bare number would be rejected
        elif isinstance(value, int):
            text = str(value)
        else:
            text = '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
        lines.append(f'"{name}" = {text}')
    return "\n".join(lines) + "\n"
