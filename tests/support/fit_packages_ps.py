"""Users' `model.fit` scripts under parameter servers, as packages a job runs: the
`model.fit` part of TensorFlow's tutorial "Parameter server training with
ParameterServerStrategy", and keras.io's "Timeseries classification from scratch"
with its callbacks. Each is the page's code, changed only where Keras 3 or the data
needs it (said at each place). The chief calls `model.fit(...)` as the page does: the
replica's launcher (`mljob.fitting.launch`) makes it run under ParameterServerStrategy.
Each writes its History as JSON to `<job-dir>/history.json`.
"""
from __future__ import annotations

import os

# TensorFlow's tutorial, its Model.fit part: the cluster from TF_CONFIG, workers and ps
# in server.join(), the chief's strategy with the tutorial's partitioner, dataset_fn,
# the model compiled in scope with steps_per_execution, and its three callbacks.
PS_TUTORIAL = '''\
import argparse
import json
import os

import tensorflow as tf



def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--job-dir", required=True)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if cluster_resolver.task_type in ("worker", "ps"):
        print(f"{cluster_resolver.task_type} {cluster_resolver.task_id}: server.join()",
              flush=True)
        server = tf.distribute.Server(
            cluster_resolver.cluster_spec(), job_name=cluster_resolver.task_type,
            task_index=cluster_resolver.task_id,
            protocol=cluster_resolver.rpc_layer or "grpc", start=True)
        server.join()
        return
    NUM_PS = len(cluster_resolver.cluster_spec().as_dict()["ps"])
    variable_partitioner = (
        tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=(256 << 10),
            max_shards=NUM_PS))
    strategy = tf.distribute.ParameterServerStrategy(
        cluster_resolver,
        variable_partitioner=variable_partitioner)

    def dataset_fn(input_context):
        global_batch_size = 64
        batch_size = input_context.get_per_replica_batch_size(global_batch_size)
        x = tf.random.uniform((10, 10))
        # Keras 3's mse does not broadcast (batch,) labels against the (batch, 10)
        # outputs as tf.keras 2's did (its own fit fails on them): labels of their shape.
        y = tf.random.uniform((10, 10))
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10).repeat()
        dataset = dataset.shard(
            input_context.num_input_pipelines,
            input_context.input_pipeline_id)
        dataset = dataset.batch(batch_size)
        dataset = dataset.prefetch(2)
        return dataset

    # Keras 3 has no tf.keras.utils.experimental.DatasetCreator: the function itself.
    dc = dataset_fn

    with strategy.scope():
        model = tf.keras.models.Sequential([tf.keras.layers.Dense(10)])
        model.compile(tf.keras.optimizers.SGD(), loss="mse", steps_per_execution=10)

    working_dir = args.job_dir
    log_dir = os.path.join(working_dir, "log")
    # Keras 3's ModelCheckpoint saves a .keras file; one a epoch here.
    ckpt_filepath = os.path.join(working_dir, "ckpt", "epoch-{epoch:02d}.keras")
    backup_dir = os.path.join(working_dir, "backup")

    callbacks = [
        tf.keras.callbacks.TensorBoard(log_dir=log_dir),
        tf.keras.callbacks.ModelCheckpoint(filepath=ckpt_filepath),
        tf.keras.callbacks.BackupAndRestore(backup_dir=backup_dir),
    ]

    history = model.fit(dc, epochs=args.epochs, steps_per_epoch=20, callbacks=callbacks)
    with open(os.path.join(working_dir, "history.json"), "w") as f:
        json.dump({"epoch": history.epoch, "history": history.history}, f)
    print(f"chief: trained {len(history.epoch)} epochs", flush=True)


if __name__ == "__main__":
    main()
'''

