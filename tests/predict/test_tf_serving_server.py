"""A real `predict serve` process held to TF Serving's contracts with TF Serving's own
clients: Classify/Regress/MultiInference (gRPC) and :classify/:regress (REST) with the
export's labels, config reload by gRPC and by polling, warmup, health (REST and
grpc.health.v1), Vertex AI's routes, the batching parameters file and one log line
per version event."""
import shutil
import time

import grpc
import httpx
import numpy as np
import pytest

from tests.support.common import Reaper, free_ports
from tests.support.predict_models import start_server
from tests.support.tf_serving import (LABELS, classifier_export, example, features,
                                      regressor_export, warmup_file)

pytest.importorskip("predict.serving_api.apis.prediction_service_pb2_grpc")
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from predict.serving_api.apis import (classification_pb2, inference_pb2,  # noqa: E402
                                     model_management_pb2, model_service_pb2_grpc,
                                     prediction_service_pb2_grpc, regression_pb2)
from predict.serving_api.config import model_server_config_pb2  # noqa: E402

ROWS = features(3, seed=9)
CONFIG = """model_config_list {{
  config {{ name: "iris" base_path: "{iris}" model_platform: "tensorflow"
           logging_config {{ log_collector_config {{ type: "tfrecord" filename_prefix: "logs/iris" }}
                             sampling_config {{ sampling_rate: 1.0 }} }} }}
  config {{ name: "reg" base_path: "{reg}" model_platform: "tensorflow" }}
}}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("tfs")
    iris = classifier_export(str(root / "iris" / "1"), seed=4)
    extra = root / "iris" / "1" / "assets.extra"
    extra.mkdir()
    warmup_file(str(extra / "tf_serving_warmup_requests"), ROWS)
    reg = regressor_export(str(root / "reg" / "1"), seed=5)
    shutil.copytree(reg, root / "reg2" / "3")
    config = root / "models.config"
    config.write_text(CONFIG.format(iris=root / "iris", reg=root / "reg"))
    batching = root / "batching.config"
    batching.write_text("max_batch_size { value: 8 }\nbatch_timeout_micros { value: 2000 }\n"
                        "max_enqueued_batches { value: 100 }\n")
    grpc_port = free_ports(1)[0]
    reaper = Reaper()
    env = {**__import__("os").environ, "AIP_HEALTH_ROUTE": "/vertex/health",
           "AIP_PREDICT_ROUTE": "/vertex/predict"}
    try:
        proc, url = start_server(
            reaper.popen, str(config), "--model_config_file_poll_wait_seconds=1",
            f"--port={grpc_port}", "--enable_batching",
            f"--batching_parameters_file={batching}", "--max_num_load_retries=0",
            "--rest_api_enable_cors_support=true", flag="--model_config_file", env=env)
        with httpx.Client(base_url=url, timeout=60) as client, \
                grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            yield {"proc": proc, "rest": client, "channel": channel, "root": root,
                   "config": config, "models": {"iris": iris, "reg": reg}, "reaper": reaper}
    finally:
        reaper.stop_all()


@pytest.fixture(scope="module")
def direct(server):
    from predict.runtime import model as models
    return {name: models.load(path) for name, path in server["models"].items()}


def _input(proto_input, rows, context=None):
    target = proto_input.example_list if context is None else \
        proto_input.example_list_with_context
    for row in rows:
        target.examples.add().ParseFromString(example(row))
    if context is not None:
        target.context.ParseFromString(example(context))


def test_classify_and_regress_over_grpc_with_the_exports_labels(server, direct):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(server["channel"])
    want = direct["iris"].predict({"x": ROWS})["outputs"]
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name, request.model_spec.signature_name = "iris", "classification"
    _input(request.input, ROWS)
    answer = stub.Classify(request, timeout=60)
    assert answer.model_spec.version.value == 1
    assert answer.model_spec.signature_name == "classification"
    for row, scores in zip(answer.result.classifications, want, strict=True):
        assert [c.label for c in row.classes] == LABELS
        np.testing.assert_allclose([c.score for c in row.classes], scores, rtol=1e-5)

    regress = regression_pb2.RegressionRequest()
    regress.model_spec.name, regress.model_spec.signature_name = "reg", "regression"
    _input(regress.input, ROWS)
    values = [r.value for r in stub.Regress(regress, timeout=60).result.regressions]
    np.testing.assert_allclose(values, direct["reg"].predict({"x": ROWS})["outputs"][:, 0],
                               rtol=1e-5)

    multi = inference_pb2.MultiInferenceRequest()
    task = multi.tasks.add()
    task.model_spec.name, task.model_spec.signature_name = "iris", "classification"
    task.method_name = "tensorflow/serving/classify"
    _input(multi.input, ROWS[:1])
    (result,) = stub.MultiInference(multi, timeout=60).results
    assert [c.label for c in result.classification_result.classifications[0].classes] == LABELS
    other = multi.tasks.add()
    other.model_spec.name, other.model_spec.signature_name = "reg", "regression"
    other.method_name = "tensorflow/serving/regress"
    with pytest.raises(grpc.RpcError) as raised:
        stub.MultiInference(multi, timeout=60)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "must access the same model name" in raised.value.details()
    wrong = regression_pb2.RegressionRequest()
    wrong.model_spec.name, wrong.model_spec.signature_name = "iris", "classification"
    _input(wrong.input, ROWS[:1])
    with pytest.raises(grpc.RpcError) as raised:
        stub.Regress(wrong, timeout=60)
    assert "Expected regression signature method_name to be tensorflow/serving/regress" \
        in raised.value.details()


def test_classify_and_regress_over_rest(server, direct):
    client = server["rest"]
    context = {"x": ROWS[0].tolist()}
    answer = client.post("/v1/models/iris:classify", json={
        "signature_name": "classification", "context": context,
        "examples": [{"x": r.tolist()} for r in ROWS[1:]]})
    assert answer.status_code == 200, answer.text
    assert answer.headers["access-control-allow-origin"] == "*"  # CORS is on
    want = direct["iris"].predict({"x": ROWS[1:]})["outputs"]
    result = answer.json()["result"]
    assert [[label for label, _ in row] for row in result] == [LABELS, LABELS]
    np.testing.assert_allclose([[s for _, s in row] for row in result], want, rtol=1e-5)
    only_context = client.post("/v1/models/iris/versions/1:classify", json={
        "signature_name": "classification", "context": context, "examples": [{}]}).json()
    np.testing.assert_allclose([s for _, s in only_context["result"][0]],
                               direct["iris"].predict({"x": ROWS[:1]})["outputs"][0], rtol=1e-5)
    answer = client.post("/v1/models/reg:regress", json={
        "signature_name": "regression", "examples": [{"x": r.tolist()} for r in ROWS]})
    np.testing.assert_allclose(answer.json()["result"],
                               direct["reg"].predict({"x": ROWS})["outputs"][:, 0], rtol=1e-5)
    for body, words in [({"examples": []}, "\"examples\" must be a non-empty list"),
                        ({"examples": [{"x": [1, "a"]}]}, "must all be numbers or all strings"),
                        ({"examples": [{"x": [1.0] * 4}], "instances": []}, "unknown key"),
                        ({"signature_name": "serving_default", "examples": [{"x": [1.0] * 4}]},
                         "Expected classification signature method_name")]:
        bad = client.post("/v1/models/iris:classify", json=body)
        assert bad.status_code == 400 and words in bad.json()["error"], bad.text


@pytest.mark.parametrize("feature, words", [([1.0, 2.0], "Number of float values"),
                                            (1.5, "Number of float values"),
                                            ("abc", "Data types don't match")],
                         ids=["a feature of the wrong length", "a scalar", "a string"])
def test_a_malformed_example_is_the_requests_fault_on_both_apis(server, feature, words):
    """An Example the classification signature cannot parse answers HTTP 400 and gRPC
    INVALID_ARGUMENT with TensorFlow's reason, as TF Serving does; no traceback."""
    bad = server["rest"].post("/v1/models/iris:classify", json={
        "signature_name": "classification", "examples": [{"x": feature}]})
    assert bad.status_code == 400, bad.text
    assert "cannot parse them" in bad.json()["error"] and words in bad.json()["error"]
    import tensorflow as tf
    proto = tf.train.Example()
    values = feature if isinstance(feature, list) else [feature]
    if isinstance(values[0], str):
        proto.features.feature["x"].bytes_list.value.extend(v.encode() for v in values)
    else:
        proto.features.feature["x"].float_list.value.extend(values)
    stub = prediction_service_pb2_grpc.PredictionServiceStub(server["channel"])
    for request, call in ((classification_pb2.ClassificationRequest(), stub.Classify),
                          (regression_pb2.RegressionRequest(), stub.Regress)):
        request.model_spec.name = "iris" if call is stub.Classify else "reg"
        request.model_spec.signature_name = "classification" if call is stub.Classify \
            else "regression"
        request.input.example_list.examples.add().CopyFrom(proto)
        with pytest.raises(grpc.RpcError) as raised:
            call(request, timeout=60)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value
        assert words in raised.value.details()


