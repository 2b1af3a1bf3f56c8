"""Auto-partitioning: which time partitions a table should have at an instant.

An auto-partitioned table has exactly one partition column, of type STRING, whose values are times
(:func:`check_auto_partition_key`). At each check the coordinator creates the partitions of the current
time and the next ones, and drops those past retention, as Apache Fluss's auto-partitioning does
(``table.auto-partition.time-unit``, ``num-precreate``, ``num-retention``, ``time-zone``). This module
is the arithmetic only: time comes in as epoch milliseconds, nothing reads a clock.

Units and their values (:class:`TimeUnit`):

========  ==================  ==============
unit      value               example
========  ==================  ==============
SECOND    ``yyyyMMddHHmmss``  20261127134530
HOUR      ``yyyyMMddHH``      2026112713
DAY       ``yyyyMMdd``        20261127
MONTH     ``yyyyMM``          202611
QUARTER   ``yyyyQ``           20264 (Q4)
YEAR      ``yyyy``            2026
========  ==================  ==============

SECOND is kvlease's own (Fluss has none): it is meant for tests and demos, where partitions are made
and expired each second; a real table checks far less often than that.

- **num-precreate** N (default 2): a check makes the partition of the current time and of the next
  N-1 exist (:func:`to_create`; at 2024-11-11 with DAY and 3: 20241111, 20241112, 20241113). 0: none.
- **num-retention** R (default 7): a check keeps the R partitions before the current one and drops
  older ones (:func:`expired`; at 2024-11-11 with DAY and 3 it keeps 20241108-20241110 and drops
  20241107 and earlier). R = 0 keeps only the current partition and later ones. A negative R
  (:data:`NO_RETENTION`) drops nothing, as in Fluss, where a negative ``num-retention`` means "do not
  drop partitions". A value that is not one of the unit's (a partition added by hand) is never dropped:
  what cannot be dated is not expired (Fluss compares names as strings, so it drops ``2024-11-01``,
  which sorts below ``20241108``).
- **time zone** (default UTC): values are the wall-clock time of an IANA zone (``zoneinfo``).

Steps are taken as Fluss takes them with ``java.time.ZonedDateTime``: SECOND and HOUR step on the
instant time line (``plusSeconds``/``plusHours``: one hour is 3600 s), DAY, MONTH, QUARTER and YEAR
on the zone's calendar (``plusDays``, ``plusMonths``…). So around a daylight-saving change an HOUR
table skips the local hour that does not exist (spring forward: 01, then 03) and sees the repeated
local hour twice (fall back: both instants are the same partition, which one step after the other
names again: :func:`to_create` lists it once, and a retention counted across it keeps one hour fewer).

When checks run is the caller's choice (Fluss drops, then creates, at each check; it delays a DAY
table's checks by a random number of minutes of the day to spread the work); so is the partition
limit a table's settings must fit (:meth:`AutoPartition.check_fits`).

Values of a unit have a fixed width, so they sort as the times they name: the retention cutoff is a
value (:func:`retention_cutoff`) and the values below it are expired. Values exist for the years
1-9999 (Python's ``datetime``); a step beyond them names no partition.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from typing import Iterable, Mapping, Sequence
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from kvlease.common.errors import InvalidTableError, did_you_mean, show
from kvlease.common.columns import Column

#: The table options, Fluss's names.
TIME_UNIT_KEY = "table.auto-partition.time-unit"
PRECREATE_KEY = "table.auto-partition.num-precreate"
RETENTION_KEY = "table.auto-partition.num-retention"
TIME_ZONE_KEY = "table.auto-partition.time-zone"

DEFAULT_PRECREATE = 2
DEFAULT_RETENTION = 7
DEFAULT_TIME_ZONE = "UTC"
#: num-retention that drops nothing (any negative value does).
NO_RETENTION = -1

#: An IANA zone name's shape, checked before ``zoneinfo`` opens a file named after it.
_ZONE_NAME = re.compile(r"[A-Za-z0-9_+-]{1,64}(?:/[A-Za-z0-9_+-]{1,64}){0,3}")
_DIGITS = re.compile(r"[0-9]+")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class TimeUnit(enum.Enum):
    """How long one partition of an auto-partitioned table lasts; names its values' format."""

    SECOND = "yyyyMMddHHmmss"
    HOUR = "yyyyMMddHH"
    DAY = "yyyyMMdd"
    MONTH = "yyyyMM"
    QUARTER = "yyyyQ"
    YEAR = "yyyy"

    @classmethod
    def parse(cls, text: object) -> TimeUnit:
        """The unit named ``text`` (case-insensitive); InvalidTableError listing the units otherwise."""
        if isinstance(text, TimeUnit):
            return text
        if isinstance(text, str) and text.upper() in cls.__members__:
            return cls[text.upper()]
        hint = did_you_mean(text, cls.__members__) if isinstance(text, str) else ""
        raise InvalidTableError(f"unknown {TIME_UNIT_KEY} {show(text)}: one of {', '.join(cls.__members__)}"
                                + (f"; {hint}" if hint else ""))

    @property
    def format(self) -> str:
        """The values' format, in Java's pattern letters (``yyyyMMdd``)."""
        return self.value

    @property
    def width(self) -> int:
        """Every value of the unit has this many digits."""
        return len(self.value)

    @property
    def example(self) -> str:
        """The value of 2026-11-27 13:45:30."""
        return _text(self, datetime(2026, 11, 27, 13, 45, 30))


