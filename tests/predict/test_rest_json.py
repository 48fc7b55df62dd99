"""The REST path's JSON through orjson reads and writes exactly what json does (the
bodies it would read otherwise go to json), and a request past --rest_api_timeout_in_ms
is answered 504 at the timeout while its call finishes on the pool (predict.runtime.calls)."""
import asyncio
import json
import math
import threading

import pytest

from predict.runtime import calls, instances
from predict.api import http as rest_http
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


def test_a_request_past_its_timeout_is_504_while_its_call_goes_on():
    """The call is still running when the timeout answers (it waits for an event the
    test sets after): the answer comes at the timeout, not after the call, by
    construction; the call then ends on the pool."""
    runner = calls.Calls(2, timeout_s=0.05)
    release, ended = threading.Event(), threading.Event()

    def call():
        release.wait(120)
        ended.set()
        return "late"
    try:
        with pytest.raises(calls.DeadlineExceeded, match="--rest_api_timeout_in_ms"):
            asyncio.run(runner.rest(call))
        assert not ended.is_set()
        release.set()
        assert ended.wait(120)
    finally:
        release.set()
        runner.close()
    patient = calls.Calls(1, timeout_s=120)
    try:
        assert asyncio.run(patient.rest(lambda: "in time")) == "in time"
    finally:
        patient.close()
