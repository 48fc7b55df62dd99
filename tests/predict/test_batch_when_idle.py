"""`--batch_when_idle` (ours): with batching on, a batch runs as soon as no request is on
its way to a batch queue, not after the whole batch_timeout_micros; requests still on
their way are waited for and merged; without the flag a batch waits the timeout out,
as TF Serving's does. Against a real export, through the batcher and through a real
server's REST and gRPC ports."""
import threading
import time

import grpc
import httpx
import numpy as np
import pytest
import tensorflow as tf

from predict import batching, flags, model as models
from predict.errors import UsageError
from tests.support.predict_models import images, saved_model_export, start_server

LONG_S = 20.0  # a batch timeout no answer in these tests waits for


class Doubler(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
    def serve(self, x):
        return {"y": x * 2.0}


@pytest.fixture(scope="module")
def doubler(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("doubler"))
    module = Doubler()
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    model = models.load(path)
    calls = []
    predict_merged = model.predict_merged

    def counted(batch, signature_name=None):
        calls.append(len(batch["x"]))
        return predict_merged(batch, signature_name)
    model.predict_merged = counted
    return model, calls


def _client(batcher, arrivals, model, row, answers, i):
    """A server's thread carrying one request (Arrivals.carry) into the batcher."""
    arrivals.carry()
    try:
        answers[i] = batcher.predict(model, "m", {"x": row}, "serving_default")
    finally:
        arrivals.gone()


def _queued(batcher, rows: int) -> None:
    """Wait until the open batch holds `rows` rows."""
    deadline = time.time() + 30
    while time.time() < deadline:
        queues = list(batcher._queues.values())
        if queues and queues[0].batches and queues[0].batches[0].rows == rows:
            return
        time.sleep(0.01)
    raise AssertionError(f"the open batch never held {rows} rows")


def test_requests_on_their_way_are_waited_for_then_run_together_at_once(doubler):
    model, calls = doubler
    calls.clear()
    arrivals = batching.Arrivals()
    batcher = batching.Batcher(max_batch_size=8, timeout_s=LONG_S, arrivals=arrivals)
    rows = [np.array([[i, i + 0.5]], np.float32) for i in range(3)]
    answers: dict = {}
    for _ in rows:  # three requests read by the server, none decoded yet
        arrivals.coming()
    began = time.time()
    threads = []
    for i, row in enumerate(rows):
        thread = threading.Thread(target=_client, args=(batcher, arrivals, model, row,
                                                        answers, i))
        thread.start()
        threads.append(thread)
        if i < 2:  # the third is still on its way: the first two wait for it
            _queued(batcher, i + 1)
            time.sleep(0.2)
            assert not answers
    for thread in threads:
        thread.join(30)
    assert time.time() - began < LONG_S / 2
    assert calls == [3]  # one call, all three rows
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(answers[i]["y"], row * 2)
    assert arrivals.count == 0


def test_a_request_that_leaves_without_joining_lets_the_open_batch_run(doubler):
    model, calls = doubler
    calls.clear()
    arrivals = batching.Arrivals()
    batcher = batching.Batcher(max_batch_size=8, timeout_s=LONG_S, arrivals=arrivals)
    arrivals.coming()
    arrivals.coming()  # a second request, refused before it reaches the batcher
    answers: dict = {}
    row = np.array([[1.0, 2.0]], np.float32)
    thread = threading.Thread(target=_client, args=(batcher, arrivals, model, row,
                                                    answers, 0))
    began = time.time()
    thread.start()
    _queued(batcher, 1)
    time.sleep(0.2)
    assert not answers  # still waiting for the other
    arrivals.carry()
    arrivals.gone()  # it was answered (an error) without joining a queue
    thread.join(30)
    assert time.time() - began < LONG_S / 2
    np.testing.assert_array_equal(answers[0]["y"], row * 2)


def test_without_it_a_batch_waits_out_its_timeout_as_tf_servings(doubler):
    model, _ = doubler
    batcher = batching.Batcher(max_batch_size=8, timeout_s=0.5)
    began = time.time()
    answer = batcher.predict(model, "m", {"x": np.ones((1, 2), np.float32)},
                             "serving_default")
    assert time.time() - began >= 0.45
    np.testing.assert_array_equal(answer["y"], [[2.0, 2.0]])


def test_the_flag_needs_batching():
    assert flags.parse(["--model_dir=x"]).batch_when_idle is False
    assert flags.parse(["--model_dir=x", "--enable_batching", "--batch_when_idle"]) \
        .batch_when_idle is True
    with pytest.raises(UsageError, match="--batch_when_idle needs --enable_batching"):
        flags.parse(["--model_dir=x", "--batch_when_idle"])


def test_a_lone_rest_or_grpc_request_is_answered_without_waiting_out_the_timeout(
        tmp_path, reaper):
    from predict import tensors
    from predict.serving_api.apis import predict_pb2, prediction_service_pb2_grpc
    from tests.support.common import free_ports
    export = saved_model_export(str(tmp_path / "model"), seed=3)
    grpc_port, = free_ports(1)
    proc, url = start_server(reaper.popen, export, f"--port={grpc_port}",
                             "--enable_batching", "--max_batch_size=8",
                             f"--batch_timeout_micros={int(LONG_S * 1e6)}",
                             "--batch_when_idle")
    imgs = images(2, seed=5)
    body = {"instances": [{"image": img.tolist(), "key": i} for i, img in enumerate(imgs)]}
    with httpx.Client(timeout=60) as client:
        for _ in range(3):
            began = time.time()
            answer = client.post(f"{url}/v1/models/default:predict", json=body)
            assert answer.status_code == 200, answer.text
            assert time.time() - began < LONG_S / 4
        assert [p["key"] for p in answer.json()["predictions"]] == [0, 1]
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "default"
    tensors.fill(request.inputs["image"], imgs)
    tensors.fill(request.inputs["key"], np.array([0, 1], np.int64))
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for _ in range(3):
            began = time.time()
            reply = stub.Predict(request, timeout=60)
            assert time.time() - began < LONG_S / 4
    assert tensors.to_array(reply.outputs["key"]).tolist() == [0, 1]
    reaper.stop(proc)
