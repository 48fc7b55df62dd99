"""Every path a call can take answers what the SavedModel's own signature answers,
called in this process by TensorFlow: REST (rows and columns) and gRPC, batching off and
on, one shape and another, the same shape again; with the defaults, to the bit. The
opt-in layer (`--prefer_tflite_model`, a model.tflite beside the SavedModel) answers
within the bound docs/predict.md states (predict.runtime.tflite: RTOL, ATOL). And a server
started with TF Serving's flags only maps no TensorFlow Lite and no pygrpc-native
library into its process."""
from __future__ import annotations

import concurrent.futures
import os
import shutil
import sys

import grpc
import httpx
import numpy as np
import pytest
import tensorflow as tf

from mljob.procs import free_ports
from predict.serving_api.apis import predict_pb2, prediction_service_pb2_grpc
from tests.support.predict_models import images

ROWS = (1, 3, 1, 3, 2)  # shapes once, then again: a second call of a shape is no other path
# LiteRT's interpreter (ai-edge-litert) and pygrpc-native: TensorFlow's own
# tensorflow/lite/python library is TensorFlow's, loaded with it
LITE_LIBS = ("ai_edge_litert", "pygrpc_native")


def _export(kind: str, path: str) -> str:
    from trainer import model as models
    from trainer.export import export
    export(kind, models.build(kind, seed=5).get_weights(), path)
    return path


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("paths")
    return {kind: _export(kind, str(root / kind / "1")) for kind in ("mlp", "cnn")}


def reference(export_dir: str, imgs: np.ndarray, keys: list) -> dict:
    """The SavedModel's serving_default called in process, as TF Serving calls it."""
    fn = tf.saved_model.load(export_dir).signatures["serving_default"]
    out = fn(image=tf.constant(imgs), key=tf.constant(np.array(keys, np.int64)))
    return {name: value.numpy() for name, value in out.items()}


def start(reaper, export_dir: str, *flags: str):
    """`predict serve` on the version's base path with TF Serving's flags; (process,
    REST URL, gRPC channel)."""
    import select
    import subprocess
    import time
    rest, port = free_ports(2)
    proc = reaper.popen([sys.executable, "-m", "predict", "serve",
                         f"--model_base_path={os.path.dirname(export_dir)}",
                         "--model_name=m", f"--port={port}", f"--rest_api_port={rest}",
                         *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if select.select([proc.stdout], [], [], 0.5)[0] and \
                proc.stdout.readline().startswith("serving model "):
            # the ready lines come in one write: the rest are in the reader's buffer
            while not proc.stdout.readline().startswith("serving gRPC"):
                pass
            return proc, f"http://127.0.0.1:{rest}", grpc.insecure_channel(f"127.0.0.1:{port}")
    raise AssertionError(f"the server did not start: {proc.stderr.read()[-2000:]}")


def rest_rows(url: str, imgs, keys) -> dict:
    answer = httpx.post(f"{url}/v1/models/m:predict", timeout=120, json={
        "instances": [{"image": i.tolist(), "key": k} for i, k in zip(imgs, keys, strict=True)]})
    assert answer.status_code == 200, answer.text
    rows = answer.json()["predictions"]
    return {"scores": np.array([r["scores"] for r in rows], np.float32),
            "classes": np.array([r["classes"] for r in rows], np.int64),
            "key": np.array([r["key"] for r in rows], np.int64)}


def rest_columns(url: str, imgs, keys) -> dict:
    answer = httpx.post(f"{url}/v1/models/m:predict", timeout=120, json={
        "inputs": {"image": imgs.tolist(), "key": list(keys)}})
    assert answer.status_code == 200, answer.text
    out = answer.json()["outputs"]
    return {"scores": np.array(out["scores"], np.float32),
            "classes": np.array(out["classes"], np.int64), "key": np.array(out["key"])}


def grpc_predict(channel, imgs, keys) -> dict:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "m"
    request.inputs["image"].CopyFrom(tf.make_tensor_proto(imgs))
    request.inputs["key"].CopyFrom(tf.make_tensor_proto(np.array(keys, np.int64)))
    got = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request,
                                                                             timeout=120)
    return {name: tf.make_ndarray(value) for name, value in got.outputs.items()}


PATHS = {"REST rows": rest_rows, "REST columns": rest_columns}


def answers(url: str, channel, export_dir: str):
    """(path, rows, what the server answered, what the signature answers)."""
    for i, rows in enumerate(ROWS):
        imgs = images(rows, seed=100 + i)
        keys = list(range(i, i + rows))
        want = reference(export_dir, imgs, keys)
        for name, call in PATHS.items():
            yield name, rows, call(url, imgs, keys), want
        yield "gRPC", rows, grpc_predict(channel, imgs, keys), want


def same_bits(got: dict, want: dict) -> bool:
    return set(got) == set(want) and all(
        got[k].dtype == want[k].dtype and got[k].shape == want[k].shape and
        got[k].tobytes() == want[k].tobytes() for k in want)


@pytest.mark.parametrize("kind", ["mlp", pytest.param("cnn", marks=pytest.mark.slow)])
@pytest.mark.parametrize("flags", [(), ("--enable_batching", "--batch_timeout_micros=500")],
                         ids=["defaults", "batching"])
def test_every_path_answers_the_signatures_bits(exports, reaper, kind, flags):
    """With TF Serving's defaults (and with batching, one request a batch), every answer
    is the signature's own, bit for bit: TensorFlow's executor answers every call."""
    _, url, channel = start(reaper, exports[kind], *flags)
    with channel:
        for path, rows, got, want in answers(url, channel, exports[kind]):
            assert same_bits(got, want), (path, rows, got, want)


@pytest.mark.slow
def test_merged_batches_answer_the_merged_call(exports, reaper):
    """Batching on, 8 clients at once: a request merged with others is answered its rows
    of the signature's call on the merged batch; TensorFlow's kernels may round a row
    otherwise beside other rows, within float32's rounding (docs/predict.md)."""
    export_dir = exports["mlp"]
    _, url, channel = start(reaper, export_dir, "--enable_batching",
                            "--batch_timeout_micros=20000", "--max_batch_size=16")
    imgs = images(8, seed=3)
    want = reference(export_dir, imgs, list(range(8)))
    with channel, concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda i: rest_rows(url, imgs[i:i + 1], [i]), range(8)))
    for i, one in enumerate(got):
        assert one["key"].tolist() == [i] and one["classes"][0] == want["classes"][i]
        np.testing.assert_allclose(one["scores"][0], want["scores"][i], rtol=1e-6, atol=1e-7)


