"""`python -m predict serve`: TF Serving's REST API, tested over 127.0.0.1 with httpx
against a real server process."""
import asyncio
import base64
import json
import signal
import socket

import httpx
import numpy as np
import pytest
import tensorflow as tf

from tests.support.common import Reaper
from tests.support.predict_models import (images, legacy_export, legacy_reference, saved_model_export,
                             start_server)

MODEL = "/v1/models/default"


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    return {"saved": saved_model_export(str(root / "model")),
            "legacy": legacy_export(str(root / "legacy"))}


@pytest.fixture(scope="module")
def server(exports):
    """One server for the module (start-up costs seconds); stopped by PID after."""
    reaper = Reaper()
    try:
        proc, url = start_server(reaper.popen, exports["saved"], "--max-instances", "50")
        with httpx.Client(base_url=url, timeout=60) as client:
            yield client
    finally:
        reaper.stop_all()


@pytest.fixture(scope="module")
def direct(exports):
    fn = tf.saved_model.load(exports["saved"]).signatures["serving_default"]
    return lambda imgs, keys: {k: v.numpy() for k, v in fn(
        image=tf.constant(imgs), key=tf.constant(keys, tf.int64)).items()}


def test_status_and_metadata_have_tf_servings_shape(server):
    assert server.get(MODEL).json() == {"model_version_status": [{
        "version": "1", "state": "AVAILABLE",
        "status": {"error_code": "OK", "error_message": ""}}]}
    assert server.get(f"{MODEL}/versions/1").status_code == 200
    meta = server.get(f"{MODEL}/metadata").json()
    assert meta["model_spec"] == {"name": "default", "signature_name": "", "version": "1"}
    sigs = meta["metadata"]["signature_def"]["signature_def"]
    assert set(sigs) == {"serving_default", "predict_images"}
    serving = sigs["serving_default"]
    assert serving["method_name"] == "tensorflow/serving/predict"
    assert serving["inputs"]["image"]["dtype"] == "DT_FLOAT"
    assert serving["inputs"]["image"]["tensor_shape"] == {
        "dim": [{"size": "-1", "name": ""}, {"size": "784", "name": ""}],
        "unknown_rank": False}
    assert serving["inputs"]["image"]["name"] == "serving_default_image:0"
    assert serving["inputs"]["key"]["dtype"] == "DT_INT64"
    assert {k: v["dtype"] for k, v in serving["outputs"].items()} == {
        "key": "DT_INT64", "scores": "DT_FLOAT", "classes": "DT_INT64"}


def test_row_and_columnar_formats_agree_with_the_model(server, direct):
    imgs = images(4, seed=11)
    want = direct(imgs, [3, 1, 4, 1])
    rows = server.post(f"{MODEL}:predict", json={"instances": [
        {"image": img.tolist(), "key": k} for img, k in zip(imgs, [3, 1, 4, 1])]})
    assert rows.status_code == 200
    predictions = rows.json()["predictions"]
    assert [p["key"] for p in predictions] == [3, 1, 4, 1]
    assert [p["classes"] for p in predictions] == want["classes"].tolist()
    np.testing.assert_allclose([p["scores"] for p in predictions], want["scores"], rtol=1e-6)
    cols = server.post(f"{MODEL}/versions/1:predict", json={
        "inputs": {"image": imgs.tolist(), "key": [3, 1, 4, 1]}}).json()["outputs"]
    assert cols["key"] == [3, 1, 4, 1] and cols["classes"] == want["classes"].tolist()
    np.testing.assert_allclose(cols["scores"], want["scores"], rtol=1e-6)


def test_b64_images_and_signature_name(server, direct):
    imgs = images(2, seed=12)
    b64 = [{"b64": base64.b64encode(img.astype("<f4").tobytes()).decode()} for img in imgs]
    answer = server.post(f"{MODEL}:predict", json={
        "signature_name": "predict_images", "instances": b64})
    assert answer.status_code == 200, answer.text
    predictions = answer.json()["predictions"]
    assert all(set(p) == {"scores", "classes"} for p in predictions)
    np.testing.assert_allclose([p["scores"] for p in predictions],
                               direct(imgs, [0, 1])["scores"], rtol=1e-6)
    named = server.post(f"{MODEL}:predict", json={"instances": [
        {"image": b64[0], "key": 9}]}).json()["predictions"]
    assert named[0]["key"] == 9 and named[0]["classes"] == predictions[0]["classes"]


