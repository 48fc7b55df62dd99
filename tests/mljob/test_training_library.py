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
    # The servers serve until stopped, and SIGTERM stops each (exit 143).
    for proc in servers:
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
    for proc, name in zip(servers, ("ps0", "w0", "w1"), strict=True):
        assert wait_exit(proc, 30, tmp_path / f"{name}.log") == 143
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
    model_fn = kwargs.pop("model_fn", _tiny_model)
    return training.fit(model_fn, kwargs.pop("data", _tiny_data), **kwargs)


def _weighted_data(context):
    import tensorflow as tf
    return tf.data.Dataset.from_tensors(([[0.0, 1.0]], [1], [2.0])).repeat()


def _unlabelled_data(context):
    import tensorflow as tf
    return tf.data.Dataset.from_tensors([[0.0, 1.0]]).repeat()


@pytest.mark.parametrize("overrides, fragment", [
    (lambda keras: {"optimizer": keras.optimizers.Adam()},
     "give the optimizer as a function that returns a new one"),
    (lambda keras: {"optimizer": lambda: "adam"}, "optimizer gave str, not a Keras optimizer"),
    (lambda keras: {"metrics": ["f1"]}, "unknown metric 'f1'; give a Keras metric name"),
    (lambda keras: {"metrics": {"loss": "accuracy"}}, "a name other than 'loss'"),
    (lambda keras: {"loss": "no_such_loss"}, "unknown loss 'no_such_loss'"),
    (lambda keras: {"loss": None}, "no loss: pass loss=..."),
    (lambda keras: {"optimizer": None}, "no optimizer: pass optimizer=..."),
    (lambda keras: {"class_weight": {0: 1.0, 1: 3.0}, "data": _weighted_data},
     "class_weight and sample weights in the dataset cannot be used together"),
    (lambda keras: {"class_weight": {-1: 2.0}}, "class_weight keys must be class indices"),
    (lambda keras: {"loss": {"nope": "mse"}},
     "loss or metrics do not fit the model's outputs"),
    (lambda keras: {"data": _unlabelled_data}, "the dataset gives no labels"),
    (lambda keras: {"metrics": [keras.metrics.F1Score()]},
     "a metric does not fit the labels or outputs"),
    (lambda keras: {"loss": 3}, "loss must be a Keras loss or a function"),
], ids=["optimizer instance", "optimizer not one", "unknown metric", "metric named loss",
        "unknown loss", "no loss", "no optimizer", "class_weight and sample weights",
        "class_weight key", "loss dict not the outputs", "no labels", "metric misfit",
        "loss not one"])
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


# ---- what compile takes (losses.Objective), in this process --------------------------

def _objective(model, **kwargs):
    import tensorflow as tf

    from mljob.training.losses import Objective
    y_spec = kwargs.pop("y_spec", tf.TensorSpec([None, 1], tf.float32))
    objective = Objective.of(model, **kwargs)
    objective.build(model, (tf.TensorSpec([None, 2], tf.float32), y_spec))
    return objective


def _sigmoid_model(activation="sigmoid", units=1):
    import keras
    x = keras.Input((2,), name="x")
    return keras.Model(x, keras.layers.Dense(units, activation=activation)(x))


def _metrics_of(objective, labels, outputs):
    import tensorflow as tf
    state = objective.update(objective.zero_state(), tf.constant(labels), tf.constant(outputs),
                             None, [], tf.constant(0.0))
    return objective.results(state)[1]


