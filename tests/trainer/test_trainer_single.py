"""The single-node replica in this process: flags, training, checkpoints, summaries read
back with TensorBoard's own reader, the export; usage errors before TensorFlow loads."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from mljob import storage
from trainer import task
from tests.support.trainer_runs import FAST, ROOT, export_accuracy

JOB = "memory://jobs/single"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One short MLP run into memory://, copied to a local folder for the readers."""
    import fsspec
    fs = fsspec.filesystem("memory")
    fs.rm("/jobs/single", recursive=True) if fs.exists("/jobs/single") else None
    args = [*FAST, "--job-dir", JOB, "--train-steps", "120", "--checkpoint-every", "50",
            "--eval-every", "60", "--log-every", "20", "--keep-checkpoints", "2",
            "--steps-per-execution", "7"]
    status, out = _main_capturing(args)
    local = tmp_path_factory.mktemp("single") / "job"
    storage.download_tree(JOB, str(local))
    files = sorted(fs.find("/jobs/single"))
    fs.rm("/jobs/single", recursive=True)
    return status, out, local, files


def _main_capturing(args):
    import contextlib
    import io
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        status = task.main(args)
    return status, buffer.getvalue()


def test_trains_and_reports_the_contract_lines(trained):
    status, out, _, _ = trained
    assert status == 0, out
    lines = out.splitlines()
    # The precision the job computes in and TensorFlow's CPU kernels, decided once before
    # the model is built, then the started line.
    assert lines[0].startswith("mixed precision: ")
    assert lines[1].startswith("cpu kernels: ")
    assert lines[2].startswith("training started: strategy=single step=0 train_steps=120 "
                               "model=mlp ")
    steps = [line for line in lines if line.startswith("step ")]
    # The first line right after the first step, then every --log-every steps, whatever
    # --steps-per-execution packs together.
    assert [s.split()[1] for s in steps] == ["1/120", "20/120", "40/120", "60/120",
                                             "80/120", "100/120", "120/120"]
    for line in steps:
        fields = dict(f.split("=") for f in line.split()[2:])
        assert set(fields) == {"loss", "accuracy", "examples/s", "lr"}
        # the MLP's default: a cosine from 0.01 at step 0 to 0 at --train-steps, the
        # rate the optimizer's next step takes
        done = int(line.split()[1].split("/")[0])
        assert float(fields["lr"]) == pytest.approx(
            0.005 * (1 + math.cos(math.pi * done / 120)), rel=1e-3, abs=1e-7)
    evals = [line for line in lines if line.startswith("eval step=")]
    assert [e.split()[1] for e in evals] == ["step=60", "step=120"]
    assert float(evals[-1].rsplit("accuracy=", 1)[1]) > 0.6
    assert any(line.startswith("training finished: step=120 ") for line in lines)
    assert lines[-1] == f"exported model to {JOB}/model"


def test_checkpoints_are_published_and_pruned(trained):
    _, _, local, files = trained
    names = sorted(os.listdir(local / "checkpoints"))
    # keep 2: ckpt-50 was pruned after ckpt-120's state file was published.
    assert names == ["checkpoint", "ckpt-100.data-00000-of-00001", "ckpt-100.index",
                     "ckpt-120.data-00000-of-00001", "ckpt-120.index"]
    state = (local / "checkpoints" / "checkpoint").read_text()
    assert state.splitlines()[0] == 'model_checkpoint_path: "ckpt-120"'
    import tensorflow as tf
    reader = tf.train.load_checkpoint(str(local / "checkpoints" / "ckpt-120"))
    assert reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == 120
    assert any(f.endswith("/model/saved_model.pb") for f in files)


def test_summaries_read_back_with_tensorboard(trained):
    from tensorboard.backend.event_processing import event_accumulator
    _, _, local, _ = trained
    train = event_accumulator.EventAccumulator(str(local / "summaries" / "train"),
                                               size_guidance={"tensors": 0})
    train.Reload()
    tags = set(train.Tags()["tensors"])
    # grouped by prefix, so TensorBoard's time-series page opens loss and accuracy first
    assert {"metrics/loss", "metrics/accuracy", "optimizer/learning_rate",
            "speed/steps_per_sec", "speed/examples_per_sec"} <= tags
    assert [e.step for e in train.Tensors("metrics/loss")] == [1, 20, 40, 60, 80, 100, 120]
    histograms = [t for t in tags if t.startswith("weights/")]
    assert "weights/hidden/kernel" in histograms
    assert train.SummaryMetadata("weights/hidden/kernel").plugin_data.plugin_name \
        == "histograms"
    evals = event_accumulator.EventAccumulator(str(local / "summaries" / "eval"))
    evals.Reload()
    assert {"metrics/loss", "metrics/accuracy"} <= set(evals.Tags()["tensors"])
    assert [e.step for e in evals.Tensors("metrics/accuracy")] == [60, 120]