def test_sampled_requests_are_logged_as_prediction_logs(server):
    """logging_config: every request of "iris" (rate 1.0) in TF Serving's PredictionLog
    records, REST and gRPC alike; the file is a valid warmup file; "reg" logs none."""
    from predict.serving_api.apis import prediction_log_pb2
    from predict.runtime import records
    from predict.models import warmup
    (path,) = (server["root"] / "logs").glob("iris-*.tfrecord")
    with open(path, "rb") as f:
        logs = [prediction_log_pb2.PredictionLog.FromString(r)
                for r in records.read_tfrecords(f)]
    kinds = [log.WhichOneof("log_type") for log in logs]
    # the gRPC test's Classify and MultiInference (its failing calls are not logged),
    # then the REST test's two :classify; the warmup before traffic is not logged
    assert kinds == ["classify_log", "multi_inference_log", "classify_log", "classify_log"]
    rest = logs[2]
    assert rest.log_metadata.model_spec.name == "iris"
    assert rest.log_metadata.sampling_config.sampling_rate == 1.0
    assert len(rest.classify_log.request.input.example_list.examples) == 2
    assert [c.label for c in rest.classify_log.response.result.classifications[0].classes] \
        == LABELS
    warmup.check_file(str(path))
    assert sorted(p.name.split("-")[0] for p in (server["root"] / "logs").iterdir()) == ["iris"]