def test_accuracy_is_resolved_as_keras_resolves_it():
    import keras
    import numpy as np
    labels = np.array([[0.0], [1.0], [1.0], [0.0]], np.float32)
    # A sigmoid output: probabilities, right when on the label's side of 0.5 (the issue's
    # bug thresholded them at 0, calling every example class 1).
    probabilities = np.array([[0.3], [0.7], [0.4], [0.1]], np.float32)
    objective = _objective(_sigmoid_model(), loss=keras.losses.BinaryCrossentropy(),
                           metrics=["accuracy"])
    assert _metrics_of(objective, labels, probabilities) == {"accuracy": 0.75}
    # From logits: threshold at 0 (sigmoid 0.5), for accuracy and AUC given by name.
    logits = np.array([[-0.2], [0.3], [0.2], [-1.0]], np.float32)
    objective = _objective(_sigmoid_model(None),
                           loss=keras.losses.BinaryCrossentropy(from_logits=True),
                           metrics=["accuracy", "auc"])
    got = _metrics_of(objective, labels, logits)
    assert got["accuracy"] == 1.0  # at 0.5 the logits 0.3 and 0.2 would count as 0
    auc = keras.metrics.AUC(from_logits=True)
    auc.update_state(labels, logits)
    assert got["auc"] == pytest.approx(float(auc.result()))
    # Softmax outputs: sparse labels -> sparse categorical, one-hot -> categorical.
    import tensorflow as tf
    model = _sigmoid_model("softmax", 3)
    sparse = _objective(model, loss="sparse_categorical_crossentropy", metrics=["acc"],
                        y_spec=tf.TensorSpec([None], tf.int64))
    assert isinstance(sparse.metrics.metrics[0], keras.metrics.SparseCategoricalAccuracy)
    onehot = _objective(model, loss="categorical_crossentropy", metrics=["accuracy"],
                        y_spec=tf.TensorSpec([None, 3], tf.float32))
    assert isinstance(onehot.metrics.metrics[0], keras.metrics.CategoricalAccuracy)


def test_metric_states_merge_into_the_metric_over_every_example():
    """Two replicas' (or ps workers') batches: their states merged give Keras's metric
    over all the examples, not the mean of the two values."""
    import keras
    import numpy as np
    import tensorflow as tf
    rng = np.random.default_rng(5)
    labels = (rng.random((64, 1)) > 0.5).astype(np.float32)
    scores = np.clip(labels * 0.3 + rng.random((64, 1)) * 0.7, 0, 1).astype(np.float32)
    scores[:32] = scores[:32] * 0.5  # the halves score on different scales
    metrics = lambda: [keras.metrics.AUC(name="auc"),  # noqa: E731
                       keras.metrics.Precision(name="precision"),
                       keras.metrics.TruePositives(name="tp"), "accuracy"]
    objective = _objective(_sigmoid_model(), loss="binary_crossentropy", metrics=metrics())
    states = []
    for half in (slice(0, 32), slice(32, 64)):
        loss, each = objective.loss(tf.constant(labels[half]), tf.constant(scores[half]))
        states.append(objective.update(objective.zero_state(), tf.constant(labels[half]),
                                       tf.constant(scores[half]), None, each, loss))
    loss, merged = objective.results(objective.merge(states))
    whole = {}
    for metric in metrics()[:3] + [keras.metrics.BinaryAccuracy(name="accuracy")]:
        metric.update_state(labels, scores)
        whole[metric.name] = float(metric.result())
    assert merged == pytest.approx(whole, rel=1e-6)
    halves = [objective.results(s)[1]["auc"] for s in states]
    assert abs(np.mean(halves) - merged["auc"]) > 0.01  # an average would be wrong
    bce = keras.losses.BinaryCrossentropy()
    assert loss == pytest.approx(float(bce(labels, scores)), rel=1e-5)


def test_sample_and_class_weights_weigh_the_loss_as_keras_does():
    import keras
    import numpy as np
    import tensorflow as tf
    labels = np.array([0, 1, 2, 1], np.int64)
    outputs = np.array([[.7, .2, .1], [.2, .5, .3], [.1, .1, .8], [.6, .3, .1]], np.float32)
    model = _sigmoid_model("softmax", 3)
    objective = _objective(model, loss="sparse_categorical_crossentropy",
                           class_weight={1: 3.0}, y_spec=tf.TensorSpec([None], tf.int64))
    weights = objective.class_weights(tf.constant(labels)).numpy()
    assert weights.tolist() == [1.0, 3.0, 1.0, 3.0]
    onehot = objective.class_weights(tf.constant(np.eye(3, dtype=np.float32)[labels]))
    assert onehot.numpy().tolist() == weights.tolist()
    loss, _ = objective.loss(tf.constant(labels), tf.constant(outputs), tf.constant(weights))
    keras_loss = keras.losses.SparseCategoricalCrossentropy()(labels, outputs,
                                                              sample_weight=weights)
    assert float(loss) == pytest.approx(float(keras_loss), rel=1e-6)


