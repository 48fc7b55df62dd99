"""`python -m predict serve --port`: TF Serving's gRPC API, called over 127.0.0.1 with
TF Serving's stubs (the vendored ones, predict.serving_api; and the released
`tensorflow-serving-api` package's, in a process of their own); its answers agree with
the REST API's and with `saved_model_cli run`. Also the Prometheus metrics both APIs
feed, and `--enable-batching`."""
import asyncio
import json
import os
import subprocess
import sys

import grpc
import httpx
import numpy as np
import pytest
import tensorflow as tf

from mljob.procs import free_ports
from tests.support.common import Reaper
from tests.support.predict_models import (images, metric_samples, saved_model_cli_run,
                                          saved_model_export, start_server)

serving_apis = pytest.importorskip("predict.serving_api.apis.prediction_service_pb2_grpc")
from predict.serving_api.apis import (classification_pb2, get_model_metadata_pb2,  # noqa: E402
                                     get_model_status_pb2, model_service_pb2_grpc,
                                     predict_pb2, prediction_service_pb2_grpc)

KEYS = [31, 32, 33]
IMAGES = images(len(KEYS), seed=31)


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    return saved_model_export(str(tmp_path_factory.mktemp("grpc") / "model"), seed=12)


@pytest.fixture(scope="module")
def served(export_dir):
    """(REST client, gRPC channel) of one server with both APIs."""
    reaper = Reaper()
    grpc_port = free_ports(1)[0]
    try:
        proc, url = start_server(reaper.popen, export_dir, "--grpc-port", str(grpc_port),
                                 "--model-name", "mnist")
        with httpx.Client(base_url=url, timeout=60) as client, \
                grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            yield client, channel
    finally:
        reaper.stop_all()


def predict_request(imgs, keys, **spec):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = spec.get("name", "mnist")
    if "version" in spec:
        request.model_spec.version.value = spec["version"]
    request.inputs["image"].CopyFrom(tf.make_tensor_proto(imgs))
    request.inputs["key"].CopyFrom(tf.make_tensor_proto(np.asarray(keys, np.int64)))
    return request


def test_grpc_rest_and_saved_model_cli_agree(served, export_dir, tmp_path):
    client, channel = served
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    answer = stub.Predict(predict_request(IMAGES, KEYS), timeout=60)
    assert answer.model_spec.name == "mnist" and answer.model_spec.version.value == 1
    grpc_out = {k: tf.make_ndarray(v) for k, v in answer.outputs.items()}
    rest = client.post("/v1/models/mnist:predict", json={"inputs": {
        "image": IMAGES.tolist(), "key": KEYS}}).json()["outputs"]
    cli = saved_model_cli_run(export_dir, IMAGES, KEYS, tmp_path / "cli")
    assert grpc_out["key"].tolist() == rest["key"] == cli["key"].tolist() == KEYS
    assert grpc_out["classes"].tolist() == rest["classes"] == cli["classes"].tolist()
    np.testing.assert_allclose(grpc_out["scores"], cli["scores"], rtol=1e-6)
    np.testing.assert_allclose(rest["scores"], cli["scores"], rtol=1e-6)


# TF Serving's released client stubs, installed apart by .ci/setup (--no-deps --target):
# the server's vendored set and these differ in predict.proto, so no process imports both
RELEASED = os.environ.get("MLJOB_TFS_CLIENT") or os.path.expanduser(
    "~/.cache/mljob/tfs-client")
RELEASED_CLIENT = r"""
import hashlib, importlib, importlib.util, json, pkgutil, sys, types
# TensorFlow's protos without tensorflow/__init__ (the whole library, 5-30 s): the stubs
# import only tensorflow.core's *_pb2 modules
tf = types.ModuleType("tensorflow")
tf.__path__ = list(importlib.util.find_spec("tensorflow").submodule_search_locations)
sys.modules["tensorflow"] = tf
import grpc
from tensorflow.core.framework import tensor_pb2, types_pb2
import tensorflow_serving
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
args = json.loads(sys.argv[1])
request = predict_pb2.PredictRequest()
request.model_spec.name = "mnist"
image = request.inputs["image"]
image.dtype = types_pb2.DT_FLOAT
for n in args["shape"]:
    image.tensor_shape.dim.add(size=n)
image.float_val.extend(args["image"])
key = request.inputs["key"]
key.dtype = types_pb2.DT_INT64
key.tensor_shape.dim.add(size=len(args["keys"]))
key.int64_val.extend(args["keys"])
with grpc.insecure_channel(args["target"]) as channel:
    answer = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
        request, timeout=60)
descriptors = {}
for pkg in ("apis", "config"):
    for m in pkgutil.iter_modules(importlib.import_module("tensorflow_serving." + pkg).__path__):
        if m.name.endswith("_pb2"):
            mod = importlib.import_module(f"tensorflow_serving.{pkg}.{m.name}")
            descriptors[f"{pkg}.{m.name}"] = mod.DESCRIPTOR.serialized_pb.hex()
print(json.dumps({"stubs": tensorflow_serving.__file__, "version": answer.model_spec.version.value,
                  "answer": answer.SerializeToString().hex(), "descriptors": descriptors}))
"""


