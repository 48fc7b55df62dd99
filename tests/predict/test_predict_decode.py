"""The input decoder every mode shares: what it accepts, what it refuses and why."""
import base64
import io
import json

import numpy as np
import pytest

from predict.runtime import decode, instances, records
from predict.errors import InputError, InstanceError, UsageError
from predict.runtime.model import Signature, TensorInfo

IMAGE = TensorInfo(np.float32, (None, 784), "image:0")
KEY = TensorInfo(np.int64, (None,), "key:0")
SERVING = Signature("serving_default", {"image": IMAGE, "key": KEY},
                    {"key": KEY, "scores": TensorInfo(np.float32, (None, 10), "s:0"),
                     "classes": TensorInfo(np.int64, (None,), "c:0")})
IMAGES_ONLY = Signature("predict_images", {"image": IMAGE},
                        {"scores": TensorInfo(np.float32, (None, 10), "s:0")})
PIXELS = [0.5] * 784


def test_named_instance_becomes_typed_arrays():
    out = decode.decode_instance({"image": PIXELS, "key": 7}, SERVING)
    assert out["image"].dtype == np.float32 and out["image"].shape == (784,)
    assert out["key"].dtype == np.int64 and out["key"] == 7


def test_28x28_image_is_flattened_row_major():
    grid = np.arange(784, dtype=np.float32).reshape(28, 28) / 784
    out = decode.decode_instance({"image": grid.tolist(), "key": 1}, SERVING)
    np.testing.assert_array_equal(out["image"], grid.reshape(784))


def test_bare_value_for_a_one_input_signature_and_b64_floats():
    img = np.linspace(0, 1, 784, dtype=np.float32)
    b64 = {"b64": base64.b64encode(img.astype("<f4").tobytes()).decode()}
    for value in (img.tolist(), b64):
        np.testing.assert_array_equal(decode.decode_instance(value, IMAGES_ONLY)["image"], img)
    np.testing.assert_array_equal(
        decode.decode_instance({"image": b64, "key": 3}, SERVING)["image"], img)


def _deep(depth):
    value = 0.5
    for _ in range(depth):
        value = [value]
    return value


BAD_INSTANCES = [
    ("short image", {"image": [0.5] * 783, "key": 1}, "image has shape [783]"),
    ("28x27 image", {"image": [[0.5] * 27] * 28, "key": 1}, "image has shape [28, 27]"),
    ("strings for floats", {"image": ["0.5"] * 784, "key": 1}, "strings where float32"),
    ("booleans for floats", {"image": [True] * 784, "key": 1}, "booleans"),
    ("NaN pixel", {"image": [float("nan")] + PIXELS[1:], "key": 1}, "NaN or infinite"),
    ("infinite pixel", {"image": [float("inf")] + PIXELS[1:], "key": 1}, "NaN or infinite"),
    ("unknown input", {"image": PIXELS, "key": 1, "label": 3}, "unknown input 'label'"),
    ("float key", {"image": PIXELS, "key": 1.5}, "key must hold integers"),
    ("string key", {"image": PIXELS, "key": "7"}, "strings where int64"),
    ("key beyond int64", {"image": PIXELS, "key": 2**63}, "beyond the int64 range"),
    ("key beyond 64 bits", {"image": PIXELS, "key": 2**64 + 1}, "beyond 64 bits"),
    ("key as a list", {"image": PIXELS, "key": [1]}, "key has shape [1]"),
    ("ragged image", {"image": [[0.5] * 28] * 27 + [[0.5] * 27], "key": 1}, "rectangular"),
    ("mixed image", {"image": PIXELS[:-1] + [[0.5]], "key": 1}, "rectangular"),
    ("deep nesting", {"image": _deep(50), "key": 1}, "nested"),
    ("bad b64", {"image": {"b64": "@@@"}, "key": 1}, "not valid base64"),
    ("b64 wrong size", {"image": {"b64": base64.b64encode(b"\0" * 12).decode()}, "key": 1},
     "12 bytes, expected 3136"),

    ("missing image", {"key": 1}, "missing input 'image'"),
    ("empty object", {}, "missing input 'image'"),
]
TWO = Signature("serving_default", {"a": TensorInfo(np.float32, (None,), "a:0"),
                                    "b": TensorInfo(np.int64, (None,), "b:0")},
                {"y": TensorInfo(np.float32, (None,), "y:0")})


@pytest.mark.parametrize("instance,message", [(i, m) for _, i, m in BAD_INSTANCES],
                         ids=[name for name, _, _ in BAD_INSTANCES])
