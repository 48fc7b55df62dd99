"""The plain Keras 3 baseline: `model.fit` of the trainer's own model on the trainer's
own data, printing progress lines in the trainer's format so one parser times both.

    python -m bench.keras_baseline --model cnn --train-steps 400 --batch-size 100

The baseline is what a user would write without us: `trainer.model.build`, Adam,
sparse categorical cross-entropy from logits, accuracy, and `fit` over
`trainer.data.train_dataset` with every `compile`/`fit` default (one step per call,
no XLA on CPU). The variant flags change one thing each, to find out what makes a
training step faster on this CPU:

  --steps-per-execution N   pack N steps into one tf.function call (compile's option)
  --jit-compile on          XLA (Keras's "auto" means off on a CPU-only machine)
  --pipeline float-once     convert uint8 -> float32 once, then slice/shuffle/batch
                            the floats (the default converts each batch)
  --pipeline numpy          `fit(x, y, batch_size=...)` on float32 arrays: the tutorial idiom
  --mixed-precision P       a Keras dtype policy, e.g. mixed_bfloat16

At the end it evaluates on the test split and prints `eval step=... accuracy=...`, so a
variant that is faster but learns worse shows it.
"""
from __future__ import annotations

import argparse
import math
import sys
import time


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.keras_baseline", allow_abbrev=False)
    p.add_argument("--model", choices=("cnn", "mlp"), default="cnn")
    p.add_argument("--train-steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--steps-per-execution", type=int, default=1)
    p.add_argument("--jit-compile", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--pipeline", choices=("trainer", "float-once", "numpy"), default="trainer")
    p.add_argument("--mixed-precision", default=None, metavar="POLICY")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-eval", action="store_true", help="skip the final test evaluation")
    p.add_argument("--eval-every", type=int, default=0,
                   help="also evaluate on the test split every N steps (a callback calling "
                   "model.evaluate; 0: only at the end), for time to accuracy")
    args = p.parse_args(argv)
    if min(args.train_steps, args.batch_size, args.log_every, args.steps_per_execution) < 1:
        p.error("--train-steps, --batch-size, --log-every and --steps-per-execution "
                "must be positive")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import keras
    import tensorflow as tf

    from trainer import data, model as models

    if args.mixed_precision:
        keras.mixed_precision.set_global_policy(args.mixed_precision)
    keras.utils.set_random_seed(args.seed)
    dataset = data.load(args.data_dir)
    model = models.build(args.model, seed=args.seed)
    jit = {"auto": "auto", "on": True, "off": False}[args.jit_compile]
    model.compile(optimizer=keras.optimizers.Adam(args.learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], steps_per_execution=args.steps_per_execution,
                  jit_compile=jit)
    progress = _Progress(args.train_steps, args.batch_size, args.log_every)
    print(f"training started: strategy=keras-fit step=0 train_steps={args.train_steps} "
          f"model={args.model} pipeline={args.pipeline} "
          f"steps_per_execution={args.steps_per_execution} jit_compile={args.jit_compile} "
          f"mixed_precision={args.mixed_precision or 'off'} data={dataset.source}",
          flush=True)
    callbacks = [progress]
    test = data.eval_dataset(dataset.test_images, dataset.test_labels, 1000)
    if args.eval_every > 0:
        callbacks.append(_Evaluate(test, args.eval_every, progress))
    fit_kwargs = dict(verbose=0, callbacks=callbacks)
    if args.pipeline == "numpy":
        x, y = data.to_float(dataset.train_images), dataset.train_labels
        steps_per_epoch = len(y) // args.batch_size
        epochs = math.ceil(args.train_steps / steps_per_epoch)
        progress.stop_after = args.train_steps
        model.fit(x, y, batch_size=args.batch_size, epochs=epochs, shuffle=True, **fit_kwargs)
    else:
        if args.pipeline == "trainer":
            ds = data.train_dataset(dataset.train_images, dataset.train_labels,
                                    args.batch_size, seed=args.seed)
        else:
            x = data.to_float(dataset.train_images)
            ds = (tf.data.Dataset.from_tensor_slices((x, dataset.train_labels))
                  .shuffle(len(x), seed=args.seed).repeat()
                  .batch(args.batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
        model.fit(ds, steps_per_epoch=args.train_steps, epochs=1, **fit_kwargs)
    if not args.no_eval:
        loss, accuracy = model.evaluate(test, verbose=0)
        print(f"eval step={progress.done} loss={loss:.4f} accuracy={accuracy:.4f}", flush=True)
    print(f"training finished: step={progress.done}", flush=True)
    return 0


class _Progress:
    """Prints `step n/T loss= accuracy= examples/s= lr=` lines as the trainer does."""

    def __new__(cls, *args, **kwargs):
        import keras

        class Progress(keras.callbacks.Callback):
            def __init__(self, total, batch_size, log_every):
                super().__init__()
                self.total, self.batch_size, self.log_every = total, batch_size, log_every
                self.done = 0
                self.stop_after = None
                self.epoch_base = 0
                self._last = (0, time.monotonic())

            def on_train_batch_end(self, batch, logs=None):
                # With steps_per_execution N this runs once per N steps, `batch` being
                # the last step's index within the epoch.
                step = self.epoch_base + batch + 1
                crossed = step // self.log_every > self.done // self.log_every
                self.done = step
                if self.done == 1 or crossed or step >= self.total:
                    now = time.monotonic()
                    rate = (step - self._last[0]) * self.batch_size / max(now - self._last[1], 1e-9)
                    self._last = (step, now)
                    logs = logs or {}
                    print(f"step {step}/{self.total} loss={float(logs.get('loss', 0)):.4f} "
                          f"accuracy={float(logs.get('accuracy', 0)):.4f} "
                          f"examples/s={rate:.1f} lr=0", flush=True)
                if self.stop_after and step >= self.stop_after:
                    self.model.stop_training = True

            def on_epoch_begin(self, epoch, logs=None):
                self.epoch_base = self.done

        return Progress(*args, **kwargs)


class _Evaluate:
    """Evaluates on the test split every N steps (after the step's progress line) and
    prints `eval step=... loss=... accuracy=...` as the trainer does."""

    def __new__(cls, *args, **kwargs):
        import keras

        class Evaluate(keras.callbacks.Callback):
            def __init__(self, test, every, progress):
                super().__init__()
                self.test, self.every, self.progress = test, every, progress
                self.last = 0

            def on_train_batch_end(self, batch, logs=None):
                step = self.progress.done
                if step // self.every > self.last // self.every:
                    self.last = step
                    loss, accuracy = self.model.evaluate(self.test, verbose=0)
                    print(f"eval step={step} loss={loss:.4f} accuracy={accuracy:.4f}",
                          flush=True)

        return Evaluate(*args, **kwargs)


if __name__ == "__main__":
    sys.exit(main())
