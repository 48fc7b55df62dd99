"""Users' `model.fit` scripts as packages, unchanged but for where the data comes from:
TensorFlow's tutorial "Multi-worker training with Keras" (`main.py`, `mnist_setup.py`
reading Fashion-MNIST as Debian ships it instead of downloading MNIST) and keras.io's
"Training & evaluation with the built-in methods" with its callbacks."""
from __future__ import annotations

import os

# Read in place of `tf.keras.datasets.mnist.load_data()` (no network here).
LOAD_DATA = '''\
def load_data():
    """Fashion-MNIST's four IDX files as Debian's dataset-fashion-mnist ships them."""
    import gzip
    folder = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")

    def idx(name, offset):
        with gzip.open(os.path.join(folder, name + ".gz")) as f:
            return np.frombuffer(f.read(), np.uint8, offset=offset)
    return ((idx("train-images-idx3-ubyte", 16).reshape(-1, 28, 28),
             idx("train-labels-idx1-ubyte", 8)),
            (idx("t10k-images-idx3-ubyte", 16).reshape(-1, 28, 28),
             idx("t10k-labels-idx1-ubyte", 8)))
'''

# tensorflow.org/tutorials/distribute/multi_worker_with_keras, as written there but for
# the data: `mnist_setup.load_data()` where the page calls the download.
MNIST_SETUP = '''\
import os
import tensorflow as tf
import numpy as np

''' + LOAD_DATA + '''

def mnist_dataset(batch_size):
  (x_train, y_train), _ = load_data()
  # The `x` arrays are in uint8 and have values in the [0, 255] range.
  # You need to convert them to float32 with values in the [0, 1] range.
  x_train = x_train / np.float32(255)
  y_train = y_train.astype(np.int64)
  train_dataset = tf.data.Dataset.from_tensor_slices(
      (x_train, y_train)).shuffle(60000).repeat().batch(batch_size)
  return train_dataset

def build_and_compile_cnn_model():
  model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(28, 28)),
      tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
      tf.keras.layers.Conv2D(32, 3, activation='relu'),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(128, activation='relu'),
      tf.keras.layers.Dense(10)
  ])
  model.compile(
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
      metrics=['accuracy'])
  return model
'''

TUTORIAL_MAIN = '''\
import os
import json

import tensorflow as tf
import mnist_setup

per_worker_batch_size = 64
tf_config = json.loads(os.environ['TF_CONFIG'])
num_workers = len(tf_config['cluster']['worker'])

strategy = tf.distribute.MultiWorkerMirroredStrategy()

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_setup.mnist_dataset(global_batch_size)

with strategy.scope():
  # Model building/compiling need to be within `strategy.scope()`.
  multi_worker_model = mnist_setup.build_and_compile_cnn_model()


multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=70)
'''

# keras.io/guides/training_with_built_in_methods: get_compiled_model, fit on arrays with
# validation and the guide's callbacks, in a task module taking --job-dir; the strategy
# from TF_CONFIG as TensorFlow's tutorials build it (parameter servers when the cluster
# has ps, the workers and ps joining their servers; MultiWorkerMirrored with several
# workers; else the default). Two callbacks of the test's own: one prints each epoch's
# end (which replica, which epoch), one kills the chief once in the middle of an epoch
# (--die-at-epoch; a batch-level callback, added only then: parameter servers refuse
# batch-level callbacks), as a preempted machine would.
CALLBACKS_TASK = '''\
import argparse
import json
import os
import signal

import numpy as np
import tensorflow as tf
import keras
from keras import layers

''' + LOAD_DATA + '''

parser = argparse.ArgumentParser()
parser.add_argument("--job-dir", required=True)
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--patience", type=int, default=100)
parser.add_argument("--min-delta", type=float, default=1e-3)
parser.add_argument("--die-at-epoch", type=int, default=-1)
args = parser.parse_args()

tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
cluster, task = tf_config.get("cluster", {}), tf_config.get("task", {})
me = f"{task.get('type', 'chief')}-{task.get('index', 0)}"
chief = task.get("type", "chief") in ("chief", "master")
if "ps" in cluster:
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):
        tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                             task_index=resolver.task_id, protocol="grpc").join()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
elif cluster.get("worker"):
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
else:
    strategy = tf.distribute.get_strategy()


def get_uncompiled_model():
    inputs = keras.Input(shape=(784,), name="digits")
    x = layers.Dense(64, activation="relu", name="dense_1")(inputs)
    x = layers.Dense(64, activation="relu", name="dense_2")(x)
    outputs = layers.Dense(10, activation="softmax", name="predictions")(x)
    return keras.Model(inputs=inputs, outputs=outputs)


def get_compiled_model():
    model = get_uncompiled_model()
    model.compile(
        optimizer="rmsprop",
        loss="sparse_categorical_crossentropy",
        metrics=["sparse_categorical_accuracy"],
    )
    return model


class EpochReport(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        print(f"epoch_end replica={me} epoch={epoch} loss={logs['loss']:.6f}", flush=True)


class Preempted(keras.callbacks.Callback):
    """The chief's machine lost in the middle of epoch --die-at-epoch, once."""

    def __init__(self):
        super().__init__()
        self.epoch = None
        self.marker = os.path.join(args.job_dir, "preempted-once")

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if chief and self.epoch == args.die_at_epoch and batch == 3 and \\
                not os.path.exists(self.marker):
            open(self.marker, "w").close()
            print(f"killed in epoch {self.epoch} at batch {batch}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


(x_train, y_train), _ = load_data()
x_train = x_train[:4096].reshape(-1, 784).astype("float32") / 255
y_train = y_train[:4096].astype("float32")

with strategy.scope():
    model = get_compiled_model()

callbacks = [
    keras.callbacks.EarlyStopping(monitor="loss", min_delta=args.min_delta,
                                  patience=args.patience,
                                  verbose=1),
    keras.callbacks.ModelCheckpoint(
        filepath=os.path.join(args.job_dir, "ckpt", "mymodel_{epoch}.keras")),
    keras.callbacks.CSVLogger(os.path.join(args.job_dir, "log.csv"), append=True),
    keras.callbacks.TensorBoard(log_dir=os.path.join(args.job_dir, "logs")),
    keras.callbacks.BackupAndRestore(backup_dir=os.path.join(args.job_dir, "backup")),
    EpochReport(),
]
if args.die_at_epoch >= 0:
    callbacks.append(Preempted())
history = model.fit(x_train, y_train, batch_size=64, epochs=args.epochs,
                    validation_split=0.2, callbacks=callbacks, verbose=2)
print(f"fit_ended replica={me} epochs={history.epoch}", flush=True)
if chief:
    with open(os.path.join(args.job_dir, "history.json"), "w") as f:
        json.dump({"epoch": history.epoch, "history": history.history}, f)
'''


