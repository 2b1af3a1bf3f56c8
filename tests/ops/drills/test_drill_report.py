"""The drill report: a check fails on any violation, and the exit code follows the checks."""

import io
import json

import pytest

from kvlease.ops.drills import EXIT_OK, EXIT_VIOLATED, Check, Report, finish, render

pytestmark = pytest.mark.unit


def test_a_check_with_a_violation_fails_the_report_and_the_exit_code():
    report = Report("x", figures={"recovery_s": [1.25, 2.5]})
    report.add(Check.of("leases read back as acknowledged", [], checked=16))
    assert report.ok and finish(report, False, io.StringIO()) == EXIT_OK
    report.add(Check.of("no leased file deleted", ["kv/1/0/snap-3/000009.sst is gone"], checked=4))
    out = io.StringIO()
    assert not report.ok and finish(report, False, out) == EXIT_VIOLATED
    text = out.getvalue()
    assert "drill x: FAIL" in text and "[VIOLATED] no leased file deleted (4 checked)" in text
    assert "kv/1/0/snap-3/000009.sst is gone" in text and "recovery_s: 1.250, 2.500" in text


def test_json_is_one_document_and_many_reports_fail_together():
    good, bad = Report("a"), Report("b", [Check.of("c", ["v"])])
    out = io.StringIO()
    assert finish([good, bad], True, out) == EXIT_VIOLATED
    doc = json.loads(out.getvalue())
    assert doc["ok"] is False and [d["ok"] for d in doc["drills"]] == [True, False]
    assert doc["drills"][1]["checks"] == [{"name": "c", "ok": False, "checked": 0, "violations": ["v"]}]


def test_long_violation_lists_are_cut_in_text():
    text = render(Report("x", [Check.of("c", [f"v{i}" for i in range(25)])]))
    assert "v9" in text and "v10" not in text and "and 15 more" in text


def test_a_skipped_drill_counts_as_ok_and_says_why():
    skipped = Report("zk-leader-loss", skipped="needs --zk-nodes 3")
    assert skipped.ok and render(skipped) == "drill zk-leader-loss: SKIPPED (needs --zk-nodes 3)"
    out = io.StringIO()
    assert finish([skipped, Report("a")], True, out) == EXIT_OK
    assert json.loads(out.getvalue())["drills"][0]["skipped"] == "needs --zk-nodes 3"


def test_a_report_reads_back_from_its_json():
    report = Report("x", [Check.of("c", ["v"], checked=3), Check.of("d", [], 2)], {"recovery_s": [1.5]})
    again = Report.from_dict(json.loads(json.dumps(report.as_dict())))
    assert again == report and not again.ok
    # a document that says it failed without a failed check still fails
    assert not Report.from_dict({"drill": "y", "ok": False, "checks": []}).ok
