"""What `ps_fit.fit` refuses before training, each in one line naming the fix: what
parameter servers cannot run as Keras's `fit` runs it (tf.keras 2 refused the same),
checked before any cluster is touched."""
from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

import keras  # noqa: E402

from mljob.fitting import ps_fit, ps_inputs  # noqa: E402
from mljob.training.errors import UsageError  # noqa: E402


def _dataset():
    return tf.data.Dataset.from_tensor_slices(
        (tf.zeros((8, 3)), tf.zeros((8, 1)))).batch(4).repeat()


def _model(compiled=True):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    if compiled:
        model.compile("sgd", loss="mse")
    return model


class _Strategy:
    """Stands for a ParameterServerStrategy: the refusals come before it is used."""


def _refused(match: str, model=None, **kwargs) -> str:
    kwargs.setdefault("x", _dataset())
    kwargs.setdefault("steps_per_epoch", 2)
    with pytest.raises(UsageError, match=match) as info:
        ps_fit.fit(model or _model(), _Strategy(), **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_steps_per_epoch_is_required_as_tf_keras_2_required_it():
    message = _refused("steps_per_epoch is required", steps_per_epoch=None)
    assert "steps_per_epoch=N" in message


@pytest.mark.parametrize("kwargs, match", [
    ({"x": [[1.0, 2.0, 3.0]]}, "fit takes NumPy arrays .*, a tf.data.Dataset or a "
                               "function"),
    ({"y": [1.0]}, "leave y and sample_weight out"),
    ({"validation_split": 0.2}, "validation_split splits arrays only.*give validation_data"),
    ({"x": lambda context: _dataset(), "validation_split": 0.2}, "give validation_data"),
    ({"validation_data": _dataset()}, "give validation_steps"),
    ({"validation_data": 3}, "validation_data of type int"),
    ({"epochs": 0}, "epochs must be a positive integer"),
])
def test_what_the_workers_cannot_read_is_refused(kwargs, match):
    _refused(match, **kwargs)


class _Extended:
    @staticmethod
    def variable_created_in_scope(variable):
        return False


class _StrategyOfOthers(_Strategy):
    """A strategy none of whose variables the model's are."""
    extended = _Extended()


def test_a_model_made_outside_the_strategy_s_scope_is_refused():
    with pytest.raises(UsageError, match=r"made outside strategy.scope\(\)") as info:
        ps_fit.fit(_model(), _StrategyOfOthers(), x=_dataset(), steps_per_epoch=2)
    assert "\n" not in str(info.value)


def test_an_uncompiled_model_is_refused():
    _refused("compile the model in strategy.scope", model=_model(compiled=False))


class _PerBatch(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        pass


@pytest.mark.parametrize("callback, match", [
    (_PerBatch(), r"callback _PerBatch has batch-level methods \(on_train_batch_end\)"),
    (keras.callbacks.LambdaCallback(on_batch_end=lambda b, l: None), "batch-level"),
    (keras.callbacks.ModelCheckpoint("m.keras", save_freq=5), r"save_freq=5"),
    (keras.callbacks.TensorBoard(update_freq="batch"), r"update_freq=1"),
    (keras.callbacks.TensorBoard(profile_batch=2), "profile_batch"),
])
def test_a_callback_acting_per_batch_is_refused(callback, match):
    _refused(match, callbacks=[callback])


def test_epoch_level_callbacks_pass():
    callbacks = [keras.callbacks.EarlyStopping(), keras.callbacks.CSVLogger("x.csv"),
                 keras.callbacks.ModelCheckpoint("m.keras"), keras.callbacks.TensorBoard(),
                 keras.callbacks.BackupAndRestore("backup"),
                 keras.callbacks.ReduceLROnPlateau(), keras.callbacks.TerminateOnNaN(),
                 keras.callbacks.LearningRateScheduler(lambda e, lr: lr),
                 keras.callbacks.LambdaCallback(on_epoch_end=lambda e, l: None)]
    assert ps_inputs.check_callbacks(callbacks) == callbacks