def test_export_loads_and_predicts(trained):
    _, _, local, _ = trained
    assert export_accuracy(str(local / "model")) > 0.6


@pytest.mark.parametrize("argv, words", [
    (["--bogus", "1"], "unrecognized arguments: --bogus"),
    (["--train-step", "3"], "unrecognized arguments: --train-step"),  # no abbreviations
    (["--train-steps", "0"], "--train-steps"),
    (["--model", "resnet"], "--model"),
    (["--strategy", "ps"], "--strategy ps needs parameter servers"),
    (["--train-files", "a.gz"], "--eval-files"),
    (["--job-dir", "nosuchscheme://x"], "--job-dir"),
    (["--ps-wire-dtype", "float16"], "--ps-wire-dtype"),
    (["--ps-wire-dtype", "bfloat16", "--no-ps-local-steps"],
     "--ps-wire-dtype bfloat16 packs what local steps send"),
    (["--ps-merge", "sum"], "--ps-merge"),
    (["--ps-merge", "mean", "--no-ps-local-steps"],
     "--ps-merge mean merges what local steps send"),
])
def test_usage_errors_exit_2_with_one_line(capsys, argv, words):
    assert task.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert words in err


def test_cluster_errors_come_before_tensorflow_loads(tmp_path):
    code = ("import sys; from trainer import task; status = task.main(['--model', 'mlp']); "
            "print('tensorflow' in sys.modules); sys.exit(status)")
    env = dict(os.environ, TF_CONFIG='{"cluster": {"ps": ["127.0.0.1:1"]}, '
               '"task": {"type": "ps", "index": 0}}')
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout.strip() == "False"
    assert done.stderr.startswith("error: TF_CONFIG cluster has parameter servers but no "
                                  "worker")


def test_partitioner_choice():
    import tensorflow as tf

    from mljob.training.strategies import make_partitioner
    assert make_partitioner(0, num_ps=1) is None          # one ps: nothing to spread
    assert make_partitioner(1, num_ps=3) is None          # --ps-shards 1: no sharding
    auto = make_partitioner(0, num_ps=3)
    assert auto(tf.TensorShape([3136, 1024]), tf.float32) == [3, 1]  # the CNN's dense1
    assert auto(tf.TensorShape([784, 100]), tf.float32) == [2, 1]    # 306 KiB: 2 shards
    assert auto(tf.TensorShape([100]), tf.float32) == [1]            # small: kept whole
    assert make_partitioner(2, num_ps=1)(tf.TensorShape([784, 100]), tf.float32) == [2, 1]


def test_gs_job_dir_on_the_emulator_publishes_and_resumes(gcs_emulator):
    job = "gs://mljob-test/jobs/trainer-single"
    args = [*FAST, "--job-dir", job, "--checkpoint-every", "20", "--log-every", "20",
            "--eval-every", "0"]
    status, out = _main_capturing([*args, "--train-steps", "40"])
    assert status == 0, out
    fs, _ = storage.filesystem(job)
    files = {p.split("trainer-single/", 1)[1] for p in fs.find(job)}
    assert {"checkpoints/checkpoint", "checkpoints/ckpt-40.index",
            "model/saved_model.pb"} <= files
    assert any(f.startswith("summaries/train/events.out.tfevents.") for f in files)
    assert any(f.startswith("summaries/eval/events.out.tfevents.") for f in files)
    # A second run downloads the newest checkpoint and goes on from its step.
    status, out = _main_capturing([*args, "--train-steps", "60"])
    assert status == 0, out
    assert "training started: strategy=single step=40 train_steps=60" in out
    assert storage.read_bytes(f"{job}/checkpoints/checkpoint").startswith(
        b'model_checkpoint_path: "ckpt-60"')


def test_flag_choices_match_the_model_module():
    from trainer import model
    assert task.MODELS == model.MODELS  # repeated in task.py to keep TensorFlow unloaded


def test_missing_tensorflow_is_one_line(monkeypatch, capsys, tmp_path):
    """TensorFlow is an extra (cluster images bring their own): without it the trainer
    says so in one line instead of a ModuleNotFoundError traceback."""
    import sys as _sys
    from trainer import task
    monkeypatch.setitem(_sys.modules, "tensorflow", None)  # find_spec then finds none
    monkeypatch.delenv("TF_CONFIG", raising=False)
    status = task.main(["--job-dir", str(tmp_path / "job"), "--model", "mlp"])
    err = capsys.readouterr().err
    assert status == 1 and err.count("\n") == 1
    assert err.startswith("error: TensorFlow is not installed for this Python; install "
                          "mljob with its cpu or gpu extra")
    assert not (tmp_path / "job").exists()
