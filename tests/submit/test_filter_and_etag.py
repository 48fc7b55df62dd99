"""`jobs list --filter` in gcloud's expression language as users write it (!=, <, >,
<=, >=, ~, OR, NOT, parentheses, labels.KEY:*), and the Job resource's `etag` that
`jobs update --etag` checks."""
from __future__ import annotations

import json
import time

import pytest

from submit import jobs
from tests.support.submit_cli import at_once, one_error_line, run

T0 = 1610737200.0  # 2021-01-15T19:00:00Z


@pytest.fixture
def index():
    rows = [("census_1", "SUCCEEDED", {"owner": "ana"}, 0),
            ("census_2", "FAILED", {"owner": "bo", "stage": "dev"}, 3600),
            ("census_10", "RUNNING", {}, 7200),
            ("speech_1", "QUEUED", {"stage": "prod"}, 10800)]
    for job_id, state, labels, offset in rows:
        jobs.save(jobs.JobRecord(job_id, state=state, create_time=T0 + offset,
                                 labels=labels))


def listed(capsys, text):
    status, out, err = run(capsys, "jobs", "list", "--filter", text, "--format",
                           "value(jobId)")
    assert status == 0, err
    return out.split()


@pytest.mark.parametrize("text, want", [
    ("state!=FAILED", ["census_1", "census_10", "speech_1"]),
    ("createTime>2021-01-15T19:00:00 AND state!=FAILED", ["census_10", "speech_1"]),
    ("createTime>=2021-01-15T20:00:00Z", ["census_2", "census_10", "speech_1"]),
    ("createTime<2021-01-15T20:00:00+00:00", ["census_1"]),
    ("createTime<=2021-01-15T20:00:00", ["census_1", "census_2"]),
    ("labels.owner:*", ["census_1", "census_2"]),
    ("NOT labels.owner:*", ["census_10", "speech_1"]),
    ("-labels.owner:*", ["census_10", "speech_1"]),
    ("state=RUNNING OR state=QUEUED", ["census_10", "speech_1"]),
    ("(state=RUNNING OR state=QUEUED) AND NOT labels.stage=prod", ["census_10"]),
    ("state:(running queued)", ["census_10", "speech_1"]),
    ("jobId~^census_[0-9]$", ["census_1", "census_2"]),
    ("jobId!~census", ["speech_1"]),
    ("labels.owner>an", ["census_1", "census_2"]),
    ("labels.stage!=dev", ["census_1", "census_10", "speech_1"]),  # no label: not dev
    ("jobId:census_1* labels.owner=ana", ["census_1"]),  # adjacent terms: AND
    ("labels.owner='ana'", ["census_1"]),
])
def test_gclouds_filter_expressions(capsys, index, text, want):
    assert listed(capsys, text) == want


@pytest.mark.parametrize("text, words", [
    ("state=RUNNING AND jobId:c* OR state=QUEUED", "AND and OR side by side need "
                                                   "parentheses"),
    ("(state=RUNNING", "a ( is not closed"),
    ("state=RUNNING)", "unexpected ')'"),
    ("createTime>yesterday", "'yesterday' is not a time"),
    ("jobId~[a-", "not a regular expression"),
    ("jobId~'(?=a)'", "not a regular expression RE2 takes"),
    ("jobId~a{4294967296}", "counts past 1000"),
    ("jobId~'(a{999}){999}'", "not a regular expression RE2 takes"),
    ("(" * 1000 + "state=RUNNING" + ")" * 1000, "nested too deep"),
    ("NOT " * 1000 + "state=RUNNING", "nested too deep"),
    ("state=RUNNING AND", "a term is missing at its end"),
    ("state='RUNNING", "unclosed quote"),
    ("colour!=red", "unknown field 'colour'"),
])
def test_filter_mistakes_are_one_line(capsys, index, text, words):
    status, out, err = run(capsys, "jobs", "list", "--filter", text)
    assert status == 2 and out == ""
    assert words in one_error_line(err)


def test_etag_changes_with_the_job_and_update_checks_it(capsys, index):
    def etag():
        status, out, err = run(capsys, "jobs", "describe", "census_1", "--format", "json")
        assert status == 0, err
        return json.loads(out)["etag"]
    first = etag()
    assert first == etag() and len(first) == 12  # 8 bytes, base64
    status, _, err = run(capsys, "jobs", "update", "census_1", "--update-labels",
                         "stage=prod", "--etag", first)
    assert status == 0, err
    second = etag()
    assert second != first  # the labels changed: so did the etag
    status, out, err = run(capsys, "jobs", "update", "census_1", "--update-labels",
                           "stage=dev", "--etag", first)  # read before the change
    assert status == 1 and "the job changed since it was read" in one_error_line(err)
    assert etag() == second  # refused: nothing changed


@pytest.mark.parametrize("text", ["jobId~a{4294967296}", "(" * 1000 + "state=RUNNING",
                                  "NOT " * 1000 + "jobId:*", "jobId~'(?<=a)b'"])
def test_list_jobs_says_the_same_one_line(index, text):
    """The API raises its own UsageError (submit.errors'), never RecursionError or
    OverflowError from the parser or the pattern's compiler."""
    from submit import api
    with pytest.raises(api.UsageError) as caught:
        api.list_jobs(filter=text)
    assert "\n" not in str(caught.value) and str(caught.value).startswith("--filter")


@pytest.mark.parametrize("pattern", ["^((a+))+$", "^(a|a|a|a|a|a|a|a)*$",
                                     "^(a|aa|aaa|aaaa|a|aa|aaa|aaaa)+$", "^((a*)*)*$"])
def test_patterns_that_backtracked_for_minutes_finish_at_once(capsys, index, pattern):
    """Python's re took 58 s to 23 minutes on each over a 61-character label; RE2 is
    linear in the value (a generous bound, not a measurement)."""
    for i in range(20):
        jobs.save(jobs.JobRecord(f"redos_{i}", state="SUCCEEDED",
                                 labels={"k": "a" * 60 + "b"}))
    started = time.monotonic()
    assert listed(capsys, f"labels.k~'{pattern}'") == []
    assert listed(capsys, f"labels.k!~'{pattern}'")[:1] == ["census_1"]
    assert time.monotonic() - started < 5


def test_an_etag_is_a_compare_and_set(index):
    """Two `jobs update --etag E` at once, 20 times: exactly one succeeds each time, and
    every label an update reported written is there at the end."""
    from submit import resource
    written: dict[str, str] = {}
    for round_ in range(20):
        etag = resource.job(jobs.load("census_2"))["etag"]
        codes = at_once([["jobs", "update", "census_2", "--update-labels",
                                  f"{who}{round_}=x", "--etag", etag] for who in "ab"])
        assert sorted(codes) == [0, 1], (round_, codes)
        written[f"{'ab'[codes.index(0)]}{round_}"] = "x"
        labels = resource.current_labels(jobs.load("census_2"))
        assert written.items() <= labels.items(), (round_, labels)
        assert f"{'ab'[codes.index(1)]}{round_}" not in labels
