"""REST :predict with batching on: a small request is read, checked and decoded on the
event loop and waits in its batch queue there, not on a pool thread, so requests merge
however few pool threads there are; the answers come back to the loop from the thread
that ran the batch. A version that is not batched, a request too big to batch and a
model whose requests are logged go through the pool as before; a batch's error is each
request's error."""
from __future__ import annotations

import asyncio
import threading
import time

import httpx
import numpy as np
import pytest
import tensorflow as tf

from predict import batching, server
from predict.errors import InputError
from tests.support.predict_models import images, metric_samples, start_server

MODEL = "default"


class _Doubler:
    """A loaded model's face (signature, predict) that doubles x, and remembers the
    thread and rows of each call."""

    signatures = {"serving_default": None}
    source = "doubler"

    def __init__(self, fail: BaseException | None = None, seconds: float = 0.0):
        self.calls: list = []
        self.threads: list = []
        self.fail = fail
        self.seconds = seconds

    def signature(self, name=None):
        return type("Sig", (), {"name": "serving_default"})()

    def predict(self, batch, signature_name=None):
        self.calls.append((threading.current_thread().name, len(batch["x"])))
        self.threads.append(threading.get_ident())
        if self.fail is not None:
            raise self.fail
        if self.seconds:
            time.sleep(self.seconds)
        return {"y": batch["x"] * 2}


def _service(batcher, timeout_s=5.0):
    return server.PredictionService(None, max_body_bytes=1 << 20, max_instances=10,
                                    threads=1, timeout_s=timeout_s, batcher=batcher)


def _ask(service, model, rows_each: list) -> list:
    """Each batch of rows_each through service._queued at once, on one event loop:
    [answer or the exception raised]."""
    async def main():
        return await asyncio.gather(*(service._queued(model, {"x": np.array(rows)},
                                                      "serving_default")
                                      for rows in rows_each), return_exceptions=True)
    return asyncio.run(main())


def test_queued_requests_merge_without_pool_threads_and_each_gets_its_rows():
    batcher = batching.Batcher(max_batch_size=8, timeout_s=0.3)
    service = _service(batcher)
    model = _Doubler()
    try:
        answers = _ask(service, batcher.wrap(model, "m"), [[1.0], [2.0], [3.0, 4.0]])
    finally:
        service.pool.shutdown()
    assert [a["y"].tolist() for a in answers] == [[2.0], [4.0], [6.0, 8.0]]
    assert model.calls == [("batcher", 4)]  # one call, on the batch queue's thread
    assert service.answers.idle()


def test_not_batched_or_too_big_goes_to_the_pool_and_errors_reach_each_request():
    batcher = batching.Batcher(max_batch_size=2, timeout_s=0.05)
    service = _service(batcher)
    try:
        plain = _Doubler()  # a version without batching (per-model parameters)
        assert _ask(service, plain, [[1.0]])[0]["y"].tolist() == [2.0]
        assert plain.calls[0][0].startswith("predict")
        model = _Doubler()
        assert _ask(service, batcher.wrap(model, "m"), [[1.0, 2.0]])[0]["y"].tolist() == \
            [2.0, 4.0]  # max_batch_size rows: alone, on the pool
        assert model.calls[0][0].startswith("predict")
        failing = _Doubler(InputError("x", "is not what the model takes"))
        answers = _ask(service, batcher.wrap(failing, "f"), [[1.0], [2.0]])
        assert failing.calls == [("batcher", 2)]
        assert all(isinstance(a, InputError) for a in answers), answers
    finally:
        service.pool.shutdown()


def test_a_queued_request_past_the_timeout_answers_504_and_the_batch_still_runs():
    batcher = batching.Batcher(max_batch_size=8, timeout_s=0.6)
    service = _service(batcher, timeout_s=0.1)
    model = _Doubler(RuntimeError("the model broke"))  # an error nobody awaits any more
    try:
        started = time.perf_counter()
        (answer,) = _ask(service, batcher.wrap(model, "m"), [[1.0]])
        assert isinstance(answer, server.HTTPError) and answer.status == 504
        assert time.perf_counter() - started < 0.5
        deadline = time.time() + 10
        while not model.calls and time.time() < deadline:
            time.sleep(0.02)
        assert model.calls == [("batcher", 1)]
    finally:
        service.pool.shutdown()