GOOD = [0.5] * 784
ERRORS = [
    # (name, method, path, body, status, words in the error)
    ("unknown model", "POST", "/v1/models/other:predict", {"instances": [GOOD]}, 404,
     "model 'other' not found"),
    ("unknown version", "GET", f"{MODEL}/versions/7", None, 404, "no version '7'"),
    ("unknown route", "GET", "/v2/whatever", None, 404, "no route /v2/whatever"),
    ("unknown verb", "POST", f"{MODEL}:explain", {}, 404, "unknown method :explain"),
    ("classify a predict signature", "POST", f"{MODEL}:classify", {"examples": [{"key": 1}]},
     400, "Expected classification signature method_name to be tensorflow/serving/classify"),
    ("GET predict", "GET", f"{MODEL}:predict", None, 405, "use POST"),
    ("POST status", "POST", MODEL, {}, 405, "use GET"),
    ("DELETE metadata", "DELETE", f"{MODEL}/metadata", None, 405, "use GET"),
    ("not JSON", "POST", f"{MODEL}:predict", b"{instances:", 400, "malformed JSON"),
    ("empty body", "POST", f"{MODEL}:predict", b"", 400, "empty body"),
    ("not an object", "POST", f"{MODEL}:predict", [1, 2], 400, "must be a JSON object"),
    ("both formats", "POST", f"{MODEL}:predict",
     {"instances": [], "inputs": {}}, 400, "exactly one of"),
    ("neither format", "POST", f"{MODEL}:predict", {"signature_name": "x"}, 400,
     "exactly one of"),
    ("unknown key", "POST", f"{MODEL}:predict", {"instances": [GOOD], "extra": 1}, 400,
     "unknown key 'extra'"),
    ("empty instances", "POST", f"{MODEL}:predict", {"instances": []}, 400, "non-empty"),
    ("unknown signature", "POST", f"{MODEL}:predict",
     {"signature_name": "nope", "instances": [GOOD]}, 400, "no signature 'nope'"),
    ("bare value, short", "POST", f"{MODEL}:predict", {"instances": [GOOD[:5]]}, 400,
     "instance 0: image has shape [5]"),  # a bare value is the input besides the key
    ("bad shape at index 2", "POST", f"{MODEL}:predict", {"instances": [
        {"image": GOOD, "key": 1}, {"image": GOOD, "key": 2}, {"image": GOOD[:5], "key": 3}]},
     400, "instance 2: image has shape [5]"),
    ("string pixels", "POST", f"{MODEL}:predict",
     {"instances": [{"image": ["0.5"] * 784, "key": 1}]}, 400, "instance 0: image holds strings"),
    ("NaN pixel", "POST", f"{MODEL}:predict",
     b'{"instances": [{"image": [NaN' + b", 0.5" * 783 + b'], "key": 1}]}', 400,
     "instance 0: image holds NaN"),
    ("missing input", "POST", f"{MODEL}:predict", {"instances": [{"key": 1}]}, 400,
     "instance 0: missing input 'image'"),
    ("unknown input", "POST", f"{MODEL}:predict",
     {"instances": [{"image": GOOD, "key": 1, "label": 2}]}, 400, "unknown input 'label'"),
    ("too many instances", "POST", f"{MODEL}:predict",
     {"instances": [{"image": [0.0] * 784, "key": i} for i in range(51)]}, 400,
     "51 instances; this server takes at most 50"),
    ("columnar batch mismatch", "POST", f"{MODEL}:predict",
     {"inputs": {"image": [GOOD, GOOD], "key": [1]}}, 400, "differ in batch size"),
    ("deeply nested JSON", "POST", f"{MODEL}:predict", b"[" * 200_000, 400,
     "nested too deeply"),
    ("deeply nested image", "POST", f"{MODEL}:predict",
     {"instances": [{"image": json.loads("[" * 60 + "0.5" + "]" * 60), "key": 1}]}, 400,
     "nested"),
]


@pytest.mark.parametrize("method,path,body,status,words", [e[1:] for e in ERRORS],
                         ids=[e[0] for e in ERRORS])
def test_errors(server, method, path, body, status, words):
    content = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    answer = server.request(method, path, content=content)
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert set(answer.json()) == {"error"} and words in answer.json()["error"]
    if status == 405:
        assert answer.headers["allow"] in ("GET", "POST")


def test_body_limit_answers_413_and_the_server_goes_on(server):
    big = b'{"instances": [' + b"0.5, " * 400_000 + b"0.5]}"  # about 2 MB
    answer = server.post(f"{MODEL}:predict", content=big)
    assert answer.status_code == 413 and "exceeds 1572864 bytes" in answer.json()["error"]

    def chunks():  # no Content-Length: the limit is enforced while reading
        for _ in range(40):
            yield b" " * 65536
    answer = server.post(f"{MODEL}:predict", content=chunks())
    assert answer.status_code == 413
    assert server.get(MODEL).status_code == 200


def test_100_concurrent_clients_all_answered(server, direct):
    imgs = images(100, seed=13)
    want = direct(imgs, list(range(100)))["classes"].tolist()

    async def one(client, i):
        answer = await client.post(f"{MODEL}:predict", json={"instances": [
            {"image": imgs[i].tolist(), "key": i}]})
        assert answer.status_code == 200, answer.text
        (prediction,) = answer.json()["predictions"]
        return prediction["key"], prediction["classes"]

    async def main():
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(base_url=str(server.base_url), timeout=120,
                                     limits=limits) as client:
            return await asyncio.gather(*(one(client, i) for i in range(100)))

    results = asyncio.run(main())
    assert results == [(i, want[i]) for i in range(100)]