# keras.io's "Timeseries classification from scratch": its model, compile and
# callbacks (ModelCheckpoint of the best model, ReduceLROnPlateau, EarlyStopping), with
# CSVLogger and TensorBoard added. FordA's download is replaced by series of its shape
# (shorter), validation_split (which a dataset read on the workers cannot take) by
# validation_data, and the arrays by a repeated dataset; EarlyStopping's patience is
# 2 with a min_delta no epoch reaches, so it stops the run at its third epoch. The
# strategy comes from TF_CONFIG as the tutorials make it (parameter servers, several
# workers, or one node), so the same script runs under every configuration.
TIMESERIES = '''\
import argparse
import json
import os

import keras
import numpy as np
import tensorflow as tf


num_classes = 2


def readucr(n, length, seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    t = np.linspace(0, 6.28, length)
    x = np.sin(t[None, :] * (1 + y[:, None])) + rng.normal(scale=0.5, size=(n, length))
    return x.astype("float32"), y


def make_model(input_shape):
    input_layer = keras.layers.Input(input_shape)

    conv1 = keras.layers.Conv1D(filters=64, kernel_size=3, padding="same")(input_layer)
    conv1 = keras.layers.BatchNormalization()(conv1)
    conv1 = keras.layers.ReLU()(conv1)

    conv2 = keras.layers.Conv1D(filters=64, kernel_size=3, padding="same")(conv1)
    conv2 = keras.layers.BatchNormalization()(conv2)
    conv2 = keras.layers.ReLU()(conv2)

    conv3 = keras.layers.Conv1D(filters=64, kernel_size=3, padding="same")(conv2)
    conv3 = keras.layers.BatchNormalization()(conv3)
    conv3 = keras.layers.ReLU()(conv3)

    gap = keras.layers.GlobalAveragePooling1D()(conv3)

    output_layer = keras.layers.Dense(num_classes, activation="softmax")(gap)

    return keras.models.Model(inputs=input_layer, outputs=output_layer)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--job-dir", required=True)
    args = parser.parse_args()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    cluster = resolver.cluster_spec().as_dict()
    if "ps" in cluster:
        if resolver.task_type in ("worker", "ps"):
            tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                 task_index=resolver.task_id, protocol="grpc").join()
            return
        strategy = tf.distribute.ParameterServerStrategy(resolver)
    elif cluster.get("worker"):
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        strategy = tf.distribute.get_strategy()
    x_train, y_train = readucr(256, 64, 0)
    x_test, y_test = readucr(64, 64, 1)
    x_train = x_train.reshape((x_train.shape[0], x_train.shape[1], 1))
    x_test = x_test.reshape((x_test.shape[0], x_test.shape[1], 1))

    with strategy.scope():
        model = make_model(input_shape=x_train.shape[1:])
        model.compile(
            optimizer="adam",
            loss="sparse_categorical_crossentropy",
            metrics=["sparse_categorical_accuracy"],
        )
    epochs = 20
    batch_size = 32
    out = args.job_dir
    callbacks = [
        keras.callbacks.ModelCheckpoint(
            os.path.join(out, "best_model.keras"), save_best_only=True,
            monitor="val_loss"
        ),
        keras.callbacks.ReduceLROnPlateau(
            monitor="val_loss", factor=0.5, patience=20, min_lr=0.0001
        ),
        keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, min_delta=10.0,
                                      verbose=1),
        keras.callbacks.CSVLogger(os.path.join(out, "training.csv")),
        keras.callbacks.TensorBoard(log_dir=os.path.join(out, "logs")),
    ]
    train = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(256) \\
        .batch(batch_size).repeat()
    history = model.fit(
        train,
        batch_size=batch_size,
        epochs=epochs,
        steps_per_epoch=8,
        callbacks=callbacks,
        validation_data=(x_test, y_test),
        verbose=2,
    )
    with open(os.path.join(out, "history.json"), "w") as f:
        json.dump({"epoch": history.epoch, "history": history.history}, f)
    print(f"chief: trained {len(history.epoch)} epochs", flush=True)


if __name__ == "__main__":
    main()
'''

# The chief and two workers and a parameter server, the chief named chief in TF_CONFIG
# (ParameterServerStrategy's coordinator must be).
CONFIG_PS = ("trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
             "  workerCount: 2\n  parameterServerCount: 1\n  useChiefInTfConfig: true\n")


def write_fit_package(folder: str, name: str, config: str = CONFIG_PS) -> str:
    """`folder/<name>job/` (setup.py, task.py: PS_TUTORIAL or TIMESERIES by `name`) and
    its config.yaml (`config`); returns the folder."""
    source = {"pstutorial": PS_TUTORIAL, "timeseries": TIMESERIES}[name]
    package = f"{name}job"
    os.makedirs(os.path.join(folder, package), exist_ok=True)
    with open(os.path.join(folder, "setup.py"), "w") as f:
        f.write(f"from setuptools import setup\nsetup(name={package!r}, version='0.1', "
                f"packages=[{package!r}])\n")
    for file, text in (("__init__.py", ""), ("task.py", source)):
        with open(os.path.join(folder, package, file), "w") as f:
            f.write(text)
    with open(os.path.join(folder, "config.yaml"), "w") as f:
        f.write(config)
    return folder


__all__ = ["PS_TUTORIAL", "TIMESERIES", "CONFIG_PS", "write_fit_package"]