def _on_loop(service, model, rows_each: list, also=None, run=asyncio.run) -> tuple:
    """_ask on a loop whose thread is known: (answers, the loop's thread, seconds);
    also(), if given, runs on another thread once the requests are queued."""
    async def main():
        loop_thread = threading.get_ident()
        started = time.perf_counter()
        asks = [asyncio.ensure_future(service._queued(model, {"x": np.array(rows)},
                                                      "serving_default"))
                for rows in rows_each]
        await asyncio.sleep(0)  # every request queued
        side = threading.Thread(target=also) if also is not None else None
        if side is not None:
            side.start()
        answers = await asyncio.gather(*asks)
        if side is not None:
            await asyncio.get_running_loop().run_in_executor(None, side.join)
        return answers, loop_thread, time.perf_counter() - started
    return run(main())


@pytest.fixture(autouse=True)
def _fast_on_a_loaded_machine(monkeypatch):
    """A doubling's batch takes microseconds, but a loaded machine can hold any thread
    for a millisecond: these tests judge "fast" at 50 ms."""
    monkeypatch.setattr(batching, "LOOP_S", 0.05)


def test_once_a_queues_batches_run_fast_the_event_loop_times_and_runs_them():
    """The first batch runs on a batcher thread; once it ran within LOOP_S, the batches
    the loop opens wait out their timeout on the loop and run there (no thread switch
    a batch), a batch that fills up at once; a thread's request that joins such a batch
    is answered by the loop's run."""
    batcher = batching.Batcher(max_batch_size=4, timeout_s=0.3)
    service = _service(batcher)
    model = _Doubler()
    wrapped = batcher.wrap(model, "m")
    try:
        answers, loop_thread, _ = _on_loop(service, wrapped, [[1.0], [2.0]])
        assert model.calls == [("batcher", 2)] and model.threads[-1] != loop_thread
        answers, loop_thread, took = _on_loop(service, wrapped, [[3.0], [4.0]])
        assert [a["y"].tolist() for a in answers] == [[6.0], [8.0]]
        assert model.calls[-1][1] == 2 and model.threads[-1] == loop_thread
        assert took >= 0.29  # it waited out its timeout
        answers, loop_thread, took = _on_loop(service, wrapped, [[1.0], [2.0, 3.0, 4.0]])
        assert model.calls[-1][1] == 4 and model.threads[-1] == loop_thread
        assert took < 0.25  # full: at once
        joined: dict = {}

        def thread_request():
            joined["answer"] = wrapped.predict({"x": np.array([5.0])})
        answers, loop_thread, _ = _on_loop(service, wrapped, [[1.0]], also=thread_request)
        assert joined["answer"]["y"].tolist() == [10.0]
        assert model.calls[-1][1] == 2 and model.threads[-1] == loop_thread
    finally:
        service.pool.shutdown()


def test_on_uvloop_whose_timers_have_a_millisecond_grain_no_batch_runs_early_or_never():
    """The server's loop is uvloop's: a timer due in 50.4 ms may fire a millisecond
    early, and the batch is then timed again, not run early nor left waiting."""
    uvloop = pytest.importorskip("uvloop")
    timeout = 0.0504
    batcher = batching.Batcher(max_batch_size=8, timeout_s=timeout)
    service = _service(batcher, timeout_s=2.0)
    model = _Doubler()
    wrapped = batcher.wrap(model, "m")
    try:
        _on_loop(service, wrapped, [[1.0]], run=uvloop.run)
        for i in range(10):
            answers, loop_thread, took = _on_loop(service, wrapped, [[float(i)]],
                                                  run=uvloop.run)
            assert answers[0]["y"].tolist() == [2.0 * i]
            assert model.threads[-1] == loop_thread and took >= timeout
    finally:
        service.pool.shutdown()


def test_a_slow_batch_sends_the_next_ones_back_to_the_batcher_threads():
    batcher = batching.Batcher(max_batch_size=8, timeout_s=0.05)
    service = _service(batcher)
    model = _Doubler()
    wrapped = batcher.wrap(model, "m")
    try:
        _on_loop(service, wrapped, [[1.0]])
        _, loop_thread, _ = _on_loop(service, wrapped, [[1.0]])
        assert model.threads[-1] == loop_thread
        model.seconds = batching.LOOP_S * 5  # this one blocks the loop: the last there
        _, loop_thread, _ = _on_loop(service, wrapped, [[1.0]])
        assert model.threads[-1] == loop_thread
        model.seconds = 0.0
        _, loop_thread, _ = _on_loop(service, wrapped, [[1.0]])
        assert model.calls[-1][0] == "batcher" and model.threads[-1] != loop_thread
    finally:
        service.pool.shutdown()


