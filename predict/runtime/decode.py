"""Instances (parsed JSON) -> column arrays a signature accepts, and outputs -> JSON.

One decoder serves every entry point (local, batch, the REST server), so an instance is
accepted or refused the same way everywhere. Each instance is checked on its own and a
bad one raises `InstanceError` with the problem; the caller names where it came from.

Rules (docs/predict.md lists them for users):
- an instance is an object of named inputs, or a bare value when the signature has a
  single input; unknown and missing inputs are errors;
- numbers must be JSON numbers (no strings, no booleans), floats must be finite, and
  integer inputs take integers only; what an input accepts comes from the signature
  (dtype, shape) only, whatever its name (a model may rescale 0-255 pixels itself);
- the instance key is optional: an input that the signature passes through to an
  output of the same name (`key`, shape [None]) may be left out, and then its output is
  left out of that instance's answer (TF Serving's clients send no key);
- a value of the right size but another shape is flattened when the signature wants a
  flat vector (a 28x28 image for a 784 input), and a scalar where it wants one value
  (`{"age": 60}` for a [None, 1] input, as Keras takes it); any other shape mismatch is
  an error;
- `{"b64": "..."}` is binary: decoded bytes for string inputs, raw little-endian values
  of the input's dtype for numeric inputs (784 float32 = 3,136 bytes for an image);
- nesting deeper than MAX_DEPTH is refused before numpy or anything recursive sees it.
"""
from __future__ import annotations

import base64
import binascii
import math

import numpy as np

from predict.errors import InstanceError, shown
from predict.runtime.model import Signature, TensorInfo

MAX_DEPTH = 8
INT64_MAX = np.iinfo(np.int64).max
KEYLESS = "\0keyless"  # marks a decoded instance that came without its key


class Batch(dict):
    """Column arrays, one per input; `keyless` when the request left out the key."""

    keyless = False


def passthrough_key(sig: Signature) -> str | None:
    """The instance key: an input of shape [None] that is also an output of that name,
    beside at least one other input (the export's `key`)."""
    for name, info in sig.inputs.items():
        if name in sig.outputs and info.shape is not None and len(info.shape) == 1 \
                and len(sig.inputs) > 1:
            return name
    return None


def _no_key(info: TensorInfo, count: int | None = None) -> np.ndarray:
    """What a left-out key is filled with (its answer is not shown)."""
    dtype = np.dtype(info.dtype)
    shape = () if count is None else (count,)
    return np.full(shape, b"", dtype=object) if dtype.kind == "O" else np.zeros(shape, dtype)


def decode_instance(instance, sig: Signature) -> dict:
    """One row-format instance -> {input name: array without the batch dimension}; an
    instance without its key gets the KEYLESS mark."""
    names = list(sig.inputs)
    key = passthrough_key(sig)
    others = [n for n in names if n != key]
    if key is not None and len(others) == 1 and not (isinstance(instance, dict)
                                                    and not _is_b64(instance)):
        instance = {others[0]: instance}  # a bare value for the one input besides the key
    if isinstance(instance, dict) and not _is_b64(instance):
        keyless = key is not None and key not in instance and bool(instance)
        given = [n for n in names if not (keyless and n == key)]
        _check_names(instance, sig, optional=key if keyless else None)
        decoded: dict = {n: to_array(instance[n], n, sig.inputs[n], batched=False)
                         for n in given}
        if keyless:
            assert key is not None  # keyless needs a key
            decoded[key] = _no_key(sig.inputs[key])
            decoded[KEYLESS] = True
        return decoded
    if len(names) != 1:
        raise InstanceError(f"a bare value needs a signature with one input, but "
                            f"{sig.name} takes {_listing(names)}: send an object like "
                            f"{{{', '.join(repr(n) + ': ...' for n in names)}}}")
    return {names[0]: to_array(instance, names[0], sig.inputs[names[0]], batched=False)}


def _check_names(given: dict, sig: Signature, optional: str | None = None) -> None:
    """Every input of the signature given (but the optional key), and nothing else."""
    names = list(sig.inputs)
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise InstanceError(f"unknown input {shown(unknown[0])}; signature {sig.name} takes "
                            f"{_listing(names)}")
    missing = [n for n in names if n not in given and n != optional]
    if missing:
        raise InstanceError(f"missing input {missing[0]!r}; signature {sig.name} takes "
                            f"{_listing(names)}")


def stack(decoded: list, sig: Signature) -> dict:
    """Decoded instances -> one batch of column arrays."""
    return {n: np.stack([d[n] for d in decoded]).astype(info.dtype, copy=False)
            for n, info in sig.inputs.items()}


