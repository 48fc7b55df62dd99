"""`python -m predict batch`: many files, bad instances reported without stopping."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from predict.runtime import records
from predict.__main__ import main
from tests.support.predict_models import images, instance_lines, saved_model_export


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    return saved_model_export(str(tmp_path_factory.mktemp("exports") / "model"))


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def example(img, key):
    return tf.train.Example(features=tf.train.Features(feature={
        "image": tf.train.Feature(float_list=tf.train.FloatList(value=img.tolist())),
        "key": tf.train.Feature(int64_list=tf.train.Int64List(value=[key]))
    })).SerializeToString()


def test_text_files_bad_instances_reported_others_predicted(export_dir, tmp_path, capsys):
    imgs = images(7, seed=1)
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.json").write_text(instance_lines(imgs[:4], keys=[0, 1, 2, 3]))
    bad_shape = json.dumps({"image": [0.5] * 10, "key": 5})
    bad_type = json.dumps({"image": ["x"] * 784, "key": 6})
    (inputs / "b.json").write_text(
        instance_lines(imgs[4:5], keys=[4]) + bad_shape + "\n" + "{oops\n" + bad_type + "\n"
        + instance_lines(imgs[5:7], keys=[7, 8]))
    out = tmp_path / "out"
    status = main(["batch", "--model-dir", export_dir, "--input-paths",
                   str(inputs / "*.json"), "--data-format", "text", "--output-path", str(out),
                   "--batch-size", "2"])
    stdout = capsys.readouterr().out
    assert status == 0
    assert stdout.strip().splitlines()[-1] == "10 instances: 7 predicted, 3 failed"
    assert sorted(os.listdir(out)) == [
        "prediction.errors_stats-00000-of-00002", "prediction.errors_stats-00001-of-00002",
        "prediction.results-00000-of-00002", "prediction.results-00001-of-00002"]
    first = read_jsonl(out / "prediction.results-00000-of-00002")
    second = read_jsonl(out / "prediction.results-00001-of-00002")
    assert [r["key"] for r in first + second] == [0, 1, 2, 3, 4, 7, 8]
    assert read_jsonl(out / "prediction.errors_stats-00000-of-00002") == []
    errors = read_jsonl(out / "prediction.errors_stats-00001-of-00002")
    assert [(e["input"], e["line"]) for e in errors] == [(str(inputs / "b.json"), n)
                                                         for n in (2, 3, 4)]
    assert "image has shape [10]" in errors[0]["error"]
    assert "malformed JSON" in errors[1]["error"]
    assert "strings where float32" in errors[2]["error"]


def test_tfrecords_of_json_and_examples(export_dir, tmp_path, capsys):
    imgs = images(4, seed=3)
    path = tmp_path / "in.tfrecord"
    with open(path, "wb") as f:
        records.write_tfrecords(f, [
            json.dumps({"image": imgs[0].tolist(), "key": 100}).encode(),
            example(imgs[1], 101),
            b"\x00\x01 not an instance",
            example(imgs[2], 102),
        ])
    status = main(["batch", "--model-dir", export_dir, "--input-paths", str(path),
                   "--data-format", "tf-record", "--output-path", str(tmp_path / "out")])
    assert status == 0
    assert capsys.readouterr().out.strip() == "4 instances: 3 predicted, 1 failed"
    rows = read_jsonl(tmp_path / "out" / "prediction.results-00000-of-00001")
    assert [r["key"] for r in rows] == [100, 101, 102]
    errors = read_jsonl(tmp_path / "out" / "prediction.errors_stats-00000-of-00001")
    assert errors[0]["record"] == 3 and "neither a JSON instance" in errors[0]["error"]


def test_no_input_or_no_model_or_used_output_exit_2(export_dir, tmp_path, capsys):
    (tmp_path / "in.json").write_text(instance_lines(images(1)))
    common = ["--data-format", "text", "--output-path", str(tmp_path / "out")]
    assert main(["batch", "--model-dir", export_dir, "--input-paths",
                 str(tmp_path / "nothing-*.json"), *common]) == 2
    assert "no input file matched" in capsys.readouterr().err
    assert main(["batch", "--model-dir", str(tmp_path / "missing"), "--input-paths",
                 str(tmp_path / "in.json"), *common]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["batch", "--model-dir", export_dir, "--input-paths",
                 str(tmp_path / "in.json"), *common]) == 0
    capsys.readouterr()
    assert main(["batch", "--model-dir", export_dir, "--input-paths",
                 str(tmp_path / "in.json"), *common]) == 2
    assert "already holds predictions" in capsys.readouterr().err
    assert not any(n.startswith(".prediction-tmp") for n in os.listdir(tmp_path / "out"))


def test_gcs_inputs_outputs_and_model(export_dir, gcs_emulator, tmp_path):
    from mljob import storage
    bucket = "gs://mljob-test/predict-batch"
    storage.upload_tree(export_dir, f"{bucket}/model")
    imgs = images(3, seed=5)
    storage.write_bytes(f"{bucket}/in/part-0.json", instance_lines(imgs[:2], [1, 2]).encode())
    storage.write_bytes(f"{bucket}/in/part-1.json", instance_lines(imgs[2:], [3]).encode())
    done = subprocess.run(
        [sys.executable, "-m", "predict", "batch", "--model-dir", f"{bucket}/model",
         "--input-paths", f"{bucket}/in/part-*.json", "--data-format", "text",
         "--output-path", f"{bucket}/out"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "3 instances: 3 predicted, 0 failed"
    assert "\r" not in done.stderr  # no progress bar when stderr is not a terminal
    keys = []
    for shard in ("00000-of-00002", "00001-of-00002"):
        text = storage.read_bytes(f"{bucket}/out/prediction.results-{shard}").decode()
        keys += [json.loads(line)["key"] for line in text.splitlines()]
        assert storage.read_bytes(f"{bucket}/out/prediction.errors_stats-{shard}") == b""
    assert keys == [1, 2, 3]


def test_batch_agrees_with_a_direct_model_call(export_dir, tmp_path, capsys):
    imgs = images(5, seed=8)
    (tmp_path / "in.json").write_text(instance_lines(imgs))
    assert main(["batch", "--model-dir", export_dir, "--input-paths",
                 str(tmp_path / "in.json"), "--data-format", "text", "--output-path",
                 str(tmp_path / "out"), "--batch-size", "3"]) == 0
    rows = read_jsonl(tmp_path / "out" / "prediction.results-00000-of-00001")
    direct = tf.saved_model.load(export_dir).signatures["serving_default"](
        image=tf.constant(imgs), key=tf.range(5, dtype=tf.int64))
    np.testing.assert_allclose([r["scores"] for r in rows], direct["scores"].numpy(),
                               rtol=1e-5, atol=1e-7)


def test_gzip_tfrecords(export_dir, tmp_path, capsys):
    import gzip
    imgs = images(3, seed=9)
    with gzip.open(tmp_path / "in.tfrecord.gz", "wb") as f:
        records.write_tfrecords(f, [example(img, k) for k, img in enumerate(imgs)])
    assert main(["batch", "--model-dir", export_dir, "--input-paths",
                 str(tmp_path / "*.gz"), "--data-format", "tf-record-gzip",
                 "--output-path", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.strip() == "3 instances: 3 predicted, 0 failed"
    rows = read_jsonl(tmp_path / "out" / "prediction.results-00000-of-00001")
    assert [r["key"] for r in rows] == [0, 1, 2]


@pytest.mark.slow
def test_a_batch_killed_mid_write_leaves_nothing_in_the_output(export_dir, tmp_path, reaper):
    """`predict batch` writes beside the output folder and publishes at the end: stopped
    once rows are written, then SIGKILLed, it leaves no `prediction.*` file there, so the
    same command again is not refused as an output that holds predictions."""
    import signal

    from tests.support.common import ROOT
    (tmp_path / "a.json").write_text(instance_lines(images(600, seed=5), keys=range(600)))
    out = tmp_path / "out"
    argv = ["batch", "--model-dir", export_dir, "--input-paths", str(tmp_path / "a.json"),
            "--data-format", "text", "--output-path", str(out), "--batch-size", "1"]
    proc = reaper.python("-m", "predict", *argv, cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": ROOT})

    def written():
        return [os.path.join(d, n) for d, _, names in os.walk(out) for n in names
                if n.startswith("prediction.results-")
                and os.path.getsize(os.path.join(d, n)) > 0]
    deadline = time.monotonic() + 240
    while not written():
        assert proc.poll() is None and time.monotonic() < deadline, "no rows written"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGSTOP)  # mid-shard, and it stays there while looked at
    try:
        assert not [n for n in os.listdir(out) if n.startswith("prediction.")]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)
    assert len(open(written()[0]).readlines()) < 600  # it was killed mid-write
    assert main(argv) == 0
    assert [r["key"] for r in read_jsonl(out / "prediction.results-00000-of-00001")] == \
        list(range(600))
