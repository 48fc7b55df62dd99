"""Helpers for the trainer's tests: start replicas of `python -m trainer.task` on 127.0.0.1,
wait for them with bounded timeouts, and score an export on the packaged sample."""
from __future__ import annotations

import json
import os
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(ROOT, "trainer", "sample")
# The cheap setup every process test uses: the MLP on the packaged 3,000-image sample.
FAST = ["--model", "mlp", "--data-dir", SAMPLE, "--seed", "1"]


def run_task(args) -> str:
    """`trainer.task.main(args)` in this process; its printed lines (exit 0 asserted)."""
    import contextlib
    import io

    from trainer import task
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = task.main(args)
    assert status == 0, out.getvalue()
    return out.getvalue()


def cluster(ports: list[int], workers: int, ps: int, chief: str = "chief") -> dict:
    hosts = [f"127.0.0.1:{p}" for p in ports]
    spec = {chief: hosts[:1], "worker": hosts[1:1 + workers]}
    if ps:
        spec["ps"] = hosts[1 + workers:1 + workers + ps]
    return spec


def tf_config(spec: dict, task_type: str, index: int = 0) -> str:
    return json.dumps({"cluster": spec, "task": {"type": task_type, "index": index},
                       "environment": "cloud"})


def start(reaper, log_path, args, *, tf_config: str | None = None,
          env: dict | None = None, module: str = "trainer.task") -> subprocess.Popen:
    """One replica of `python -m module` (the bundled trainer unless told), stdout and
    stderr into log_path."""
    child_env = dict(os.environ)
    child_env.pop("TF_CONFIG", None)
    if tf_config is not None:
        child_env["TF_CONFIG"] = tf_config
    child_env.update(env or {})
    log = open(log_path, "wb")
    try:
        return reaper.python("-m", module, *args, stdout=log,
                             stderr=subprocess.STDOUT, env=child_env, cwd=ROOT)
    finally:
        log.close()


def wait_exit(proc: subprocess.Popen, timeout: float, log_path=None) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        tail = read(log_path)[-3000:] if log_path else ""
        raise AssertionError(f"pid {proc.pid} still running after {timeout}s\n{tail}") from None


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def read(path) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def lines(path, prefix: str) -> list[str]:
    return [line for line in read(path).splitlines() if line.startswith(prefix)]


def export_accuracy(path: str, data_dir: str = SAMPLE) -> float:
    """Accuracy of a SavedModel export on a data dir's test set (the sample's 1,000
    images unless told), through its serving signature, loaded with plain
    tf.saved_model.load (what a single-node server does)."""
    import numpy as np
    import tensorflow as tf

    from trainer import data
    test = data.load(data_dir)
    loaded = tf.saved_model.load(path)
    out = loaded.signatures["serving_default"](
        image=tf.constant(data.to_float(test.test_images)),
        key=tf.constant(np.arange(len(test.test_labels), dtype=np.int64)))
    return float(np.mean(out["classes"].numpy() == test.test_labels))


__all__ = ["ROOT", "SAMPLE", "FAST", "cluster", "tf_config", "start", "wait_exit",
           "wait_for", "read", "lines", "export_accuracy"]