def decode_columns(inputs, sig: Signature) -> Batch:
    """Columnar `inputs` (object of batched values, or one bare batched value) -> batch;
    without its key, `keyless`."""
    names = list(sig.inputs)
    key = passthrough_key(sig)
    others = [n for n in names if n != key]
    if not (isinstance(inputs, dict) and not _is_b64(inputs)):
        if len(others) != 1:
            raise InstanceError(f"bare inputs need a signature with one input, but "
                                f"{sig.name} takes {_listing(names)}")
        inputs = {others[0]: inputs}
    keyless = key is not None and key not in inputs and bool(inputs)
    _check_names(inputs, sig, optional=key if keyless else None)
    batch = Batch((n, to_array(inputs[n], n, sig.inputs[n], batched=True))
                  for n in names if not (keyless and n == key))
    return _sized(batch, sig, key if keyless else None)


def _sized(batch: Batch, sig: Signature, missing_key: str | None) -> Batch:
    """The batch checked for one batch size, with a left-out key filled in."""
    sizes = {n: a.shape[0] if a.ndim else 0 for n, a in batch.items()}
    if len(set(sizes.values())) > 1:
        raise InstanceError("inputs differ in batch size: " +
                            ", ".join(f"{n} has {s}" for n, s in sizes.items()))
    if missing_key is not None:
        batch[missing_key] = _no_key(sig.inputs[missing_key], next(iter(sizes.values())))
        batch.keyless = True
    return batch


def check_columns(arrays: dict, sig: Signature) -> Batch:
    """Ready arrays (a gRPC request's tensors), one per input with the batch dimension
    -> the batch, checked like JSON columns: names, dtype, shape, values, batch size."""
    key = passthrough_key(sig)
    keyless = key is not None and key not in arrays and bool(arrays)
    _check_names(arrays, sig, optional=key if keyless else None)
    batch = Batch()
    for name, info in sig.inputs.items():
        if keyless and name == key:
            continue
        arr = np.asarray(arrays[name])
        want = np.dtype(info.dtype)
        if arr.dtype != want and not (want.kind == "O" and arr.dtype.kind in "OS"):
            raise InstanceError(f"{name} is {arr.dtype.name}, the signature wants "
                                f"{want.name}")
        arr = _fit_shape(arr, info.shape, name)
        _check_values(arr, name, info)
        batch[name] = arr
    return _sized(batch, sig, key if keyless else None)


def shown_outputs(outputs, batch, sig: Signature) -> list:
    """The outputs a columnar answer shows: not the key's when the request had none."""
    key = passthrough_key(sig) if getattr(batch, "keyless", False) else None
    return [n for n in outputs if n != key]


def to_array(value, name: str, info: TensorInfo, *, batched: bool) -> np.ndarray:
    """Check and convert one input's value; `batched` says it carries the batch dim."""
    want = info.shape if batched or info.shape is None else info.shape[1:]
    if _is_b64(value):
        arr = _from_b64(value["b64"], name, info, want)
    else:
        depth = _depth(value)
        if depth > MAX_DEPTH:
            raise InstanceError(f"{name} is nested {depth}+ levels deep; at most "
                                f"{MAX_DEPTH} levels are accepted")
        arr = _convert(value, name, info)
    arr = _fit_shape(arr, want, name)
    _check_values(arr, name, info)
    return arr


def _convert(value, name: str, info: TensorInfo) -> np.ndarray:
    dtype = np.dtype(info.dtype)
    if dtype.kind == "O":  # tf.string
        return _strings(value, name)
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError, OverflowError, RecursionError):
        raise InstanceError(f"{name} is not a rectangular array of numbers "
                            "(ragged or mixed nested lists)") from None
    kind = arr.dtype.kind
    if kind in "US":
        raise InstanceError(f"{name} holds strings where {dtype.name} numbers are expected")
    if kind == "b" and dtype.kind != "b":
        raise InstanceError(f"{name} holds booleans where {dtype.name} numbers are expected")
    if kind == "O":
        raise InstanceError(f"{name} is not a rectangular array of numbers "
                            "(ragged, mixed types, or integers beyond 64 bits)")
    if dtype.kind in "iu":
        if kind == "f":
            raise InstanceError(f"{name} must hold integers ({dtype.name}), got floats")
        if kind == "u" and arr.size and arr.max() > INT64_MAX:
            raise InstanceError(f"{name} holds an integer beyond the int64 range")
    if dtype.kind == "b" and kind != "b":
        raise InstanceError(f"{name} must hold true/false values")
    with np.errstate(over="ignore", invalid="ignore"):
        return arr.astype(dtype)


def _strings(value, name: str) -> np.ndarray:
    def one(v):
        if isinstance(v, str):
            return v.encode("utf-8")
        if _is_b64(v):
            return _b64_bytes(v["b64"], name)
        raise InstanceError(f"{name} must hold strings, got {type(v).__name__}")
    if isinstance(value, list):
        if any(isinstance(v, list) for v in value):
            raise InstanceError(f"{name}: nested string lists are not supported")
        return np.array([one(v) for v in value], dtype=object)
    return np.array(one(value), dtype=object)