def _answer(sock, buffered: bytearray, head_only: bool = False):
    """(status, headers, body) of the next answer on a raw keep-alive connection."""
    while b"\r\n\r\n" not in buffered:
        data = sock.recv(65536)
        assert data, "the server closed the connection"
        buffered += data
    head, _, rest = bytes(buffered).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    size = 0 if head_only else int(headers.get("content-length", 0))
    while len(rest) < size:
        data = sock.recv(65536)
        assert data, "the server closed the connection"
        rest += data
    buffered[:] = rest[size:]
    return int(lines[0].split()[1]), headers, rest[:size]


def test_head_100_continue_and_pipelined_requests_on_one_connection(server, direct):
    """The answers on one keep-alive connection, byte for byte where uvicorn writes an
    answer's head and body itself: a HEAD (no body), an Expect: 100-continue upload,
    three requests sent at once (answered in order), then the connection still works."""
    host, port = str(server.base_url).split("//")[1].rsplit(":", 1)
    img = images(1, seed=15)[0]
    body = json.dumps({"instances": [{"image": img.tolist(), "key": 9}]}).encode()
    want = direct(img[None], [9])["classes"].tolist()
    post = (f"POST {MODEL}:predict HTTP/1.1\r\nhost: x\r\ncontent-type: "
            f"application/json\r\ncontent-length: {len(body)}\r\n").encode()
    buffered = bytearray()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"HEAD {MODEL} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
        status, headers, got = _answer(sock, buffered, head_only=True)
        # the routes answer GET (HEAD is 405); its head says how long the body would be
        assert status == 405 and int(headers["content-length"]) > 0 and got == b""
        sock.sendall(post + b"expect: 100-continue\r\n\r\n")
        assert _answer(sock, buffered, head_only=True)[0] == 100
        sock.sendall(body)
        status, _, got = _answer(sock, buffered)
        assert status == 200 and json.loads(got)["predictions"][0]["classes"] == want[0]
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n" + post + b"\r\n" + body +
                     f"GET {MODEL}/metadata HTTP/1.1\r\nhost: x\r\n\r\n".encode())
        answers = [_answer(sock, buffered) for _ in range(3)]
        assert [a[0] for a in answers] == [200, 200, 200]
        assert json.loads(answers[0][2])["status"] == "SERVING"
        assert json.loads(answers[1][2])["predictions"][0]["key"] == 9
        assert "signature_def" in json.loads(answers[2][2])["metadata"]
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        assert _answer(sock, buffered)[0] == 200 and buffered == b""


def test_legacy_export_served_the_same_way(exports, reaper):
    proc, url = start_server(reaper.popen, exports["legacy"], "--model-name", "seeds")
    imgs = images(3, seed=14)
    with httpx.Client(base_url=url, timeout=60) as client:
        answer = client.post("/v1/models/seeds:predict", json={"instances": [
            {"image": img.tolist(), "key": k} for img, k in zip(imgs, [4, 5, 6])]})
        assert answer.status_code == 200, answer.text
        predictions = answer.json()["predictions"]
        assert [p["key"] for p in predictions] == [4, 5, 6]
        np.testing.assert_allclose([p["scores"] for p in predictions],
                                   legacy_reference(exports["legacy"], imgs), rtol=1e-5)
        meta = client.get("/v1/models/seeds/metadata").json()
        serving = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
        assert serving["inputs"]["key"] == {
            "dtype": "DT_INT64", "name": "key:0",
            "tensor_shape": {"dim": [{"size": "-1", "name": ""}], "unknown_rank": False}}
        assert set(serving["outputs"]) == {"key", "scores"}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_the_server_cleanly(exports, reaper, sig):
    proc, url = start_server(reaper.popen, exports["saved"])
    port = httpx.URL(url).port
    assert httpx.get(f"{url}{MODEL}").status_code == 200
    proc.send_signal(sig)
    assert proc.wait(30) == 0, proc.stderr.read()
    assert "Traceback" not in proc.stderr.read()
    with socket.socket() as s:  # the port is free again
        s.bind(("127.0.0.1", port))


def test_port_in_use_is_a_usage_error(exports):
    import subprocess
    import sys
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "predict", "serve", "--model-dir",
                               exports["saved"], "--rest_api_port", str(port)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2
        assert f"error: cannot listen on 127.0.0.1:{port}" in done.stderr
        grpc_busy = subprocess.run([sys.executable, "-m", "predict", "serve", "--model-dir",
                                    exports["saved"], f"--port={port}"],
                                   capture_output=True, text=True, timeout=120)
    assert grpc_busy.returncode == 2
    assert f"error: cannot listen on 127.0.0.1:{port} for gRPC (Address already in use); " \
        "pick another --port" in grpc_busy.stderr