def test_health_vertex_routes_and_metrics(server, direct):
    client = server["rest"]
    assert client.get("/healthz").json() == {"status": "SERVING",
                                            "models": {"iris": ["1"], "reg": ["1"]}}
    assert client.get("/vertex/health").status_code == 200
    answer = client.post("/vertex/predict", json={"instances": [r.tolist() for r in ROWS],
                                                  "parameters": {}})
    np.testing.assert_allclose(answer.json()["predictions"],
                               direct["iris"].predict({"x": ROWS})["outputs"], rtol=1e-5)
    from predict.serving_api.apis import prediction_log_pb2
    import tensorflow as tf
    from predict.runtime import records
    (path,) = (server["root"] / "logs").glob("iris-*.tfrecord")
    with open(path, "rb") as f:
        last = prediction_log_pb2.PredictionLog.FromString(list(records.read_tfrecords(f))[-1])
    np.testing.assert_allclose(tf.make_ndarray(last.predict_log.request.inputs["x"]), ROWS)
    np.testing.assert_allclose(tf.make_ndarray(last.predict_log.response.outputs["outputs"]),
                               answer.json()["predictions"], rtol=1e-6)
    refused = client.post("/vertex/predict", json={"instances": [ROWS[0].tolist()],
                                                   "parameters": {"top_k": 2}})
    assert refused.status_code == 400 and "takes no parameters" in refused.json()["error"]
    stub = health_pb2_grpc.HealthStub(server["channel"])
    for service in ("", "tensorflow.serving.PredictionService", "iris"):
        check = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=30)
        assert check.status == health_pb2.HealthCheckResponse.SERVING
    metrics = client.get("/monitoring/prometheus/metrics")
    assert metrics.status_code == 200 and ":tensorflow:serving:request_count" in metrics.text


def test_reload_by_grpc_and_by_polling_then_the_log(server):
    channel, root, client = server["channel"], server["root"], server["rest"]
    service = model_service_pb2_grpc.ModelServiceStub(channel)
    request = model_management_pb2.ReloadConfigRequest()
    for name in ("iris", "reg", "reg2"):
        config = request.config.model_config_list.config.add()
        config.name, config.base_path = name, str(root / name)
        config.model_platform = "tensorflow"
    service.HandleReloadConfigRequest(request, timeout=120)
    assert client.get("/v1/models/reg2").json()["model_version_status"][0]["state"] == \
        "AVAILABLE"  # loaded before the reload answered
    request.config.model_config_list.config[2].version_labels["stable"] = 9
    with pytest.raises(grpc.RpcError) as raised:
        service.HandleReloadConfigRequest(request, timeout=120)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "label 'stable' names version 9, which is not available" in raised.value.details()
    bad = model_server_config_pb2.ModelServerConfig()
    bad.model_config_list.config.add(name="x", base_path=str(root / "nowhere"))
    with pytest.raises(grpc.RpcError) as raised:
        service.HandleReloadConfigRequest(
            model_management_pb2.ReloadConfigRequest(config=bad), timeout=60)
    assert "does not exist" in raised.value.details()

    server["config"].write_text(CONFIG.format(iris=root / "iris", reg=root / "reg2"))
    deadline = time.time() + 60
    while time.time() < deadline:  # polled each second: reg now serves reg2's version 3
        status = client.get("/v1/models/reg").json().get("model_version_status", [])
        if status and status[0]["version"] == "3" and status[0]["state"] == "AVAILABLE":
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"the polled config was not applied: {status}")
    assert client.get("/v1/models/x").status_code == 404
    server["reaper"].stop_all()
    log = server["proc"].stderr.read()
    assert "model iris: version 1 warmed up with 2 requests" in log
    for line in (f"model reg2: loading version 3 from {root / 'reg2' / '3'}",
                 "model reg2: version 3 available", "model reg: version 1 unloaded",
                 "model config reloaded (HandleReloadConfigRequest): iris, reg, reg2",
                 f"model config reloaded from {server['config']}: iris, reg",
                 "model config reload refused (HandleReloadConfigRequest): model 'reg2': "
                 "label 'stable' "
                 "names version 9"):
        assert line in log, log
        assert log.count(line) == 1, line  # each line once, never twice
    assert "Traceback" not in log