def _from_b64(text, name: str, info: TensorInfo, want) -> np.ndarray:
    raw = _b64_bytes(text, name)
    dtype = np.dtype(info.dtype)
    if dtype.kind == "O":
        return np.array(raw, dtype=object)
    if want is None or any(d is None for d in want):
        raise InstanceError(f"{name}: b64 values need an input of fixed shape")
    count = math.prod(want)
    if len(raw) != count * dtype.itemsize:
        raise InstanceError(f"{name}: b64 value has {len(raw)} bytes, expected "
                            f"{count * dtype.itemsize} ({count} little-endian {dtype.name})")
    return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(want)


def _b64_bytes(text, name: str) -> bytes:
    if not isinstance(text, str):
        raise InstanceError(f"{name}: b64 value must be a string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InstanceError(f"{name}: b64 value is not valid base64") from None


def _fit_shape(arr: np.ndarray, want, name: str) -> np.ndarray:
    if want is None or _matches(arr.shape, want):
        return arr
    # A [None, 1] input takes a scalar a row ({"age": 60}), as Keras takes one: the last
    # axis of one is added.
    if want and want[-1] == 1 and _matches(arr.shape + (1,), want):
        return arr[..., np.newaxis]
    # A flat vector input accepts any nesting of the same values (28x28 for 784), per
    # instance or per batch (N x 28 x 28 for N x 784).
    flat = want[-1] if want and want[-1] is not None else None
    lead = len(want) - 1
    if flat is not None and arr.ndim > len(want) and \
            math.prod(arr.shape[lead:]) == flat and _matches(arr.shape[:lead], want[:lead]):
        return arr.reshape(arr.shape[:lead] + (flat,))
    raise InstanceError(f"{name} has shape {_shape(arr.shape)}, the signature wants "
                        f"{_shape(want)}")


def _check_values(arr: np.ndarray, name: str, info: TensorInfo) -> None:
    if np.dtype(info.dtype).kind != "f" or not arr.size:
        return
    if not np.isfinite(arr).all():
        raise InstanceError(f"{name} holds NaN or infinite values (or values beyond "
                            f"the {np.dtype(info.dtype).name} range)")


def encode_rows(outputs: dict, keyless: list | None = None, key: str | None = None) -> list:
    """Column outputs -> one JSON-able value per instance (TF Serving's `predictions`):
    an object per instance, or the bare value when there is a single output. Instances
    marked in `keyless` are answered without the `key` output (still an object: the
    signature has several outputs)."""
    names = output_order(outputs)
    columns = [_jsonable(outputs[n]) for n in names]
    rows = columns[0] if len(names) == 1 else [
        dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]
    if key is None or key not in outputs or not keyless or not any(keyless):
        return rows
    return [{n: v for n, v in r.items() if n != key} if k else r
            for r, k in zip(rows, keyless, strict=True)]


def encode_columns(outputs: dict, shown: list | None = None):
    """Column outputs -> TF Serving's columnar `outputs` (bare when single); `shown`
    leaves the others out (an object still, when there were several)."""
    names = output_order(outputs)
    if shown is not None and len(names) > 1:
        return {n: _jsonable(outputs[n]) for n in names if n in shown}
    if len(names) == 1:
        return _jsonable(outputs[names[0]])
    return {n: _jsonable(outputs[n]) for n in names}


def output_order(outputs) -> list:
    """`key` first (it identifies the instance), then the rest by name."""
    return sorted(outputs, key=lambda n: (n != "key", n))


def _jsonable(arr: np.ndarray):
    if arr.dtype.kind in "OS":
        return _bytes_to_json(arr.tolist())
    return arr.tolist()


def _bytes_to_json(value):
    if isinstance(value, list):
        return [_bytes_to_json(v) for v in value]
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(value).decode("ascii")}
    return value


def _depth(value) -> int:
    """Nesting depth along first elements, stopping past MAX_DEPTH (cheap for a 784
    list; ragged deeper branches are caught by numpy's own dimension limit)."""
    depth = 0
    while isinstance(value, list) and depth <= MAX_DEPTH:
        depth += 1
        if not value:
            break
        value = value[0]
    return depth


def _is_b64(value) -> bool:
    return isinstance(value, dict) and len(value) == 1 and "b64" in value


def _matches(shape, want) -> bool:
    return len(shape) == len(want) and all(
        w is None or s == w for s, w in zip(shape, want, strict=True))


def _shape(shape) -> str:
    return "[" + ", ".join("None" if d is None else str(d) for d in shape) + "]"


def _listing(names) -> str:
    return ", ".join(names)


__all__ = ["decode_instance", "decode_columns", "check_columns", "stack", "to_array", "encode_rows",
           "encode_columns", "output_order", "passthrough_key", "shown_outputs", "Batch",
           "KEYLESS", "MAX_DEPTH"]
