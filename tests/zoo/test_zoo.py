"""The zoo (tests/zoo/models.py) trained by `mljob.training.fit` on a single node, in
this process, a few steps each, then for every model:

- the export's `serving_default` (its inputs the model's own, strings as strings) gives
  the trained model's predictions: the Keras model with the checkpoint's weights;
- the evaluation the run reported (its TensorBoard eval scalars) equals Keras's own
  `model.evaluate` on the same data with the same weights (its metric objects);
- what the model holds was trained and exported: lookup tables answer, Normalization's
  statistics, BatchNormalization's moving statistics and a custom layer's state are
  the trained ones, not their initial values;
- one `predict serve` process serving every export answers REST and gRPC with the
  export's own predictions, and `predict local` too (census: string, int64 and float
  inputs).
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.support.common import ROOT
from tests.zoo import models as zoo

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
STEPS = 20
EVAL_N = 256


def _run_dir(root, name):
    return os.path.join(str(root), name)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """{name: job dir}, every zoo model trained and exported."""
    from mljob import cluster, training
    root = tmp_path_factory.mktemp("zoo")
    jobs = {}
    for name, entry in zoo.ZOO.items():
        job = _run_dir(root, name)
        keras.backend.clear_session()  # layer names from 0: trained_model's match them
        status = training.fit(
            entry.model_fn, **zoo.fit_arguments(entry, eval_n=EVAL_N),
            config=training.RunConfig(job_dir=job, train_steps=STEPS, batch_size=32,
                                      eval_every=0, checkpoint_every=0, log_every=10,
                                      steps_per_execution=5),
            info=cluster.from_environment({}))
        assert status == 0
        jobs[name] = job
    return jobs


def trained_model(entry, job):
    """The model as training left it: model_fn's, with the final checkpoint's weights
    (the checkpoint names weights by path: the names restart as they did for the run)."""
    keras.backend.clear_session()
    model = entry.model_fn()
    checkpoint = tf.train.Checkpoint(model={w.path: w.value for w in model.weights})
    checkpoint.read(tf.train.latest_checkpoint(os.path.join(job, "checkpoints"))) \
        .expect_partial().assert_existing_objects_matched()
    return model


def eval_features(entry):
    return zoo.entry_data(entry, EVAL_N, 1)[0]


def _predictable(features):
    """Features as `model.predict` takes them (numpy strings as string tensors)."""
    def one(v):
        return tf.constant(v) if v.dtype.kind in "US" else v
    return {k: one(v) for k, v in features.items()} if isinstance(features, dict) \
        else one(features)


def export_predictions(job, features):
    """serving_default of the export on `features` (numpy), keys 0..n-1; by output."""
    loaded = tf.saved_model.load(os.path.join(job, "model"))
    fn = loaded.signatures["serving_default"]
    n = len(next(iter(features.values())))
    out = fn(**{k: tf.constant(v) for k, v in features.items()},
             key=tf.constant(np.arange(n, dtype=np.int64)))
    assert out.pop("key").numpy().tolist() == list(range(n))
    return {k: v.numpy() for k, v in out.items()}


def reported_eval(job) -> dict:
    """The run's last eval scalars, by name, from its TensorBoard events."""
    values = {}
    for path in glob.glob(os.path.join(job, "summaries", "eval", "events.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                values[value.tag.split("/", 1)[1]] = float(
                    tf.make_ndarray(value.tensor))
    return values


@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_export_equals_the_trained_model_and_metrics_equal_keras(trained, name):
    entry, job = zoo.ZOO[name], trained[name]
    model = trained_model(entry, job)
    raw = eval_features(entry)
    features = zoo.as_inputs(entry, raw)
    expected = model.predict(_predictable(raw), batch_size=64, verbose=0)
    got = export_predictions(job, features)
    if not isinstance(expected, dict):
        expected = {"outputs": expected} if len(got) == 1 and "outputs" in got else \
            dict(zip(model.output_names, expected if isinstance(expected, list)
                     else [expected], strict=True))
    assert set(got) == set(expected)
    for key in got:
        np.testing.assert_allclose(got[key], np.asarray(expected[key], np.float32),
                                   rtol=entry.tolerance, atol=entry.tolerance)

    reference = entry.reference(trained_model(entry, job))
    keras_says = reference.evaluate(zoo.dataset(entry, EVAL_N, 1, 64), verbose=0,
                                    return_dict=True)
    reported = reported_eval(job)
    assert set(keras_says) <= set(reported), (keras_says, reported)
    for metric, value in keras_says.items():
        assert reported[metric] == pytest.approx(float(value), rel=1e-4, abs=1e-5), \
            (metric, reported, keras_says)


def test_sigmoid_accuracy_is_keras_accuracy_not_a_threshold_at_zero(trained):
    """The issue's census case: a sigmoid output with BinaryCrossentropy(); accuracy is
    the share of probabilities on the right side of 0.5 (Keras's BinaryAccuracy)."""
    entry, job = zoo.ZOO["census"], trained["census"]
    model = trained_model(entry, job)
    x, y = zoo.entry_data(entry, EVAL_N, 1)
    p = model.predict(_predictable(x), verbose=0).reshape(-1)
    right = np.mean((p > 0.5) == (y > 0.5))
    assert reported_eval(job)["accuracy"] == pytest.approx(right, abs=1e-6)
    assert right > 0.75  # it learned: the old threshold at 0 called every example 1
    assert np.mean((p > 0) == (y > 0.5)) < right


def test_what_the_models_hold_was_trained_and_exported(trained):
    # BatchNormalization's moving statistics moved from their initial 0 and 1.
    image = trained_model(zoo.ZOO["image"], trained["image"])
    bn = image.get_layer("bn")
    assert np.abs(np.asarray(bn.moving_mean)).max() > 1e-3
    assert np.abs(np.asarray(bn.moving_variance) - 1).max() > 1e-3
    # The subclassed model's own state (running mean, batch count) in the export.
    sub = tf.saved_model.load(os.path.join(trained["subclassed"], "model"))
    state = {v.name.split(":")[0].split("/")[-1]: v.numpy() for v in sub.model_variables}
    assert state["batches_seen"] == STEPS
    assert np.abs(state["running_mean"] - 2).max() < 1.0  # the data's mean is 2
    # The lookup table answers in the export: an unknown colour differs from a known one.
    fn = sub.signatures["serving_default"]
    x = tf.constant([[2.0, 2.0, 2.0]] * 2)
    out = fn(x=x, colour=tf.constant(["blue", "purple"]), key=tf.constant([1, 2], tf.int64))
    assert out["outputs"].numpy()[0] != out["outputs"].numpy()[1]
    # The census export takes the raw columns in their own dtypes.
    census = tf.saved_model.load(os.path.join(trained["census"], "model"))
    spec = census.signatures["serving_default"].structured_input_signature[1]
    assert {k: v.dtype.name for k, v in spec.items()} == {
        "age": "float32", "hours": "float32", "city": "string", "children": "int64",
        "occupation": "string", "key": "int64"}


# ---- the same answers from `predict local`, REST and gRPC ------------------------------

INSTANCES = 4


def _json_value(value):
    value = value.tolist() if isinstance(value, np.ndarray) else value
    return value.decode() if isinstance(value, bytes) else value


def _instances(entry) -> list[dict]:
    features = zoo.as_inputs(entry, eval_features(entry))
    return [{**{k: _json_value(np.asarray(v[i])) for k, v in features.items()}, "key": i}
            for i in range(INSTANCES)]


@pytest.fixture(scope="module")
def served(trained, tmp_path_factory):
    """(REST base URL, gRPC port) of one `predict serve` with every export."""
    from mljob.procs import free_ports
    from tests.support.common import Reaper
    from tests.support.predict_models import start_server
    root = tmp_path_factory.mktemp("served")
    config = ["model_config_list {"]
    for name, job in trained.items():
        shutil.copytree(os.path.join(job, "model"), root / name / "1")
        config.append(f'  config {{ name: "{name}" base_path: "{root / name}" '
                      'model_platform: "tensorflow" }')
    (root / "models.config").write_text("\n".join(config + ["}"]) + "\n")
    reaper = Reaper()
    grpc_port = free_ports(1)[0]
    try:
        _, url = start_server(reaper.popen, str(root / "models.config"), "--grpc-port",
                              str(grpc_port), flag="--model-config-file")
        yield url, grpc_port
    finally:
        reaper.stop_all()


def test_rest_and_grpc_answer_as_the_export_does(trained, served):
    import grpc
    import httpx
    pytest.importorskip("predict.serving_api.apis.prediction_service_pb2_grpc")
    from predict.serving_api.apis import predict_pb2, prediction_service_pb2_grpc
    url, grpc_port = served
    with httpx.Client(base_url=url, timeout=120) as client, \
            grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for name, job in sorted(trained.items()):
            entry = zoo.ZOO[name]
            features = {k: v[:INSTANCES] for k, v in
                        zoo.as_inputs(entry, eval_features(entry)).items()}
            expected = export_predictions(job, features)
            answer = client.post(f"/v1/models/{name}:predict",
                                 json={"instances": _instances(entry)})
            assert answer.status_code == 200, (name, answer.text[:500])
            rows = answer.json()["predictions"]
            assert [row["key"] for row in rows] == list(range(INSTANCES)), name
            request = predict_pb2.PredictRequest()
            request.model_spec.name = name
            for k, v in features.items():
                request.inputs[k].CopyFrom(tf.make_tensor_proto(v))
            request.inputs["key"].CopyFrom(tf.make_tensor_proto(
                np.arange(INSTANCES, dtype=np.int64)))
            grpc_out = {k: tf.make_ndarray(v)
                        for k, v in stub.Predict(request, timeout=120).outputs.items()}
            for out, want in expected.items():
                rest = np.array([row[out] for row in rows], np.float32)
                np.testing.assert_allclose(rest, want, rtol=1e-5, atol=1e-6,
                                           err_msg=f"{name} REST {out}")
                np.testing.assert_allclose(grpc_out[out], want, rtol=1e-6, atol=1e-7,
                                           err_msg=f"{name} gRPC {out}")


def test_predict_local_answers_as_the_export_does(trained, tmp_path):
    entry, job = zoo.ZOO["census"], trained["census"]
    path = tmp_path / "census.json"
    path.write_text("".join(json.dumps(i) + "\n" for i in _instances(entry)))
    done = subprocess.run([sys.executable, "-m", "predict", "local", "--model-dir",
                           os.path.join(job, "model"), "--json-instances", str(path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert [row["key"] for row in rows] == list(range(INSTANCES))
    features = {k: v[:INSTANCES] for k, v in zoo.as_inputs(entry, eval_features(entry)).items()}
    want = export_predictions(job, features)["outputs"]
    np.testing.assert_allclose(np.array([row["outputs"] for row in rows], np.float32), want,
                               rtol=1e-5, atol=1e-6)
