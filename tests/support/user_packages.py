"""Users' own training packages, as tests submit them: a TF1-style trainer of the
original Cloud ML samples' era, and a package with a dependency from PyPI."""
from __future__ import annotations

import os

# A `trainer/` package in the samples' style: graph mode under tf.compat.v1,
# tf.train.Server, replica_device_setter, MonitoredTrainingSession, server.join() on ps.
# TensorFlow's own gs:// file system talks to storage.googleapis.com only, so outputs
# are written locally and copied to a gs:// URL through fsspec (which honours
# STORAGE_EMULATOR_HOST).
TF1_TASK = '''\
"""Linear regression on synthetic data, trained between-graph on ps and workers."""
import argparse
import json
import os
import shutil
import tempfile

import fsspec
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1


def publish(local, url):
    """Copy a local folder to url (a path or gs://)."""
    if "://" not in url:
        shutil.copytree(local, url, dirs_exist_ok=True)
        return
    fs, path = fsspec.core.url_to_fs(url)
    fs.put(local.rstrip("/") + "/", path, recursive=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--log_dir", required=True)
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--max_steps", type=int, default=100)
    parser.add_argument("--job-dir")
    args = parser.parse_args()
    env = json.loads(os.environ.get("TF_CONFIG", "{}"))
    task, cluster = env.get("task", {}), env.get("cluster")
    job_name, index = task.get("type", "master"), task.get("index", 0)
    tf1.disable_eager_execution()
    target, device, config = "", None, None
    if cluster:
        spec = tf1.train.ClusterSpec(cluster)
        server = tf1.train.Server(spec, job_name=job_name, task_index=index)
        if job_name == "ps":
            print(f"ps {index}: serving; server.join()", flush=True)
            server.join()
            return
        target = server.target
        device = tf1.train.replica_device_setter(
            worker_device=f"/job:{job_name}/task:{index}", cluster=spec)
        config = tf1.ConfigProto(device_filters=["/job:ps", f"/job:{job_name}/task:{index}"])
    is_chief = job_name in ("master", "chief")
    with tf1.device(device):
        step = tf1.train.get_or_create_global_step()
        x = tf1.placeholder(tf.float32, [None, 3], name="x")
        y = tf1.placeholder(tf.float32, [None, 1], name="y")
        w = tf1.get_variable("w", [3, 1], initializer=tf1.zeros_initializer())
        b = tf1.get_variable("b", [1], initializer=tf1.zeros_initializer())
        loss = tf1.reduce_mean(tf1.square(tf1.matmul(x, w) + b - y))
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
    rng = np.random.default_rng(index)
    true_w = np.array([[1.0], [-2.0], [0.5]], np.float32)
    scratch = tempfile.mkdtemp()
    checkpoints = os.path.join(scratch, "train")
    hooks = [tf1.train.StopAtStepHook(last_step=args.max_steps)]
    with tf1.train.MonitoredTrainingSession(
            master=target, is_chief=is_chief, hooks=hooks, config=config,
            checkpoint_dir=checkpoints if is_chief else None) as sess:
        while not sess.should_stop():
            xs = rng.normal(size=(32, 3)).astype(np.float32)
            _, at, value, wv, bv = sess.run([train, step, loss, w, b],
                                            {x: xs, y: xs @ true_w + 0.3})
    print(f"{job_name} {index}: step {at} loss {value:.4f}", flush=True)
    if not is_chief:
        return
    export = os.path.join(scratch, "export")
    with tf1.Graph().as_default(), tf1.Session() as local:
        xin = tf1.placeholder(tf.float32, [None, 3], name="x")
        key = tf1.placeholder(tf.int64, [None], name="key")
        weights, bias = tf1.Variable(wv, name="w"), tf1.Variable(bv, name="b")
        local.run(tf1.global_variables_initializer())
        signature = tf1.saved_model.predict_signature_def(
            inputs={"x": xin, "key": key},
            outputs={"y": tf1.matmul(xin, weights) + bias, "key": tf1.identity(key)})
        builder = tf1.saved_model.Builder(export)
        builder.add_meta_graph_and_variables(
            local, [tf1.saved_model.tag_constants.SERVING],
            signature_def_map={"serving_default": signature})
        builder.save()
    publish(checkpoints, args.log_dir)
    publish(export, args.model_dir)
    print(f"exported to {args.model_dir}", flush=True)


if __name__ == "__main__":
    main()
'''

CONFIG_STANDARD_1_MASTER = """\
trainingInput:
  scaleTier: STANDARD_1
  useChiefInTfConfig: false
"""


def write_tf1_trainer(project: str) -> str:
    """`project/trainer/` with `__init__.py` and `task.py`, no setup.py anywhere;
    returns the project folder (the one to run `--package-path=trainer` from)."""
    folder = os.path.join(project, "trainer")
    os.makedirs(folder, exist_ok=True)
    for name, text in (("__init__.py", ""), ("task.py", TF1_TASK)):
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    with open(os.path.join(project, "config.yaml"), "w") as f:
        f.write(CONFIG_STANDARD_1_MASTER)
    return project


def write_package_with_requirement(folder: str, requirement: str, module: str) -> str:
    """A package `tablejob` whose install_requires names `requirement` and whose task
    imports `module` (which the base environment lacks)."""
    os.makedirs(os.path.join(folder, "tablejob"), exist_ok=True)
    with open(os.path.join(folder, "setup.py"), "w") as f:
        f.write("from setuptools import setup\n"
                f"setup(name='tablejob', version='0.1', packages=['tablejob'], "
                f"install_requires=[{requirement!r}])\n")
    task = (f"import {module}\n"
            f"print('imported', {module}.__name__, 'from', {module}.__file__)\n")
    for name, text in (("__init__.py", ""), ("task.py", task)):
        with open(os.path.join(folder, "tablejob", name), "w") as f:
            f.write(text)
    return folder