def lite_copy(export_dir: str, root) -> str:
    """A copy of the version with the model.tflite `python -m predict tflite` writes."""
    from predict.__main__ import main
    copy = root / "1"
    shutil.copytree(export_dir, copy)
    assert main(["tflite", "--model-dir", str(copy)]) == 0
    assert (copy / "model.tflite").is_file()
    return str(copy)


def mapped(pid: int) -> set:
    """The shared libraries and Python extension modules mapped into a process."""
    with open(f"/proc/{pid}/maps") as f:
        return {line.split()[-1] for line in f if line.rstrip().endswith(".so") or
                ".so." in line.split()[-1]}


@pytest.mark.slow
def test_tflite_answers_within_its_bound_and_maps_litert_only_when_asked(
        exports, reaper, tmp_path):
    """--prefer_tflite_model with a model.tflite: every path answers within the bound
    the docs state (predict.runtime.tflite.RTOL/ATOL; classes and keys equal); the same folder
    served with TF Serving's flags only maps no TensorFlow Lite library and answers the
    signature's bits."""
    from predict.runtime import tflite
    export_dir = lite_copy(exports["cnn"], tmp_path)
    proc, url, channel = start(reaper, export_dir, "--prefer_tflite_model=true")
    assert any("ai_edge_litert" in lib for lib in mapped(proc.pid))  # it answers
    with channel:
        for path, rows, got, want in answers(url, channel, export_dir):
            assert got["classes"].tolist() == want["classes"].tolist(), (path, rows)
            np.testing.assert_allclose(got["scores"], want["scores"], rtol=tflite.RTOL,
                                       atol=tflite.ATOL, err_msg=f"{path} {rows}")
    proc, url, channel = start(reaper, export_dir, "--prefer_tflite_model=false",
                               "--xla_cpu_compilation_enabled=false")
    assert not [lib for lib in mapped(proc.pid) if any(n in lib for n in LITE_LIBS)]
    with channel:
        for path, rows, got, want in answers(url, channel, export_dir):
            assert same_bits(got, want), (path, rows)


def test_tf_servings_flags_alone_map_no_tflite_and_no_native_grpc(exports, reaper):
    """A server started with TF Serving's flags only: TensorFlow's runtime and grpcio,
    nothing else in its process (read from /proc/PID/maps once it answered)."""
    proc, url, channel = start(reaper, exports["mlp"])
    with channel:
        grpc_predict(channel, images(1), [0])
        rest_rows(url, images(1), [0])
    libs = mapped(proc.pid)
    assert any("_pywrap_tensorflow" in lib or "libtensorflow" in lib for lib in libs)
    assert any("cygrpc" in lib for lib in libs)  # grpcio's own server
    assert not [lib for lib in libs if any(n in lib for n in LITE_LIBS)]
