"""The gRPC API's own TensorProto conversions (predict.runtime.tensors) give what TensorFlow's
give: the same arrays from a request's tensors (packed bytes, values one by one, values
TensorFlow fills in, broken ones) and the same answer protos, byte for byte, for every
dtype a request or an answer carries."""
import numpy as np
import pytest
import tensorflow as tf

from predict.runtime import tensors
from tensorflow.core.framework import tensor_pb2

DTYPES = [np.float32, np.float64, np.int32, np.uint8, np.int16, np.int8, np.int64,
          np.bool_, np.uint16, np.uint32, np.uint64, np.float16, np.complex64]
SHAPES = [(), (0,), (1,), (3,), (1, 10), (2, 3, 4), (4, 0, 2)]


def _values(dtype, shape):
    rng = np.random.default_rng(len(shape) * 7 + np.dtype(dtype).itemsize)
    if np.dtype(dtype).kind == "b":
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)  # the extremes too: a narrower field would wrap them
        values = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
        if values.size >= 2:
            values.flat[0], values.flat[-1] = info.min, info.max
        return values
    return (rng.standard_normal(shape) * 1e3).astype(dtype)


def _same_array(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_answers_are_the_protos_tensorflow_writes(dtype):
    for shape in SHAPES:
        value = _values(dtype, shape)
        got = tensor_pb2.TensorProto()
        tensors.fill(got, value)
        want = tf.make_tensor_proto(value)
        assert got.SerializeToString(deterministic=True) == \
            want.SerializeToString(deterministic=True), (shape, got, want)
        _same_array(tf.make_ndarray(got), value)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # TF's own cast of big uint64s
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_requests_read_as_tensorflow_reads_them(dtype):
    for shape in SHAPES:
        value = _values(dtype, shape)
        packed = tf.make_tensor_proto(value)  # tensor_content past one element
        _same_array(tensors.to_array(packed), value)
        one_by_one = tf.make_tensor_proto(value.ravel().tolist(),
                                          dtype=tf.as_dtype(value.dtype), shape=shape)
        _same_array(tensors.to_array(one_by_one), tf.make_ndarray(one_by_one))


def test_values_tensorflow_fills_in_and_broken_bytes_are_its_own():
    # fewer values than elements: TensorFlow repeats the last one, or fills zeros
    for proto in (tensor_pb2.TensorProto(dtype=1, float_val=[1.5, 2.5]),
                  tensor_pb2.TensorProto(dtype=9, int64_val=[7]),
                  tensor_pb2.TensorProto(dtype=10)):
        proto.tensor_shape.dim.add().size = 4
        _same_array(tensors.to_array(proto), tf.make_ndarray(proto))
    broken = tensor_pb2.TensorProto(dtype=1, tensor_content=b"\0" * 10)
    broken.tensor_shape.dim.add().size = 3
    with pytest.raises(ValueError):
        tf.make_ndarray(broken)
    with pytest.raises(ValueError):
        tensors.to_array(broken)
    # values past the dtype's range: whatever TensorFlow answers (values or an error)
    wide = tensor_pb2.TensorProto(dtype=4, int_val=[300, 1])  # uint8
    wide.tensor_shape.dim.add().size = 2
    assert _outcome(tensors.to_array, wide) == _outcome(tf.make_ndarray, wide)
    strings = tf.make_tensor_proto(np.array([b"a", b"bc"], dtype=object))
    assert tensors.to_array(strings).tolist() == [b"a", b"bc"]


def _outcome(convert, proto):
    try:
        value = convert(proto)
    except Exception as exc:
        return type(exc)
    return value.dtype, value.shape, value.tolist()


def test_a_requests_packed_bytes_are_read_in_place_not_copied():
    proto = tf.make_tensor_proto(np.arange(784, dtype=np.float32).reshape(1, 784))
    array = tensors.to_array(proto)
    assert not array.flags.writeable and not array.flags.owndata
    assert array[0, 783] == 783.0
