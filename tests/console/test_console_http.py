"""The console over real HTTP (`python -m submit console` in its own process, httpx as the
client): cancel refused from any origin but its own and without the page's token, a
foreign Host refused, hostile ids, filters and task names answered with one line, logs as
server-sent events resumed by Last-Event-ID, values escaped, and the command's own errors."""
from __future__ import annotations

import re
import socket
import subprocess
import sys

import httpx
import pytest

from submit import jobs as records
from tests.support.browser import start_console
from tests.support.common import ROOT


def stored_job(tmp_path, job_id="fake01", state=records.RUNNING, **fields):
    """A record in the index as a local job whose supervisor is gone leaves it."""
    log_dir = tmp_path / job_id / "logs"
    log_dir.mkdir(parents=True)
    (log_dir / "master-replica-0.log").write_text("".join(
        f"INFO\t2026-11-25 12:00:0{i} +0000\tmaster-replica-0\tline {i}\n"
        for i in range(1, 4)))
    (log_dir / "worker-replica-0.log").write_text(
        "INFO\t2026-11-25 12:00:05 +0000\tworker-replica-0\tworker line\n")
    record = records.JobRecord(job_id=job_id, state=state, runner="local",
                               job_dir=str(tmp_path / job_id), log_dir=str(log_dir), replicas=[
                                   records.ReplicaRecord("master-replica-0", state="RUNNING"),
                                   records.ReplicaRecord("worker-replica-0", state="RUNNING")],
                               **fields)
    records.save(record)
    return record


@pytest.fixture
def console(tmp_path, reaper):
    url = start_console(reaper, tmp_path / "console.log")
    with httpx.Client(base_url=url, timeout=30) as client:
        yield url, client


def token_of(client, job_id) -> str:
    page = client.get(f"/jobs/{job_id}")
    assert page.status_code == 200
    return re.search(r'name=csrf value="([^"]+)"', page.text)[1]


def test_cancel_only_from_its_own_page(tmp_path, console):
    url, client = console
    stored_job(tmp_path)
    token = token_of(client, "fake01")
    refused = [
        ({"Origin": "http://evil.example"}, {"csrf": token}),          # another site
        ({"Origin": url.replace("127.0.0.1", "localhost")}, {"csrf": token}),  # not its own
        ({}, {"csrf": token}),                                         # no origin at all
        ({"Referer": "http://evil.example/jobs/fake01"}, {"csrf": token}),
        ({"Origin": url}, {}),                                         # no token
        ({"Origin": url}, {"csrf": token[:-1] + ("A" if token[-1] != "A" else "B")}),
    ]
    for headers, form in refused:
        answer = client.post("/jobs/fake01/cancel", headers=headers, data=form)
        assert answer.status_code == 403, (headers, form)
        assert "Refused" in answer.text
        assert records.load("fake01").state == records.RUNNING  # nothing was done
    # a token from another console run is stale
    answer = client.post("/jobs/fake01/cancel", headers={"Origin": url},
                         data={"csrf": "x" * 43})
    assert answer.status_code == 403
    # its own page's form, with a Referer instead of an Origin
    answer = client.post("/jobs/fake01/cancel", headers={"Referer": f"{url}/jobs/fake01"},
                         data={"csrf": token})
    assert answer.status_code == 303 and answer.headers["location"] == "/jobs/fake01"
    assert records.load("fake01").state == records.CANCELLED
    again = client.post("/jobs/fake01/cancel", headers={"Origin": url}, data={"csrf": token})
    assert again.status_code == 409 and "already ended CANCELLED" in again.text
    # the ended job's page has no cancel form
    assert "name=csrf" not in client.get("/jobs/fake01").text


