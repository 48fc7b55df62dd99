"""Each replica's CPU and memory, sampled by the local supervisor (psutil): a chief that
keeps a core busy and holds 200 MiB beside a worker that sleeps, told apart by the record's
summary, `jobs describe` and the samples file the console draws."""
from __future__ import annotations

import json
import os

from submit import jobs as records
from submit.local import usage
from submit.home import mljob_home
from tests.support.submit_cli import run as submit_in_process, write_package

BUSY_TASK = r'''
import json, os, sys, time
task = json.loads(os.environ["TF_CONFIG"])["task"]
if task["type"] in ("chief", "master"):
    held = bytearray(200 * 1024 * 1024)       # resident: every page written
    for i in range(0, len(held), 4096):
        held[i] = 1
    end = time.time() + float(os.environ.get("BUSY_S", "6"))
    while time.time() < end:                  # one core busy
        sum(range(10000))
    print(f"cpu_seconds {time.process_time()}", flush=True)
    sys.exit(0)
time.sleep(600)
'''


def test_describe_shows_each_replicas_peak_and_mean(capsys, tmp_path):
    config = tmp_path / "custom.yaml"
    config.write_text("trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
                      "  workerCount: 1\n")
    pkg = write_package(tmp_path / "pkg", BUSY_TASK)
    status, _, err = submit_in_process(
        capsys, "busy", "--config", str(config), "--job-dir", str(tmp_path / "job"),
        "--package-path", pkg, "--module-name", "fakejob.task")
    assert status == 0, err
    record = records.load("busy")
    chief, worker = record.usage["master-replica-0"], record.usage["worker-replica-0"]
    assert chief["samples"] >= 2 and worker["samples"] >= 2
    # as busy as the machine lets it be (other tests share its two cores), never idle
    assert chief["cpuPeak"] >= 0.1, chief
    assert worker["cpuPeak"] < 0.25, worker               # asleep (once Python started)
    assert chief["cpuMean"] > 5 * worker["cpuMean"], (chief, worker)
    assert 200 <= chief["memoryPeakMiB"] < 1024, chief    # the 200 MiB it held
    assert worker["memoryPeakMiB"] < 100, worker
    assert chief["memoryMeanMiB"] <= chief["memoryPeakMiB"]
    # the samples over time, as the console reads them
    samples = list(usage.read(os.path.join(mljob_home(), "runs", "busy")))
    assert {s["label"] for s in samples} == {"master-replica-0", "worker-replica-0"}
    times = [s["t"] for s in samples if s["label"] == "master-replica-0"]
    assert times == sorted(times) and times[-1] - times[0] >= 1.0
    assert usage.summarize(samples) == record.usage
    # the samples add up to the CPU time the chief itself counted: each second's share is
    # measured, whatever the load (the first second is the baseline, so some is missing)
    log = open(os.path.join(tmp_path, "job", "logs", "master-replica-0.log")).read()
    used = float(log.split("cpu_seconds ")[1].split()[0])
    chief_samples = [s for s in samples if s["label"] == "master-replica-0"]
    sampled = chief_samples[0]["cpu"] * usage.EVERY_S + sum(
        b["cpu"] * (b["t"] - a["t"])
        for a, b in zip(chief_samples[:-1], chief_samples[1:], strict=True))
    assert 0.5 * used <= sampled <= 1.1 * used + 0.1, (sampled, used)

    status, out, err = submit_in_process(capsys, "jobs", "describe", "busy")
    assert status == 0, err
    rows = {line.split()[0]: line.split() for line in err.splitlines()
            if line.startswith(("master-replica-0 ", "worker-replica-0 "))}
    assert float(rows["master-replica-0"][1]) == chief["cpuPeak"]
    assert float(rows["master-replica-0"][3]) == chief["memoryPeakMiB"]
    assert float(rows["worker-replica-0"][2]) == worker["cpuMean"]
    assert "cpuPeak" in out  # the record's own copy, in the YAML


def test_damaged_sample_lines_are_skipped(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    good = {"t": 1.0, "label": "master-replica-0", "cpu": 0.5, "rss": 1048576}
    (run_dir / usage.FILE).write_text(
        json.dumps(good) + "\n{not json\n" + json.dumps({"t": "x", "label": 1}) + "\n"
        + json.dumps({**good, "t": 2.0, "cpu": 1.5}) + "\n")
    summary = usage.summarize(list(usage.read(str(run_dir))))
    assert summary == {"master-replica-0": {"cpuPeak": 1.5, "cpuMean": 1.0,
                                            "memoryPeakMiB": 1.0, "memoryMeanMiB": 1.0,
                                            "samples": 2}}


def test_a_tuning_jobs_trials_are_summed_up_with_its_own(tmp_path, monkeypatch):
    """A running tuning job's trials sample into trials/<id>/; describe reads them all,
    and an ended job's record wins over whatever files are left."""
    run_dir = tmp_path / "home" / "runs" / "tune01"
    monkeypatch.setenv("MLJOB_HOME", str(tmp_path / "home"))
    for trial in ("1", "2"):
        folder = run_dir / "trials" / trial
        folder.mkdir(parents=True)
        (folder / usage.FILE).write_text(json.dumps(
            {"t": 1.0, "label": f"{trial}/master-replica-0", "cpu": float(trial),
             "rss": 2 * usage.MIB}) + "\n")
    record = records.JobRecord(job_id="tune01", state=records.RUNNING)
    summary = usage.summary_of(record)
    assert sorted(summary) == ["1/master-replica-0", "2/master-replica-0"]
    assert summary["2/master-replica-0"]["cpuPeak"] == 2.0
    record.set_state(records.SUCCEEDED)
    record.usage = {"master-replica-0": dict(summary["1/master-replica-0"])}
    assert usage.summary_of(record) == record.usage
