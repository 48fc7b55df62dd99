"""TFRecord files for batch prediction, read from any fsspec file object.

A record is one instance, in either of two encodings:
- Cloud ML batch prediction's convention: the JSON instance as UTF-8 bytes (first
  non-blank byte `{`, `[` or `"`, or a number);
- a serialized `tf.train.Example` whose features are named after the signature's
  inputs: `image` a float_list of 784 values, `key` an int64_list of one value
  (a one-value list feeds a scalar input), bytes_list for string inputs.

The framing (length, masked CRC32C of the length, data, masked CRC32C of the data) is
checked; a damaged record ends the file with an error, since the framing after it
cannot be trusted.
"""
from __future__ import annotations

import base64
import json
import struct

import google_crc32c

from mljob.errors import first_line, too_many_digits
from predict.errors import InstanceError
from predict.runtime.model import Signature

_MASK_DELTA = 0xA282EAD8
# One record is one instance (a 28x28 image is 3 KB as floats); a length field beyond
# this is damage or hostility, and is refused before its bytes are read.
MAX_RECORD_BYTES = 64 * 1024 * 1024


class CorruptRecordError(InstanceError):
    """The file's framing is damaged; nothing after this point can be read."""


def read_tfrecords(f):
    """Yield each record's bytes from a binary file object."""
    while True:
        header = f.read(12)
        if not header:
            return
        if len(header) < 12:
            raise CorruptRecordError("truncated TFRecord header; the rest of the file "
                                     "was skipped")
        length, length_crc = struct.unpack("<QI", header)
        if _masked_crc(header[:8]) != length_crc:
            raise CorruptRecordError("corrupt TFRecord length (CRC mismatch); the rest of "
                                     "the file was skipped")
        if length > MAX_RECORD_BYTES:  # refused before anything that size is allocated
            raise CorruptRecordError(f"a TFRecord claims {length} bytes, more than the "
                                     f"{MAX_RECORD_BYTES} one instance may hold; the rest "
                                     "of the file was skipped")
        data = f.read(length)
        footer = f.read(4)
        if len(data) < length or len(footer) < 4:
            raise CorruptRecordError("truncated TFRecord; the rest of the file was skipped")
        if _masked_crc(data) != struct.unpack("<I", footer)[0]:
            raise CorruptRecordError("corrupt TFRecord data (CRC mismatch); the rest of the "
                                     "file was skipped")
        yield data


def write_tfrecords(f, payloads) -> None:
    """Write records (bytes) with TFRecord framing; used to build test inputs."""
    for data in payloads:
        header = struct.pack("<Q", len(data))
        f.write(header + struct.pack("<I", _masked_crc(header)))
        f.write(data + struct.pack("<I", _masked_crc(data)))


def to_instance(record: bytes, sig: Signature):
    """One record -> an instance for `decode.decode_instance`."""
    head = record.lstrip()[:1]
    if head and (head in b'{["-0123456789'):
        try:
            return json.loads(record.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InstanceError(f"record is not a JSON instance: {exc}") from None
        except RecursionError:
            raise InstanceError("record is not a JSON instance: nested too deeply") from None
        except ValueError as exc:  # an integer beyond Python's string conversion limit
            raise InstanceError(f"record is not a JSON instance: "
                                f"{too_many_digits(exc) or first_line(exc)}") from None
    return _from_example(record, sig)


def _from_example(record: bytes, sig: Signature) -> dict:
    from google.protobuf.message import DecodeError
    from tensorflow.core.example import example_pb2
    example = example_pb2.Example()
    try:
        example.ParseFromString(record)
    except DecodeError:
        raise InstanceError("record is neither a JSON instance nor a tf.train.Example") \
            from None
    features = example.features.feature
    if not features:
        raise InstanceError("record is neither a JSON instance nor a tf.train.Example "
                            "with features")
    instance = {}
    for name, feature in features.items():
        kind = feature.WhichOneof("kind")
        values = list(getattr(feature, kind).value) if kind else []
        if kind == "bytes_list":
            values = [{"b64": base64.b64encode(v).decode("ascii")} for v in values]
        info = sig.inputs.get(name)
        if info is not None and info.shape is not None and len(info.shape) == 1:
            if len(values) != 1:
                raise InstanceError(f"feature {name!r} must hold exactly one value, "
                                    f"got {len(values)}")
            values = values[0]
        instance[name] = values
    return instance


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


__all__ = ["read_tfrecords", "write_tfrecords", "to_instance", "CorruptRecordError",
           "MAX_RECORD_BYTES"]
