"""The console on damaged and extreme records (`python -m submit console` over real HTTP):
a record whose values are out of range is left out of the list and its page answers 422
in one line (both were 500), and a tuning job whose trials reported finite but extreme
objectives (1e308 with -1e308; 0 with 5e-324) is drawn (was 500)."""
from __future__ import annotations

import json
import os

from submit import jobs as records
from submit.console import svg
from tests.console.test_console_http import console  # noqa: F401 (the fixture)
from tests.submit.test_hardening_round4 import DAMAGED, _good


def _tuning(job_id: str, *values: float) -> None:
    trials = [{"trialId": str(i + 1), "state": "SUCCEEDED",
               "hyperparameters": {"x": v, "opt": "adam"},
               "finalMetric": {"trainingStep": "1", "objectiveValue": v}}
              for i, v in enumerate(values)]
    records.save(records.JobRecord(
        job_id, state=records.SUCCEEDED, start_time=5.0, end_time=9.0,
        training_input={"hyperparameters": {"goal": "MAXIMIZE", "params": [
            {"parameterName": "x", "type": "DOUBLE", "minValue": -1e308,
             "maxValue": 1e308}]}},
        training_output={"isHyperparameterTuningJob": True, "trials": trials}))


def test_damaged_records_are_4xx_and_extreme_charts_are_drawn(console):  # noqa: F811
    _, client = console
    folder = os.path.join(os.environ["MLJOB_HOME"], "jobs")
    os.makedirs(folder, exist_ok=True)
    bad = ["create time 1e20", "end time Infinity", "objective a string", "trial id ²",
           "spec hyperparameters a list"]
    for n, case in enumerate(bad):
        with open(os.path.join(folder, f"bad{n:02d}.json"), "w") as f:
            json.dump(_good(f"bad{n:02d}", **DAMAGED[case]), f)
    _tuning("wide01", 1e308, -1e308)
    _tuning("tiny01", 0.0, 5e-324)
    for path in ("/", "/rows"):
        page = client.get(path)
        assert page.status_code == 200, path
        assert 'data-job="wide01"' in page.text and "bad0" not in page.text
    for n, case in enumerate(bad):
        page = client.get(f"/jobs/bad{n:02d}")
        assert page.status_code == 422, case
        assert "is damaged (its " in page.text and "Traceback" not in page.text
    for job_id in ("wide01", "tiny01"):
        page = client.get(f"/jobs/{job_id}")
        assert page.status_code == 200, job_id
        per_trial = page.text.split('class="chart per-trial"', 1)[1].split("</svg>", 1)[0]
        assert per_trial.count("<circle") == 2 and "nan" not in per_trial
        assert "inf" not in per_trial.replace("info", "")
        if job_id == "tiny01":  # two values 5e-324 apart: an axis widened to be read
            assert 'font-size="11">0.5</text>' in per_trial


def test_ticks_of_spans_too_narrow_or_too_wide_are_the_ends():
    assert svg._ticks(0.0, 5e-324) == [0.0, 5e-324]
    assert svg._ticks(-1e308, 1.7e308) == [-1e308, 1.7e308]


