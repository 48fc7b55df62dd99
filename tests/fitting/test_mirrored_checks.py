"""What model.fit cannot run under MultiWorkerMirroredStrategy as Keras runs it is
refused before training, in one line naming the fix."""
from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from mljob.fitting import FitRefused  # noqa: E402
from mljob.fitting import mirrored  # noqa: E402


def model(optimizer="adam"):
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    m.compile(optimizer=optimizer, loss="mse")
    return m


X, Y = np.zeros((8, 3), "float32"), np.zeros((8, 2), "float32")


def refusal(m, **arguments) -> str:
    with pytest.raises(FitRefused) as info:
        mirrored.check(m, {"shuffle": True, **arguments})
    text = str(info.value)
    assert "\n" not in text and text.startswith("model.fit under MultiWorkerMirrored")
    return text


def test_datasets_are_taken():
    mirrored.check(model(), {"x": tf.data.Dataset.from_tensor_slices((X, Y)).batch(4),
                             "shuffle": True})
    mirrored.check(model(), {"x": X, "y": Y, "shuffle": False})


def test_generators_and_py_datasets_are_refused():
    assert "tf.data.Dataset" in refusal(model(), x=iter([(X, Y)]))

    class Seq(keras.utils.PyDataset):
        def __len__(self):
            return 1

        def __getitem__(self, i):
            return X, Y

    assert "Seq" in refusal(model(), x=Seq())


@pytest.mark.parametrize("option", [{"use_ema": True}, {"gradient_accumulation_steps": 2}])
def test_optimizer_options_a_replica_cannot_take_are_refused(option):
    text = refusal(model(keras.optimizers.Adam(**option)),
                   x=tf.data.Dataset.from_tensor_slices((X, Y)).batch(4))
    assert next(iter(option)) in text


def test_an_unbuilt_second_optimizer_is_refused():
    m = model()
    m.d_optimizer = keras.optimizers.Adam(name="d_adam")
    assert "d_adam" in refusal(m, x=tf.data.Dataset.from_tensor_slices((X, Y)).batch(4))