@pytest.mark.skipif(not os.path.isdir(os.path.join(RELEASED, "tensorflow_serving")),
                    reason=f"TF Serving's released stubs are not in {RELEASED} (.ci/setup)")
def test_the_released_tensorflow_serving_api_stubs_call_the_server(served):
    """A client of the released `tensorflow-serving-api` 2.21.0 stubs, in its own process,
    gets the answer the vendored stubs get; the vendored protos (tag 2.20.0) are its
    own byte for byte but predict.proto, where 2.21.0 adds one request option."""
    from google.protobuf import descriptor_pb2

    from predict.serving_api import RELEASE
    client, channel = served
    port = channel._channel.target().decode().rsplit(":", 1)[1]
    env = {**os.environ, "PYTHONPATH": RELEASED}
    out = subprocess.run([sys.executable, "-c", RELEASED_CLIENT, json.dumps({
        "target": f"127.0.0.1:{port}", "shape": list(IMAGES.shape),
        "image": IMAGES.ravel().tolist(), "keys": KEYS})], env=env, capture_output=True,
        text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    released = json.loads(out.stdout.strip().splitlines()[-1])
    assert released["stubs"].startswith(RELEASED)  # theirs, not the vendored ones
    ours = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
        predict_request(IMAGES, KEYS), timeout=60)
    theirs = predict_pb2.PredictResponse.FromString(bytes.fromhex(released["answer"]))
    assert released["version"] == 1
    assert {k: tf.make_ndarray(v).tolist() for k, v in theirs.outputs.items()} == \
        {k: tf.make_ndarray(v).tolist() for k, v in ours.outputs.items()}
    assert tf.make_ndarray(theirs.outputs["key"]).tolist() == KEYS
    import importlib
    differ = []
    for name, hexed in sorted(released["descriptors"].items()):
        mine = importlib.import_module(f"predict.serving_api.{name}").DESCRIPTOR
        if mine.serialized_pb != bytes.fromhex(hexed):
            differ.append(name)
    assert len(released["descriptors"]) == 20 and differ == ["apis.predict_pb2"], differ
    theirs_fd = descriptor_pb2.FileDescriptorProto.FromString(
        bytes.fromhex(released["descriptors"]["apis.predict_pb2"]))
    options = next(m for m in theirs_fd.message_type if m.name == "PredictRequest")
    options = next(m for m in options.nested_type if m.name == "RequestOptions")
    handshake = [f.name for f in options.field if f.name == "handshake"]
    assert handshake == ["handshake"] and RELEASE == "2.20.0"


def test_metadata_status_and_classify(served):
    client, channel = served
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "mnist"
    meta = stub.GetModelMetadata(request, timeout=60)
    defs = get_model_metadata_pb2.SignatureDefMap()
    meta.metadata["signature_def"].Unpack(defs)
    serving = defs.signature_def["serving_default"]
    assert set(defs.signature_def) == {"serving_default", "predict_images"}
    assert serving.inputs["image"].dtype == tf.float32.as_datatype_enum
    assert [d.size for d in serving.inputs["image"].tensor_shape.dim] == [-1, 784]
    assert serving.inputs["image"].name == "serving_default_image:0"
    rest_sig = client.get("/v1/models/mnist/metadata").json()[
        "metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert {k: v["name"] for k, v in rest_sig["outputs"].items()} == {
        k: v.name for k, v in serving.outputs.items()}

    status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
        get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "mnist"}), timeout=60)
    (version,) = status.model_version_status
    assert version.version == 1
    assert version.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE

    classify = classification_pb2.ClassificationRequest()
    classify.model_spec.name = "mnist"
    for img, key in zip(IMAGES, KEYS, strict=True):
        example = classify.input.example_list.examples.add()
        example.features.feature["image"].float_list.value.extend(img.tolist())
        example.features.feature["key"].int64_list.value.append(key)
    # TF Serving classifies only with a classification signature (tf.Example in);
    # tests/predict/test_tf_serving_inference.py serves one
    with pytest.raises(grpc.RpcError) as raised:
        stub.Classify(classify, timeout=60)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Expected classification signature method_name to be " \
        "tensorflow/serving/classify. Was: tensorflow/serving/predict" in raised.value.details()


