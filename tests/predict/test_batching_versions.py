"""`--enable-batching` across a version swap: clients never pause while the new version
is published (the old version's batching queue is busy when the swap comes); once the
status shows the new version alone, every batched answer is the new version's."""
from __future__ import annotations

import asyncio
import threading

import httpx
import numpy as np
import tensorflow as tf

from tests.support.predict_models import (images, metric_samples, publish_version,
                                          saved_model_export, start_server, states,
                                          wait_for_status)

MODEL = "/v1/models/default"
IMAGES = images(8, seed=33)


def _scores(path: str) -> np.ndarray:
    fn = tf.saved_model.load(path).signatures["serving_default"]
    return fn(image=tf.constant(IMAGES), key=tf.constant(np.arange(8), tf.int64))[
        "scores"].numpy()


def _versions(expected: dict, rows: list) -> list:
    """For each answered row (key, scores): the version whose exact output it is."""
    found = []
    for row in rows:
        key = row["key"]
        found.append(next((v for v, want in expected.items()
                           if np.allclose(row["scores"], want[key], rtol=1e-5, atol=1e-7)),
                          None))
    return found


def _predict_all(url: str, count: int) -> list:
    """count concurrent one-instance requests; their predictions."""
    async def main():
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            async def one(i):
                answer = await client.post(f"{MODEL}:predict", json={
                    "instances": [{"image": IMAGES[i % 8].tolist(), "key": i % 8}]})
                assert answer.status_code == 200, answer.text
                return answer.json()["predictions"][0]
            return await asyncio.gather(*(one(i) for i in range(count)))
    return asyncio.run(main())


def test_batched_requests_after_a_swap_are_answered_by_the_new_version(tmp_path, reaper):
    exports = {v: saved_model_export(str(tmp_path / f"export{v}"), seed=v) for v in (1, 2)}
    expected = {v: _scores(path) for v, path in exports.items()}
    assert not np.allclose(expected[1], expected[2])
    base = tmp_path / "base"
    publish_version(exports[1], str(base), 1)
    proc, url = start_server(reaper.popen, str(base), "--enable-batching",
                             "--max-batch-size", "8", "--batch-timeout-micros", "20000",
                             "--threads", "8", "--file-system-poll-wait-seconds", "0.2",
                             flag="--model-base-path")
    assert set(_versions(expected, _predict_all(url, 16))) == {1}
    stop, background, errors = threading.Event(), [], []

    def keep_asking():  # the queue never idles across the swap
        try:
            while not stop.is_set():
                background.extend(_predict_all(url, 4))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=keep_asking, daemon=True)
    thread.start()
    try:
        publish_version(exports[2], str(base), 2)
        with httpx.Client(base_url=url, timeout=60) as client:
            status = wait_for_status(client, MODEL,
                                     lambda s: states(s) == {2: "AVAILABLE", 1: "END"})
            assert states(status) == {2: "AVAILABLE", 1: "END"}
        stop.set()  # the old version's queue (if any) lives on for seconds idle
        thread.join(120)
        before = metric_samples(httpx.get(f"{url}/monitoring/prometheus/metrics").text,
                                ":mljob:serving:batch_size_count")
        after_swap = []
        for _ in range(3):
            after_swap += _predict_all(url, 16)
    finally:
        stop.set()
        thread.join(120)
    assert errors == []
    assert len(background) > 0
    assert set(_versions(expected, after_swap)) == {2}, _versions(expected, after_swap)
    text = httpx.get(f"{url}/monitoring/prometheus/metrics").text
    calls = metric_samples(text, ":mljob:serving:batch_size_count")
    key = frozenset({("model_name", "default")})
    assert calls[key] - before[key] < 48  # requests after the swap shared calls


