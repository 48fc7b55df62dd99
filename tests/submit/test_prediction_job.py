"""`jobs submit prediction`: a batch prediction job of worker processes on a real export,
text split at line boundaries, real gzip TFRecords, a killed worker, cancel and resume."""
import glob
import gzip
import io
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from mljob import storage
from predict.runtime import records
from submit import jobs
from tests.support.common import ROOT, pid_alive
from tests.support.predict_models import images, instance_lines, saved_model_export
from tests.support.submit_cli import one_error_line, run
from tests.support.trainer_runs import wait_for

JOB_TIMEOUT = 240


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    return saved_model_export(str(tmp_path_factory.mktemp("exports") / "model"))


def flags(export_dir, inputs, out, fmt="text", *extra, job="j"):
    return ["jobs", "submit", "prediction", job, *extra, "--model-dir", export_dir,
            "--input-paths", inputs, "--output-path", str(out), "--data-format", fmt,
            "--region", "us-central1"]


def results(out):
    return [json.loads(line) for f in sorted(glob.glob(str(out / "prediction.results-*")))
            for line in open(f)]


def errors(out):
    return [json.loads(line) for f in sorted(glob.glob(str(out / "prediction.errors_stats-*")))
            for line in open(f)]


def test_text_job_splits_a_large_file_at_lines_and_agrees_with_predict_batch(
        export_dir, tmp_path, capsys, monkeypatch):
    inputs = tmp_path / "in"
    inputs.mkdir()
    big = instance_lines(images(120, seed=1))
    lines = big.splitlines(keepends=True)
    bad = '{"image": [0.5], "key": 9999}\n'
    lines.insert(77, bad)  # a bad instance inside the split file
    (inputs / "a.json").write_text("".join(lines))
    (inputs / "b.json").write_text(instance_lines(images(5, seed=2), keys=range(500, 505))
                                   + "{oops\n")
    monkeypatch.setenv("MLJOB_PREDICTION_SPLIT_BYTES", "60000")  # a.json in ~4 ranges
    out = tmp_path / "out"
    status, stdout, err = run(capsys, *flags(export_dir, str(inputs / "*.json"), out, "text",
                                             "--max-worker-count", "2",
                                             "--batch-size", "7", "--labels", "team=vision"))
    assert status == 0, err
    assert "Job [j] SUCCEEDED." in stdout
    names = sorted(os.listdir(out))
    shards = [n for n in names if n.startswith("prediction.results-")]
    count = len(shards)
    assert count >= 4 and all(n.endswith(f"-of-{count:05d}") for n in shards)
    assert len([n for n in names if n.startswith("prediction.errors_stats-")]) == count
    assert not [n for n in names if n.startswith(".prediction-tmp")]
    rows = results(out)
    assert [r["key"] for r in rows] == list(range(120)) + list(range(500, 505))
    errs = errors(out)
    assert len(errs) == 2
    ranged = next(e for e in errs if e["input"].endswith("a.json"))
    text = (inputs / "a.json").read_bytes()
    assert text[ranged["offset"]:].startswith(bad.encode())  # the offset names the line
    assert "image has shape [1]" in ranged["error"]
    whole = next(e for e in errs if e["input"].endswith("b.json"))
    assert whole["line"] == 6
    # the same loop as `predict batch`: the same answers for the same instances
    from predict.__main__ import main as predict_main
    reference = tmp_path / "reference"
    assert predict_main(["batch", "--model-dir", export_dir, "--input-paths",
                         str(inputs / "*.json"), "--data-format", "text", "--output-path",
                         str(reference)]) == 0
    expected = results(reference)  # batches differ, so float sums may round differently
    assert [(r["key"], r["classes"]) for r in rows] == [(r["key"], r["classes"])
                                                        for r in expected]
    assert np.allclose([r["scores"] for r in rows], [r["scores"] for r in expected],
                       rtol=0, atol=1e-6)
    record = jobs.load("j")
    assert record.state == jobs.SUCCEEDED and record.labels == {"team": "vision"}
    assert record.prediction_output["predictionCount"] == "125"
    assert record.prediction_output["errorCount"] == "2"
    assert record.prediction_output["outputPath"] == str(out)
    assert 0 < record.prediction_output["nodeHours"] < 1
    assert record.prediction_output["progress"]["instancesDone"] == 127
    assert record.prediction_input["dataFormat"] == "TEXT"
    status, described, _ = run(capsys, "jobs", "describe", "j")
    assert "predictionCount: '125'" in described and "shardsDone: " in described
    log = open(os.path.join(record.log_dir, "service.log")).read()
    assert "with 2 workers" in log and "progress: 127 of ~127 instances (100.0%)" in log
    status, streamed, err = run(capsys, "jobs", "stream-logs", "j")
    assert status == 0, err
    assert "\tservice\tprogress: 127 of ~127" in streamed
    assert "\tworker-replica-1\tshard " in streamed
    status, service, err = run(capsys, "jobs", "stream-logs", "j", "--task-name", "service")
    assert status == 0, err  # the events from before the log folder existed too
    assert service.splitlines()[0].endswith("\tservice\tjob PREPARING"), service
    status, listed, _ = run(capsys, "jobs", "list", "--filter", "state=SUCCEEDED")
    assert listed.splitlines()[1].split()[:2] == ["j", "SUCCEEDED"]
    # a second job never writes over this one's output
    status, _, err = run(capsys, *flags(export_dir, str(inputs / "*.json"), out, job="k"))
    assert status == 2 and "holds the output of job 'j'" in one_error_line(err)


