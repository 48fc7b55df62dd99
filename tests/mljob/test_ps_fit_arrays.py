"""NumPy arrays given to `fit` under parameter servers (`mljob.fitting.ps_arrays`), as
Keras's `fit` takes them on one node: each worker's pipeline made from them (Keras's
batches, its `validation_split`, its default steps), and what Keras refuses refused in
one line, before any cluster is touched. The training itself is the ps equivalence
suite's (tests/mljob/test_ps_fit_equivalence.py)."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras  # noqa: E402

from mljob.fitting import ps_arrays, ps_fit  # noqa: E402
from mljob.training.errors import UsageError  # noqa: E402
from mljob.training.keras_private import train_validation_split  # noqa: E402


def _prepare(x, y=None, sample_weight=None, **kwargs):
    arguments = dict(batch_size=None, shuffle=False, validation_split=0.0,
                     validation_data=None, class_weight=None, steps_per_epoch=None)
    arguments.update(kwargs)
    return ps_arrays.prepare(x, y, sample_weight, **arguments)


def _batches(arrays, count, worker=0, workers=1):
    dataset = arrays.per_worker(tf.distribute.InputContext(workers, worker, 1))
    return [keras.tree.map_structure(np.asarray, b) for b in dataset.take(count)]


def test_in_order_without_shuffle_keras_s_batches_and_steps_pass_after_pass():
    x, y = np.arange(20.0).reshape(10, 2), np.arange(10)
    arrays = _prepare(x, y, batch_size=4)
    assert (arrays.steps_per_epoch, arrays.batch_size) == (3, 4)  # ceil(10 / 4)
    labels = [b[1].tolist() for b in _batches(arrays, 6)]
    assert labels == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] * 2
    first = _batches(arrays, 1)[0][0]
    assert first.dtype == np.float32  # floats in floatx, as Keras's array adapter casts


def test_keras_s_default_batch_size_and_a_given_steps_per_epoch():
    x = np.zeros((100, 3), "float32")
    assert _prepare(x, np.zeros(100)).steps_per_epoch == 4  # batches of 32
    given = _prepare(x, np.zeros(100), steps_per_epoch=7)
    assert (given.steps_per_epoch, given.batch_size) == (7, 15)  # Keras's ceil(100 / 7)
    assert _prepare(x, np.zeros(100), steps_per_epoch=7, batch_size=10).batch_size == 10


def test_validation_split_is_keras_s_the_last_examples_before_any_shuffling():
    x, y = np.arange(40.0).reshape(20, 2), np.arange(20)
    arrays = _prepare(x, y, batch_size=5, validation_split=0.2, shuffle=True)
    (_, _, _), held = train_validation_split((x, y, None), validation_split=0.2)
    assert np.array_equal(arrays.validation[1], held[1])
    assert arrays.validation[1].tolist() == [16, 17, 18, 19]
    assert arrays.steps_per_epoch == 4  # the 16 kept, in batches of 5
    seen = sorted(v for b in _batches(arrays, 4) for v in b[1].tolist())
    assert seen == list(range(16))  # one pass: each kept example once, none held out


def test_validation_data_given_wins_over_validation_split_as_in_keras():
    x, y = np.zeros((20, 2)), np.zeros(20)
    arrays = _prepare(x, y, validation_split=0.5, validation_data=(x, y))
    assert arrays.validation is None and arrays.steps_per_epoch == 1


def test_shuffled_each_pass_and_in_each_worker_s_own_order():
    x, y = np.arange(64.0).reshape(32, 2), np.arange(32)
    arrays = _prepare(x, y, batch_size=32, shuffle=True)
    one, two = [b[1].tolist() for b in _batches(arrays, 2, worker=0, workers=2)]
    other = _batches(arrays, 1, worker=1, workers=2)[0][1].tolist()
    assert sorted(one) == sorted(two) == sorted(other) == list(range(32))
    assert one != two and one != other and one != list(range(32))


def test_shuffle_batch_shuffles_whole_batches():
    x, y = np.zeros((40, 1)), np.arange(40)
    batches = [b[1].tolist() for b in _batches(_prepare(x, y, batch_size=8,
                                                        shuffle="batch"), 5)]
    assert sorted(batches) == [list(range(i, i + 8)) for i in range(0, 40, 8)]


def test_dicts_lists_and_sample_weights_keep_keras_s_structure():
    x = {"a": np.zeros((6, 2)), "b": np.ones((6, 1))}
    arrays = _prepare(x, [np.zeros(6), np.ones(6)], np.full(6, 2.0), batch_size=3)
    features, labels, weights = _batches(arrays, 1)[0]
    assert set(features) == {"a", "b"} and isinstance(labels, tuple)
    assert weights.tolist() == [2.0, 2.0, 2.0]
    assert ps_arrays.given(x) and ps_arrays.given(tf.zeros((3, 2)))
    tensors = _prepare(tf.zeros((6, 2)), tf.range(6), batch_size=4)  # tensors as arrays
    assert [b[1].tolist() for b in _batches(tensors, 2)] == [[0, 1, 2, 3], [4, 5]]
    assert not ps_arrays.given([[1.0, 2.0]]) and not ps_arrays.given(lambda c: None)


@pytest.mark.parametrize("kwargs, match", [
    ({"y": np.zeros(7)}, r"different numbers of examples \(x: 8; y: 7\)"),
    ({"y": np.zeros(8), "sample_weight": np.ones(8), "class_weight": {0: 1.0}},
     "both class_weight and sample_weight"),
    ({"y": np.zeros(8), "validation_split": 0.9}, "not sufficient to split it"),
    ({"y": np.zeros(8), "validation_split": 1.5}, "validation_split must be a fraction"),
    ({"y": np.zeros(8), "batch_size": 0}, "batch_size must be a positive integer"),
    ({"y": np.zeros(8), "shuffle": "yes"}, "shuffle must be True, False or"),
    ({"y": "labels"}, "y is a str: give y as arrays"),
])
def test_what_keras_refuses_of_arrays_is_refused_in_one_line(kwargs, match):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", loss="mse")
    with pytest.raises(UsageError, match=match) as info:
        ps_fit.fit(model, object(), x=np.zeros((8, 3)), **kwargs)
    assert "\n" not in str(info.value)


def test_arrays_too_large_to_ship_in_a_graph_name_the_fix(monkeypatch):
    monkeypatch.setattr(ps_arrays, "MAX_BYTES", 1 << 20)
    with pytest.raises(UsageError, match=r"hold 2.0 MiB, more than the 1 MiB .* give x as "
                                         r"a function .* reads the examples from files"):
        _prepare(np.zeros((1024, 512), "float64"), np.zeros(1024, "int8"))  # float32
