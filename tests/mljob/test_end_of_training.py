"""What a run leaves when it ends, against Keras's `fit` on the same data and seed:
`AdamW(use_ema=True)` (keras.io's MNIST convnet): `fit` ends by writing the moving
averages into the model (`optimizer.finalize_variable_values`), so the final checkpoint
and the export hold the averaged model, not the raw weights."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras  # noqa: E402

from mljob import cluster, training  # noqa: E402
from mljob.training import export as export_lib  # noqa: E402
from mljob.training.checkpoints import CheckpointStore  # noqa: E402
from tests.mljob import keras_io_models as zoo  # noqa: E402

STEPS, BATCH = 6, 16


def _ema_model():
    return zoo.mnist_convnet(keras.optimizers.AdamW(learning_rate=3e-3, use_ema=True))


def test_an_ema_run_s_checkpoint_and_export_hold_the_averages_as_fit_leaves_them(tmp_path,
                                                                                    capsys):
    reference = _ema_model()
    raw = _ema_model()
    reference.fit(zoo.mnist_dataset(BATCH).repeat(), steps_per_epoch=STEPS, epochs=1,
                  verbose=0, shuffle=False)
    job = tmp_path / "job"
    status = training.fit(
        _ema_model, lambda ctx: zoo.mnist_dataset(ctx.batch_size).repeat(),
        serving=training.Serving(key=None), info=cluster.from_environment({}),
        config=training.RunConfig(job_dir=str(job), train_steps=STEPS, batch_size=BATCH,
                                  log_every=3, eval_every=0, checkpoint_every=0))
    assert status == 0
    capsys.readouterr()
    restored = export_lib.built(_ema_model)  # named as the run names its model
    store = CheckpointStore(str(job / "checkpoints"), keep=5, writer=False)
    try:
        assert store.restore(tf.train.Checkpoint(
            model={w.path: w.value for w in restored.weights}), partial=True) == STEPS
    finally:
        store.close()
    for ours, theirs in zip(restored.weights, reference.weights, strict=True):
        assert np.allclose(np.asarray(ours), np.asarray(theirs), atol=1e-5), ours.path
    # The averages are not the raw weights: without the end of training they differ.
    raw.fit(zoo.mnist_dataset(BATCH).repeat(), steps_per_epoch=STEPS, epochs=1,
            verbose=0, shuffle=False, callbacks=[_KeepRaw()])
    assert max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(
        _KeepRaw.weights, reference.get_weights(), strict=True)) > 1e-3
    x, _ = zoo.mnist_data()
    served = export_lib.load(str(job / "model")).signatures["serving_default"]
    answer = next(iter(served(tf.constant(x[:4])).values()))
    assert np.allclose(np.asarray(answer), np.asarray(reference(x[:4], training=False)),
                       atol=1e-5)


class _KeepRaw(keras.callbacks.Callback):
    """The weights before fit's end of training (on_epoch_end comes before it)."""
    weights: list = []

    def on_epoch_end(self, epoch, logs=None):
        type(self).weights = [np.array(w) for w in self.model.get_weights()]


def _dropout_model():
    keras.utils.set_random_seed(7)
    inputs = keras.Input((784,))
    x = keras.layers.Dense(32, activation="relu")(inputs)
    x = keras.layers.Dropout(0.5)(x)
    x = keras.layers.Dense(32, activation="relu")(x)
    x = keras.layers.Dropout(0.3)(x)
    model = keras.Model(inputs, keras.layers.Dense(10)(x))
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.CategoricalCrossentropy(from_logits=True))
    return model


def _flat(batch: int):
    x, y = zoo.mnist_data(STEPS * batch)
    return tf.data.Dataset.from_tensor_slices((x.reshape(-1, 784), y)).batch(batch)


def test_a_resumed_run_draws_the_dropout_masks_the_uninterrupted_one_would(tmp_path, capsys):
    """STEPS steps, stopped, resumed for STEPS more, is Keras's `fit` for 2 * STEPS steps:
    the dropout seeds come back from the checkpoint (the data repeats every STEPS
    batches, so the resumed run's data is the same either way)."""
    reference = _dropout_model()
    reference.fit(_flat(BATCH).repeat(), steps_per_epoch=2 * STEPS, epochs=1, verbose=0,
                  shuffle=False)
    job = tmp_path / "job"
    for steps in (STEPS, 2 * STEPS):
        assert training.fit(
            _dropout_model, lambda ctx: _flat(ctx.batch_size).repeat(),
            info=cluster.from_environment({}),
            config=training.RunConfig(job_dir=str(job), train_steps=steps,
                                      batch_size=BATCH, steps_per_execution=1,
                                      log_every=STEPS, eval_every=0,
                                      checkpoint_every=0)) == 0
    capsys.readouterr()
    restored = export_lib.built(_dropout_model)
    store = CheckpointStore(str(job / "checkpoints"), keep=5, writer=False)
    try:
        assert store.restore(tf.train.Checkpoint(
            model={w.path: w.value for w in restored.weights}), partial=True) == 2 * STEPS
    finally:
        store.close()
    for ours, theirs in zip(restored.weights, reference.weights, strict=True):
        assert np.allclose(np.asarray(ours), np.asarray(theirs), atol=1e-5), ours.path
