"""The one predict loop that `local`, `batch` and `serve` share: decode, stack, predict,
encode.

Each entry point reads instances its own way (lines, records, a request body) and
reports a bad one its own way (`local` and `serve` stop at the first, `batch` writes it
to the errors file and goes on), but the steps between an instance and its prediction
are these, so an instance gives the same answer everywhere.
"""
from __future__ import annotations

from predict.runtime import decode
from predict.errors import InputError, InstanceError
from predict.runtime.model import Model, Signature


def decode_labelled(labelled, sig: Signature) -> list:
    """(label, instance) pairs -> decoded instances; the first bad one raises
    InputError naming its label (`line 3`, `instance 2`)."""
    decoded = []
    for where, instance in labelled:
        try:
            decoded.append(decode.decode_instance(instance, sig))
        except InstanceError as exc:
            raise InputError(where, str(exc)) from None
    return decoded


def predict_rows(model: Model, decoded: list, sig: Signature) -> list:
    """Decoded instances -> one JSON-able prediction per instance, in order (one model
    call for all of them); an instance sent without its key is answered without it."""
    batch, finish = rows_call(decoded, sig)
    return finish(model.predict(batch, sig.name))


def rows_call(decoded: list, sig: Signature) -> tuple:
    """predict_rows in two halves, for a caller that calls the model its own way:
    (the batch to call it with, finish(outputs) -> the predictions)."""
    keyless = [decode.KEYLESS in d for d in decoded]
    passthrough = decode.passthrough_key(sig)
    return decode.stack(decoded, sig), \
        lambda outputs: decode.encode_rows(outputs, keyless, passthrough)


def predict_columns(model: Model, batch: dict, sig: Signature):
    """A decoded columnar batch -> TF Serving's columnar `outputs` (no key output when
    the request sent no key)."""
    return columns_finish(batch, sig)(model.predict(batch, sig.name))


def columns_finish(batch: dict, sig: Signature):
    """predict_columns' second half: finish(outputs) -> the `outputs`."""
    return lambda outputs: decode.encode_columns(
        outputs, decode.shown_outputs(outputs, batch, sig))


__all__ = ["decode_labelled", "predict_rows", "rows_call", "predict_columns",
           "columns_finish"]
