"""Hostile inputs the predictor must answer in one line: integers beyond Python's
int-string conversion limit (thousands of digits), malformed HTTP, an output path that
is a file, an input that is a folder. The server is a real process spoken to over
127.0.0.1, with httpx and with raw sockets for what httpx will not send."""
from __future__ import annotations

import json
import os
import socket
import sys

import httpx
import pytest

from predict.__main__ import main
from tests.support.common import Reaper
from tests.support.predict_models import images, instance_lines, saved_model_export, \
    start_server

MODEL = "/v1/models/default"
HUGE = "9" * (sys.get_int_max_str_digits() + 700)  # 5,000 digits by default
DIGITS = f"more than {sys.get_int_max_str_digits()} digits"


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    return saved_model_export(str(tmp_path_factory.mktemp("exports") / "model"))


@pytest.fixture(scope="module")
def server(export_dir):
    reaper = Reaper()
    try:
        proc, url = start_server(reaper.popen, export_dir)
        with httpx.Client(base_url=url, timeout=60) as client:
            yield proc, client
    finally:
        reaper.stop_all()


def _ok(client) -> None:
    """The server still answers a good request."""
    img = images(1, seed=2)[0].tolist()
    answer = client.post(f"{MODEL}:predict", json={"instances": [{"image": img, "key": 5}]})
    assert answer.status_code == 200 and answer.json()["predictions"][0]["key"] == 5


@pytest.mark.parametrize("body", [
    '{"instances": [{"image": [0.5], "key": HUGE}]}',
    '{"inputs": {"key": [HUGE], "image": [[0.5]]}}',
    '{"instances": [HUGE]}'], ids=["key", "columnar", "bare"])
def test_huge_integers_are_400_not_500(server, body):
    """Before: json raised ValueError, the server answered 500 and logged a traceback."""
    proc, client = server
    answer = client.post(f"{MODEL}:predict", content=body.replace("HUGE", HUGE),
                         headers={"content-type": "application/json"})
    assert answer.status_code == 400
    assert list(answer.json()) == ["error"] and DIGITS in answer.json()["error"]
    _ok(client)
    assert proc.poll() is None


def _raw(client, request: bytes) -> int:
    """Send bytes as they are; the status of the answer."""
    host, port = client.base_url.host, client.base_url.port
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, _ = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1])


@pytest.mark.parametrize("request_bytes, status", [
    (b"FOO /v1/models/default HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    (b"BREW /v1/models/default:predict HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    (b"POST /v1/models/default:predict HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
     400),
    (b"POST /v1/models/default:predict HTTP/1.1\r\nHost: x\r\n"
     b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", 400),
    (b"POST /v1/models/default:predict HTTP/1.1\r\nHost: x\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n-2\r\n{}\r\n0\r\n\r\n", 400),
    (b"GET /v1/models/default HTTP/1.1 extra\r\nHost: x\r\n\r\n", 400),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40, 400),
    (b"FOO\r\nHost: x\r\n\r\n", 400),
    (b"F@O /v1/models/default HTTP/1.1\r\nHost: x\r\n\r\n", 400),
], ids=["unknown method", "unknown method on predict", "negative Content-Length",
        "chunk size not hex", "negative chunk size", "malformed request line",
        "a TLS hello", "a method alone", "a method of no letters"])
def test_malformed_http_is_refused_and_the_server_goes_on(server, request_bytes, status):
    """uvicorn answers what it cannot parse itself (400; a method llhttp does not know
    is a parse error there, 405 when h11 parses: either refuses it)."""
    proc, client = server
    got = _raw(client, request_bytes)
    assert got == status or (status == 400 and got == 405 and b"HTTP/1.1" in
                             request_bytes.split(b"\r\n")[0]), got
    _ok(client)
    assert proc.poll() is None


def test_local_huge_integer_is_exit_2_with_one_line(export_dir, tmp_path, capsys):
    for flag, text in (("--json-instances", '{"image": [0.5], "key": HUGE}\n'),
                       ("--json-request", '{"instances": [HUGE]}')):
        source = tmp_path / "in.txt"
        source.write_text(text.replace("HUGE", HUGE))
        status = main(["local", "--model-dir", export_dir, flag, str(source)])
        out, err = capsys.readouterr()
        assert status == 2 and out == "", (flag, err)
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
        assert DIGITS in err and "Traceback" not in err


def test_batch_records_the_huge_integer_and_goes_on(export_dir, tmp_path, capsys):
    imgs = images(2, seed=4)
    lines = instance_lines(imgs[:1], keys=[1]) + '{"image": [0.5], "key": ' + HUGE + "}\n" \
        + instance_lines(imgs[1:], keys=[3])
    (tmp_path / "in.json").write_text(lines)
    out = tmp_path / "out"
    status = main(["batch", "--model-dir", export_dir, "--input-paths",
                   str(tmp_path / "in.json"), "--data-format", "text",
                   "--output-path", str(out)])
    assert status == 0
    assert capsys.readouterr().out.strip() == "3 instances: 2 predicted, 1 failed"
    error = json.loads((out / "prediction.errors_stats-00000-of-00001").read_text())
    assert error["line"] == 2 and DIGITS in error["error"]


def test_batch_output_path_at_a_file_is_exit_2(export_dir, tmp_path, capsys):
    (tmp_path / "in.json").write_text(instance_lines(images(1, seed=1), keys=[1]))
    taken = tmp_path / "results.txt"
    taken.write_text("keep me\n")
    for output, words in ((taken, "is a file"), (taken / "sub", "cannot create")):
        status = main(["batch", "--model-dir", export_dir, "--input-paths",
                       str(tmp_path / "in.json"), "--data-format", "text",
                       "--output-path", str(output)])
        err = capsys.readouterr().err
        assert status == 2 and len(err.strip().splitlines()) == 1 and words in err, err
    assert taken.read_text() == "keep me\n"


def test_local_on_a_folder_is_exit_2(export_dir, tmp_path, capsys):
    for flag in ("--json-instances", "--json-request", "--text-instances"):
        status = main(["local", "--model-dir", export_dir, flag, str(tmp_path)])
        err = capsys.readouterr().err
        assert status == 2 and "is a folder" in err and len(err.strip().splitlines()) == 1
    model_file = os.path.join(export_dir, "saved_model.pb")
    (tmp_path / "x.json").write_text(instance_lines(images(1, seed=1), keys=[1]))
    status = main(["local", "--model-dir", model_file, "--json-instances",
                   str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1, err