def write_tutorial(folder: str) -> str:
    """The tutorial's two files as top-level modules (`--module-name main`)."""
    os.makedirs(folder, exist_ok=True)
    for name, text in (("main.py", TUTORIAL_MAIN), ("mnist_setup.py", MNIST_SETUP),
                       ("setup.py", 'from setuptools import setup\nsetup(name="tutorial", '
                        'version="0.1", py_modules=["main", "mnist_setup"])\n')):
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    return folder


def write_callbacks_package(folder: str) -> str:
    """keras.io's guide as `fitguide.task`."""
    os.makedirs(os.path.join(folder, "fitguide"), exist_ok=True)
    for name, text in (("fitguide/__init__.py", ""), ("fitguide/task.py", CALLBACKS_TASK),
                       ("setup.py", 'from setuptools import setup\nsetup(name="fitguide", '
                        'version="0.1", packages=["fitguide"])\n')):
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    return folder


# keras.io/guides/custom_train_step_in_tensorflow, "A first simple example" as the page
# writes it (its train_step returns {m.name: m.result() for m in self.metrics}, a dict
# of the compiled metrics nested in it), the strategy from TF_CONFIG around the model.
CUSTOM_STEP_TASK = '''\
import json
import os

import numpy as np
import tensorflow as tf
import keras

cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {})
strategy = tf.distribute.MultiWorkerMirroredStrategy() if cluster.get("worker") \\
    else tf.distribute.get_strategy()


class CustomModel(keras.Model):
    def train_step(self, data):
        # Unpack the data. Its structure depends on your model and
        # on what you pass to `fit()`.
        x, y = data

        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)  # Forward pass
            # Compute the loss value
            # (the loss function is configured in `compile()`)
            loss = self.compute_loss(y=y, y_pred=y_pred)

        # Compute gradients
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)

        # Update weights
        self.optimizer.apply(gradients, trainable_vars)

        # Update metrics (includes the metric that tracks the loss)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)

        # Return a dict mapping metric names to current value
        return {m.name: m.result() for m in self.metrics}


with strategy.scope():
    # Construct and compile an instance of CustomModel
    inputs = keras.Input(shape=(32,))
    outputs = keras.layers.Dense(1)(inputs)
    model = CustomModel(inputs, outputs)
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])

# Just use `fit` as usual
x = np.random.random((1000, 32))
y = np.random.random((1000, 1))
history = model.fit(x, y, epochs=3, verbose=2)
print("history " + json.dumps(sorted(history.history)), flush=True)
'''


def write_custom_step_package(folder: str) -> str:
    """keras.io's custom train_step example as `customstep.task`."""
    os.makedirs(os.path.join(folder, "customstep"), exist_ok=True)
    for name, text in (("customstep/__init__.py", ""),
                       ("customstep/task.py", CUSTOM_STEP_TASK),
                       ("setup.py", 'from setuptools import setup\nsetup(name="customstep", '
                        'version="0.1", packages=["customstep"])\n')):
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    return folder