def test_a_slow_browser_on_a_big_log_keeps_the_console_small(tmp_path, reaper):
    """The event stream reads ahead at most QUEUE_BYTES of 48 MB of logs of long lines
    (13 replicas' files, each under the tail the console starts at) while the browser
    takes none (before: the whole log in memory, twice)."""
    import socket
    import time

    import psutil

    from tests.console.test_console_http import stored_job
    from tests.support.browser import start_console
    record = stored_job(tmp_path, job_id="big01", state=records.SUCCEEDED)
    line = "INFO\t2026-11-28 12:00:00 +0000\tworker-replica-0\t" + "z" * 250_000 + "\n"
    for index in range(13):
        with open(os.path.join(record.log_dir, f"worker-replica-{index}.log"), "a") as f:
            f.write(line * 15)
    url = start_console(reaper, tmp_path / "console.log")
    port = int(url.rsplit(":", 1)[1])
    (server,) = [p for p in psutil.Process().children(recursive=True)
                 if str(port) in " ".join(p.cmdline())]
    before = server.memory_info().rss
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(f"GET /jobs/big01/logs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                     "\r\n".encode())
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        time.sleep(3)  # the browser reads nothing more
        grown = (server.memory_info().rss - before) / (1 << 20)
    assert grown < 25, f"the console grew by {grown:.0f} MiB"


def test_a_big_log_is_shown_from_its_tail_and_resumed_at_the_same_lines(tmp_path,
                                                                      console):  # noqa: F811
    """A 12 MB log starts at its last 4 MiB (a seek), after one line saying what was
    skipped; a browser reconnecting with Last-Event-ID continues the same numbering."""
    from tests.console.test_console_http import stored_job
    _, client = console
    record = stored_job(tmp_path, job_id="tail01", state=records.SUCCEEDED)
    path = os.path.join(record.log_dir, "master-replica-0.log")
    with open(path, "w") as f:
        for i in range(120_000):
            f.write(f"INFO\t2026-11-28 12:00:00 +0000\tmaster-replica-0\tline {i} "
                    + "q" * 80 + "\n")
    size = os.path.getsize(path)

    def events(**headers) -> list[tuple[str, str]]:
        with client.stream("GET", "/jobs/tail01/logs", params={"task": "master-replica-0"},
                           headers=headers) as answer:
            text = answer.read().decode()
        return [(e.split("\n")[0][4:], e.split("\n", 1)[1][6:])
                for e in text.split("\n\n") if e.startswith("id: ")]

    first = events()
    assert first[0] == ("1", f"-- {(size - (4 << 20)) / (1 << 20):.1f} MiB of "
                             "master-replica-0.log skipped (`jobs stream-logs` prints them) --")
    assert first[1][1].startswith("INFO\t") and first[-1][1].split("\t")[3].startswith(
        "line 119999 ")
    shown = sum(len(text) + 1 for _, text in first[1:])
    assert (4 << 20) - 200 < shown <= 4 << 20  # whole lines of the last 4 MiB
    with open(path, "a") as f:  # the job logged on: a new tail would begin later
        for i in range(120_000, 150_000):
            f.write(f"INFO\t2026-11-28 12:00:00 +0000\tmaster-replica-0\tline {i}\n")
    again = events(**{"Last-Event-ID": "5"})
    assert again[:len(first) - 5] == first[5:]  # the same lines under the same numbers
    assert again[-1][1].endswith("\tline 149999")


SHAPES = {  # a tuning spec or trial field of another type than Cloud ML writes
    "categoricalValues a number": ({"categoricalValues": 5}, {}),
    "categoricalValues a text": ({"categoricalValues": "adam"}, {}),
    "categoricalValues an object": ({"categoricalValues": {"a": 1}}, {}),
    "categoricalValues null": ({"categoricalValues": None}, {}),
    "a trial's hyperparameters a list": ({}, {"hyperparameters": ["adam"]}),
    "a trial's finalMetric a number": ({}, {"finalMetric": 3}),
    "objective a numeric text": ({}, {"finalMetric": {"objectiveValue": "0.5"}}),
}


def test_odd_shapes_of_a_tuning_record_render_the_job_page(console):  # noqa: F811
    """A trial parameter whose categoricalValues is a number (was 500), and its kin: the
    page is drawn from what the record holds."""
    _, client = console
    for n, (param, trial) in enumerate(SHAPES.values()):
        job_id = f"shape{n:02d}"
        trials = [{"trialId": str(i), "state": "SUCCEEDED",
                   "hyperparameters": {"opt": "adam"},
                   "finalMetric": {"trainingStep": "1", "objectiveValue": 0.5 + i},
                   **trial} for i in (1, 2)]
        records.save(records.JobRecord(
            job_id, state=records.SUCCEEDED, start_time=5.0, end_time=9.0,
            training_input={"hyperparameters": {"goal": "MAXIMIZE", "params": [
                {"parameterName": "opt", "type": "CATEGORICAL", **param}]}},
            training_output={"isHyperparameterTuningJob": True, "trials": trials}))
    for n, case in enumerate(SHAPES):
        page = client.get(f"/jobs/shape{n:02d}")
        if page.status_code == 422:  # what the record reader refuses: one line, as before
            assert not case.startswith("categorical") and "is damaged (its" in page.text
            continue
        assert page.status_code == 200, (case, page.text[-300:])
        assert 'id=trials-table' in page.text and 'class="chart per-parameter"' in page.text
        if case.startswith("categoricalValues"):
            assert ">adam</text>" in page.text  # the category seen, on the axis
