"""`predict local`: gcloud's `ai-platform local predict` on a loaded model.

All instances are read and checked before anything is predicted, so a mistake on line
900 gives one error and no partial output (local is for small inputs; `predict batch`
streams large ones). Instances then run in batches of at most MAX_BATCH.
"""
from __future__ import annotations

import json

from predict.runtime import loop
from predict.errors import InputError
from predict.runtime.model import Model

MAX_BATCH = 256


def predict_instances(model: Model, labelled, signature_name: str | None = None):
    """(label, instance) pairs -> one JSON-able prediction per instance, in order."""
    sig = model.signature(signature_name)
    decoded = loop.decode_labelled(labelled, sig)
    if not decoded:
        raise InputError("input", "no instances; give at least one")
    for start in range(0, len(decoded), MAX_BATCH):
        yield from loop.predict_rows(model, decoded[start:start + MAX_BATCH], sig)


def write_json(predictions, out) -> None:
    for row in predictions:
        out.write(json.dumps(row) + "\n")


def write_table(predictions, out, digits: int = 4) -> None:
    """gcloud's table: one column an output, upper-case headings; scores rounded."""
    rows = list(predictions)
    if rows and isinstance(rows[0], dict):
        names = list(rows[0])
        cells = [[_cell(row[n], digits) for n in names] for row in rows]
    else:
        names = ["prediction"]
        cells = [[_cell(row, digits)] for row in rows]
    heads = [n.upper() for n in names]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]
    out.write("  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip() + "\n")
    for c in cells:
        out.write("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip() + "\n")


def _cell(value, digits: int) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    if isinstance(value, list):
        return "[" + ", ".join(_cell(v, digits) for v in value) + "]"
    return str(value)


__all__ = ["MAX_BATCH", "predict_instances", "write_json", "write_table"]