def test_foreign_hosts_and_hostile_requests(tmp_path, console):
    url, client = console
    stored_job(tmp_path, labels={"team": "<script>alert(1)</script>"})
    # DNS rebinding: a page of another name resolving to 127.0.0.1
    assert client.get("/", headers={"Host": "evil.example"}).status_code == 421
    assert client.get("/jobs/fake01", headers={"Host": "evil.example:80"}).status_code == 421
    page = client.get("/")
    assert "<script>alert" not in page.text and "&lt;script&gt;alert(1)" in page.text
    assert page.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    bad = client.get("/", params={"filter": "colour=blue"})
    assert bad.status_code == 400 and "unknown field &#x27;colour&#x27;" in bad.text
    assert client.get("/", params={"filter": "state=RUNNING"}).text.count(
        'data-job="fake01"') == 1
    assert client.get("/rows", params={"filter": "state=FAILED"}).text.count("fake01") == 0
    for job_id in ("nosuch", "bad%20id", "x" * 200, "..%2F..%2Fetc"):
        answer = client.get(f"/jobs/{job_id}")
        assert answer.status_code == 404, job_id
        assert "Traceback" not in answer.text
    assert client.get("/jobs/nosuch/logs").status_code == 404
    # a batch prediction job's progress, from its predictionOutput (int64 strings)
    records.save(records.JobRecord(job_id="batch01", state=records.RUNNING, runner="local",
                                   prediction_output={
                                       "predictionCount": "28", "errorCount": "2",
                                       "outputPath": "/out/<b>",
                                       "progress": {"instancesDone": 30,
                                                    "instancesTotal": 120}}))
    page = client.get("/jobs/batch01").text
    assert '<progress max="120" value="30"></progress> 30 of 120' in page
    assert "<th>errorCount</th><td>2</td>" in page and "/out/&lt;b&gt;" in page
    assert "<progress" not in client.get("/jobs/fake01").text
    bad = client.get("/jobs/fake01/logs", params={"task": "chief-replica-9"})
    assert bad.status_code == 400
    assert "names no replica of job fake01; use one of master-replica-0" in bad.text


def test_logs_as_server_sent_events(tmp_path, console):
    _, client = console
    stored_job(tmp_path, job_id="done01", state=records.SUCCEEDED)

    def events(**kwargs):
        with client.stream("GET", "/jobs/done01/logs", **kwargs) as answer:
            assert answer.status_code == 200
            assert answer.headers["content-type"].startswith("text/event-stream")
            return answer.read().decode()

    text = events()
    assert text.count("data: INFO\t") == 4
    assert "id: 1\ndata: INFO\t2026-11-25 12:00:01 +0000\tmaster-replica-0\tline 1" in text
    assert text.rstrip().endswith("event: end\ndata: SUCCEEDED")
    only = events(params={"task": "worker-replica-0"})
    assert "worker line" in only and "line 1" not in only
    resumed = events(params={"task": "master-replica-0"}, headers={"Last-Event-ID": "2"})
    assert "line 1" not in resumed and "line 2" not in resumed
    assert "id: 3\ndata: INFO\t2026-11-25 12:00:03 +0000\tmaster-replica-0\tline 3" in resumed
    # a Last-Event-ID that is no ASCII number streams from the start (`²` was a 500)
    for bad in (b"\xb2", b"1\xb2", "\uff13".encode(), b"-1", b"1e3", b"9" * 12):
        again = events(params={"task": "master-replica-0"}, headers={"Last-Event-ID": bad})
        assert "id: 1\ndata: INFO\t2026-11-25 12:00:01 +0000\tmaster-replica-0\tline 1" \
            in again, bad
    # a hand-edited log_dir outside the job's own folders is not read
    record = records.load("done01")
    record.log_dir = str(tmp_path / "done01" / "logs" / ".." / ".." / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "master-replica-0.log").write_text("SECRET\n")
    records.save(record)
    text = events()
    assert "SECRET" not in text and "none of the job's own folders" in text