def _gzip_tfrecords(payloads) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb") as f:
        records.write_tfrecords(f, payloads)
    return buffer.getvalue()


def test_gzip_tfrecords_on_gcs_json_and_examples_damage_is_an_error_line(
        export_dir, capsys, gcs_emulator):
    import tensorflow as tf
    imgs = images(6, seed=3)
    base = "gs://mljob-test/prediction-job"
    whole = _gzip_tfrecords([json.dumps({"image": img.tolist(), "key": k}).encode()
                             for k, img in enumerate(imgs[:3])])
    storage.write_bytes(f"{base}/in/a.tfrecord.gz", whole)
    storage.write_bytes(f"{base}/in/b.tfrecord.gz", _gzip_tfrecords([tf.train.Example(
        features=tf.train.Features(feature={
            "image": tf.train.Feature(float_list=tf.train.FloatList(value=img)),
            "key": tf.train.Feature(int64_list=tf.train.Int64List(value=[k]))}))
        .SerializeToString() for k, img in zip((3, 4, 5), imgs[3:], strict=True)]))
    storage.write_bytes(f"{base}/in/c.tfrecord.gz", whole[:40])  # cut inside record 1
    plain = io.BytesIO()
    records.write_tfrecords(plain, [b'{"image": [0.5], "key": 1}'])
    storage.write_bytes(f"{base}/in/d.tfrecord.gz", plain.getvalue())  # not gzip at all
    out = f"{base}/out"
    status, stdout, err = run(capsys, *flags(export_dir, f"{base}/in/*.gz", out,
                                             "tf-record-gzip", "--async",
                                             "--max-worker-count", "2"))
    assert status == 0, err
    try:
        record = wait_for(lambda: (r := jobs.load("j")).done and r, JOB_TIMEOUT, "the job")
    finally:
        _stop_supervisor("j")
    assert record.state == jobs.SUCCEEDED, record.error_message
    fs, path = storage.filesystem(out)
    fs.invalidate_cache()
    names = sorted(os.path.basename(p) for p in fs.ls(path))
    assert names == [".mljob-job.json"] + [f"prediction.{kind}-0000{i}-of-00004"
                                           for kind in ("errors_stats", "results")
                                           for i in range(4)]

    def lines(kind):
        return [json.loads(line) for i in range(4) for line in storage.read_bytes(
            f"{out}/prediction.{kind}-0000{i}-of-00004").decode().splitlines()]
    assert [r["key"] for r in lines("results")] == [0, 1, 2, 3, 4, 5]
    errs = lines("errors_stats")
    assert [e["input"].rsplit("/", 1)[1] for e in errs] == ["c.tfrecord.gz",
                                                           "d.tfrecord.gz"]
    assert all("damaged gzip data" in e["error"] for e in errs)
    assert record.prediction_output["predictionCount"] == "6"
    assert record.prediction_output["errorCount"] == "2"


def _stop_supervisor(job_id):
    record = jobs.load(job_id)
    if not record.done and record.supervisor_alive():
        os.killpg(record.supervisor_pid, signal.SIGTERM)
        wait_for(lambda: not jobs.load(job_id).supervisor_alive(), 60, "the supervisor")


