"""TensorProto <-> numpy array for the gRPC API, without TensorFlow's general
converters for the common numeric dtypes.

`tf.make_ndarray` and `tf.make_tensor_proto` take every dtype, list and scalar
TensorFlow knows, and check and dispatch in Python on the way: some 25 and 20 us a
tensor, a third of what the server spends on a one-instance Predict besides the model.
For the dtypes requests carry (floats, integers, booleans) the same arrays and the same
protos come from the proto's bytes directly:

- a request's `tensor_content` is read in place (`np.frombuffer`: no copy; the array is
  read-only, and nothing in the server writes into a request's arrays); values given
  one by one in the typed field (`float_val`, `int64_val`, ...) are read when there is
  exactly one a element;
- an answer's array is written as `make_tensor_proto` writes it: `tensor_content` for
  the dtypes TensorFlow packs that way when there is more than one element, the typed
  field otherwise.

Anything else (strings, half and bfloat16, complex, a proto whose values TensorFlow
fills in from its last value, bytes of the wrong length, a big-endian array) goes
through TensorFlow's converters, so the answers and the errors are theirs.
"""
from __future__ import annotations

import math

import numpy as np

from predict.errors import InputError, InstanceError, shown
from predict.runtime import decode

# numpy dtype -> (TensorFlow's DataType number, the typed field, packed as
# tensor_content past one element): TensorFlow's own choices (tensor_util's
# _TENSOR_CONTENT_TYPES leaves out bool and uint16).
_NUMERIC: dict[np.dtype, tuple[int, str, bool]] = {
    np.dtype(np.float32): (1, "float_val", True),
    np.dtype(np.float64): (2, "double_val", True),
    np.dtype(np.int32): (3, "int_val", True),
    np.dtype(np.uint8): (4, "int_val", True),
    np.dtype(np.int16): (5, "int_val", True),
    np.dtype(np.int8): (6, "int_val", True),
    np.dtype(np.int64): (9, "int64_val", True),
    np.dtype(np.bool_): (10, "bool_val", False),
    np.dtype(np.uint16): (17, "int_val", False),
    np.dtype(np.uint32): (22, "uint32_val", True),
    np.dtype(np.uint64): (23, "uint64_val", True),
}
_BY_ENUM: dict[int, tuple[np.dtype, str]] = {
    enum: (dtype, field) for dtype, (enum, field, _) in _NUMERIC.items()}


def to_array(proto) -> np.ndarray:
    """A TensorProto -> the array `tf.make_ndarray` gives (read-only when it is the
    proto's packed bytes)."""
    known = _BY_ENUM.get(proto.dtype)
    if known is not None:
        dtype, field = known
        shape = [d.size for d in proto.tensor_shape.dim]
        count = math.prod(shape)
        content = proto.tensor_content
        try:
            if content:
                if len(content) == count * dtype.itemsize:
                    return np.frombuffer(content, dtype).reshape(shape)
            else:
                values = getattr(proto, field)
                if len(values) == count:
                    return np.fromiter(values, dtype, count).reshape(shape)
        except (ValueError, OverflowError):  # TensorFlow's converter says what
            pass
    import tensorflow as tf
    return tf.make_ndarray(proto)


def fill(target, value: np.ndarray) -> None:
    """Write `value` into the (empty) TensorProto `target` as `tf.make_tensor_proto`
    would write it."""
    known = _NUMERIC.get(value.dtype) if type(value) is np.ndarray else None
    if known is None or value.nbytes >= 1 << 31:  # TensorFlow refuses 2 GB: its error
        import tensorflow as tf
        target.CopyFrom(tf.make_tensor_proto(value))
        return
    enum, field, packed = known
    target.dtype = enum
    target.tensor_shape.SetInParent()  # a scalar's shape is there, with no dims
    dims = target.tensor_shape.dim
    for size in value.shape:
        dims.add().size = size
    if packed and value.size > 1:
        target.tensor_content = value.tobytes()
    else:
        getattr(target, field).extend(value.ravel().tolist())


def _check_elements(key: str, proto, limit: int) -> None:
    """A TensorProto's tensor_shape bounded before it is decoded: TensorFlow fills the
    elements that no value gives with the last value, so a shape of millions with one
    value allocated hundreds of megabytes. A request holds at most `limit` elements
    (--max-body-bytes: what the REST API's largest body could hold, two bytes a number
    at the least); a shape that does not fit is refused before anything is allocated."""
    dims = [d.size for d in proto.tensor_shape.dim]
    where = f"input {shown(key)}"
    if any(d < 0 for d in dims):
        raise InputError(where, f"tensor_shape has a negative dimension ({min(dims)}); "
                                "give each dimension's size")
    elements = math.prod(dims)
    if elements > limit:
        raise InputError(where, f"tensor_shape {dims[:6]}{'...' if len(dims) > 6 else ''} "
                                f"promises {_many(elements)} elements; a request holds at most "
                                f"{limit:,} (--max-body-bytes); send fewer instances a "
                                "request")


def _many(n: int) -> str:
    return f"{n:,}" if n < 10 ** 15 else f"more than 10^{len(str(n)) - 1}"


def predict_response(predict_pb2, model, request, check_count, max_elements: int):
    """A PredictRequest run on a loaded model -> PredictResponse (its model_spec names
    only the signature; the caller adds model and version)."""
    sig = model.signature(request.model_spec.signature_name or None)
    arrays = {}
    for key, proto in request.inputs.items():
        _check_elements(key, proto, max_elements)
        try:
            arrays[key] = to_array(proto)
        except Exception as exc:  # a malformed TensorProto
            raise InputError(f"input {shown(key)}",
                             f"not a valid tensor: {exc}") from None
    try:
        batch = decode.check_columns(arrays, sig)
    except InstanceError as exc:
        raise InputError("inputs", str(exc)) from None
    check_count(next(iter(batch.values())).shape[0])
    outputs = model.predict(batch, sig.name)
    wanted = list(request.output_filter) or decode.shown_outputs(outputs, batch, sig)
    unknown = [n for n in wanted if n not in outputs]
    if unknown:
        raise InputError("output_filter", f"unknown output {shown(unknown[0])}; "
                         f"{sig.name} gives {', '.join(sorted(outputs))}")
    response = predict_pb2.PredictResponse()
    response.model_spec.signature_name = sig.name
    for name in wanted:
        fill(response.outputs[name], outputs[name])
    return response


__all__ = ["to_array", "fill", "predict_response"]