#: SECOND and HOUR step on the instant time line, by this many milliseconds.
_STEP_MS = {TimeUnit.SECOND: 1000, TimeUnit.HOUR: 3_600_000}
#: MONTH, QUARTER and YEAR step on the calendar, by this many months.
_STEP_MONTHS = {TimeUnit.MONTH: 1, TimeUnit.QUARTER: 3, TimeUnit.YEAR: 12}


def zone(name: object) -> ZoneInfo:
    """The time zone named ``name``; InvalidTableError unless it is an IANA name (Europe/Berlin, UTC)."""
    if isinstance(name, str) and _ZONE_NAME.fullmatch(name):
        try:
            return ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError, OSError):  # not found; not a zone file; a directory
            pass
    raise InvalidTableError(f"unknown {TIME_ZONE_KEY} {show(name)}: it must be an IANA time zone name "
                            f"like Europe/Berlin or UTC")


def _text(unit: TimeUnit, moment: datetime) -> str:
    """``moment``'s wall-clock fields in ``unit``'s format."""
    if unit is TimeUnit.QUARTER:
        return f"{moment.year:04d}{(moment.month - 1) // 3 + 1}"
    fields = (f"{moment.year:04d}{moment.month:02d}{moment.day:02d}"
              f"{moment.hour:02d}{moment.minute:02d}{moment.second:02d}")
    return fields[:unit.width]


def _local(tz: str, at_ms: int) -> datetime:
    return (_EPOCH + timedelta(milliseconds=at_ms)).astimezone(zone(tz))


def value_at(unit: TimeUnit, tz: str, at_ms: int) -> str:
    """The value of the partition holding the instant ``at_ms`` (epoch milliseconds) in time zone ``tz``."""
    return _text(unit, _local(tz, at_ms))


def _value_after(unit: TimeUnit, tz: str, at_ms: int, steps: int) -> str | None:
    """The value ``steps`` units after (before, if negative) the one of ``at_ms``, stepped as Fluss does
    (module docstring); None past the years 1-9999."""
    try:
        if unit in _STEP_MS:
            return value_at(unit, tz, at_ms + steps * _STEP_MS[unit])
        local = _local(tz, at_ms)
        if unit is TimeUnit.DAY:
            day = local.date() + timedelta(days=steps)
        else:
            year, month = divmod(local.year * 12 + local.month - 1 + steps * _STEP_MONTHS[unit], 12)
            day = date(year, month + 1, 1)
        return _text(unit, datetime(day.year, day.month, day.day))
    except (OverflowError, ValueError):
        return None


def value_problem(unit: TimeUnit, value: object) -> str | None:
    """Why ``value`` is not a value of ``unit`` (a one-line message naming the expected format), or None
    when it is one: exactly the unit's digits, naming a real date, hour, minute and second, or quarter 1-4."""
    if isinstance(value, str) and len(value) == unit.width and _DIGITS.fullmatch(value) and _real(unit, value):
        return None
    return (f"bad partition value {show(value)} for a {unit.name} auto-partitioned table: "
            f"expected {unit.format}, e.g. {unit.example}")


