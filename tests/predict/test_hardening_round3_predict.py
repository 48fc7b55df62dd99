"""Hostile inputs, third round, on the predictor's side: a gRPC tensor_shape promising
millions of elements (the server's peak memory measured), versions past int64 in REST
paths and in publish, publishing races on every backend, an empty file://, model config
files that expand or nest without bound, control characters in names, and client
names or disconnects that should not be echoed whole or logged as faults."""
from __future__ import annotations

import json
import os
import socket
import threading
import time

import httpx
import pytest

from predict.models import config as model_config, publish as publishing
from predict.__main__ import main
from predict.errors import UsageError
from predict.models.versions import scan_versions
from tests.support.common import Reaper, free_ports
from tests.support.predict_models import saved_model_export, start_server

grpc = pytest.importorskip("grpc")
serving = pytest.importorskip("predict.serving_api.apis.predict_pb2")
from predict.serving_api.apis import predict_pb2, prediction_service_pb2_grpc  # noqa: E402


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    return saved_model_export(str(tmp_path_factory.mktemp("round3") / "model"), seed=5)


@pytest.fixture(scope="module")
def served(export_dir):
    """(process, REST client, gRPC channel) of one server; its log is read at the end."""
    reaper = Reaper()
    grpc_port = free_ports(1)[0]
    try:
        proc, url = start_server(reaper.popen, export_dir, "--grpc-port", str(grpc_port),
                                 "--model-name", "mnist")
        with httpx.Client(base_url=url, timeout=60) as client, \
                grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            yield proc, client, channel
    finally:
        reaper.stop_all()


def _peak_mb(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), in MB."""
    with open(f"/proc/{pid}/status") as f:
        line = next(x for x in f if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def test_a_tensor_shape_promising_millions_of_elements_is_refused_before_allocating(
        served):
    """Before: `tensor_shape` [50000000] with one value given was filled in by
    make_ndarray (200 MB a request) before any check. The server's peak is measured."""
    proc, _, channel = served
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "mnist"
    image = request.inputs["image"]
    image.dtype = 1  # DT_FLOAT
    for size in (50_000_000, 1, 784):
        image.tensor_shape.dim.add(size=size)
    image.float_val.append(0.5)
    request.inputs["key"].dtype = 9  # DT_INT64
    request.inputs["key"].tensor_shape.dim.add(size=1)
    request.inputs["key"].int64_val.append(1)
    before = _peak_mb(proc.pid)
    with pytest.raises(grpc.RpcError) as raised:
        stub.Predict(request, timeout=60)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details() == (
        "input 'image': tensor_shape [50000000, 1, 784] promises 39,200,000,000 "
        "elements; a request holds at most 1,572,864 (--max-body-bytes); send fewer "
        "instances a request")
    del image.tensor_shape.dim[:]
    image.tensor_shape.dim.add(size=12_000_000)  # 48 MB if filled in
    with pytest.raises(grpc.RpcError) as raised:
        stub.Predict(request, timeout=60)
    assert "promises 12,000,000 elements" in raised.value.details()
    assert _peak_mb(proc.pid) - before < 30, (before, _peak_mb(proc.pid))


def test_version_paths_past_int64_are_404_not_500(served):
    """Before: /versions/<5000 digits> raised ValueError in int() (a 500 and a
    traceback in the log); 2^63 is past TF Serving's int64 versions too."""
    _, client, _ = served
    for digits in ("9" * 5000, str(2 ** 63), "0" * 30 + "1"):
        for path in (f"/v1/models/mnist/versions/{digits}",
                     f"/v1/models/mnist/versions/{digits}/metadata"):
            answer = client.get(path)
            assert answer.status_code == 404, (path[:60], answer.text[:200])
            assert "versions are numbers from 0 to 9223372036854775807" in answer.text
            assert len(answer.text) < 300
        answer = client.post(f"/v1/models/mnist/versions/{digits}:predict",
                             json={"instances": []})
        assert answer.status_code == 404


