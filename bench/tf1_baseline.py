"""The design mljob's parameter-server path replaces: TensorFlow 1's between-graph
replication, written as the original samples wrote it.

    TF_CONFIG=... python -m bench.tf1_baseline --model mlp --train-steps 2000

Every replica builds its own graph under `tf.compat.v1`; `replica_device_setter` puts
the variables on the ps (round-robin over several) and the ops on the replica itself;
the master (or chief) and every worker train, each step one `session.run` fed from
NumPy (`feed_dict`), against one shared global step, in a `MonitoredTrainingSession`.
The ps runs `server.join()` until it is stopped. The models are the trainer's CNN and
MLP with the same shapes, initialisers, loss and batch size; the optimiser is Adam or
plain SGD.

The master prints the trainer's own progress line (`step n/T ... examples/s=...`) with
the global step, so `bench.common` times both designs the same way. Without TF_CONFIG
it trains on one process (the single-node figure of this design).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _dense(x, units: int, name: str, tf):
    fan_in = int(x.shape[-1])
    w = tf.compat.v1.get_variable(f"{name}/kernel", [fan_in, units],
                                  initializer=tf.compat.v1.glorot_uniform_initializer())
    b = tf.compat.v1.get_variable(f"{name}/bias", [units],
                                  initializer=tf.compat.v1.zeros_initializer())
    return tf.matmul(x, w) + b


def _conv(x, filters: int, name: str, tf):
    w = tf.compat.v1.get_variable(f"{name}/kernel", [5, 5, int(x.shape[-1]), filters],
                                  initializer=tf.compat.v1.glorot_uniform_initializer())
    b = tf.compat.v1.get_variable(f"{name}/bias", [filters],
                                  initializer=tf.compat.v1.zeros_initializer())
    y = tf.nn.relu(tf.nn.conv2d(x, w, strides=1, padding="SAME") + b)
    return tf.nn.max_pool2d(y, 2, 2, "VALID")


def logits(model: str, images, training, tf):
    """The trainer's models (trainer/model.py) as raw variables: MLP 784-100(sigmoid)-10,
    CNN conv5x5x32-pool-conv5x5x64-pool-dense1024-dropout(0.4)-10."""
    if model == "mlp":
        x = tf.reshape(images, [-1, 784])
        return _dense(tf.sigmoid(_dense(x, 100, "hidden", tf)), 10, "logits", tf)
    x = tf.reshape(images, [-1, 28, 28, 1])
    x = _conv(_conv(x, 32, "conv1", tf), 64, "conv2", tf)
    x = tf.nn.relu(_dense(tf.reshape(x, [-1, 7 * 7 * 64]), 1024, "dense1", tf))
    x = tf.cond(training, lambda: tf.nn.dropout(x, rate=0.4), lambda: x)
    return _dense(x, 10, "logits", tf)


def _load(data_dir: str | None):
    from trainer import data
    dataset = data.load(data_dir)
    images = data.to_float(dataset.train_images).reshape(-1, 784)
    test = (data.to_float(dataset.test_images).reshape(-1, 784),
            dataset.test_labels.astype(np.int64))
    return images, dataset.train_labels.astype(np.int64), test


def _evaluate(session, ops, test, batch: int = 1000) -> tuple[float, float]:
    """Mean loss and accuracy over the whole test split, batches of 1000, as the
    trainer evaluates; `ops` is (x, y, training, loss, accuracy)."""
    x, y, training, loss, accuracy = ops
    images, labels = test
    total_loss = total_right = 0.0
    for at in range(0, len(labels), batch):
        feed = {x: images[at:at + batch], y: labels[at:at + batch], training: False}
        batch_loss, batch_acc = session.run([loss, accuracy], feed_dict=feed)
        n = len(labels[at:at + batch])
        total_loss += batch_loss * n
        total_right += batch_acc * n
    return total_loss / len(labels), total_right / len(labels)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tf1_baseline", allow_abbrev=False)
    p.add_argument("--model", default="mlp", choices=("mlp", "cnn"))
    p.add_argument("--train-steps", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--optimizer", default="adam", choices=("adam", "sgd"))
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--job-dir", default=None, help="accepted for bench.common; unused")
    p.add_argument("--eval-every", type=int, default=0,
                   help="the chief evaluates on the test split every N global steps and "
                   "prints the trainer's `eval step=...` line (0: never)")
    p.add_argument("--checkpoint-every", default=None, help="accepted; unused")
    args = p.parse_args(argv)

    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    cluster_def = config.get("cluster") or {}
    task = config.get("task") or {}
    job, index = task.get("type", ""), int(task.get("index", 0))
    server = None
    if cluster_def:
        cluster = tf.train.ClusterSpec(cluster_def)
        server = tf.distribute.Server(cluster, job_name=job, task_index=index)
        if job == "ps":
            server.join()  # until the benchmark stops it
            return 0
        device = tf.compat.v1.train.replica_device_setter(
            worker_device=f"/job:{job}/task:{index}", cluster=cluster)
    else:
        cluster = None
        device = None
    is_chief = job in ("chief", "master", "")

    images, labels, test = _load(args.data_dir)
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.device(device):
        x = tf.compat.v1.placeholder(tf.float32, [None, 784])
        y = tf.compat.v1.placeholder(tf.int64, [None])
        training = tf.compat.v1.placeholder_with_default(True, [])
        out = logits(args.model, x, training, tf)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=y, logits=out))
        accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(out, 1), y), tf.float32))
        step = tf.compat.v1.train.get_or_create_global_step()
        optimizer = (tf.compat.v1.train.AdamOptimizer(args.learning_rate)
                     if args.optimizer == "adam"
                     else tf.compat.v1.train.GradientDescentOptimizer(args.learning_rate))
        train_op = optimizer.minimize(loss, global_step=step)

    rng = np.random.default_rng(index + (0 if is_chief else 1000))
    session_config = tf.compat.v1.ConfigProto()
    if cluster is not None:
        # Only this replica and the ps: a worker never waits for another worker.
        session_config.device_filters[:] = ["/job:ps", f"/job:{job}/task:{index}"]
    with graph.as_default():
        hooks = [tf.compat.v1.train.StopAtStepHook(last_step=args.train_steps)]
        session = tf.compat.v1.train.MonitoredTrainingSession(
            master=server.target if server else "", is_chief=is_chief, hooks=hooks,
            config=session_config, save_checkpoint_secs=None, save_summaries_steps=None,
            save_summaries_secs=None, log_step_count_steps=None)
    if is_chief:
        print(f"training started: design=tf1-between-graph model={args.model} "
              f"optimizer={args.optimizer} batch_size={args.batch_size}", flush=True)
    last_logged, last_time, last_eval = 0, time.monotonic(), 0
    with session:
        while not session.should_stop():
            pick = rng.integers(0, len(images), args.batch_size)
            _, global_step, batch_loss, batch_acc = session.run(
                [train_op, step, loss, accuracy], feed_dict={x: images[pick], y: labels[pick]})
            global_step += 1
            if is_chief and global_step // args.log_every > last_logged // args.log_every:
                from mljob.contracts import progress_line
                now = time.monotonic()
                rate = (global_step - last_logged) * args.batch_size / max(now - last_time, 1e-9)
                print(progress_line(min(global_step, args.train_steps), args.train_steps,
                                    float(batch_loss), float(batch_acc), rate,
                                    args.learning_rate), flush=True)
                last_logged, last_time = global_step, now
            if is_chief and args.eval_every and global_step // args.eval_every \
                    > last_eval // args.eval_every and not session.should_stop():
                last_eval = global_step
                test_loss, test_acc = _evaluate(session, (x, y, training, loss, accuracy),
                                                test)
                print(f"eval step={min(global_step, args.train_steps)} loss={test_loss:.4f} "
                      f"accuracy={test_acc:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