def test_bad_instance_is_refused_with_the_problem_named(instance, message):
    with pytest.raises(InstanceError) as info:
        decode.decode_instance(instance, SERVING)
    assert message in str(info.value)


def test_values_are_checked_by_dtype_and_shape_only_whatever_the_name():
    """An input named `image` of a user's model that rescales 0-255 pixels itself."""
    for pixels in ([200.0] * 784, [-0.1] + PIXELS[1:], [255.0] * 784):
        out = decode.decode_instance({"image": pixels, "key": 1}, SERVING)
        np.testing.assert_array_equal(out["image"], np.float32(pixels))
    assert decode.check_columns({"image": np.full((1, 784), 255, np.float32),
                                 "key": np.array([1])}, SERVING)["image"].max() == 255


def test_the_key_is_optional_and_comes_back_only_when_sent():
    assert decode.passthrough_key(SERVING) == "key"
    assert decode.passthrough_key(IMAGES_ONLY) is None and decode.passthrough_key(TWO) is None
    keyless = decode.decode_instance({"image": PIXELS}, SERVING)
    bare = decode.decode_instance(PIXELS, SERVING)  # a bare value for the one other input
    keyed = decode.decode_instance({"image": PIXELS, "key": 5}, SERVING)
    assert decode.KEYLESS in keyless and decode.KEYLESS in bare and decode.KEYLESS not in keyed
    assert keyless["key"].dtype == np.int64 and keyless["key"].shape == ()
    outputs = {"scores": np.eye(3, 10, dtype=np.float32), "classes": np.array([0, 1, 2]),
               "key": np.array([0, 5, 0])}
    rows = decode.encode_rows(outputs, [True, False, True], "key")
    assert [sorted(r) for r in rows] == [["classes", "scores"], ["classes", "key", "scores"],
                                         ["classes", "scores"]]
    assert rows[1]["key"] == 5 and rows[2]["classes"] == 2
    assert decode.encode_rows({"key": np.array([0]), "y": np.array([0.5])}, [True], "key") \
        == [{"y": 0.5}]  # an object still: the signature has two outputs
    assert decode.encode_columns({"key": np.array([0]), "y": np.array([0.5])}, ["y"]) \
        == {"y": [0.5]}
    batch = decode.decode_columns({"image": [PIXELS, PIXELS]}, SERVING)
    assert batch.keyless and batch["key"].tolist() == [0, 0]
    assert decode.shown_outputs(outputs, batch, SERVING) == ["scores", "classes"]
    sent = decode.decode_columns({"image": [PIXELS], "key": [3]}, SERVING)
    assert not sent.keyless and "key" in decode.shown_outputs(outputs, sent, SERVING)
    grpc = decode.check_columns({"image": np.zeros((2, 784), np.float32)}, SERVING)
    assert grpc.keyless and grpc["key"].tolist() == [0, 0]
    strings = Signature("s", {"x": IMAGE, "id": TensorInfo(np.object_, (None,), "id:0")},
                        {"id": TensorInfo(np.object_, (None,), "id:0")})
    assert decode.decode_instance({"x": PIXELS}, strings)["id"] == b""
    with pytest.raises(InstanceError, match="a bare value needs a signature with one input"):
        decode.decode_instance([0.5, 1], TWO)  # no key: both inputs are features


def test_columns_check_batch_sizes_and_flatten_grids():
    grids = np.full((2, 28, 28), 0.25).tolist()
    batch = decode.decode_columns({"image": grids, "key": [4, 5]}, SERVING)
    assert batch["image"].shape == (2, 784) and batch["key"].tolist() == [4, 5]
    with pytest.raises(InstanceError, match="differ in batch size"):
        decode.decode_columns({"image": grids, "key": [4]}, SERVING)
    with pytest.raises(InstanceError, match="missing input 'image'"):
        decode.decode_columns({"key": [4, 5]}, SERVING)
    assert decode.decode_columns([PIXELS], IMAGES_ONLY)["image"].shape == (1, 784)


def test_outputs_are_rows_or_bare_values_key_first():
    outputs = {"scores": np.eye(2, 10, dtype=np.float32), "classes": np.array([0, 1]),
               "key": np.array([9, 8])}
    rows = decode.encode_rows(outputs)
    assert list(rows[0]) == ["key", "classes", "scores"] and rows[1]["key"] == 8
    assert decode.encode_rows({"classes": np.array([3, 4])}) == [3, 4]
    assert decode.encode_columns(outputs)["key"] == [9, 8]