@pytest.mark.slow
def test_a_real_server_merges_rest_requests_with_one_pool_thread(tmp_path, reaper):
    """Eight clients at once against --rest_api_num_threads=1: before, each request held
    the one pool thread while it waited for its batch (eight batches of one, one
    timeout each); now all eight wait in the queue and share one call. A model whose
    requests are logged is batched too, through the pool, and its log is written."""
    from tests.support.predict_models import saved_model_export
    export = saved_model_export(str(tmp_path / "m" / "1"), seed=3)
    config = tmp_path / "models.config"
    models, log = tmp_path / "m", tmp_path / "logs" / "logged"
    config.write_text(
        f'model_config_list {{ config {{ name: "default" base_path: "{models}" '
        'model_platform: "tensorflow" } config { name: "logged" '
        f'base_path: "{models}" model_platform: "tensorflow" logging_config {{ '
        f'log_collector_config {{ type: "tfrecord" filename_prefix: "{log}" }} '
        'sampling_config { sampling_rate: 1.0 } } } }')
    params = tmp_path / "batching.config"
    params.write_text("max_batch_size { value: 8 }\nbatch_timeout_micros { value: 1000000 }\n")
    proc, url = start_server(reaper.popen, str(config), "--enable_batching",
                             f"--batching_parameters_file={params}",
                             "--rest_api_num_threads=1", flag="--model_config_file")
    imgs = images(8, seed=8)
    fn = tf.saved_model.load(export).signatures["serving_default"]
    want = fn(image=tf.constant(imgs), key=tf.constant(np.arange(8), tf.int64))

    def count() -> float:
        text = httpx.get(f"{url}/monitoring/prometheus/metrics").text
        return metric_samples(text, ":mljob:serving:batch_size_count").get(
            frozenset({("model_name", MODEL)}), 0.0)

    async def main(name):
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            async def one(i):
                answer = await client.post(f"/v1/models/{name}:predict", json={
                    "instances": [{"image": imgs[i].tolist(), "key": i}]})
                assert answer.status_code == 200, answer.text
                return answer.json()["predictions"][0]
            return await asyncio.gather(*(one(i) for i in range(8)))

    before = count()
    started = time.time()
    rows = asyncio.run(main(MODEL))
    assert time.time() - started < 4  # one timeout, not eight
    assert count() - before <= 2
    assert [r["key"] for r in rows] == list(range(8))
    np.testing.assert_allclose([r["scores"] for r in rows], want["scores"].numpy(),
                               rtol=1e-5, atol=1e-7)
    logged = asyncio.run(main("logged"))
    np.testing.assert_allclose([r["scores"] for r in logged], want["scores"].numpy(),
                               rtol=1e-5, atol=1e-7)
    reaper.stop(proc)
    from predict import records
    from predict.serving_api.apis import prediction_log_pb2
    (path,) = (tmp_path / "logs").glob("logged-*.tfrecord")
    with open(path, "rb") as f:
        kinds = [prediction_log_pb2.PredictionLog.FromString(r).WhichOneof("log_type")
                 for r in records.read_tfrecords(f)]
    assert kinds == ["predict_log"] * 8



def test_a_threads_batch_behind_one_the_loop_runs_is_timed_by_the_threads():
    """REST and gRPC requests share a queue: a loop's batch at the head, a gRPC
    thread's batch behind it. Once the loop has run its own, the threads time and run
    the one behind (at its timeout, not after their idle wait of seconds)."""
    batcher = batching.Batcher(max_batch_size=3, timeout_s=0.2)
    service = _service(batcher)
    model = _Doubler()
    wrapped = batcher.wrap(model, "m")
    answered: dict = {}

    def thread_request():  # two rows: they do not fit beside the loop's two
        time.sleep(0.1)  # its batch is due after the loop's
        started = time.perf_counter()
        answered["y"] = wrapped.predict({"x": np.array([5.0, 6.0])})["y"].tolist()
        answered["seconds"] = time.perf_counter() - started
    try:
        _on_loop(service, wrapped, [[1.0]])  # the queue's first batch: it runs fast
        answers, loop_thread, _ = _on_loop(service, wrapped, [[1.0, 2.0]],
                                           also=thread_request)
        assert answers[0]["y"].tolist() == [2.0, 4.0] and answered["y"] == [10.0, 12.0]
        assert answered["seconds"] < 1.5, answered
        assert [rows for _, rows in model.calls[-2:]] == [2, 2]
    finally:
        service.pool.shutdown()