def _serve(reaper, *args, wait=True):
    import subprocess
    import sys
    proc = reaper.popen([sys.executable, "-m", "predict", "serve", *args],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return proc, proc.communicate(timeout=300)
    line = proc.stdout.readline()
    assert line.startswith("serving model "), (line, proc.stderr.read())
    return proc, line + proc.stdout.readline()


@pytest.mark.slow
def test_rest_is_off_by_default_timeouts_and_tags(server, reaper):
    """TF Serving's defaults and flags, each against what TF Serving documents: REST
    off unless --rest_api_port (gRPC alone answers); --rest_api_timeout_in_ms answers
    504 while gRPC waits; --saved_model_tags picks the MetaGraph (a tag set the export
    lacks fails the load, exit 2 after --max_num_load_retries)."""
    from predict.serving_api.apis import predict_pb2
    import tensorflow as tf
    model = server["models"]["reg"]
    grpc_port, rest_port = free_ports(2)
    proc, lines = _serve(reaper, f"--model_dir={model}", f"--port={grpc_port}")
    assert "serving model default over gRPC (REST off: --rest_api_port=0)" in lines
    assert f"serving gRPC at 127.0.0.1:{grpc_port}" in lines
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "default"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(ROWS))
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        assert len(tf.make_ndarray(stub.Predict(request, timeout=60).outputs["outputs"])) == 3
    reaper.stop(proc)
    # each start on ports of its own: the stopped server's may not be free again yet
    grpc_port, rest_port = free_ports(2)

    params = server["root"] / "slow-batches.config"
    params.write_text("max_batch_size { value: 4 }\nbatch_timeout_micros { value: 3000000 }\n"
                      "max_enqueued_batches { value: 1 }\n")
    proc, _ = _serve(reaper, f"--model_dir={model}", f"--port={grpc_port}",
                     f"--rest_api_port={rest_port}", "--rest_api_timeout_in_ms=300",
                     "--enable_batching", f"--batching_parameters_file={params}",
                     "--saved_model_tags=serve")
    rest = f"http://127.0.0.1:{rest_port}/v1/models/default:predict"
    started = time.time()
    slow = httpx.post(rest, json={"instances": [r.tolist() for r in ROWS]}, timeout=60)
    assert slow.status_code == 504 and "--rest_api_timeout_in_ms" in slow.json()["error"]
    assert time.time() - started < 2.5  # answered at the timeout, not after the batch
    # its 3 rows still wait in the one batch allowed: 3 more do not fit, no room for more
    full = httpx.post(rest, json={"instances": [r.tolist() for r in ROWS]}, timeout=60)
    assert full.status_code == 503 and "the batch queue is full" in full.json()["error"]
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.Predict(request, timeout=60)
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        time.sleep(3)
        assert stub.Predict(request, timeout=60).model_spec.version.value == 1
    reaper.stop(proc)
    grpc_port = free_ports(1)[0]

    proc, (out, err) = _serve(reaper, f"--model_dir={model}", f"--port={grpc_port}",
                              "--saved_model_tags=serve,gpu", "--max_num_load_retries=0",
                              wait=False)
    assert proc.returncode == 2
    assert "has no MetaGraph tagged 'serve,gpu' (--saved_model_tags); it has serve" in err
    assert "Traceback" not in err


@pytest.mark.slow
def test_tensorflow_thread_pools_follow_the_flags():
    import subprocess
    import sys
    code = ("from predict.serving import flags, process; import tensorflow as tf; "
            "process._tensorflow_threads(flags.parse(['--model_dir=x', "
            "'--tensorflow_intra_op_parallelism=3', '--tensorflow_session_parallelism=2'], "
            "environ={})); t = tf.config.threading; "
            "print(t.get_intra_op_parallelism_threads(), t.get_inter_op_parallelism_threads())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.stdout.split() == ["3", "2"], done.stderr[-2000:]