def _submit(reaper, argv, env=None):
    return reaper.popen([sys.executable, "-m", "submit", *argv], cwd=ROOT,
                        env={**os.environ, "PYTHONPATH": ROOT, **(env or {})},
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _published(out):
    return sorted(glob.glob(str(out / "prediction.results-*")))


@pytest.mark.slow
def test_killed_worker_shard_is_retried_and_nothing_is_lost(export_dir, tmp_path, reaper):
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(6):
        (inputs / f"{i}.json").write_text(instance_lines(images(150, seed=i),
                                                         keys=range(i * 1000, i * 1000 + 150)))
    out = tmp_path / "out"
    proc = _submit(reaper, flags(export_dir, str(inputs / "*.json"), out, "text",
                                 "--max-worker-count", "1", "--batch-size", "1"))
    record = wait_for(lambda: (r := jobs.load("j") if os.path.exists(jobs.index_path("j"))
                               else None) and r.replicas and r.replicas[0].pid and r,
                      JOB_TIMEOUT, "a worker")
    wait_for(lambda: _published(out), JOB_TIMEOUT, "a first shard")
    os.killpg(record.replicas[0].pid, signal.SIGKILL)
    assert proc.wait(JOB_TIMEOUT) == 0, proc.stdout.read().decode()
    record = jobs.load("j")
    assert record.state == jobs.SUCCEEDED
    assert record.replicas[0].restarts == 1
    keys = [r["key"] for r in results(out)]
    assert keys == [i * 1000 + k for i in range(6) for k in range(150)]
    log = open(os.path.join(record.log_dir, "service.log")).read()
    assert "worker-replica-0 exited with status 137 on shard" in log


def _kill_each_worker(proc, job_id, timeout):
    """SIGKILL every worker of the job as soon as the record shows its PID (each checked to
    be a batch worker first); the PIDs killed, once the job's process has ended."""
    killed: list[int] = []
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        record = jobs.load(job_id) if os.path.exists(jobs.index_path(job_id)) else None
        pid = record.replicas[0].pid if record and record.replicas else None
        if pid and pid not in killed:
            try:
                if "predict.batch_worker" in psutil.Process(pid).cmdline():
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            except psutil.Error:  # gone already: the supervisor saw it die
                pass
        time.sleep(0.02)
    return killed


def test_a_shard_whose_worker_dies_every_time_is_tried_exactly_the_limit(tmp_path, reaper):
    """A worker that dies with its shard gives the shard back; after MAX_SHARD_ATTEMPTS
    tries (not one more) the job fails naming the shard. Each worker is SIGKILLed as soon
    as it is started, long before it would load the export (so none is needed)."""
    from submit.prediction.job import MAX_SHARD_ATTEMPTS
    assert MAX_SHARD_ATTEMPTS == 3  # as the messages below say
    export = tmp_path / "export"
    export.mkdir()
    (export / "saved_model.pb").write_bytes(b"never loaded")
    (tmp_path / "in.json").write_text(instance_lines(images(2)))
    out = tmp_path / "out"
    proc = _submit(reaper, flags(str(export), str(tmp_path / "in.json"), out))
    killed = _kill_each_worker(proc, "j", JOB_TIMEOUT)
    said = proc.stdout.read().decode()
    assert proc.wait(60) == 1, said
    assert ("error: job j failed: shard 0 failed 3 times; worker-replica-0 exited with "
            "status 137") in said
    assert len(killed) == 3
    record = jobs.load("j")
    assert record.state == jobs.FAILED and record.replicas[0].restarts == 2
    assert not any(pid_alive(pid) for pid in killed)
    log = open(os.path.join(record.log_dir, "service.log")).read()
    assert [line.rsplit("(", 1)[1] for line in log.splitlines() if "goes back" in line] \
        == ["try 2 of 3)", "try 3 of 3)"]
    assert not _published(out)


def test_cancel_then_resume_skips_published_shards(export_dir, tmp_path, reaper, capsys):
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(8):
        (inputs / f"{i}.json").write_text(instance_lines(images(40, seed=i),
                                                         keys=range(i * 100, i * 100 + 40)))
    out = tmp_path / "out"
    argv = flags(export_dir, str(inputs / "*.json"), out, "text", "--max-worker-count", "1",
                 "--batch-size", "1")
    proc = _submit(reaper, argv)
    wait_for(lambda: len(_published(out)) >= 2, JOB_TIMEOUT, "two shards")
    status, said, err = run(capsys, "jobs", "cancel", "j")
    assert status == 0, err
    assert "CANCELLED" in said
    proc.wait(60)
    record = jobs.load("j")
    assert record.state == jobs.CANCELLED
    done = {p: os.stat(p).st_mtime_ns for p in _published(out)}
    assert 2 <= len(done) < 8
    assert not glob.glob(str(out / ".prediction-tmp-*"))
    # the same id again without --resume is refused; with it, only the rest is predicted
    status, _, err = run(capsys, *argv)
    assert status == 2 and "--resume" in one_error_line(err)
    status, stdout, err = run(capsys, *argv, "--resume")
    assert status == 0, err
    assert {p: os.stat(p).st_mtime_ns for p in done} == done  # never written again
    assert [r["key"] for r in results(out)] == [i * 100 + k for i in range(8)
                                                for k in range(40)]
    record = jobs.load("j")
    assert record.state == jobs.SUCCEEDED
    assert record.prediction_output["predictionCount"] == "320"
    log = open(os.path.join(record.log_dir, "service.log")).read()
    assert f"resuming: {len(done)} of 8 shards already published are skipped" in log


def _written(out) -> list[str]:
    """Results files holding rows anywhere under the output folder (its scratch folders
    included): where a worker writes a shard while it predicts it."""
    return [os.path.join(folder, name) for folder, _, names in os.walk(out)
            for name in names if name.startswith("prediction.results-")
            and os.path.getsize(os.path.join(folder, name)) > 0]


@pytest.mark.slow
def test_a_worker_killed_between_write_and_publish_leaves_nothing_resume_skips(
        export_dir, tmp_path, reaper, capsys):
    """A shard's results are visible in the output folder only once complete. The worker
    is stopped once it has written rows of its shard, the folder is looked at, and then the
    job's process and the worker are SIGKILLed (a crash: nothing retries); --resume must
    predict that shard again, whole."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.json").write_text(instance_lines(images(600, seed=4), keys=range(600)))
    out = tmp_path / "out"
    argv = flags(export_dir, str(inputs / "a.json"), out, "text", "--batch-size", "1")
    proc = _submit(reaper, argv)
    written = wait_for(lambda: _written(out), JOB_TIMEOUT, "the first rows written",
                       interval=0.01)
    worker = jobs.load("j").replicas[0].pid
    assert "predict.batch_worker" in psutil.Process(worker).cmdline()
    os.kill(worker, signal.SIGSTOP)  # mid-shard, and it stays there while looked at
    try:
        assert _published(out) == [], "a shard in the output folder before it is complete"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)
    finally:
        os.kill(worker, signal.SIGKILL)
    wait_for(lambda: not pid_alive(worker), 60, "the worker to die")
    assert written and len(open(written[0]).readlines()) < 600  # it was killed mid-write
    from predict.batch_worker import published
    assert not published(str(out), 0, 1)  # what --resume asks of each shard
    status, _, err = run(capsys, *argv, "--resume")
    assert status == 0, err
    assert [r["key"] for r in results(out)] == list(range(600))
    assert not glob.glob(str(out / ".prediction-tmp-*"))
    record = jobs.load("j")
    assert record.state == jobs.SUCCEEDED
    assert record.prediction_output["predictionCount"] == "600"


def test_an_export_that_cannot_load_fails_the_job_at_once_in_one_line(tmp_path, capsys):
    export = tmp_path / "export"
    export.mkdir()
    (export / "saved_model.pb").write_bytes(b"not a SavedModel")
    (tmp_path / "in.json").write_text('{"image": [0.5], "key": 1}\n')
    status, out, err = run(capsys, *flags(str(export), str(tmp_path / "in.json"),
                                          tmp_path / "out"))
    assert status == 1
    line = one_error_line(err)
    assert ("job j failed: shard 0 cannot be predicted; worker-replica-0 exited with "
            "status 2: error: ") in line
    assert "saved_model.pb is not a SavedModel" in line  # the worker's own reason
    assert jobs.load("j").replicas[0].restarts == 0
    assert jobs.load("j").state == jobs.FAILED
    assert [n for n in os.listdir(tmp_path / "out")] == [".mljob-job.json"]


def test_ctrl_c_cancels_a_foreground_job_and_stops_its_workers(export_dir, tmp_path,
                                                                reaper):
    """A job in the foreground (the default) is supervised by the submitting process:
    Ctrl-C there cancels it, every worker stopped, exit status 130."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(4):
        (inputs / f"{i}.json").write_text(instance_lines(images(40, seed=i)))
    proc = _submit(reaper, flags(export_dir, str(inputs / "*.json"), tmp_path / "out",
                                 "text", "--max-worker-count", "2", "--batch-size", "1"))
    record = wait_for(lambda: (r := jobs.load("j") if os.path.exists(jobs.index_path("j"))
                               else None) and r.state == jobs.RUNNING and r.replicas and r,
                      JOB_TIMEOUT, "the job to run")
    assert record.supervisor_pid == proc.pid  # supervised here, not detached
    proc.send_signal(signal.SIGINT)
    said = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 130, said
    assert said.splitlines()[0] == "Job [j] submitted successfully to local."
    assert "Job [j] CANCELLED." in said
    record = jobs.load("j")
    assert record.state == jobs.CANCELLED
    assert record.replicas and not any(pid_alive(r.pid) for r in record.replicas if r.pid)
