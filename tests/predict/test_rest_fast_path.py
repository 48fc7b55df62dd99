"""The REST path's shortcuts keep the answers they shortcut: orjson reads and writes
exactly what json did (the bodies it would read otherwise go to json), and a request
runs on the event loop only when nothing can wait behind it (one request in the server,
a small body, a fast model, batching off), so timeouts and concurrency behave as they
did through the thread pool."""
import asyncio
import json
import math
import threading
import time

import pytest

from predict import instances, rest_http, server
from predict.errors import InstanceError

BODIES = [
    b'{"instances": [{"image": [0.5, 0.25], "key": 7}]}',
    b"[18446744073709551616]", b"[-9223372036854775809]",  # past 64 bits: int for json
    b"[18446744073709551615]", b"[9223372036854775807, -9223372036854775808]",
    b"[12345678901234567890.5, 1e19, 0.1234567890123456789012]",
    b"[NaN, Infinity, -Infinity]", b"[1e400, -1e400]", b'["\\ud800"]',
    b'{"a": 1, "a": 2}', b"  [1]  ", b"\xef\xbb\xbf[1]", b"", b"   ", b"[1,]", b"[1] x",
    b'"\x01"', b"[" * 5000 + b"]" * 5000, b'{"k": "' + b"9" * 30 + b'"}',
    b"[" + b"9" * 5000 + b"]",
]


def _json_answer(raw: bytes):
    try:
        return "value", repr(instances.parse_json(raw.decode("utf-8")))
    except InstanceError as exc:
        return "error", str(exc)


@pytest.mark.parametrize("raw", BODIES, ids=range(len(BODIES)))
def test_bodies_read_as_json_reads_them(raw):
    try:
        got = "value", repr(instances.parse_json_bytes(raw))
    except InstanceError as exc:
        got = "error", str(exc)
    assert got == _json_answer(raw)


def test_a_big_integer_stays_an_integer():
    assert instances.parse_json_bytes(b'{"key": [18446744073709551616]}') == \
        {"key": [2 ** 64]}
    with pytest.raises(UnicodeDecodeError):
        instances.parse_json_bytes(b'{"k": "\xff"}')


@pytest.mark.parametrize("payload", [
    {"predictions": [{"key": 1, "scores": [0.25, 1e-05, 3.0e300]}]},
    {"outputs": [math.nan, math.inf, -math.inf]}, {"outputs": [2 ** 70, -2 ** 64]},
    {"predictions": ["null", "h\u00e9", {"b64": "AAE="}]}, {"result": [[["0", 0.5]]]}],
    ids=["floats", "nan", "huge ints", "strings", "classify"])
def test_answers_written_as_json_writes_them(payload):
    written = rest_http.dumps(payload)
    assert isinstance(written, bytes)
    assert repr(json.loads(written)) == repr(json.loads(json.dumps(payload)))
    if any(isinstance(v, float) and not math.isfinite(v) for v in payload.get("outputs", [])):
        assert b"NaN" in written and b"Infinity" in written  # as TF Serving writes them


def _service(timeout_s=5.0, batcher=None):
    return server.PredictionService(None, max_body_bytes=1 << 20, max_instances=10,
                                    threads=2, timeout_s=timeout_s, batcher=batcher)


def _where(service, size=100, name="m", seconds=0.0, busy=0):
    """Run one request through _in_pool; the thread its call ran on."""
    async def one():
        loop_thread = threading.current_thread()
        service._busy += busy

        def call():
            if seconds:
                time.sleep(seconds)
            return threading.current_thread()
        try:
            ran_on = await service._in_pool(size, name, call)
        finally:
            service._busy -= busy
        return "loop" if ran_on is loop_thread else "pool"
    return asyncio.run(one())


def test_only_a_lone_small_request_to_a_fast_model_runs_on_the_loop():
    service = _service()
    try:
        assert _where(service) == "pool"  # a model's first call: its speed is unknown
        assert _where(service) == "loop"  # fast, alone, small: on the loop
        assert _where(service, busy=1) == "pool"  # another request in the server
        assert _where(service, size=server.INLINE_BYTES + 1) == "pool"
        assert _where(service, name="other") == "pool"  # each model's own speed
        assert _where(service, seconds=0.02) == "loop"  # it was fast last time
        assert _where(service) == "pool"  # now it is known slow
        assert _where(service) == "loop"  # and fast again
        batched = _service(batcher=object())
        try:
            _where(batched)
            assert _where(batched) == "pool"  # the batch queue waits: never on the loop
        finally:
            batched.pool.shutdown()
        assert service._busy == 0
    finally:
        service.pool.shutdown()


