"""Auto-partitioning arithmetic (common/auto_partition.py): units and their values, time zones, what a
check creates and drops (Fluss's num-precreate and num-retention), calendar boundaries and DST. The clock
is plain epoch milliseconds."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from kvlease.common import errors
from kvlease.common.auto_partition import (NO_RETENTION, AutoPartition, TimeUnit, check_auto_partition_key,
                                           expired, retention_cutoff, to_create, value_at, value_problem)
from kvlease.common.tables import Column

pytestmark = pytest.mark.unit

S, H, D, MO, Q, Y = (TimeUnit.SECOND, TimeUnit.HOUR, TimeUnit.DAY, TimeUnit.MONTH, TimeUnit.QUARTER,
                     TimeUnit.YEAR)


def utc_ms(*fields: int) -> int:
    """Epoch milliseconds of a UTC wall-clock time (year, month, day[, hour, minute, second])."""
    return int(datetime(*fields, tzinfo=timezone.utc).timestamp()) * 1000


# -- units and values ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, unit", [("DAY", D), ("day", D), ("Hour", H), ("second", S), ("qUaRtEr", Q),
                                        ("month", MO), ("YEAR", Y), (H, H)])
def test_a_unit_is_parsed_whatever_its_case(text, unit):
    assert TimeUnit.parse(text) is unit


@pytest.mark.parametrize("text", ["days", "minute", "", " DAY", None, 3])
def test_an_unknown_unit_is_refused_listing_the_units(text):
    with pytest.raises(errors.InvalidTableError, match="one of SECOND, HOUR, DAY, MONTH, QUARTER, YEAR"):
        TimeUnit.parse(text)


def test_a_misspelt_unit_is_offered_the_close_one():
    with pytest.raises(errors.InvalidTableError, match="did you mean 'HOUR'"):
        TimeUnit.parse("hours")


@pytest.mark.parametrize("unit, value", [(S, "20261127134530"), (H, "2026112713"), (D, "20261127"),
                                         (MO, "202611"), (Q, "20264"), (Y, "2026")])
def test_each_unit_formats_an_instant(unit, value):
    assert value_at(unit, "UTC", utc_ms(2026, 11, 27, 13, 45, 30) + 999) == value
    assert unit.example == value and len(value) == unit.width


@pytest.mark.parametrize("month, quarter", [(1, "1"), (3, "1"), (4, "2"), (6, "2"), (7, "3"), (9, "3"), (10, "4"),
                                            (12, "4")])
def test_a_quarter_is_its_months_quarter(month, quarter):
    assert value_at(Q, "UTC", utc_ms(2026, month, 15)) == "2026" + quarter


def test_an_instant_belongs_to_the_partition_it_falls_in_before_1970_too():
    assert value_at(S, "UTC", utc_ms(2026, 1, 1) - 1) == "20251231235959"
    assert value_at(D, "UTC", -1) == "19691231"
    assert value_at(D, "UTC", 0) == "19700101"


def test_the_same_instant_is_another_day_in_another_time_zone():
    late_evening_utc = utc_ms(2026, 11, 27, 16, 30)
    assert value_at(D, "UTC", late_evening_utc) == "20261127"
    assert value_at(D, "Asia/Tokyo", late_evening_utc) == "20261128"  # 01:30 in Tokyo
    early_morning_utc = utc_ms(2026, 11, 27, 2, 0)
    assert value_at(D, "America/New_York", early_morning_utc) == "20261126"  # 21:00 the day before
    assert value_at(H, "Asia/Kolkata", utc_ms(2026, 11, 27, 13, 45)) == "2026112719"  # UTC+5:30
    assert value_at(Y, "Pacific/Kiritimati", utc_ms(2026, 12, 31, 10, 30)) == "2027"  # UTC+14


# -- well-formed values --------------------------------------------------------------------------------------

@pytest.mark.parametrize("unit, value", [(S, "20261127235959"), (H, "2026112700"), (H, "2026112723"),
                                         (D, "20280229"), (D, "20001231"), (MO, "202612"), (Q, "20261"),
                                         (Q, "20264"), (Y, "0001"), (Y, "9999")])
def test_a_real_time_of_the_unit_is_a_value(unit, value):
    assert value_problem(unit, value) is None


@pytest.mark.parametrize("unit, value", [
    (D, "2026-11-27"), (D, "2026112"), (D, "202611270"), (D, ""), (D, "2026112a"), (D, "２０２６１１２７"),
    (D, "20261301"), (D, "20261100"), (D, "20261131"), (D, "20270229"), (D, "19000229"), (D, "00001231"),
    (H, "2026112724"), (S, "20261127236000"), (S, "20261127235960"), (MO, "202613"), (MO, "202600"),
    (Q, "20260"), (Q, "20265"), (Q, "00004"), (Y, "0000"), (Y, "202"), (D, 20261127), (D, None),
    (D, " 20261127"), (D, "20261127\n"),
])
def test_anything_else_is_refused_naming_the_format(unit, value):
    problem = value_problem(unit, value)
    assert problem is not None and f"for a {unit.name} auto-partitioned table: expected {unit.format}" in problem
    assert "\n" not in problem


def test_the_problem_of_a_day_value_reads_as_documented():
    assert value_problem(D, "2026-11-27") == ("bad partition value '2026-11-27' for a DAY auto-partitioned "
                                              "table: expected yyyyMMdd, e.g. 20261127")


# -- num-precreate ----------------------------------------------------------------------------------------------

def test_precreate_makes_the_current_partition_and_the_next_ones_as_fluss_does():
    # Fluss's num-precreate: at 2024-11-11 with DAY and 3, 20241111, 20241112, 20241113.
    assert to_create(AutoPartition(D, precreate=3), utc_ms(2024, 11, 11, 9)) == ["20241111", "20241112", "20241113"]
    assert to_create(AutoPartition(D), utc_ms(2024, 11, 11, 9)) == ["20241111", "20241112"]  # default 2


def test_precreate_0_makes_none():
    assert to_create(AutoPartition(D, precreate=0), utc_ms(2024, 11, 11)) == []


@pytest.mark.parametrize("auto, now, values", [
    (AutoPartition(MO, precreate=3), utc_ms(2026, 12, 31, 23, 59), ["202612", "202701", "202702"]),
    (AutoPartition(MO, precreate=2), utc_ms(2026, 1, 31), ["202601", "202602"]),  # no 31 February needed
    (AutoPartition(Q, precreate=3), utc_ms(2026, 11, 1), ["20264", "20271", "20272"]),
    (AutoPartition(Y, precreate=2), utc_ms(2026, 12, 31, 23, 59, 59), ["2026", "2027"]),
    (AutoPartition(D, precreate=3), utc_ms(2026, 12, 31), ["20261231", "20270101", "20270102"]),
    (AutoPartition(D, precreate=3), utc_ms(2028, 2, 28), ["20280228", "20280229", "20280301"]),
    (AutoPartition(D, precreate=2), utc_ms(2027, 2, 28), ["20270228", "20270301"]),
    (AutoPartition(H, precreate=3), utc_ms(2026, 12, 31, 23, 10), ["2026123123", "2027010100", "2027010101"]),
    (AutoPartition(S, precreate=3), utc_ms(2026, 12, 31, 23, 59, 59), ["20261231235959", "20270101000000",
                                                                      "20270101000001"]),
])
def test_precreate_steps_across_calendar_boundaries(auto, now, values):
    assert to_create(auto, now) == values


def test_precreate_counts_in_the_tables_time_zone():
    now = utc_ms(2026, 11, 27, 16, 30)  # 01:30 on the 28th in Tokyo
    assert to_create(AutoPartition(D, precreate=2, time_zone="Asia/Tokyo"), now) == ["20261128", "20261129"]
    assert to_create(AutoPartition(D, precreate=2), now) == ["20261127", "20261128"]


def test_precreate_stops_at_the_last_year_a_value_can_name():
    assert to_create(AutoPartition(Y, precreate=5), utc_ms(9998, 6, 1)) == ["9998", "9999"]


# -- num-retention ----------------------------------------------------------------------------------------------

def test_retention_keeps_the_partitions_before_the_current_one_as_fluss_does():
    # Fluss's num-retention: at 2024-11-11 with DAY and 3, 20241108-20241110 are kept, earlier ones dropped.
    auto = AutoPartition(D, retention=3)
    now = utc_ms(2024, 11, 11, 12)
    existing = ["20241112", "20241111", "20241110", "20241109", "20241108", "20241107", "20241031", "20231225"]
    assert retention_cutoff(auto, now) == "20241108"
    assert expired(auto, now, existing) == ["20231225", "20241031", "20241107"]


def test_default_retention_is_7():
    assert retention_cutoff(AutoPartition(D), utc_ms(2024, 11, 11)) == "20241104"


def test_retention_0_keeps_only_the_current_partition_and_later():
    auto = AutoPartition(H, retention=0)
    now = utc_ms(2026, 11, 27, 13, 59, 59)
    assert retention_cutoff(auto, now) == "2026112713"
    assert expired(auto, now, ["2026112712", "2026112713", "2026112714"]) == ["2026112712"]


@pytest.mark.parametrize("retention", [NO_RETENTION, -5])
def test_a_negative_retention_drops_nothing(retention):
    auto = AutoPartition(D, retention=retention)
    assert not auto.drops and retention_cutoff(auto, utc_ms(2026, 11, 27)) is None
    assert expired(auto, utc_ms(2026, 11, 27), ["19991231", "20000101", "20261126"]) == []


@pytest.mark.parametrize("auto, now, cutoff", [
    (AutoPartition(MO, retention=2), utc_ms(2027, 1, 10), "202611"),
    (AutoPartition(Q, retention=1), utc_ms(2027, 2, 1), "20264"),
    (AutoPartition(Q, retention=4), utc_ms(2027, 2, 1), "20261"),
    (AutoPartition(Y, retention=1), utc_ms(2027, 1, 1), "2026"),
    (AutoPartition(D, retention=1), utc_ms(2028, 3, 1), "20280229"),
    (AutoPartition(D, retention=1), utc_ms(2027, 3, 1), "20270228"),
    (AutoPartition(D, retention=1), utc_ms(2027, 1, 1), "20261231"),
    (AutoPartition(H, retention=2), utc_ms(2027, 1, 1, 1), "2026123123"),
    (AutoPartition(S, retention=1), utc_ms(2027, 1, 1), "20261231235959"),
])
def test_retention_steps_back_across_calendar_boundaries(auto, now, cutoff):
    assert retention_cutoff(auto, now) == cutoff


def test_expired_is_oldest_first_each_once_and_never_what_it_cannot_date():
    auto = AutoPartition(D, retention=1)
    now = utc_ms(2026, 11, 27)
    existing = ["20261101", "2026-11-01", "manual", "20261301", "2026110", "202611011", "19991231", "20261101",
                "00000101", 20261101, None, "２０２６１１０１"]
    assert expired(auto, now, existing) == ["19991231", "20261101"]


def test_values_past_the_cutoff_are_kept_even_far_in_the_future():
    auto = AutoPartition(D, retention=0)
    assert expired(auto, utc_ms(2026, 11, 27), ["20261127", "20261128", "99991231"]) == []


def test_a_retention_reaching_before_year_1_keeps_every_value():
    auto = AutoPartition(Y, retention=5000)
    assert expired(auto, utc_ms(2026, 1, 1), ["0001", "1000", "2025"]) == []


def test_retention_counts_in_the_tables_time_zone():
    now = utc_ms(2026, 11, 27, 16, 30)  # the 28th in Tokyo
    assert retention_cutoff(AutoPartition(D, retention=1, time_zone="Asia/Tokyo"), now) == "20261127"
    assert retention_cutoff(AutoPartition(D, retention=1), now) == "20261126"


# -- daylight-saving changes (Europe/Berlin: 2026-03-29 02:00 -> 03:00; 2026-10-25 03:00 -> 02:00) -----------

BERLIN_HOURS = AutoPartition(H, precreate=3, retention=1, time_zone="Europe/Berlin")


def test_spring_forward_skips_the_local_hour_that_does_not_exist():
    before = utc_ms(2026, 3, 29, 0, 30)  # 01:30 CET
    assert value_at(H, "Europe/Berlin", before) == "2026032901"
    assert to_create(BERLIN_HOURS, before) == ["2026032901", "2026032903", "2026032904"]
    after = utc_ms(2026, 3, 29, 1, 30)  # 03:30 CEST, one hour later
    assert value_at(H, "Europe/Berlin", after) == "2026032903"
    assert retention_cutoff(BERLIN_HOURS, after) == "2026032901"
    assert expired(BERLIN_HOURS, after, ["2026032900", "2026032901", "2026032903"]) == ["2026032900"]


def test_fall_back_makes_both_instants_of_the_repeated_hour_one_partition():
    first, second = utc_ms(2026, 10, 25, 0, 30), utc_ms(2026, 10, 25, 1, 30)  # 02:30 CEST, then 02:30 CET
    assert value_at(H, "Europe/Berlin", first) == value_at(H, "Europe/Berlin", second) == "2026102502"
    assert to_create(BERLIN_HOURS, first) == ["2026102502", "2026102503"]  # the repeated hour once
    assert to_create(BERLIN_HOURS, second) == ["2026102502", "2026102503", "2026102504"]
    # one hour back from the second 02:30 is the first: retention 1 keeps no earlier hour then
    assert retention_cutoff(BERLIN_HOURS, second) == "2026102502"
    assert expired(BERLIN_HOURS, second, ["2026102501", "2026102502"]) == ["2026102501"]


def test_fall_back_in_new_york_too():
    auto = AutoPartition(H, precreate=2, time_zone="America/New_York")  # 2026-11-01 02:00 EDT -> 01:00 EST
    first, second = utc_ms(2026, 11, 1, 5, 10), utc_ms(2026, 11, 1, 6, 10)  # 01:10 EDT, 01:10 EST
    assert value_at(H, "America/New_York", first) == value_at(H, "America/New_York", second) == "2026110101"
    assert to_create(auto, first) == ["2026110101"]
    assert to_create(auto, second) == ["2026110101", "2026110102"]


def test_days_step_on_the_calendar_across_a_daylight_saving_change():
    # 24 hours are not a day there: stepping the instant would skip or repeat a date.
    auto = AutoPartition(D, precreate=2, retention=1, time_zone="Europe/Berlin")
    before_the_23_hour_day = utc_ms(2026, 3, 28, 22, 30)  # 23:30 CET on the 28th; +24 h is 00:30 on the 30th
    assert to_create(auto, before_the_23_hour_day) == ["20260328", "20260329"]
    after_the_23_hour_day = utc_ms(2026, 3, 29, 22, 30)  # 00:30 CEST on the 30th; -24 h is 23:30 on the 28th
    assert retention_cutoff(auto, after_the_23_hour_day) == "20260329"
    end_of_the_25_hour_day = utc_ms(2026, 10, 25, 22, 30)  # 23:30 CET on the 25th; -24 h is 00:30 on the 25th
    assert retention_cutoff(auto, end_of_the_25_hour_day) == "20261024"


# -- a fake clock: a SECOND table as the streaming tests use it -------------------------------------------------

def test_checks_each_second_keep_a_sliding_window_of_partitions():
    auto = AutoPartition(S, precreate=2, retention=3)
    start = utc_ms(2026, 11, 27, 23, 59, 58)
    existing: set[str] = set()
    for tick in range(5):
        now = start + tick * 1000 + 250
        existing -= set(expired(auto, now, existing))
        existing |= set(to_create(auto, now))
    # at 00:00:02 (the last check): 3 before it, it, and the next one
    assert sorted(existing) == ["20261127235959", "20261128000000", "20261128000001", "20261128000002",
                                "20261128000003"]


# -- settings ------------------------------------------------------------------------------------------------

def test_settings_default_as_in_fluss():
    auto = AutoPartition(D)
    assert (auto.precreate, auto.retention, auto.time_zone) == (2, 7, "UTC")


@pytest.mark.parametrize("kwargs, message", [
    (dict(precreate=-1), "num-precreate must be 0 or more, got -1"),
    (dict(precreate=True), "num-precreate must be an integer, got True"),
    (dict(precreate=2.0), "num-precreate must be an integer, got 2.0"),
    (dict(retention="7"), "num-retention must be an integer, got '7'"),
    (dict(time_zone="Europe"), "time-zone 'Europe': it must be an IANA time zone name like Europe/Berlin"),
    (dict(time_zone="europe/berlin"), "time-zone 'europe/berlin'"),
    (dict(time_zone="Mars/Olympus"), "time-zone 'Mars/Olympus'"),
    (dict(time_zone=""), "time-zone ''"),
    (dict(time_zone="../etc/passwd"), "time-zone '../etc/passwd'"),
    (dict(time_zone="/usr/share/zoneinfo/UTC"), "time-zone '/usr/share/zoneinfo/UTC'"),
    (dict(time_zone="Europe/Berlin\n"), "time-zone 'Europe/Berlin\\\\n'"),
    (dict(time_zone="A" * 300), "time-zone 'AAAA"),
    (dict(time_zone=None), "time-zone None"),
])
def test_bad_settings_are_refused_naming_the_setting(kwargs, message):
    with pytest.raises(errors.InvalidTableError, match=message) as raised:
        AutoPartition(D, **kwargs)
    assert "\n" not in str(raised.value)


def test_a_unit_must_be_a_time_unit():
    with pytest.raises(errors.InvalidTableError, match="time-unit 'DAY' is not a TimeUnit"):
        AutoPartition("DAY")  # type: ignore[arg-type]


@pytest.mark.parametrize("time_zone", ["UTC", "Europe/Berlin", "America/Argentina/Buenos_Aires", "Etc/GMT+5"])
def test_iana_names_are_time_zones(time_zone):
    assert AutoPartition(D, time_zone=time_zone).time_zone == time_zone


@pytest.mark.parametrize("auto, fits, too_small", [
    (AutoPartition(D), 10, 9),  # 2 + 7 + 1
    (AutoPartition(D, precreate=0, retention=0), 1, 0),
    (AutoPartition(D, precreate=2, retention=NO_RETENTION), 3, 2),  # only the pre-created must fit
])
def test_check_fits_bounds_the_partitions_auto_partitioning_keeps(auto, fits, too_small):
    auto.check_fits(fits)
    with pytest.raises(errors.InvalidTableError, match=f"keeps up to {fits} partitions.*at most {too_small}"):
        auto.check_fits(too_small)


def test_settings_round_trip_through_json():
    auto = AutoPartition(Q, precreate=0, retention=NO_RETENTION, time_zone="Asia/Tokyo")
    data = auto.to_json()
    assert data == {"unit": "QUARTER", "precreate": 0, "retention": -1, "time_zone": "Asia/Tokyo"}
    assert AutoPartition.from_json(data) == auto
    assert AutoPartition.from_json({"unit": "hour"}) == AutoPartition(H, 2, 7, "UTC")


@pytest.mark.parametrize("data, message", [
    ({}, "expected a mapping with a unit"),
    (["DAY"], "expected a mapping with a unit"),
    ({"unit": "WEEK"}, "unknown table.auto-partition.time-unit 'WEEK'"),
    ({"unit": "DAY", "precreate": -3}, "num-precreate must be 0 or more"),
    ({"unit": "DAY", "time_zone": "Nowhere"}, "time-zone 'Nowhere'"),
])
def test_bad_stored_settings_are_refused(data, message):
    with pytest.raises(errors.InvalidTableError, match=message):
        AutoPartition.from_json(data)


# -- the auto-partition column ---------------------------------------------------------------------------------

COLUMNS = (Column("day", "STRING"), Column("region", "STRING"), Column("n", "INT"), Column("id", "BIGINT"))


def test_an_auto_partitioned_table_is_partitioned_by_one_string_column():
    check_auto_partition_key(COLUMNS, ("day",))


@pytest.mark.parametrize("partition_key, message", [
    ((), "exactly one partition column, got 0"),
    (("region", "day"), r"exactly one partition column, got 2 \(region, day\)"),
    (("n",), "auto-partition column 'n' is of type INT: it must be STRING"),
    (("nope",), "'nope' is not a column of the table"),
    ("day", "must be a list of column names, not a string"),
])
def test_any_other_partition_key_is_refused_for_auto_partitioning(partition_key, message):
    with pytest.raises(errors.InvalidTableError, match=message):
        check_auto_partition_key(COLUMNS, partition_key)
