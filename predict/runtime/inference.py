"""TF Serving's Classify, Regress and MultiInference: tf.train.Example in, labelled
scores or values out, for signatures that declare them.

As in TF Serving (servables/tensorflow/classifier.cc, regressor.cc): a classification
signature has method_name `tensorflow/serving/classify`, one DT_STRING input (the
serialized Examples) and outputs `classes` (DT_STRING labels, [batch, K]) and/or
`scores` (DT_FLOAT, [batch, K]); a regression signature has method_name
`tensorflow/serving/regress`, one DT_STRING input and the output `outputs` (DT_FLOAT,
[batch] or [batch, 1]). The classes are the export's own labels; a signature without
`classes` gives empty labels, TF Serving's answer. Any other signature is refused with
TF Serving's message (INVALID_ARGUMENT / HTTP 400); `mljob.training.export` adds such
signatures to an export.

The request's `input` is an `example_list`, or an `example_list_with_context` whose
context's features are merged into every example (the example's own win). Over REST,
`{"examples": [...], "context": {...}}` holds the same as JSON features: a number, a
string, `{"b64": ...}` or a list of one kind (integers become an int64_list, any float
a float_list, strings a bytes_list).
"""
from __future__ import annotations

import base64
import binascii

import numpy as np

from predict.errors import InputError

CLASSIFY = "tensorflow/serving/classify"
REGRESS = "tensorflow/serving/regress"
_DT_STRING = np.dtype(object)


def _sig(model, name: str | None, method: str, what: str):
    sig = model.signature(name or None)
    if sig.method_name != method:
        raise InputError("signature", f"Expected {what} signature method_name to be "
                         f"{method}. Was: {sig.method_name} (signature {sig.name!r}; "
                         "export one with mljob.training.export's inference_signature)")
    if len(sig.inputs) != 1:
        raise InputError("signature", f"{what} signature {sig.name!r} must have exactly "
                         f"one input, has {len(sig.inputs)}")
    return sig


def serialized(input_proto, max_instances: int) -> list:
    """A tensorflow.serving.Input -> the serialized Examples, context merged in."""
    kind = input_proto.WhichOneof("kind")
    if kind == "example_list":
        examples = list(input_proto.example_list.examples)
        context = None
    elif kind == "example_list_with_context":
        examples = list(input_proto.example_list_with_context.examples)
        context = input_proto.example_list_with_context.context
    else:
        raise InputError("input", "Input is empty: give example_list or "
                                  "example_list_with_context")
    if not examples:
        raise InputError("input", "Input is empty: the example list holds no examples")
    if len(examples) > max_instances:
        raise InputError("request", f"{len(examples)} examples; this server takes at most "
                         f"{max_instances} a request (--max_instances)")
    out = []
    for example in examples:
        if context is not None:
            merged = type(example)()
            merged.CopyFrom(context)
            for key, feature in example.features.feature.items():
                merged.features.feature[key].CopyFrom(feature)
            example = merged
        out.append(example.SerializeToString())
    return out


def _run(model, sig, records: list) -> dict:
    """The signature on the serialized Examples. An Example the signature's parsing
    refuses (a feature of another length or type, a scalar where a list is declared)
    is the request's fault: InputError with TensorFlow's reason (HTTP 400, gRPC
    INVALID_ARGUMENT), as TF Serving answers it."""
    import tensorflow as tf
    (name,) = sig.inputs
    try:
        return model.predict({name: np.array(records, dtype=_DT_STRING)}, sig.name)
    except tf.errors.InvalidArgumentError as exc:
        raise InputError("examples", f"the signature {sig.name!r} cannot parse them: "
                         f"{_reason(exc.message or str(exc))}") from None


def _reason(message: str) -> str:
    """TensorFlow's reason out of its error text: the line after the graph's frames
    (`Name: <unknown>, Key: x, Index: 0.  Number of float values != expected...`)."""
    lines = [line.strip() for line in message.splitlines()]
    kept = [line for line in lines if line and not line.startswith((
        "Graph execution error", "Detected at node", "<stack traces", "[[", "File "))]
    return (kept[-1] if kept else "invalid argument")[:300]