def test_timeouts_still_answer_504():
    service = _service(timeout_s=0.2)
    try:
        _where(service)
        assert _where(service) == "loop"
        # a model slower than the timeout on the loop: 504, as the pool would answer
        with pytest.raises(server.HTTPError) as raised:
            _where(service, seconds=0.3)
        assert raised.value.status == 504
        # known slow now: the pool, and the 504 comes at the timeout, not after the call
        started = time.perf_counter()
        with pytest.raises(server.HTTPError) as raised:
            _where(service, seconds=1.0)
        assert raised.value.status == 504 and time.perf_counter() - started < 0.8
        # a timeout too short for the model's last call never runs on the loop
        quick = _service(timeout_s=0.01)
        try:
            _where(quick, seconds=0.0015)
            assert _where(quick) == "pool"
        finally:
            quick.pool.shutdown(wait=True)
    finally:
        service.pool.shutdown(wait=True)


class _Recorder:
    """A transport that records each write (one write: one send on the socket)."""

    def __init__(self):
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after close"
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n"


def test_an_answers_head_and_body_go_out_in_one_write():
    recorder = _Recorder()
    one = rest_http.OneWrite(recorder)
    one.write(HEAD)
    assert recorder.writes == []  # held for the body
    one.write(b"{}")
    assert recorder.writes == [HEAD + b"{}"]
    # an empty body still sends the head; a later write goes straight out
    one.write(HEAD.replace(b": 2", b": 0"))
    one.write(b"")
    one.write(b"more")
    assert recorder.writes[1:] == [HEAD.replace(b": 2", b": 0"), b"more"]
    assert not one.is_closing()  # the rest is the transport's


def test_100_continue_is_never_held_and_close_sends_a_held_head():
    recorder = _Recorder()
    one = rest_http.OneWrite(recorder)
    one.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert recorder.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    one.write(HEAD)  # the app failed after its head: uvicorn closes the connection
    one.close()
    assert recorder.writes[1:] == [HEAD] and recorder.closed


def test_the_flat_calls_tensors_answer_as_the_keyword_call(tmp_path, monkeypatch):
    """SavedModel.predict wraps arrays of the input's dtype directly as tensors and sends
    everything else (other dtypes, lists) through tf.constant: every form gives the
    signature's own answer."""
    import numpy as np
    import tensorflow as tf

    from predict import model as models
    from tests.support.predict_models import images, saved_model_export
    export = saved_model_export(str(tmp_path / "model"))
    model = models.load(export)
    assert model._flat["serving_default"] is not None  # the flat call is in use
    assert getattr(model._flat["serving_default"][1], "runtime", False)  # the runtime's
    imgs = images(3, seed=21)
    keys = np.array([5, 6, 7], np.int64)
    fn = tf.saved_model.load(export).signatures["serving_default"]
    want = {k: v.numpy() for k, v in fn(image=tf.constant(imgs),
                                        key=tf.constant(keys)).items()}
    constant, through_constant = tf.constant, []
    monkeypatch.setattr(tf, "constant", lambda value, **kw: (
        through_constant.append(type(value).__name__), constant(value, **kw))[1])
    for batch, slow in (({"image": imgs, "key": keys}, []),
                        ({"image": imgs.astype(np.float64), "key": keys.astype(np.int32)},
                         ["ndarray", "ndarray"]),
                        ({"image": imgs.tolist(), "key": keys.tolist()}, ["list", "list"]),
                        ({"image": np.asfortranarray(imgs[:, ::-1])[:, ::-1], "key": keys},
                         [])):
        through_constant.clear()
        got = model.predict(batch)
        assert through_constant == slow  # arrays of the input's dtype: wrapped directly
        assert set(got) == set(want)
        for name, value in want.items():
            assert got[name].dtype == value.dtype
            np.testing.assert_allclose(got[name], value, rtol=1e-6)