def test_per_model_batching_parameters_come_from_each_versions_folder(tmp_path):
    """--enable_per_model_batching_parameters, as TF Serving: a version folder with
    batching_params.pbtxt batches with its own parameters, one without is not batched,
    and the thread count is the global one."""
    import threading

    from predict.runtime import batching, protos

    class Model:
        signatures = {"serving_default": None}

        def __init__(self, source):
            self.source = source
            self.calls = []

        def signature(self, name=None):
            return type("Sig", (), {"name": "serving_default"})()

        def predict(self, batch, signature_name=None):
            self.calls.append(len(batch["x"]))
            return {"y": batch["x"] * 2}

    with_file = tmp_path / "m" / "1"
    with_file.mkdir(parents=True)
    (with_file / "batching_params.pbtxt").write_text(
        "max_batch_size { value: 4 }\nbatch_timeout_micros { value: 300000 }\n"
        "num_batch_threads { value: 7 }\n")
    without = tmp_path / "m" / "2"
    without.mkdir()
    common = protos.BatchingParameters(max_batch_size=100, num_batch_threads=1)
    batchers = batching.PerModelBatchers(common)
    plain = Model(str(without))
    assert batchers.wrap(plain, "m", 2) is plain  # no file: not batched
    model = Model(str(with_file))
    wrapped = batchers.wrap(model, "m", 1)
    assert isinstance(wrapped, batching.BatchedModel)
    params = batchers.batcher_for(str(with_file)).params
    assert (params.max_batch_size, params.num_batch_threads) == (4, 1)
    answers = []
    threads = [threading.Thread(target=lambda i=i: answers.append(
        wrapped.predict({"x": np.array([float(i)])}))) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(answers) == 4 and model.calls == [4]  # four requests, one call
    batchers.stop()


def test_a_versions_batching_params_are_read_and_checked_when_it_loads(tmp_path):
    """--enable_per_model_batching_parameters: a version's batching_params.pbtxt is read
    when the version loads (as TF Serving does), so a bad one (a named pipe, a device,
    values out of range) fails that version's load with the reason in its status; the
    versions with a good file or none load and answer."""
    import functools
    import os
    import shutil

    from predict.runtime import batching, protos
    from predict.serving import process as serving
    from predict.models.repository import Repository
    from predict.models.versions import LoadOptions, ModelConfig, VersionPolicy

    base = tmp_path / "m"
    saved_model_export(str(base / "1"), seed=2)
    for version in (2, 3, 4, 5):
        shutil.copytree(base / "1", base / str(version))
    (base / "2" / "batching_params.pbtxt").write_text("max_batch_size { value: 4 }\n")
    os.mkfifo(base / "3" / "batching_params.pbtxt")
    os.symlink("/dev/zero", base / "4" / "batching_params.pbtxt")
    (base / "5" / "batching_params.pbtxt").write_text("max_batch_size { value: 0 }\n")
    batchers = batching.PerModelBatchers(protos.BatchingParameters(num_batch_threads=1))
    repo = Repository(
        [ModelConfig(name="m", base_path=str(base), policy=VersionPolicy(kind="all"))],
        poll_seconds=0, load_options=LoadOptions(max_retries=0),
        loader=functools.partial(serving._load, tags=None, per_model=batchers, tflite=0))
    repo.start()
    try:
        status = {int(s["version"]): s for s in repo.get("m").status()}
        assert {v: s["state"] for v, s in status.items()} == {
            1: "AVAILABLE", 2: "AVAILABLE", 3: "END", 4: "END", 5: "END"}, status
        reasons = {v: status[v]["status"]["error_message"] for v in (3, 4, 5)}
        assert "named pipe" in reasons[3] and "batching_params.pbtxt" in reasons[3], reasons
        assert "device" in reasons[4], reasons
        assert "max_batch_size must lie in 1..1000000" in reasons[5], reasons
        assert batchers.batcher_for(str(base / "2")).params.max_batch_size == 4
        assert batchers.batcher_for(str(base / "1")) is None  # no file: not batched
    finally:
        repo.stop()
        batchers.stop()