def classify(model, signature_name: str | None, records: list):
    """-> (signature name, [[(label, score), ...] one list an example])."""
    sig = _sig(model, signature_name, CLASSIFY, "classification")
    if "classes" not in sig.outputs and "scores" not in sig.outputs:
        raise InputError("signature", f"classification signature {sig.name!r} has neither "
                         "classes nor scores")
    out = _run(model, sig, records)
    classes = out.get("classes")
    scores = out.get("scores")
    rows = []
    for i in range(len(records)):
        labels = None if classes is None else [
            c.decode("utf-8", "replace") if isinstance(c, bytes) else str(c)
            for c in np.ravel(classes[i])]
        values = None if scores is None else [float(v) for v in np.ravel(scores[i])]
        k = len(labels if labels is not None else values)  # type: ignore[arg-type]
        rows.append([(labels[j] if labels is not None else "",
                      values[j] if values is not None else 0.0) for j in range(k)])
    return sig.name, rows


def regress(model, signature_name: str | None, records: list):
    """-> (signature name, [value one an example])."""
    sig = _sig(model, signature_name, REGRESS, "regression")
    if "outputs" not in sig.outputs:
        raise InputError("signature", f"regression signature {sig.name!r} has no output "
                         "named outputs")
    values = np.asarray(_run(model, sig, records)["outputs"])
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.ndim != 1 or len(values) != len(records):
        raise InputError("signature", f"regression output has shape {list(values.shape)}; "
                         "expected [batch] or [batch, 1]")
    return sig.name, [float(v) for v in values]


# --- protos ------------------------------------------------------------------------
def fill_classification(result_proto, rows: list) -> None:
    for row in rows:
        classification = result_proto.classifications.add()
        for label, score in row:
            classification.classes.add(label=label, score=score)


def fill_regression(result_proto, values: list) -> None:
    for value in values:
        result_proto.regressions.add(value=value)


# --- REST's JSON examples -------------------------------------------------------------
def examples_from_json(body: dict, max_instances: int) -> list:
    """A REST :classify/:regress body -> serialized Examples."""
    import tensorflow as tf
    unknown = sorted(set(body) - {"examples", "context", "signature_name"})
    if unknown:
        raise InputError("request", f"unknown key {unknown[0]!r}; a :classify or :regress "
                         "body holds \"examples\", optionally \"context\" and "
                         "\"signature_name\"")
    examples = body.get("examples")
    if not isinstance(examples, list) or not examples:
        raise InputError("request", "\"examples\" must be a non-empty list of objects")
    if len(examples) > max_instances:
        raise InputError("request", f"{len(examples)} examples; this server takes at most "
                         f"{max_instances} a request (--max_instances)")
    context = body.get("context", {})
    if not isinstance(context, dict):
        raise InputError("context", "must be an object of features")
    out = []
    for index, example in enumerate(examples):
        if not isinstance(example, dict):
            raise InputError(f"example {index}", "must be an object of features")
        proto = tf.train.Example()
        for name, value in {**context, **example}.items():
            _feature(proto.features.feature[name], value, f"example {index}: {name}")
        out.append(proto.SerializeToString())
    return out


def _feature(feature, value, where: str) -> None:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise InputError(where, "an empty list has no type; leave the feature out")
    if all(isinstance(v, bool) for v in values) or any(isinstance(v, bool) for v in values):
        raise InputError(where, "booleans are not a feature type; use 0 and 1")
    if all(isinstance(v, int) for v in values):
        if any(not -2 ** 63 <= v < 2 ** 63 for v in values):
            raise InputError(where, "an integer lies outside the int64 range")
        feature.int64_list.value.extend(values)
    elif all(isinstance(v, (int, float)) for v in values):
        if any(not np.isfinite(v) for v in values):
            raise InputError(where, "values must be finite numbers")
        feature.float_list.value.extend(float(v) for v in values)
    elif all(isinstance(v, (str, dict)) for v in values):
        feature.bytes_list.value.extend(_bytes(v, where) for v in values)
    else:
        raise InputError(where, "a feature's values must all be numbers or all strings "
                                "(or {\"b64\": ...})")


def _bytes(value, where: str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if set(value) != {"b64"} or not isinstance(value["b64"], str):
        raise InputError(where, "an object value must be {\"b64\": \"...\"}")
    try:
        return base64.b64decode(value["b64"], validate=True)
    except (binascii.Error, ValueError):
        raise InputError(where, "b64 value is not valid base64") from None


__all__ = ["classify", "regress", "serialized", "fill_classification", "fill_regression",
           "examples_from_json", "CLASSIFY", "REGRESS"]
