"""Exports for the predictor's tests and benchmark: the trainer's SavedModel (written by
`trainer.export.export`, never a stand-in) and a seeds-style TF1 `export.meta` export."""
from __future__ import annotations

import json
import os

import numpy as np


def saved_model_export(path: str, seed: int = 7) -> str:
    """An MLP export with the contract's signatures at path (a local folder or URL),
    written by the trainer's own exporter: the predictor is tested on what users get."""
    from trainer import model as models
    from trainer.export import export
    export("mlp", models.build("mlp", seed=seed).get_weights(), path)
    return path


def legacy_export(path: str, seed: int = 3) -> str:
    """The seeds' TF1 export: placeholders key int64 [None] and image float32 [None,784],
    one dense layer, softmax scores; JSON `inputs`/`outputs` collections; Saver files
    export.index/export.data-*/checkpoint and export.meta."""
    import tensorflow as tf
    v1 = tf.compat.v1
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(seed)
    graph = tf.Graph()
    with graph.as_default():
        key = v1.placeholder(tf.int64, [None], name="key")
        image = v1.placeholder(tf.float32, [None, 784], name="image")
        weights = v1.get_variable(
            "softmax/weights", initializer=rng.normal(0, 0.1, (784, 10)).astype(np.float32))
        bias = v1.get_variable("softmax/bias",
                               initializer=rng.normal(0, 0.1, 10).astype(np.float32))
        scores = tf.nn.softmax(tf.matmul(image, weights) + bias, name="scores")
        key_out = tf.identity(key, name="key_out")
        v1.add_to_collection("inputs", json.dumps({"key": key.name, "image": image.name}))
        v1.add_to_collection("outputs", json.dumps({"key": key_out.name,
                                                     "scores": scores.name}))
        saver = v1.train.Saver()
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            prefix = os.path.join(path, "export")
            saver.save(sess, prefix, write_meta_graph=False)
            saver.export_meta_graph(prefix + ".meta")
    return path


def legacy_reference(path: str, images: np.ndarray) -> np.ndarray:
    """The legacy export's scores computed with numpy from its checkpoint."""
    import tensorflow as tf
    reader = tf.train.load_checkpoint(os.path.join(path, "export"))
    logits = images @ reader.get_tensor("softmax/weights") + reader.get_tensor("softmax/bias")
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def images(n: int, seed: int = 0) -> np.ndarray:
    """n float32 images in [0, 1], rounded so JSON and Python literals carry them exactly."""
    return np.random.default_rng(seed).random((n, 784)).round(3).astype(np.float32)


def instance_lines(imgs: np.ndarray, keys=None) -> str:
    keys = range(len(imgs)) if keys is None else keys
    return "".join(json.dumps({"image": img.tolist(), "key": int(k)}) + "\n"
                   for img, k in zip(imgs, keys, strict=True))


MONITORING_CONFIG = os.path.join(os.path.dirname(__file__), "monitoring.config")


def start_server(popen, model_dir: str, *extra: str, timeout: float = 180.0,
                 flag: str = "--model-dir", env=None):
    """Start `python -m predict serve FLAG model_dir` with popen (the reaper's), REST on
    a free port (--rest_api_port), gRPC on another unless extra names --port or
    --grpc-port, Prometheus metrics on, and wait for its ready line; returns (process,
    base URL)."""
    import select
    import subprocess
    import sys
    import time
    from tests.support.common import free_ports
    port, grpc_port = free_ports(2)
    named = {a.split("=")[0].replace("-", "_") for a in extra}
    args = ["--rest_api_port", str(port)]
    if not named & {"__port", "__grpc_port"}:
        args += ["--port", str(grpc_port)]
    if "__monitoring_config_file" not in named:
        args += ["--monitoring_config_file", MONITORING_CONFIG]
    proc = popen([sys.executable, "-m", "predict", "serve", flag, model_dir, *args, *extra],
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + timeout
    while time.time() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if line.startswith("serving model "):
                return proc, f"http://127.0.0.1:{port}"
            if not line and proc.poll() is not None:
                break
    raise AssertionError(f"server did not become ready: {proc.poll()=} "
                         f"{proc.stderr.read() if proc.poll() is not None else ''}")


def publish_version(export_dir: str, base_url: str, version: int) -> str:
    """Publish an export as BASE/<version> the way the trainer publishes (a rename into
    place locally, saved_model.pb last on object stores); returns the version's URL."""
    from mljob import contracts, storage
    url = storage.join(base_url, str(version))
    storage.publish_dir(export_dir, url, marker=contracts.SAVED_MODEL_MARKER)
    return url


def wait_for_status(client, path: str, want, timeout: float = 120.0) -> list:
    """Poll GET path until want(model_version_status) is true; returns that status."""
    import time
    deadline = time.time() + timeout
    status = None
    while time.time() < deadline:
        answer = client.get(path)
        if answer.status_code == 200:
            status = answer.json()["model_version_status"]
            if want(status):
                return status
        time.sleep(0.2)
    raise AssertionError(f"status of {path} never matched: {status}")


def states(status: list) -> dict:
    """model_version_status -> {version: state}."""
    return {int(s["version"]): s["state"] for s in status}


def saved_model_cli_run(export_dir: str, imgs: np.ndarray, keys, outdir) -> dict:
    """TensorFlow's own `saved_model_cli run` on serving_default; outputs by name."""
    import subprocess
    expr = f"image={imgs.tolist()!r};key={list(keys)!r}"
    done = subprocess.run(["saved_model_cli", "run", "--dir", export_dir, "--tag_set", "serve",
                           "--signature_def", "serving_default", "--input_exprs", expr,
                           "--outdir", str(outdir)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return {name: np.load(os.path.join(outdir, f"{name}.npy"))
            for name in ("key", "scores", "classes")}


def metric_samples(text: str, name: str) -> dict:
    """{frozenset of (label, value): value} of one metric in a Prometheus exposition."""
    import re
    out = {}
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
        if match:
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match[1] or ""))
            out[labels] = float(match[2])
    return out