def test_a_long_instance_key_is_not_echoed_whole(served):
    _, client, _ = served
    big = "k" * 1_000_000
    answer = client.post("/v1/models/mnist:predict", json={"instances": [{big: 1}]})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert "unknown input 'kkkk" in error and "(1000000 chars)" in error
    assert len(answer.content) < 2000
    answer = client.post("/v1/models/mnist:predict", json={big: 1})
    assert answer.status_code == 400 and len(answer.content) < 2000


def test_a_client_that_disconnects_mid_body_is_not_a_server_fault(served):
    proc, client, _ = served
    host, port = client.base_url.host, client.base_url.port
    for _ in range(3):
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(b"POST /v1/models/mnist:predict HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 100000\r\n"
                         b"\r\n" + b'{"instances": [' + b"1," * 1000)
        time.sleep(0.3)
    assert client.get("/v1/models/mnist").status_code == 200
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and "failed" not in err, err[-3000:]


# --- publish ---------------------------------------------------------------------------

def _race(base: str, export_dir: str, n: int, monkeypatch) -> list:
    """n publishers that all scan the base path and its claims before any of them
    claims a number (so all of them try the same one first)."""
    barrier = threading.Barrier(n, timeout=60)
    claims_seen = threading.Barrier(n, timeout=60)
    scan, claimed = publishing.scan_versions, publishing._claimed

    def scanned(url):
        found = scan(url)
        barrier.wait()
        return found

    def listed(url):
        found = claimed(url)
        claims_seen.wait()
        return found
    monkeypatch.setattr(publishing, "scan_versions", scanned)
    monkeypatch.setattr(publishing, "_claimed", listed)
    results: list = [None] * n

    def one(i):
        try:
            results[i] = publishing.publish(export_dir, base)
        except Exception as exc:  # reported by the assertion below
            results[i] = exc
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


@pytest.mark.parametrize("backend", ["local", "memory", "gs"])
def test_concurrent_publishes_never_share_a_version(backend, export_dir, tmp_path,
                                                    monkeypatch, request):
    """Before: two publishes into one base path at once both reported version 2, and
    one export was lost. On gs:// the claims are objects in the GCS emulator."""
    if backend == "gs":
        request.getfixturevalue("gcs_emulator")
        base = f"gs://mljob-test/race-{os.getpid()}-{time.time_ns()}/m"
    elif backend == "memory":
        request.getfixturevalue("memfs")
        base = "memory://race/m"
    else:
        base = str(tmp_path / "m")
    assert publishing.publish(export_dir, base) == 1
    results = _race(base, export_dir, 4, monkeypatch)
    assert sorted(results) == [2, 3, 4, 5], results
    assert sorted(scan_versions(base)) == [1, 2, 3, 4, 5]
    monkeypatch.undo()
    assert publishing.publish(export_dir, base) == 6
    with pytest.raises(UsageError, match="already has version 3"):
        publishing.publish(export_dir, base, 3)


def test_a_version_past_int64_is_refused(export_dir, tmp_path, capsys):
    """Before: --version 9223372036854775808 reported success; no server lists it."""
    status = main(["publish", "--model-dir", export_dir, "--model-base-path",
                   str(tmp_path / "m"), "--version", str(2 ** 63)])
    err = capsys.readouterr().err
    assert status == 2 and err == ("error: --version 9223372036854775808 is outside 1 to "
                                   "9223372036854775807; versions are int64, as TF "
                                   "Serving's are\n")
    assert not (tmp_path / "m").exists()
    assert main(["publish", "--model-dir", export_dir, "--model-base-path",
                 str(tmp_path / "m"), "--version", str(2 ** 63 - 1)]) == 0
    assert list(scan_versions(str(tmp_path / "m"))) == [2 ** 63 - 1]


