"""The source's options, parsed and checked once, before any job runs.

Option names are case-insensitive (Spark passes them so). An unknown option,
a bad value or a missing one raises :class:`OptionError`, one line naming the
option, with ``did you mean 'table'?`` when a known name or value is close
(:func:`kvlease.common.errors.did_you_mean`, as the CLI's usage errors do); the list of
options is docs/spark.md, "Options" (and docs/architecture.md, "The Spark source").
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from kvlease.client.admin import parse_bootstrap
from kvlease.client.admin import AdminClient
from kvlease.client.table import TableClient
from kvlease.client.cluster_dir import cluster_dir_bootstrap, cluster_dir_security
from kvlease.common import config as cfg
from kvlease.common.config import parse_duration_ms
from kvlease.common.errors import InvalidRequestError, did_you_mean, show, single_line
from kvlease.common.model import lease_id_problem
from kvlease.common.tables import TableInfo, parse_table_path
from kvlease.common.tls import TlsFiles

STARTUP_MODES = ("full", "earliest", "latest", "timestamp")
BOOTSTRAP_MODES = ("snapshot", "live")
CONNECTION = ("bootstrap", "cluster", "table", "ca-file", "cert-file", "key-file", "user", "password",
              "password-file", "retry.timeout")
#: The TLS options and the config keys they set (``ca-file`` turns TLS on).
TLS_OPTIONS = {"ca-file": cfg.TLS_CA_FILE.name, "cert-file": cfg.TLS_CERT_FILE.name, "key-file": cfg.TLS_KEY_FILE.name}
#: Client settings (TLS, credentials, ``retry.timeout``): ``((dotted config key, value), …)``, picklable.
Security = tuple[tuple[str, Any], ...]
READ_ONLY = ("startup.mode", "startup.timestamp", "ending.timestamp", "ending.offsets", "bootstrap.mode",
             "lease.id", "lease.duration", "lease.acquire.max-attempts", "lease.acquire.max-wait",
             "maxrowspertrigger", "split.max-rows", "partition.discovery.interval", "partitions", "prefix")
#: Options stating a table's merge engine (kvlease.spark_source.write_options: ignored by reads, checked by
#: writes) and those of writes only.
ENGINE_OPTIONS = ("merge-engine", "version-column", "agg", "delete-behavior")
WRITE_OPTIONS = ("partial-update",)
#: Options Spark itself sets on a source or sink; they mean nothing here and are ignored.
SPARK_OWN = ("checkpointlocation", "path")
#: Option names as the docs spell them, where that is not lower case (Spark hands them over lower-cased).
SPELLED = {"maxrowspertrigger": "maxRowsPerTrigger", "checkpointlocation": "checkpointLocation"}


#: The last millisecond of the year 9999 (what ISO-8601 can write); the end of the range times may take.
MAX_TIMESTAMP_MS = 253_402_300_799_999
#: Changelog offsets travel as int64.
MAX_OFFSET = (1 << 63) - 1


class OptionError(InvalidRequestError):
    """An option is unknown, missing or malformed; the message names it, on one line (a path or a quoted
    message with a line break in it keeps it as ``\\n``)."""

    def __init__(self, message: str = "", **details: object) -> None:
        super().__init__(single_line(message), **details)


@dataclass(frozen=True)
class Options:
    """Everything the options say, typed; picklable (it travels to Spark's Python workers)."""

    bootstrap: tuple[str, ...]
    table: str  # DB.NAME
    startup_mode: str = "full"
    startup_timestamp_ms: int | None = None
    ending_timestamp_ms: int | None = None
    ending_offsets: Mapping[int, int] | None = None
    bootstrap_mode: str = "snapshot"
    lease_id: str | None = None
    lease_duration_ms: int = 3_600_000
    acquire_max_attempts: int = 8
    acquire_max_wait_s: float = 30.0
    max_rows_per_trigger: int | None = None
    split_max_rows: int | None = None
    partition_discovery_interval_ms: int = 10_000  # streaming reads of a partitioned table: how often to list them
    partitions: tuple[str, ...] = ()  # a batch read of a partitioned table: these partitions only (names)
    prefix: str | None = None  # a full batch read: these bucket-key prefixes only (spark_source/prefix_pruning.py)
    security: Security = ()  # TLS settings (a --secure cluster directory's, or the ca/cert/key-file options)
    given: frozenset[str] = field(default=frozenset(), compare=False)

    @property
    def change_feed(self) -> bool:
        """A batch read of change rows (``startup.mode`` other than ``full``) rather than of the table."""
        return self.startup_mode != "full"


def parse(options: Mapping[str, Any], *, reading: bool = True) -> Options:
    """Check and type ``options``; raises :class:`OptionError` naming the first bad one."""
    given = {str(k).lower(): str(v) for k, v in options.items()}
    check_names(given, reading=reading)
    values: dict[str, Any] = {"bootstrap": _bootstrap(given), "table": _table(given), "security": _security(given)}
    if reading:
        values.update(_read_options(given))
    return Options(**values, given=frozenset(given))


def check_names(given: Mapping[str, str], *, reading: bool = True) -> None:
    """OptionError for the first of ``given`` (lower-cased names) that is not an option of a read (or a
    write): with the known name it is close to, else the known names."""
    allowed = {*CONNECTION, *ENGINE_OPTIONS, *(READ_ONLY if reading else WRITE_OPTIONS)}
    for name in sorted(given):
        if name in SPARK_OWN or name in allowed:
            continue
        if name in READ_ONLY:
            raise OptionError(f"option '{_spelled(name)}' applies to reads only, not to writes")
        hint = did_you_mean(name, [_spelled(n) for n in (*allowed, *SPARK_OWN)])
        if hint:
            raise OptionError(f"unknown option {show(name)}: {hint}")
        raise OptionError(f"unknown option {show(name)} (known: {', '.join(sorted(map(_spelled, allowed)))})")


def _spelled(name: str) -> str:
    """An option's name as the docs spell it (``maxRowsPerTrigger``), from the lower-cased one Spark passes."""
    return SPELLED.get(name, name)


def connection(options: Mapping[str, Any]) -> tuple[tuple[str, ...], str, Security]:
    """``(coordinator addresses, DB.NAME, security settings)`` alone; :func:`parse` checks the rest."""
    given = {str(k).lower(): str(v) for k, v in options.items()}
    return _bootstrap(given), _table(given), _security(given)


def connect(bootstrap: tuple[str, ...], security: Security = ()) -> AdminClient:
    """An admin client of the cluster at ``bootstrap``, with TLS when ``security`` says so (the driver's and
    every executor's: the certificate files must be readable at the same paths there)."""
    return AdminClient(list(bootstrap), cfg.Config(dict(security), env={}))


def open_table(admin: AdminClient, table_id: int, security: Security = (),
               partition: TableInfo | None = None, read_as: tuple | None = None) -> TableClient:
    """The table client of a read or write on ``admin``'s cluster: its calls to tablet servers retry as
    long as ``retry.timeout`` says, like the admin client's calls to the coordinator. ``partition``: a
    partition's view of the table (``TableInfo.of_partition``): the client reads that partition's buckets.
    ``read_as``: the columns of the schema the query read its schema from (rows written since a later
    change are read as that schema: docs/spark.md, "Schema changes")."""
    settings = dict(security)
    return TableClient(admin, table_id, cfg.Config(settings, env={}),
                       retry_total_s=admin.retry.total_s if cfg.CLIENT_RETRY_TOTAL.name in settings else None,
                       partition=partition, read_as=read_as)


def _security(given: Mapping[str, str]) -> Security:
    settings: dict[str, Any] = {}
    if "cluster" in given:
        try:
            settings.update(cluster_dir_security(given["cluster"]))
        except InvalidRequestError as exc:
            raise OptionError(f"option 'cluster': {exc}") from None
    files = {key: given[name] for name, key in TLS_OPTIONS.items() if given.get(name)}
    if files:
        settings.update({cfg.SECURITY_ENABLED.name: True, **files})
    if settings and not settings.get(cfg.TLS_CA_FILE.name):
        raise OptionError("options 'cert-file'/'key-file' need option 'ca-file' (the CA to verify the servers)")
    settings.update(_credentials(given))
    if settings.get(cfg.SECURITY_USERNAME.name) and not settings.get(cfg.TLS_CA_FILE.name):
        raise OptionError("option 'user' needs option 'ca-file' (or a --secure 'cluster'): a password is only "
                          "sent over TLS")
    if settings:
        _check_tls_files(settings, files)
    if "retry.timeout" in given:  # how long a call retries an unreachable cluster (the client's default: 60s)
        _positive_duration(given, "retry.timeout")
        settings[cfg.CLIENT_RETRY_TOTAL.name] = given["retry.timeout"].strip()
    return tuple(sorted(settings.items()))


def _check_tls_files(settings: Mapping[str, Any], files: Mapping[str, str]) -> None:
    """Read the TLS files now, so that a missing or bad one fails naming the option that gave it."""
    try:
        TlsFiles.from_config(cfg.Config(dict(settings), env={}))
    except cfg.ConfigError as exc:
        key = exc.details.get("key")
        option = next((name for name, k in TLS_OPTIONS.items() if k == key and k in files), "cluster")
        raise OptionError(f"option '{option}': {exc.message}") from None


def _credentials(given: Mapping[str, str]) -> dict[str, str]:
    """``user`` with ``password`` or ``password-file`` (read here, once: executors get the value)."""
    if "password" in given and "password-file" in given:
        raise OptionError("options 'password' and 'password-file' exclude each other: give one")
    if not given.get("user"):
        if "password" in given or "password-file" in given:
            raise OptionError("option 'password'/'password-file' needs option 'user'")
        return {}
    if "password-file" in given:
        try:
            with open(given["password-file"], encoding="utf-8") as fh:
                password = fh.read().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            raise OptionError(f"option 'password-file': cannot read {given['password-file']}: "
                              f"{getattr(exc, 'strerror', None) or exc}") from None
    else:
        password = given.get("password", "")
    if not password:
        raise OptionError("option 'user' needs option 'password' or 'password-file'")
    return {cfg.SECURITY_USERNAME.name: given["user"], cfg.SECURITY_PASSWORD.name: password}


def _bootstrap(given: Mapping[str, str]) -> tuple[str, ...]:
    if "bootstrap" in given and "cluster" in given:
        raise OptionError("options 'bootstrap' and 'cluster' exclude each other: give one")
    if "bootstrap" in given:
        try:
            return tuple(parse_bootstrap(given["bootstrap"]))
        except InvalidRequestError as exc:
            raise OptionError(f"option 'bootstrap': {exc.message}") from None
    if "cluster" in given:
        try:
            return tuple(cluster_dir_bootstrap(given["cluster"]))
        except InvalidRequestError as exc:
            raise OptionError(f"option 'cluster': {exc}") from None
    raise OptionError("option 'bootstrap' (coordinator addresses) or 'cluster' (a local cluster directory) "
                      "is required")


def _table(given: Mapping[str, str]) -> str:
    if "table" not in given:
        raise OptionError("option 'table' (DB.NAME) is required")
    try:
        database, name = parse_table_path(given["table"])
    except InvalidRequestError as exc:
        raise OptionError(f"option 'table': {exc}") from None
    return f"{database}.{name}"


def _read_options(given: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["startup_mode"] = _choice(given, "startup.mode", STARTUP_MODES, "full")
    out["bootstrap_mode"] = _choice(given, "bootstrap.mode", BOOTSTRAP_MODES, "snapshot")
    if "startup.timestamp" in given:
        if out["startup_mode"] != "timestamp":
            raise OptionError("option 'startup.timestamp' needs startup.mode=timestamp")
        out["startup_timestamp_ms"] = parse_timestamp_ms("startup.timestamp", given["startup.timestamp"])
    elif out["startup_mode"] == "timestamp":
        raise OptionError("startup.mode=timestamp needs option 'startup.timestamp' (ms since the epoch or ISO-8601)")
    if "ending.timestamp" in given and "ending.offsets" in given:
        raise OptionError("options 'ending.timestamp' and 'ending.offsets' exclude each other: give one")
    if "ending.timestamp" in given:
        out["ending_timestamp_ms"] = parse_timestamp_ms("ending.timestamp", given["ending.timestamp"])
    if "ending.offsets" in given:
        out["ending_offsets"] = _ending_offsets(given["ending.offsets"])
    if out["startup_mode"] == "full" and ("ending.timestamp" in given or "ending.offsets" in given):
        raise OptionError("options 'ending.timestamp' / 'ending.offsets' end a change feed: they need "
                          "startup.mode earliest, latest or timestamp")
    if out["bootstrap_mode"] == "live" and out["startup_mode"] != "full":
        raise OptionError("option 'bootstrap.mode'=live bootstraps a full read: it needs startup.mode=full")
    if "lease.id" in given:
        problem = lease_id_problem(given["lease.id"])  # the coordinator's own rule
        if problem is not None:
            raise OptionError(f"option 'lease.id': {problem}")
        out["lease_id"] = given["lease.id"]
    if "lease.duration" in given:
        out["lease_duration_ms"] = _positive_duration(given, "lease.duration")
    if "partition.discovery.interval" in given:
        out["partition_discovery_interval_ms"] = _positive_duration(given, "partition.discovery.interval")
    if "partitions" in given:
        out["partitions"] = _names(given["partitions"])
    if "prefix" in given:
        out["prefix"] = given["prefix"]
    if "lease.acquire.max-wait" in given:
        out["acquire_max_wait_s"] = _positive_duration(given, "lease.acquire.max-wait") / 1000.0
    for name, key in (("lease.acquire.max-attempts", "acquire_max_attempts"),
                      ("maxrowspertrigger", "max_rows_per_trigger"), ("split.max-rows", "split_max_rows")):
        if name in given:
            out[key] = _positive_int(given, name)
    return out


def _names(text: str) -> tuple[str, ...]:
    """The partition names of option ``partitions`` (comma-separated, each once, in the order given); whether
    each is a name of the table's partition key is the reader's check (it knows the table)."""
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise OptionError(f"option 'partitions': expected partition names separated by commas (like "
                          f"20261128,20261129, or k1=v1/k2=v2 for a key of two columns), got {show(text)}")
    return tuple(dict.fromkeys(names))


def _choice(given: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    value = given.get(name, default).strip().lower()
    if value not in choices:
        hint = did_you_mean(value, choices)
        raise OptionError(f"option '{name}': {show(given[name])} is not one of {', '.join(choices)}"
                          + (f"; {hint}" if hint else ""))
    return value


def _positive_int(given: Mapping[str, str], name: str) -> int:
    shown = _spelled(name)
    try:
        value = int(given[name].strip())
    except ValueError:
        raise OptionError(f"option '{shown}': expected a positive integer, got {show(given[name])}") from None
    if value <= 0:
        raise OptionError(f"option '{shown}': expected a positive integer, got {show(value)}")
    return value


def _positive_duration(given: Mapping[str, str], name: str) -> int:
    try:
        value = parse_duration_ms(given[name])
    except ValueError as exc:
        raise OptionError(f"option '{name}': {exc}") from None
    if value <= 0:
        raise OptionError(f"option '{name}': the duration must be positive, got {show(given[name])}")
    return value


def parse_timestamp_ms(name: str, text: str) -> int:
    """Milliseconds since the epoch from an integer or ISO-8601 (no zone: UTC), 1970 to 9999."""
    text = text.strip()
    if re.fullmatch(r"\d+", text):
        millis = int(text)
    else:
        try:
            when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise OptionError(f"option '{name}': expected ms since the epoch or an ISO-8601 time, "
                              f"got {show(text)}") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.timezone.utc)
        millis = int(when.timestamp() * 1000)
    if millis < 0:
        raise OptionError(f"option '{name}': {show(text)} is before 1970")
    if millis > MAX_TIMESTAMP_MS:
        raise OptionError(f"option '{name}': {show(text)} is after 9999-12-31T23:59:59.999Z ({MAX_TIMESTAMP_MS} ms "
                          "since the epoch)")
    return millis


def _ending_offsets(text: str) -> dict[int, int]:
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or not doc:
            raise ValueError("expected a JSON object")
        if any(isinstance(v, bool) or not isinstance(v, int) for v in doc.values()):
            raise ValueError("offsets must be integers")
        offsets = {int(k): v for k, v in doc.items()}
    except (ValueError, TypeError) as exc:
        raise OptionError(f"option 'ending.offsets': expected JSON like {{\"0\": 120, \"1\": 80}} "
                          f"(bucket -> end offset), got {show(text)}: {exc}") from None
    bad = {b: o for b, o in offsets.items() if not 0 <= b <= MAX_OFFSET or not 0 <= o <= MAX_OFFSET}
    if bad:
        raise OptionError(f"option 'ending.offsets': buckets and offsets must be between 0 and {MAX_OFFSET}, "
                          f"got {bad}")
    return offsets