def test_grpc_errors_have_tf_servings_codes(served):
    _, channel = served
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    cases = [
        (predict_request(IMAGES, KEYS, name="other"), grpc.StatusCode.NOT_FOUND,
         "model 'other' not found"),
        (predict_request(IMAGES, KEYS, version=7), grpc.StatusCode.NOT_FOUND,
         "no version '7'"),
        (predict_request(IMAGES.astype(np.float64), KEYS), grpc.StatusCode.INVALID_ARGUMENT,
         "image is float64, the signature wants float32"),
        (predict_request(IMAGES, KEYS[:2]), grpc.StatusCode.INVALID_ARGUMENT,
         "differ in batch size"),
    ]
    for request, code, words in cases:
        with pytest.raises(grpc.RpcError) as raised:
            stub.Predict(request, timeout=60)
        assert raised.value.code() == code and words in raised.value.details()
    missing = predict_pb2.PredictRequest()
    missing.model_spec.name = "mnist"
    missing.inputs["key"].CopyFrom(tf.make_tensor_proto(KEYS))
    with pytest.raises(grpc.RpcError) as raised:
        stub.Predict(missing, timeout=60)
    assert "missing input 'image'" in raised.value.details()


def test_grpc_the_key_is_optional(served):
    """TF Serving's clients send no key: the predictions come back without one; with
    it, the key comes back."""
    _, channel = served
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    keyless = predict_pb2.PredictRequest()
    keyless.model_spec.name = "mnist"
    keyless.inputs["image"].CopyFrom(tf.make_tensor_proto(IMAGES))
    answer = stub.Predict(keyless, timeout=60)
    keyed = stub.Predict(predict_request(IMAGES, KEYS), timeout=60)
    assert "key" not in answer.outputs and "key" in keyed.outputs
    assert set(keyed.outputs) - set(answer.outputs) == {"key"}
    np.testing.assert_array_equal(tf.make_ndarray(keyed.outputs["key"]), KEYS)
    for name in answer.outputs:
        np.testing.assert_allclose(tf.make_ndarray(answer.outputs[name]),
                                   tf.make_ndarray(keyed.outputs[name]), rtol=1e-6)


def test_metrics_count_both_apis_under_tf_servings_names(served):
    client, channel = served
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    stub.Predict(predict_request(IMAGES, KEYS), timeout=60)
    client.post("/v1/models/mnist:predict", json={"instances": [{"image": [2.0] * 784,
                                                                  "key": 1}]})
    text = client.get("/monitoring/prometheus/metrics").text
    counts = metric_samples(text, ":tensorflow:serving:request_count")
    assert counts[frozenset({("model_name", "mnist"), ("status", "OK")})] >= 1
    assert counts[frozenset({("model_name", "mnist"), ("status", "INVALID_ARGUMENT")})] >= 1
    latency = metric_samples(text, ":tensorflow:serving:request_latency_count")
    for entrypoint in ("GRPC", "REST"):
        assert latency[frozenset({("model_name", "mnist"), ("API", "Predict"),
                                  ("entrypoint", entrypoint)})] >= 1
    assert "# TYPE :tensorflow:serving:request_count counter" in text
    assert metric_samples(text, ":mljob:serving:model_version_available") == {
        frozenset({("model_name", "mnist"), ("version", "1")}): 1.0}


def test_batching_merges_concurrent_requests_and_answers_each(export_dir, reaper):
    proc, url = start_server(reaper.popen, export_dir, "--enable-batching",
                             "--max-batch-size", "16", "--batch-timeout-micros", "50000",
                             "--threads", "16")
    imgs = images(32, seed=32)
    fn = tf.saved_model.load(export_dir).signatures["serving_default"]
    want = fn(image=tf.constant(imgs), key=tf.constant(np.arange(32), tf.int64))

    async def main():
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            async def one(i):
                answer = await client.post("/v1/models/default:predict", json={
                    "instances": [{"image": imgs[i].tolist(), "key": i}]})
                assert answer.status_code == 200, answer.text
                return answer.json()["predictions"][0]
            return await asyncio.gather(*(one(i) for i in range(32)))

    rows = asyncio.run(main())
    assert [r["key"] for r in rows] == list(range(32))
    np.testing.assert_allclose([r["scores"] for r in rows], want["scores"].numpy(),
                               rtol=1e-5, atol=1e-7)
    text = httpx.get(f"{url}/monitoring/prometheus/metrics").text
    sizes = metric_samples(text, ":mljob:serving:batch_size_sum")
    calls = metric_samples(text, ":mljob:serving:batch_size_count")
    key = frozenset({("model_name", "default")})
    assert sizes[key] == 32 and calls[key] < 32   # some requests shared a call


def test_sigterm_stops_both_apis_and_frees_both_ports(export_dir, reaper):
    import signal
    import socket
    grpc_port = free_ports(1)[0]
    proc, url = start_server(reaper.popen, export_dir, "--grpc-port", str(grpc_port))
    assert httpx.get(f"{url}/v1/models/default").status_code == 200
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    assert "Traceback" not in proc.stderr.read()
    for port in (httpx.URL(url).port, grpc_port):
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
