"""mljob.training with a user's own model: a tabular classifier (numeric columns and an
embedded categorical one, tests/support/tabular_trainer.py) that is neither the bundled
CNN nor the MLP, on data the test generates. Trained as real processes on 127.0.0.1 under
a single node, a ps cluster (chief, 2 workers, 1 ps) and MultiWorkerMirroredStrategy
(2 replicas); stopped by SIGTERM and resumed from the saved step; exported; and
`python -m predict local` answers with the export, the instance keys passed through."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from tests.support.common import ROOT, free_ports, pid_alive
from tests.support.tabular_trainer import make_data
from tests.support.trainer_runs import cluster, lines, read, start, tf_config, wait_exit, \
    wait_for

USER_TRAINER = "tests.support.tabular_trainer"
TIMEOUT = 240


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "data.npz"
    return str(path), make_data(path)


def _start(reaper, tmp_path, name, args, spec=None, task=None, index=0):
    config = tf_config(spec, task, index) if spec else None
    return start(reaper, tmp_path / f"{name}.log", args, tf_config=config,
                 module=USER_TRAINER)


def _logged_steps(log) -> list[int]:
    return [int(re.match(r"step (\d+)/", line).group(1)) for line in lines(log, "step ")]


def _stopped_at(log) -> int:
    match = re.search(r"^error: stopped at step (\d+) \(", read(log), re.M)
    assert match, read(log)[-3000:]
    return int(match.group(1))


def _predict_local(tmp_path, model_dir, arrays, count=200) -> list[dict]:
    """`python -m predict local` on the first `count` examples, keys 1000 upward."""
    path = tmp_path / "instances.json"
    with open(path, "w") as f:
        for i in range(count):
            f.write(json.dumps({"num": arrays["num"][i].tolist(),
                                "cat": int(arrays["cat"][i]), "key": 1000 + i}) + "\n")
    done = subprocess.run([sys.executable, "-m", "predict", "local", "--model-dir",
                           str(model_dir), "--json-instances", str(path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert [a["key"] for a in answers] == list(range(1000, 1000 + count))
    return answers


def _check_export_answers(tmp_path, job, arrays) -> None:
    answers = _predict_local(tmp_path, job / "model", arrays)
    assert set(answers[0]) == {"key", "class", "probabilities"}
    assert all(abs(sum(a["probabilities"]) - 1) < 1e-4 for a in answers)
    predicted = np.array([a["class"] for a in answers])
    assert np.mean(predicted == arrays["label"][:len(answers)]) > 0.85


def _args(data_path, job, *extra):
    return ["--data", data_path, "--job-dir", str(job), *extra]


@pytest.mark.slow
def test_single_node_sigterm_then_resume_export_and_predict(reaper, tmp_path, data):
    data_path, arrays = data
    job = tmp_path / "job"
    first = _start(reaper, tmp_path, "run1", _args(data_path, job, "--train-steps", "100000",
                                                   "--checkpoint-every", "0"))
    wait_for(lambda: [s for s in _logged_steps(tmp_path / "run1.log") if s >= 100]
             or first.poll() is not None, TIMEOUT, "step 100")
    first.send_signal(signal.SIGTERM)
    assert wait_exit(first, 60, tmp_path / "run1.log") == 143, read(tmp_path / "run1.log")
    saved = _stopped_at(tmp_path / "run1.log")
    assert "(got SIGTERM)" in read(tmp_path / "run1.log")
    assert os.path.exists(job / "checkpoints" / f"ckpt-{saved}.index")
    assert not os.path.exists(job / "model")  # stopped: no export

    total = saved + 150
    second = _start(reaper, tmp_path, "run2", _args(data_path, job, "--train-steps",
                                                    str(total)))
    assert wait_exit(second, TIMEOUT, tmp_path / "run2.log") == 0, read(tmp_path / "run2.log")
    assert lines(tmp_path / "run2.log", "training started:")[0].startswith(
        f"training started: strategy=single step={saved} train_steps={total} model=tabular ")
    assert lines(tmp_path / "run2.log", f"eval step={total} loss=")
    assert lines(tmp_path / "run2.log", "exported model to") == [
        f"exported model to {job / 'model'}"]
    _check_export_answers(tmp_path, job, arrays)

    from tensorboard.backend.event_processing import event_accumulator
    train = event_accumulator.EventAccumulator(str(job / "summaries" / "train"))
    train.Reload()
    assert {"metrics/loss", "metrics/accuracy", "speed/examples_per_sec",
            "weights/cat_embedding/embeddings"} <= set(train.Tags()["tensors"])


@pytest.mark.slow
def test_ps_cluster_chief_two_workers_one_ps(reaper, tmp_path, data):
    data_path, arrays = data
    job = tmp_path / "job"
    spec = cluster(free_ports(4), workers=2, ps=1)
    args = _args(data_path, job, "--train-steps", "300")
    servers = [_start(reaper, tmp_path, "ps0", args, spec, "ps"),
               _start(reaper, tmp_path, "w0", args, spec, "worker", 0),
               _start(reaper, tmp_path, "w1", args, spec, "worker", 1)]
    chief = _start(reaper, tmp_path, "chief", args, spec, "chief")
    assert wait_exit(chief, TIMEOUT, tmp_path / "chief.log") == 0, read(tmp_path / "chief.log")
    log = tmp_path / "chief.log"
    assert lines(log, "training started:")[0].startswith(
        "training started: strategy=ps step=0 train_steps=300 model=tabular replicas=2 ")
    assert lines(log, "variables: ")  # the ps placed them
    # Adam: each worker's scheduled function runs local steps (the library's default).
    assert lines(log, "ps updates: local steps (")
    assert lines(log, "training finished: step=300")
    # The servers serve until stopped, and SIGTERM stops each (exit 0).
    for proc in servers:
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
    for proc, name in zip(servers, ("ps0", "w0", "w1"), strict=True):
        assert wait_exit(proc, 30, tmp_path / f"{name}.log") == 0
        assert "stopping: got SIGTERM" in read(tmp_path / f"{name}.log")
        assert not pid_alive(proc.pid)
    _check_export_answers(tmp_path, job, arrays)


@pytest.mark.slow
def test_multiworker_two_replicas_sigterm_then_resume(reaper, tmp_path, data):
    data_path, arrays = data
    job = tmp_path / "job"
    run1 = _args(data_path, job, "--train-steps", "100000", "--checkpoint-every", "0",
                 "--steps-per-execution", "5")
    spec = cluster(free_ports(2), workers=1, ps=0)
    worker = _start(reaper, tmp_path, "w0-1", run1, spec, "worker")
    chief = _start(reaper, tmp_path, "chief-1", run1, spec, "chief")
    wait_for(lambda: [s for s in _logged_steps(tmp_path / "chief-1.log") if s >= 100]
             or chief.poll() is not None or worker.poll() is not None,
             TIMEOUT, "the multiworker chief to reach step 100")
    assert chief.poll() is None and worker.poll() is None, read(tmp_path / "chief-1.log")
    chief.send_signal(signal.SIGTERM)
    assert wait_exit(chief, 60, tmp_path / "chief-1.log") == 143, \
        read(tmp_path / "chief-1.log")
    assert wait_exit(worker, 60, tmp_path / "w0-1.log") == 143, read(tmp_path / "w0-1.log")
    saved = _stopped_at(tmp_path / "chief-1.log")
    assert _stopped_at(tmp_path / "w0-1.log") == saved  # one save, the same step
    assert os.path.exists(job / "checkpoints" / f"ckpt-{saved}.index")

    total = saved + 100
    run2 = _args(data_path, job, "--train-steps", str(total), "--steps-per-execution", "5")
    spec = cluster(free_ports(2), workers=1, ps=0)
    worker = _start(reaper, tmp_path, "w0-2", run2, spec, "worker")
    chief = _start(reaper, tmp_path, "chief-2", run2, spec, "chief")
    assert wait_exit(chief, TIMEOUT, tmp_path / "chief-2.log") == 0, \
        read(tmp_path / "chief-2.log")
    assert wait_exit(worker, 60, tmp_path / "w0-2.log") == 0, read(tmp_path / "w0-2.log")
    assert lines(tmp_path / "chief-2.log", "training started:")[0].startswith(
        f"training started: strategy=multiworker step={saved} train_steps={total} "
        "model=tabular replicas=2 ")
    assert not lines(tmp_path / "w0-2.log", "exported model")  # only the chief writes
    _check_export_answers(tmp_path, job, arrays)


def test_importing_the_library_loads_no_tensorflow():
    code = ("import sys, mljob, mljob.training, mljob.training.outputs; "
            "print('tensorflow' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


# ---- the user's mistakes: a UsageError naming the fix; through main, exit 2, one line --

def _tiny_model():
    import keras
    x = keras.Input(shape=(2,), name="x")
    return keras.Model(x, keras.layers.Dense(2, name="out")(x))


def _tiny_data(context):
    import tensorflow as tf
    return tf.data.Dataset.from_tensors(([[0.0, 1.0]], [1])).repeat()


def _fit(tmp_path, **overrides):
    import keras

    from mljob import cluster, training
    kwargs = dict(loss="sparse_categorical_crossentropy",
                  optimizer=lambda: keras.optimizers.SGD(0.1),
                  config=training.RunConfig(job_dir=str(tmp_path / "job"), train_steps=2,
                                            batch_size=1),
                  info=cluster.from_environment({}))
    kwargs.update(overrides)
    return training.fit(_tiny_model, _tiny_data, **kwargs)


@pytest.mark.parametrize("overrides, fragment", [
    (lambda keras: {"optimizer": keras.optimizers.Adam()},
     "give the optimizer as a function that returns a new one"),
    (lambda keras: {"optimizer": lambda: "adam"}, "optimizer gave str, not a Keras optimizer"),
    (lambda keras: {"metrics": ["f1"]}, "unknown metric 'f1'; give a Keras metric name"),
    (lambda keras: {"metrics": {"loss": "accuracy"}}, "a name other than 'loss'"),
    (lambda keras: {"loss": "no_such_loss"}, "unknown loss 'no_such_loss'"),
], ids=["optimizer instance", "optimizer not one", "unknown metric", "metric named loss",
        "unknown loss"])
def test_library_usage_errors_name_the_fix(tmp_path, overrides, fragment):
    import keras

    from mljob.training import UsageError
    with pytest.raises(UsageError, match=re.escape(fragment)):
        _fit(tmp_path, **overrides(keras))
    assert not os.path.exists(tmp_path / "job" / "model")


@pytest.mark.parametrize("make, fragment", [
    (lambda t: t.RunConfig(train_steps=0).check(),
     "train_steps must be an integer of at least 1"),
    (lambda t: t.RunConfig(checkpoint_every=-1).check(), "checkpoint_every must be an integer"),
    (lambda t: t.RunConfig(strategy="horovod").check(), "strategy 'horovod' is not one of auto"),
    (lambda t: t.RunConfig(ps_wire_dtype="float16").check(),
     "ps_wire_dtype 'float16' is not one of float32, bfloat16"),
    (lambda t: t.RunConfig(ps_merge="sum").check(), "ps_merge 'sum' is not one of sqrt, mean"),
    (lambda t: t.Serving(inputs={}), "Serving needs at least one input"),
    (lambda t: t.Serving(inputs={"key": None}), "the instance key 'key' is also a model input"),
], ids=["train_steps 0", "negative every", "unknown strategy", "wire dtype", "merge rule", "no inputs",
        "key is an input"])
def test_library_config_errors_name_the_fix(make, fragment):
    from mljob import training
    with pytest.raises(training.UsageError, match=re.escape(fragment)):
        make(training)


def test_main_reports_a_usage_error_in_one_line_and_exits_2(tmp_path):
    script = ("from mljob import training\n"
              "training.main(lambda: None, lambda c: None, loss='mse', optimizer='sgd',\n"
              "              config=training.RunConfig(job_dir=%r, train_steps=-3))\n"
              % str(tmp_path / "job"))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, env={**os.environ, "TF_CONFIG": ""})
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error: train_steps must be an integer of at least 1, got -3"], done.stderr
    assert not os.path.exists(tmp_path / "job")
