"""The job index's summary (`submit.job_index`): `jobs list` answers from one file and
reads again only the records that changed, whoever changed them; a summary that is
damaged or forged is rebuilt from the records. Correctness only, never timing."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from submit import job_index, jobs as records, resource
from tests.support.submit_cli import run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make(job_id: str, state: str = records.SUCCEEDED, **fields) -> records.JobRecord:
    record = records.JobRecord(job_id=job_id, state=state,
                               create_time=fields.pop("create_time", 1000.0),
                               training_input={"scaleTier": "BASIC"},
                               training_output={"trials": [{"trialId": "1"}]}, **fields)
    records.save(record)
    return record


def listed(capsys, *flags) -> list[list[str]]:
    status, out, err = run(capsys, "jobs", "list", *flags)
    assert status == 0, err
    return [line.split()[:2] for line in out.splitlines()[1:]]


def test_a_record_changed_by_another_process_is_seen(capsys):
    make("alpha", records.RUNNING, create_time=1.0)
    make("beta", create_time=2.0)
    assert listed(capsys) == [["alpha", "RUNNING"], ["beta", "SUCCEEDED"]]
    assert os.path.exists(job_index.summary_path())
    # Another process rewrites alpha and adds gamma through the record API, and
    # relabels beta as `jobs update` does.
    code = ("from submit import jobs, resource\n"
            "r = jobs.load('alpha'); r.state = 'FAILED'; r.labels = {'x': 'y'}\n"
            "jobs.save(r)\n"
            "g = jobs.JobRecord(job_id='gamma', state='QUEUED', create_time=3.0)\n"
            "jobs.save(g)\n"
            "resource.save_labels(jobs.load('beta'), {'team': 'vision'})\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": ROOT})
    assert listed(capsys) == [["alpha", "FAILED"], ["beta", "SUCCEEDED"],
                              ["gamma", "QUEUED"]]
    assert listed(capsys, "--filter", "labels.team=vision") == [["beta", "SUCCEEDED"]]
    assert listed(capsys, "--filter", "labels.x=y") == [["alpha", "FAILED"]]
    os.remove(records.index_path("beta"))
    assert listed(capsys) == [["alpha", "FAILED"], ["gamma", "QUEUED"]]


def test_an_edit_in_place_of_the_same_size_is_seen(capsys):
    make("alpha", records.SUCCEEDED)
    assert listed(capsys) == [["alpha", "SUCCEEDED"]]
    path = records.index_path("alpha")
    with open(path) as f:
        text = f.read()
    before = os.stat(path)
    with open(path, "w") as f:  # same inode, same size: an editor writing in place
        f.write(text.replace('"SUCCEEDED"', '"CANCELLED"'))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # even the same mtime
    assert listed(capsys) == [["alpha", "CANCELLED"]]  # the change time still moved


def test_the_summary_answers_without_reading_unchanged_records(capsys, monkeypatch):
    for i in range(5):
        make(f"job{i}", create_time=float(i))
    listed(capsys)
    read = []
    original = job_index._read_entry
    monkeypatch.setattr(job_index, "_read_entry",
                        lambda *a: read.append(a[1]) or original(*a))
    assert [row[0] for row in listed(capsys)] == [f"job{i}" for i in range(5)]
    assert read == []
    make("job2", records.FAILED, create_time=2.0)
    assert ["job2", "FAILED"] in listed(capsys)
    assert read == ["job2.json"]


@pytest.mark.parametrize("damage", ["truncated", "not-json", "digest", "forged-types",
                                    "folder", "other-version"])
def test_a_damaged_or_forged_summary_is_rebuilt(capsys, damage):
    make("alpha", records.RUNNING, create_time=1.0)
    make("beta", create_time=2.0, labels={"team": "text"})
    expected = listed(capsys)
    path = job_index.summary_path()
    with open(path, "rb") as f:
        head, _, body = f.read().partition(b"\n")
    if damage == "folder":
        os.remove(path)
        os.makedirs(path)
    else:
        if damage == "truncated":
            data = head + b"\n" + body[: len(body) // 2]
        elif damage == "not-json":
            data = b"\x00garbage\n{"
        elif damage == "digest":  # a hand edit of an entry
            data = head + b"\n" + body.replace(b'"RUNNING"', b'"QUEUED"')
        elif damage == "other-version":
            data = head.replace(b'"version": 1', b'"version": 99') + b"\n" + body
        else:  # a consistent digest over entries of the wrong shape
            import hashlib
            entries = json.loads(body)
            for n, entry in enumerate(entries.values()):
                entry["record"] = ({"job_id": 5, "colour": "red"} if n else
                                   {**entry["record"], "create_time": "yesterday"})
            body = json.dumps(entries).encode()
            data = json.dumps({"version": 1, "digest": hashlib.sha256(body).hexdigest()}
                              ).encode() + b"\n" + body
        with open(path, "wb") as f:
            f.write(data)
    status, out, err = run(capsys, "jobs", "list")
    assert status == 0 and err == ""
    assert [line.split()[:2] for line in out.splitlines()[1:]] == expected
    if damage != "folder":
        assert job_index.load_summary(path) is not None  # written whole again
    assert listed(capsys, "--filter", "labels.team=text") == [["beta", "SUCCEEDED"]]


def test_damaged_records_are_skipped_with_a_warning_every_time(capsys, caplog):
    make("good")
    with open(os.path.join(os.path.dirname(records.index_path("good")), "bad.json"),
              "w") as f:
        f.write("{not json")
    for _ in range(2):  # from the records, then from the summary: the same warning
        caplog.clear()
        assert listed(capsys) == [["good", "SUCCEEDED"]]
        assert [r.getMessage() for r in caplog.records if "bad.json" in r.getMessage()]


def test_the_summary_gives_what_list_shows_in_every_form(capsys, monkeypatch):
    make("alpha", records.RUNNING, create_time=1.0, labels={"team": "a"},
         job_dir="/data/alpha")
    make("beta", create_time=2.0, runner="vertex",
         engine={"name": "projects/p/locations/r/customJobs/7", "region": "r",
                 "secret": "x"})
    resource.save_labels(records.load("beta"), {"team": "b"})
    forms = [[], ["--uri"], ["--format", "json"], ["--format", "value(jobId,labels.team)"],
             ["--sort-by", "~jobId", "--limit", "1"], ["--page-size", "1"]]
    outputs = {}
    for index in ("1", "0"):
        monkeypatch.setenv(job_index.ENV, index)
        for form in forms:
            status, out, err = run(capsys, "jobs", "list", *form)
            assert status == 0, err
            outputs.setdefault(tuple(form), []).append(out)
    for form, (with_index, without) in outputs.items():
        assert with_index == without, form
    whole = json.loads(outputs[("--format", "json")][0])
    assert whole[0]["trainingInput"] == {"scaleTier": "BASIC"}  # the whole record
    assert whole[1]["labels"] == {"team": "b"}


def test_page_size_must_be_positive(capsys):
    status, _, err = run(capsys, "jobs", "list", "--page-size", "0")
    assert status == 2 and "--page-size 0 must be 1 or more" in err
