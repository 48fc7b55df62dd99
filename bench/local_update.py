"""The cost of a local step on a ps worker, in one process: Keras's own step
(`optimizer.apply_gradients` on variables, as the single node trained before it fused
Adam too) beside local steps' stateless loop with Adam's update run op by op (as before)
and fused by XLA (`mljob.training.updates.adam_step`, what the workers and the single
node run), and the loop with plain SGD fused the same way (no moments: the floor of any
update).

    python -m bench.local_update                 # CNN and MLP, float32 and mixed bfloat16
    python -m bench.local_update --model cnn --precision mixed_bfloat16

Each variant runs 20-step functions on one random batch of 100 (no input pipeline), two
functions of warm-up, then `--functions` timed; reported: wall and CPU ms a step. Each
variant runs in its own process, one after another, so they do not share caches.

Writes bench/results/local_update.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench import common

VARIANTS = ("keras step", "local op by op", "local fused", "local fused plain SGD")
STEPS = 20


def _one(model_name: str, precision: str, variant: str, functions: int) -> dict:
    """Runs in a child process: the variant's ms a step."""
    import keras
    import numpy as np
    import tensorflow as tf

    from mljob.training.updates import adam_step as _adam_step
    from trainer import model as models

    model = models.build(model_name, seed=1, precision=precision)
    opt = keras.optimizers.Adam(0.001)
    parts = model.trainable_variables
    opt.build(parts)
    rng = np.random.default_rng(1)
    batch = (rng.random((100, 784), dtype=np.float32), rng.integers(0, 10, 100))
    data = iter(tf.data.Dataset.from_tensors(batch).repeat())
    state = model.non_trainable_variables
    b1, b2, eps = opt.beta_1, opt.beta_2, opt.epsilon

    def loss_of(labels, logits):
        return tf.reduce_mean(tf.cast(keras.losses.sparse_categorical_crossentropy(
            labels, logits, from_logits=True), tf.float32))

    @tf.function
    def keras_steps():
        loss = tf.constant(0.0)
        for _ in tf.range(STEPS):
            features, labels = next(data)
            with tf.GradientTape() as tape:
                loss = loss_of(labels, model(features, training=True))
            opt.apply_gradients(zip(tape.gradient(loss, parts), parts, strict=True))
        return loss

    def forward(features, weights, values):
        mapping = list(zip(state, values, strict=True)) + list(
            zip(model.trainable_weights, weights, strict=True))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            outputs = model(features, training=True)
        after = [scope.get_current_value(v) for v in state]
        return outputs, [a if a is not None else b for a, b in zip(after, values, strict=True)]

    @tf.function(jit_compile=True)
    def sgd(weights, grads):
        return [w - 0.001 * g for w, g in zip(weights, grads, strict=True)]

    op_by_op = _adam_step.python_function  # the same update, traced without XLA

    @tf.function
    def local_steps():
        moments = [[tf.identity(opt._momentums[opt._get_variable_index(p)]) for p in parts],
                   [tf.identity(opt._velocities[opt._get_variable_index(p)]) for p in parts]]
        start = ([tf.identity(p.value) for p in parts], *moments,
                 [tf.identity(v.value) for v in state])

        def step(i, weights, ms, vs, values, _loss):
            features, labels = next(data)
            with tf.GradientTape() as tape:
                tape.watch(weights)
                outputs, values = forward(features, weights, values)
                loss = loss_of(labels, outputs)
            grads = tape.gradient(loss, weights)
            t = tf.cast(i + 1, tf.float32)
            alpha = 0.001 * tf.sqrt(1 - tf.pow(b2, t)) / (1 - tf.pow(b1, t))
            if variant == "local fused":
                weights, ms, vs = _adam_step(weights, ms, vs, grads, alpha, b1, b2, eps)
            elif variant == "local op by op":
                weights, ms, vs = op_by_op(weights, ms, vs, grads, alpha, b1, b2, eps)
            else:
                weights = sgd(weights, grads)
            return i + 1, weights, ms, vs, values, loss

        return tf.while_loop(lambda i, *_: i < STEPS, step,
                             (tf.constant(0), *start, tf.constant(0.0)))[-1]

    run = keras_steps if variant == "keras step" else local_steps
    for _ in range(2):
        run().numpy()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(functions):
        run().numpy()
    steps = functions * STEPS
    return {"model": model_name, "precision": precision, "variant": variant,
            "ms_per_step": round(1000 * (time.perf_counter() - wall) / steps, 2),
            "cpu_ms_per_step": round(1000 * (time.process_time() - cpu) / steps, 2)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.local_update", allow_abbrev=False)
    p.add_argument("--model", choices=("cnn", "mlp"), action="append")
    p.add_argument("--precision", choices=("off", "mixed_bfloat16"), action="append")
    p.add_argument("--functions", type=int, default=15, help="timed 20-step functions")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_one(*args.child, args.functions)))
        return 0
    load_before = common.load_average()
    runs = []
    for model in args.model or ["cnn", "mlp"]:
        for precision in args.precision or ["off", "mixed_bfloat16"]:
            for variant in VARIANTS:
                done = subprocess.run(
                    [sys.executable, "-m", "bench.local_update", "--functions",
                     str(args.functions), "--child", model, precision, variant],
                    capture_output=True, text=True, timeout=600,
                    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
                if done.returncode != 0:
                    print(f"{model} {precision} {variant}: failed: "
                          f"{done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                    return 1
                record = json.loads(done.stdout.strip().splitlines()[-1])
                print(f"{model:4s} {precision:15s} {variant:24s} {record['ms_per_step']:8.2f} "
                      f"ms/step {record['cpu_ms_per_step']:8.2f} CPU-ms/step", flush=True)
                runs.append(record)
    common.write_json("local_update", {"steps_per_function": STEPS,
                                       "functions": args.functions, "runs": runs},
                      load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
