"""Hostile prediction inputs: property-based tests of the decoder (any JSON gives typed
arrays or the decoder's own error, never another exception), and a real server fed
10 MB bodies, 10,000 instances, NaN literals and 200 concurrent clients, still up after.

The server's ordinary error answers (routes, shapes, strings, NaN values, nesting) are in
test_predict_server.py::test_errors; this file adds what is hostile in size or number.
"""
from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.common import Reaper, pid_alive
from predict.runtime import decode, instances
from predict.errors import InputError, InstanceError, UsageError
from predict.runtime.model import Signature, TensorInfo
from tests.support.predict_models import images, saved_model_export, start_server

IMAGE = TensorInfo(np.float32, (None, 784), "image:0")
KEY = TensorInfo(np.int64, (None,), "key:0")
SERVING = Signature("serving_default", {"image": IMAGE, "key": KEY},
                    {"key": KEY, "scores": TensorInfo(np.float32, (None, 10), "s:0")})
IMAGES_ONLY = Signature("predict_images", {"image": IMAGE},
                        {"scores": TensorInfo(np.float32, (None, 10), "s:0")})
MODEL = "/v1/models/default"

# --- the decoder, property-based -----------------------------------------------------

SCALARS = (st.none() | st.booleans() | st.integers() | st.text(max_size=8)
           | st.floats(allow_nan=True, allow_infinity=True))
JSON = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=6)
                    | st.dictionaries(st.text(max_size=6), kids, max_size=4), max_leaves=40)
# Values near what the signature wants, so the deeper checks are reached too.
PIXEL = (st.floats(min_value=-0.5, max_value=1.5) | st.sampled_from([float("nan"), float("inf")])
         | st.just("0.5"))
NEAR_IMAGE = (st.lists(PIXEL, min_size=783, max_size=785)
              | st.lists(st.lists(PIXEL, min_size=27, max_size=28), min_size=28, max_size=28)
              | st.builds(lambda b: {"b64": b}, st.text(max_size=20)))
NEAR_KEY = st.integers(min_value=-2**65, max_value=2**65) | st.floats() | SCALARS
NEAR_INSTANCE = st.fixed_dictionaries({"image": NEAR_IMAGE}, optional={"key": NEAR_KEY,
                                                                        "label": SCALARS})
SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _check(decoded: dict, sig: Signature) -> None:
    assert set(decoded) == set(sig.inputs)
    for name, value in decoded.items():
        assert isinstance(value, np.ndarray) and value.dtype == sig.inputs[name].dtype
    if "image" in decoded:
        image = decoded["image"]
        assert image.shape == (784,) and np.isfinite(image).all()
        assert image.min() >= 0 and image.max() <= 1


@SETTINGS
@given(instance=JSON | NEAR_INSTANCE, sig=st.sampled_from([SERVING, IMAGES_ONLY]))
def test_any_instance_decodes_or_is_an_instance_error(instance, sig):
    try:
        decoded = decode.decode_instance(instance, sig)
    except InstanceError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    _check(decoded, sig)


@SETTINGS
@given(columns=JSON | st.fixed_dictionaries(
    {"image": st.lists(NEAR_IMAGE, max_size=3)},
    optional={"key": st.lists(NEAR_KEY, max_size=3) | NEAR_KEY}))
def test_any_columns_decode_or_are_an_instance_error(columns):
    try:
        decoded = decode.decode_columns(columns, SERVING)
    except InstanceError:
        return
    sizes = {len(v) for v in decoded.values()}
    assert len(sizes) == 1 and set(decoded) == {"image", "key"}


@SETTINGS
@given(data=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_any_bytes_as_json_lines_or_requests_give_instances_or_an_input_error(data):
    for read in (instances.json_instances, instances.json_request):
        try:
            got = list(read(data))
        except InputError as exc:
            assert "\n" not in str(exc)
            continue
        assert all(isinstance(label, str) for label, _ in got)
    try:
        list(instances.text_instances(data, IMAGES_ONLY))
    except (InputError, UsageError):
        pass


# --- a real server --------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server with the default limits (1.5 MB bodies, 100 instances), by PID."""
    model = saved_model_export(str(tmp_path_factory.mktemp("export") / "model"))
    reaper = Reaper()
    try:
        proc, url = start_server(reaper.popen, model)
        with httpx.Client(base_url=url, timeout=120) as client:
            yield client, proc
    finally:
        reaper.stop_all()


def _error(answer: httpx.Response, status: int) -> str:
    assert answer.status_code == status, answer.text[:300]
    body = answer.json()
    assert list(body) == ["error"] and "Traceback" not in body["error"]
    return body["error"]


def test_10_mb_body_is_refused_and_the_server_goes_on(server):
    client, proc = server
    body = b'{"instances": [' + b"0.5, " * 2_000_000 + b"0.5]}"   # about 10 MB
    assert _error(client.post(f"{MODEL}:predict", content=body), 413).startswith(
        "request body exceeds 1572864 bytes")
    assert client.get(MODEL).status_code == 200 and proc.poll() is None


def test_10000_instances_are_refused_before_decoding(server):
    client, _ = server
    body = json.dumps({"instances": [0] * 10_000})   # small body, many instances
    message = _error(client.post(f"{MODEL}:predict", content=body), 400)
    assert "10000 instances" in message and "at most 100" in message


@pytest.mark.parametrize("body,words", [
    ('{"instances": [{"image": [NaN' + ', 0.5' * 783 + '], "key": 1}]}', "NaN"),
    ('{"instances": [{"image": [Infinity' + ', 0.5' * 783 + '], "key": 1}]}', "NaN"),
    ('{"instances": {"image": [0.5], "key": 1}}', "instances"),
    ('{"instances": [{"image": "0.5", "key": 1}]}', "strings"),
    ('{"instances": [{"image": [' + ', '.join(['"0.5"'] * 784) + '], "key": 1}]}',
     "strings"),
    ('{"instances": [{"image": [[0.5, 0.5], [0.5]], "key": 1}]}', "rectangular"),
    ('{"inputs": {"image": [[' + ', '.join(['0.5'] * 784) + ']], "key": [1.5]}}',
     "integers"),
    ('\xff\xfe{"instances"', "JSON"),
], ids=["NaN literal", "Infinity literal", "instances an object", "string image",
        "string pixels", "ragged image", "float key", "not UTF-8"])
def test_malformed_bodies_are_400_with_the_problem_named(server, body, words):
    client, _ = server
    content = body.encode("latin-1") if body.startswith("\xff") else body.encode()
    assert words in _error(client.post(f"{MODEL}:predict", content=content), 400)


def test_200_concurrent_clients_good_and_bad_all_answered(server):
    client, proc = server
    imgs = images(200, seed=5)

    async def one(http, i):
        if i % 4 == 3:   # every fourth client sends garbage
            answer = await http.post(f"{MODEL}:predict", content=b'{"instances": [')
            return answer.status_code, None
        answer = await http.post(f"{MODEL}:predict", json={"instances": [
            {"image": imgs[i].tolist(), "key": i}]})
        return answer.status_code, answer.json()["predictions"][0]["key"]

    async def main():
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(base_url=str(client.base_url), timeout=300,
                                     limits=limits) as http:
            return await asyncio.gather(*(one(http, i) for i in range(200)))

    results = asyncio.run(main())
    assert results == [(400, None) if i % 4 == 3 else (200, i) for i in range(200)]
    assert client.get(MODEL).status_code == 200
    assert proc.poll() is None and pid_alive(proc.pid)