def _real(unit: TimeUnit, digits: str) -> bool:
    """Whether ``digits`` (the unit's width) name a time that exists on the calendar."""
    if unit is TimeUnit.QUARTER:
        return int(digits[:4]) >= 1 and digits[4] in "1234"
    padded = digits + "0101000000"[len(digits) - 4:]  # month and day 01, hour, minute and second 00
    try:
        datetime(int(padded[:4]), *(int(padded[start:start + 2]) for start in range(4, 14, 2)))
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class AutoPartition:
    """A table's auto-partitioning settings; checked when made (InvalidTableError naming the setting).

    ``retention`` below 0 (:data:`NO_RETENTION`) drops nothing. Callers creating a table also call
    :meth:`check_fits` with their partition limit."""

    unit: TimeUnit
    precreate: int = DEFAULT_PRECREATE
    retention: int = DEFAULT_RETENTION
    time_zone: str = DEFAULT_TIME_ZONE

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise InvalidTableError naming the first bad setting."""
        if not isinstance(self.unit, TimeUnit):
            raise InvalidTableError(f"{TIME_UNIT_KEY} {show(self.unit)} is not a TimeUnit (TimeUnit.parse reads one)")
        for key, number in ((PRECREATE_KEY, self.precreate), (RETENTION_KEY, self.retention)):
            if not isinstance(number, int) or isinstance(number, bool):
                raise InvalidTableError(f"{key} must be an integer, got {show(number)}")
        if self.precreate < 0:
            raise InvalidTableError(f"{PRECREATE_KEY} must be 0 or more, got {self.precreate}")
        zone(self.time_zone)

    @property
    def drops(self) -> bool:
        """Whether checks drop partitions past retention (False: :data:`NO_RETENTION`)."""
        return self.retention >= 0

    def check_fits(self, max_partitions: int) -> None:
        """InvalidTableError unless the partitions auto-partitioning keeps fit in ``max_partitions``: the
        ``retention`` ones before the current one, the current and the next ``precreate - 1``, and room
        for one more (a partition made before a check drops the oldest). Without retention only the
        pre-created ones must fit: the table then grows by a partition each unit up to the limit."""
        kept = self.precreate + max(self.retention, 0) + 1
        if kept <= max_partitions:
            return
        counted = f"num-precreate {self.precreate}" + (f" + num-retention {self.retention}" if self.drops else "")
        raise InvalidTableError(f"auto-partitioning keeps up to {kept} partitions ({counted} + 1) but a table has "
                                f"at most {max_partitions}: lower {PRECREATE_KEY} or {RETENTION_KEY}")

    def to_json(self) -> dict:
        return {"unit": self.unit.name, "precreate": self.precreate, "retention": self.retention,
                "time_zone": self.time_zone}

    @classmethod
    def from_json(cls, data: Mapping) -> AutoPartition:
        """The settings :meth:`to_json` wrote (missing ones take their default); InvalidTableError if bad."""
        if not isinstance(data, Mapping) or "unit" not in data:
            raise InvalidTableError(f"bad auto-partition settings {show(data)}: expected a mapping with a unit")
        return cls(TimeUnit.parse(data["unit"]), data.get("precreate", DEFAULT_PRECREATE),
                   data.get("retention", DEFAULT_RETENTION), data.get("time_zone", DEFAULT_TIME_ZONE))


def check_auto_partition_key(columns: Sequence[Column], partition_key: Sequence[str]) -> None:
    """InvalidTableError unless ``partition_key`` is one column of ``columns``, of type STRING: the column
    an auto-partitioned table's times are written to."""
    if isinstance(partition_key, str):
        raise InvalidTableError(f"partition key {show(partition_key)} must be a list of column names, not a string")
    if len(partition_key) != 1:
        raise InvalidTableError(f"an auto-partitioned table has exactly one partition column, got "
                                f"{len(partition_key)} ({', '.join(map(str, partition_key))})")
    name = partition_key[0]
    types = {column.name: column.type.upper() for column in columns}
    if name not in types:
        raise InvalidTableError(f"partition key column {show(name)} is not a column of the table")
    if types[name] != "STRING":
        raise InvalidTableError(f"auto-partition column {show(name)} is of type {types[name]}: it must be "
                                f"STRING (its values are times like 20261127)")


def to_create(auto: AutoPartition, now_ms: int) -> list[str]:
    """The values a check at ``now_ms`` makes exist: the current one and the next ``precreate - 1``, in
    order, each once (a repeated local hour is one value)."""
    values: dict[str, None] = {}
    for step in range(auto.precreate):
        if (value := _value_after(auto.unit, auto.time_zone, now_ms, step)) is None:
            break  # past the year 9999: no later value exists either
        values.setdefault(value)
    return list(values)


def retention_cutoff(auto: AutoPartition, now_ms: int) -> str | None:
    """The oldest value a check at ``now_ms`` keeps (the one ``retention`` units before the current one),
    or None when nothing is dropped (:data:`NO_RETENTION`). Values below it are expired."""
    if not auto.drops:
        return None
    cutoff = _value_after(auto.unit, auto.time_zone, now_ms, -auto.retention)
    return cutoff if cutoff is not None else "0" * auto.unit.width  # before year 1: every value is kept


def expired(auto: AutoPartition, now_ms: int, values: Iterable[str]) -> list[str]:
    """The ones of ``values`` (existing partitions) past retention at ``now_ms``: well-formed values of the
    unit below :func:`retention_cutoff`, oldest first, each once. A value that is not one of the unit's
    is never returned: what cannot be dated is not dropped."""
    cutoff = retention_cutoff(auto, now_ms)
    if cutoff is None:
        return []
    return sorted({value for value in values if value_problem(auto.unit, value) is None and value < cutoff})