@pytest.mark.parametrize("base", ["file://", "local://", "FILE", "NEWLINE"])
def test_an_empty_file_url_or_a_file_as_base_path_is_one_line(base, export_dir, tmp_path,
                                                               capsys, monkeypatch):
    """Before: `file://` wrote a version folder at the filesystem root; a base path
    naming a file raised NotADirectoryError (a traceback)."""
    monkeypatch.chdir(tmp_path)
    if base == "FILE":
        base = str(tmp_path / "a-file")
        open(base, "w").close()
    elif base == "NEWLINE":
        base = str(tmp_path / "m\nserving model forged")
    status = main(["publish", "--model-dir", export_dir, "--model-base-path", base])
    lines = capsys.readouterr().err.splitlines()
    assert status in (1, 2) and len(lines) == 1 and lines[0].startswith("error: "), lines
    assert ("names no folder" in lines[0] or "is a file; give the folder" in lines[0]
            or "holds a control character" in lines[0])
    assert sorted(os.listdir(tmp_path)) == (["a-file"] if "a-file" in base else [])
    assert not os.path.exists("/1") or os.path.getmtime("/1") < time.time() - 60


def test_batch_output_to_an_empty_file_url_is_one_line(export_dir, tmp_path, capsys,
                                                       monkeypatch):
    """Before: `predict batch --output-path file://` wrote into the current folder."""
    from tests.support.predict_models import images, instance_lines
    (tmp_path / "in.json").write_text(instance_lines(images(1, seed=1), keys=[1]))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    status = main(["batch", "--model-dir", export_dir, "--input-paths",
                   str(tmp_path / "in.json"), "--data-format", "text",
                   "--output-path", "file://"])
    lines = capsys.readouterr().err.splitlines()
    assert status == 1 and lines == ["error: 'file://' names no folder; write "
                                     "file:///ABSOLUTE/PATH or a plain path"], lines
    assert os.listdir(work) == []


# --- model config files and names ------------------------------------------------------

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
    for p, c in zip("abcdefgh", "bcdefghi", strict=True)) + "model_config_list: {config: [*i]}\n"


@pytest.mark.parametrize("name, text, words", [
    ("bomb.yaml", BOMB, "line 2 uses the YAML alias *a; aliases are refused"),
    ("deep.yaml", "[" * 100_000 + "]" * 100_000, "nests values more than 32 levels deep"),
    ("deep.json", "[" * 100_000 + "]" * 100_000, "nests values more than 32 levels deep"),
    ("inf.yaml", "model_config_list: {config: [{name: m, base_path: /x, "
                 "model_version_policy: {latest: {num_versions: .inf}}}]}",
     "model_version_policy must be one of"),
    ("ctl.yaml", 'model_config_list: {config: [{name: "m\\nserving model x", '
                 "base_path: /x}]}", "holds a control character"),
], ids=["alias-bomb", "deep-yaml", "deep-json", "inf", "control"])
def test_model_config_files_that_expand_or_nest_are_one_line(tmp_path, name, text, words):
    """Before: the alias bomb was taken (9^9 items to whatever walks it), 100,000
    levels raised RecursionError, `.inf` OverflowError."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UsageError) as info:
        model_config.read(str(path))
    assert words in str(info.value) and "\n" not in str(info.value)


def test_a_model_config_file_that_is_a_folder_and_a_newline_name_are_one_line(tmp_path,
                                                                             capsys):
    status = main(["serve", "--model-config-file", str(tmp_path), "--port", "0"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "is a folder; name the file" in err
    (tmp_path / "1").mkdir()
    status = main(["serve", "--model-base-path", str(tmp_path), "--model-name",
                   "m\nserving model forged", "--port", "0"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1
    assert "model name 'm\\nserving model forged' holds a control character" in err


def test_a_good_json_config_still_reads(tmp_path):
    """The depth is counted on the parser's events, before json.loads recurses; a
    config of ordinary depth reads as before."""
    path = tmp_path / "ok.json"
    path.write_text(json.dumps({"model_config_list": {"config": [
        {"name": "m", "base_path": "/x", "version_labels": {"a": 1}}]}}))
    assert model_config.read(str(path))[0].labels == {"a": 1}