def test_the_list_shows_and_filters_current_labels(tmp_path, console):
    """Labels changed by `jobs update` after the job was written are the ones the list
    shows and filters on, as `jobs list` does (both read the index's summary)."""
    _, client = console
    stored_job(tmp_path, labels={"team": "vision"})
    updated = subprocess.run([sys.executable, "-m", "submit", "jobs", "update", "fake01",
                              "--update-labels", "team=speech"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert updated.returncode == 0, updated.stderr
    rows = client.get("/rows", params={"filter": "labels.team=speech"}).text
    assert 'data-job="fake01"' in rows and "team=speech" in rows and "vision" not in rows
    assert "fake01" not in client.get("/rows", params={"filter": "labels.team=vision"}).text


def _console(*argv):
    return subprocess.run([sys.executable, "-m", "submit", "console", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_console_command_errors_are_one_line():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        port = taken.getsockname()[1]
        out = _console("--port", str(port))
        assert out.returncode == 2
        assert out.stderr.strip() == (f"error: 127.0.0.1:{port} is in use; pick another "
                                      "with --port (or --host)")
    finally:
        taken.close()
    out = _console("--port", "70000")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "70000 is not in the range 0<=x<=65535" in out.stderr
    out = _console("--host", "no-such-host.invalid", "--port", "0")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert out.stderr.startswith("error: no-such-host.invalid:0 cannot be used")


VERTEX_NAME = "projects/123456789/locations/us-central1/customJobs/7200000000000000001"
VERTEX_HANDLE = {"project": "mljob-test", "region": "us-central1",
                 "parent": "projects/mljob-test/locations/us-central1",
                 "display_name": "vx01", "name": VERTEX_NAME,
                 "id": VERTEX_NAME.rsplit("/", 1)[1]}


def _entry(n: int, task: str, text: str) -> dict:
    return {"insertId": f"id{n:04d}", "timestamp": f"2026-03-01T12:00:{n:02d}.{n:06d}Z",
            "severity": "INFO", "textPayload": text,
            "resource": {"type": "ml_job", "labels": {"job_id": VERTEX_HANDLE["id"],
                                                      "task_name": task,
                                                      "project_id": "mljob-test"}}}


def test_an_engine_job_is_shown_through_its_runner(tmp_path, reaper, monkeypatch,
                                                   gcs_emulator):
    """A Vertex AI job: its state from the engine's API, its logs from Cloud Logging (both
    through the official clients, against a recording endpoint on 127.0.0.1), its record
    kept in its gs:// job dir (the GCS emulator)."""
    from submit.runners import vertex
    from tests.support.api_edge import ApiEdge
    for name in vertex.PROJECT_ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    with ApiEdge() as api:
        monkeypatch.setenv(vertex.VERTEX_ENDPOINT_ENV, api.url)
        monkeypatch.setenv(vertex.LOGGING_ENDPOINT_ENV, api.url)
        api.route("GET", f"/v1/{VERTEX_NAME}", 200,
                  {"name": VERTEX_NAME, "state": "JOB_STATE_SUCCEEDED"})
        api.route("POST", "/v2/entries:list", 200, {"entries": [
            _entry(1, "workerpool0-0", "step 20/20 loss=0.4 accuracy=0.9"),
            _entry(2, "workerpool1-0", "worker done")]})
        missing = "projects/123456789/locations/us-central1/customJobs/404"
        api.route("GET", f"/v1/{missing}", 404, {"error": {
            "code": 404, "status": "NOT_FOUND", "message": "CustomJob not found."}})
        for job_id, name in (("vx01", VERTEX_NAME), ("vx02", missing)):
            records.save(records.JobRecord(
                job_id=job_id, runner="vertex", state=records.RUNNING,
                job_dir=f"gs://mljob-test/vertex/{job_id}",
                engine={**VERTEX_HANDLE, "display_name": job_id, "name": name}))
        url = start_console(reaper, tmp_path / "console.log")
        with httpx.Client(base_url=url, timeout=60) as client:
            page = client.get("/jobs/vx01")
            assert page.status_code == 200
            assert 'data-done="1">SUCCEEDED</strong>' in page.text
            assert records.load("vx01").state == records.SUCCEEDED  # refreshed and kept
            assert "tensorboard --logdir gs://mljob-test/vertex/vx01" in page.text
            with client.stream("GET", "/jobs/vx01/logs") as answer:
                text = answer.read().decode()
            assert "\tmaster-replica-0\tstep 20/20 loss=0.4 accuracy=0.9" in text
            assert "\tworker-replica-0\tworker done" in text
            assert text.rstrip().endswith("event: end\ndata: SUCCEEDED")
            # an engine that cannot answer: the index's copy, and why
            page = client.get("/jobs/vx02")
            assert page.status_code == 200 and ">RUNNING</strong>" in page.text
            assert "cannot ask the vertex runner: Vertex AI refused to describe job vx02" \
                in page.text