def test_a_compiled_model_supplies_loss_metrics_and_optimizer_and_arguments_win(
        tmp_path, capsys):
    import keras

    def compiled():
        model = _tiny_model()
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(
                          k=1, name="top1")])
        return model

    assert _fit(tmp_path / "a", model_fn=compiled, loss=None, optimizer=None) == 0
    out = capsys.readouterr().out
    assert "step 2/2 loss=" in out and " accuracy=" in out and " top1=" in out, out
    assert _fit(tmp_path / "b", model_fn=compiled, loss=None, optimizer=None,
                metrics=["mae"]) == 0
    out = capsys.readouterr().out
    line = [s for s in out.splitlines() if s.startswith("step 2/2 ")][0]
    assert " mae=" in line and " accuracy=" not in line and " top1=" not in line, line


def test_the_issues_lookup_table_model_exports_with_its_table(tmp_path):
    """The issue's minimal case: StringLookup -> Embedding -> Dense, exported with
    mljob.training.export (was an "untracked resource" traceback); the export takes the
    raw strings and answers as the model does."""
    import keras
    import numpy as np
    import tensorflow as tf

    from mljob import training
    from mljob.training import export as export_lib

    def model_fn():
        keras.utils.set_random_seed(3)
        x = keras.Input((), dtype="string", name="x")
        ids = keras.layers.StringLookup(vocabulary=["a", "b"])(x)
        h = keras.layers.Embedding(3, 4)(ids)
        return keras.Model(x, keras.layers.Dense(2)(h))

    model = model_fn()
    url = str(tmp_path / "model")
    export_lib.export(model_fn, model.get_weights(), url, training.Serving())
    loaded = export_lib.load(url)
    words = tf.constant(["a", "b", "zzz", "a"])
    out = loaded.signatures["serving_default"](x=words, key=tf.constant([4, 3, 2, 1],
                                                                          tf.int64))
    assert out["key"].numpy().tolist() == [4, 3, 2, 1]
    np.testing.assert_allclose(out["outputs"].numpy(), model(words).numpy(), rtol=1e-6)
    assert not np.allclose(out["outputs"].numpy()[0], out["outputs"].numpy()[2])


def test_class_weight_weighs_the_training_loss(tmp_path, capsys):
    """Every label is 1 (_tiny_data): with class 1 weighing 0 the loss a step reports
    is 0 and nothing moves; weighing 3, the loss is three times the unweighted one."""
    import keras

    def seeded():
        keras.utils.set_random_seed(1)
        return _tiny_model()
    losses = {}
    for name, weights in (("none", None), ("zero", {1: 0.0}), ("three", {1: 3.0})):
        assert _fit(tmp_path / name, model_fn=seeded, class_weight=weights,
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)) == 0
        out = capsys.readouterr().out
        line = [s for s in out.splitlines() if s.startswith("step 1/2 ")][0]
        losses[name] = float(line.split("loss=")[1].split()[0])
    assert losses["zero"] == 0.0 and losses["none"] > 0.1
    assert losses["three"] == pytest.approx(3 * losses["none"], rel=1e-3)


def test_weighted_metrics_take_the_sample_weights_and_metrics_do_not():
    import keras
    import numpy as np
    import tensorflow as tf
    labels = np.array([[1.0], [2.0], [4.0]], np.float32)
    outputs = np.array([[1.5], [1.0], [4.0]], np.float32)
    weights = np.array([2.0, 0.0, 1.0], np.float32)
    objective = _objective(_sigmoid_model(None), loss="mse", metrics=["mae"],
                           weighted_metrics=["mae"])
    loss, each = objective.loss(tf.constant(labels), tf.constant(outputs), tf.constant(weights))
    state = objective.update(objective.zero_state(), tf.constant(labels), tf.constant(outputs),
                             tf.constant(weights), each, loss)
    _, got = objective.results(state)
    plain, weighted = keras.metrics.MeanAbsoluteError(), keras.metrics.MeanAbsoluteError()
    plain.update_state(labels, outputs)
    weighted.update_state(labels, outputs, sample_weight=weights)
    assert got == pytest.approx({"mae": float(plain.result()),
                                 "weighted_mae": float(weighted.result())})
    assert float(loss) == pytest.approx(float(keras.losses.MeanSquaredError()(
        labels, outputs, sample_weight=weights)))