def test_json_lines_name_the_bad_line():
    good = json.dumps({"image": PIXELS, "key": 1})
    with pytest.raises(InputError, match="^line 3: empty line"):
        list(instances.json_instances(f"{good}\n{good}\n\n{good}\n".encode()))
    with pytest.raises(InputError, match="^line 2: malformed JSON"):
        list(instances.json_instances(f"{good}\n{{'image': 1}}\n".encode()))
    with pytest.raises(InputError, match="^line 1: malformed JSON: nested too deeply"):
        list(instances.json_instances(b"[" * 100_000 + b"\n"))
    assert len(list(instances.json_instances(f"{good}\r\n{good}\n".encode()))) == 2


def test_json_request_and_text_lines():
    got = list(instances.json_request(json.dumps({"instances": [PIXELS, PIXELS]}).encode()))
    assert [label for label, _ in got] == ["instance 0", "instance 1"]
    with pytest.raises(InputError, match='exactly the key "instances"'):
        list(instances.json_request(b'{"instances": [], "extra": 1}'))
    line = ", ".join(["0.5"] * 392) + " " + " ".join(["0.25"] * 392)
    (_, value), = instances.text_instances(line.encode(), IMAGES_ONLY)
    assert len(value) == 784 and value[-1] == 0.25
    with pytest.raises(InputError, match="^line 1: 'abc' is not a number"):
        list(instances.text_instances(b"0.5, abc\n", IMAGES_ONLY))
    with pytest.raises(UsageError, match="one input"):
        list(instances.text_instances(b"0.5\n", SERVING))


def test_tfrecord_framing_round_trips_and_catches_damage():
    buf = io.BytesIO()
    records.write_tfrecords(buf, [b"first", b"", b"third record"])
    assert list(records.read_tfrecords(io.BytesIO(buf.getvalue()))) == \
        [b"first", b"", b"third record"]
    damaged = bytearray(buf.getvalue())
    damaged[14] ^= 0xFF  # a byte of the first record's data
    with pytest.raises(records.CorruptRecordError, match="CRC mismatch"):
        list(records.read_tfrecords(io.BytesIO(bytes(damaged))))
    with pytest.raises(records.CorruptRecordError, match="truncated"):
        list(records.read_tfrecords(io.BytesIO(buf.getvalue()[:-3])))


def test_records_hold_json_or_examples():
    import tensorflow as tf
    example = tf.train.Example(features=tf.train.Features(feature={
        "image": tf.train.Feature(float_list=tf.train.FloatList(value=PIXELS)),
        "key": tf.train.Feature(int64_list=tf.train.Int64List(value=[42]))}))
    instance = records.to_instance(example.SerializeToString(), SERVING)
    assert instance["key"] == 42 and len(instance["image"]) == 784
    decoded = decode.decode_instance(instance, SERVING)
    assert decoded["key"] == 42
    as_json = records.to_instance(json.dumps({"image": PIXELS, "key": 5}).encode(), SERVING)
    assert as_json["key"] == 5
    with pytest.raises(InstanceError, match="neither a JSON instance nor"):
        records.to_instance(b"\xff\xfe garbage", SERVING)


STRUCTURED = Signature("serving_default", {
    "age": TensorInfo(np.float32, (None, 1), "age:0"),
    "city": TensorInfo(np.object_, (None, 1), "city:0")},
    {"outputs": TensorInfo(np.float32, (None, 1), "o:0")})


def test_a_one_value_input_takes_a_scalar_a_row_as_keras_does():
    """FeatureSpace's inputs are [None, 1]: {"age": 60} is a row there, as in Keras;
    rows, columns and gRPC's ready tensors all take it, and a wrong size is still
    refused."""
    row = decode.decode_instance({"age": 60, "city": "a"}, STRUCTURED)
    assert row["age"].shape == (1,) and row["age"][0] == 60
    assert row["city"].shape == (1,) and row["city"][0] == b"a"
    listed = decode.decode_instance({"age": [60], "city": ["a"]}, STRUCTURED)
    np.testing.assert_array_equal(listed["age"], row["age"])
    columns = decode.decode_columns({"age": [60, 45], "city": ["a", "b"]}, STRUCTURED)
    assert columns["age"].shape == (2, 1) and columns["city"].shape == (2, 1)
    tensors = decode.check_columns({"age": np.array([60., 45.], np.float32),
                                    "city": np.array([b"a", b"b"], object)}, STRUCTURED)
    assert tensors["age"].shape == (2, 1)
    with pytest.raises(InstanceError, match="age has shape"):
        decode.decode_instance({"age": [60, 45], "city": "a"}, STRUCTURED)
