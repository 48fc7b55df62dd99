"""Reading instances the way `gcloud ai-platform local predict` takes them.

- JSON instances: one JSON value a line (`{"image": [...], "key": 7}`, or a bare value
  for a one-input signature); empty lines are errors, as in gcloud;
- a JSON request: one document `{"instances": [...]}`;
- text instances: one line an instance, the value of the signature's single input;
  numeric inputs are numbers separated by commas and/or spaces.

Errors name where the instance came from (`line 3`, `instance 2`); json's
RecursionError on absurdly nested input is caught like any other malformed JSON.
"""
from __future__ import annotations

import json
import re
import sys

import numpy as np

from predict.errors import InputError, InstanceError, UsageError, shown
from predict.runtime.model import Signature
from mljob import storage
from mljob.errors import first_line, too_many_digits

try:
    import orjson
except ImportError:  # pragma: no cover - an install without it
    orjson = None  # type: ignore[assignment]

_SEPARATORS = re.compile(r"[,\s]+")
# orjson reads an integer beyond 64 bits as a float; json keeps it an integer (and the
# decoder refuses it by name). A number whose integer part has 19 digits may be one:
# json reads those bodies. Found with one translate and one find (a regular expression
# takes ten times orjson's time on a 15 KB image): digits become 0, what may come
# before a float's other digits (. e E +) becomes x, everything else a space; then an
# integer part of 19 digits is a space and 19 zeros.
_DIGIT_RUNS = bytes(48 if 48 <= i <= 57 else 120 if chr(i) in ".eE+" else 32
                    for i in range(256))
_LONG_INTEGER = b" " + b"0" * 19
# The first look, on every body: the same translation with [ and { made ( (counted for
# the nesting below), and any run of 19 digits (a float's fraction too: 0.63696169853210
# 45 has 16). Only a body with such a run gets the exact look above; most have none,
# and the two passes and one count take half the time of the exact look and two counts.
_SCAN = bytes(40 if chr(i) in "[{" else c for i, c in enumerate(_DIGIT_RUNS))
_DIGITS_19 = b"0" * 19
# orjson reads nesting as deep as it comes, json refuses past Python's recursion limit
# (1,000 frames): a body with fewer openings than this is not nested that deep.
_FEW_OPENINGS = 500
MAX_INPUT_BYTES = 256 * 1024 * 1024  # predict local holds its whole input in memory
MAX_LINE_BYTES = 64 * 1024 * 1024    # one instance a line, as predict batch streams them


def read_source(url: str) -> bytes:
    """The bytes of a file, any fsspec URL, or stdin for `-`; at most MAX_INPUT_BYTES."""
    too_big = UsageError(f"input {url} holds more than {MAX_INPUT_BYTES} bytes; local "
                         "prediction is for small inputs, use predict batch for more")
    if url == "-":
        data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        if len(data) > MAX_INPUT_BYTES:
            raise too_big
        return data
    try:
        return storage.read_bytes(url, limit=MAX_INPUT_BYTES)
    except FileNotFoundError:
        raise UsageError(f"input file {url} does not exist") from None
    except IsADirectoryError:
        raise UsageError(f"input {url} is a folder; pass a file (or - for stdin)") from None
    except storage.TooLargeError:
        raise too_big from None
    except storage.StorageError as exc:  # a device, named pipe or symbolic link loop
        raise UsageError(first_line(exc)) from None


def split_lines(data: bytes, where: str = "line"):
    """(label, text) for each line; a final newline does not make an empty line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = data[:exc.start].count(b"\n") + 1
        raise InputError(f"{where} {bad}", "not valid UTF-8 text") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, start=1):
        yield f"{where} {number}", line.rstrip("\r")


def parse_json(text: str):
    """One JSON value; InstanceError for empty, malformed or absurdly nested text."""
    if not text.strip():
        raise InstanceError("empty line; every line must hold one instance")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InstanceError(f"malformed JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise InstanceError("malformed JSON: nested too deeply") from None
    except ValueError as exc:
        raise InstanceError(f"malformed JSON: {too_many_digits(exc) or first_line(exc)}") \
            from None


def parse_json_bytes(raw: bytes):
    """parse_json of UTF-8 bytes (a request body), ten times faster through orjson when
    it is installed. orjson accepts less than json (no NaN or Infinity, no lone
    surrogates, no numbers beyond the float range), more in one way (nesting deeper
    than Python's recursion limit) and reads integers beyond 64 bits as floats:
    whatever it refuses, and every body with a 19-digit integer or 500 brackets, is
    read by json, so the values accepted and the errors are json's.
    UnicodeDecodeError for bytes that are not UTF-8."""
    if orjson is None:
        return parse_json(raw.decode("utf-8"))
    scan = raw.translate(_SCAN)
    if scan.count(b"(") < _FEW_OPENINGS and (
            scan.find(_DIGITS_19) < 0 or
            (b" " + raw).translate(_DIGIT_RUNS).find(_LONG_INTEGER) < 0):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return parse_json(raw.decode("utf-8"))


def json_instances(data: bytes):
    """(label, instance) per line of a --json-instances file."""
    for where, line in split_lines(data):
        try:
            yield where, parse_json(line)
        except InstanceError as exc:
            raise InputError(where, str(exc)) from None


def json_request(data: bytes):
    """(label, instance) for each instance of a {"instances": [...]} document."""
    try:
        body = parse_json(data.decode("utf-8", errors="replace"))
    except InstanceError as exc:
        raise InputError("request", str(exc)) from None
    instances = request_instances(body)
    for index, instance in enumerate(instances):
        yield f"instance {index}", instance


def request_instances(body) -> list:
    if not isinstance(body, dict) or set(body) != {"instances"}:
        keys = ", ".join(shown(k) for k in sorted(body)[:5]) if isinstance(body, dict) \
            else type(body).__name__
        raise InputError("request", f'must be an object with exactly the key "instances", '
                                    f"got {keys}")
    if not isinstance(body["instances"], list):
        raise InputError("request", '"instances" must be a list')
    return body["instances"]


def text_instances(data: bytes, sig: Signature):
    """(label, value) per line of a --text-instances file."""
    if len(sig.inputs) != 1:
        raise UsageError(f"--text-instances needs a signature with one input, but "
                         f"{sig.name} takes {', '.join(sig.inputs)}; use --json-instances "
                         "or --signature-name with a one-input signature")
    (name, info), = sig.inputs.items()
    for where, line in split_lines(data):
        try:
            yield where, text_value(line, name, np.dtype(info.dtype))
        except InstanceError as exc:
            raise InputError(where, str(exc)) from None


def text_value(line: str, name: str, dtype: np.dtype):
    if not line.strip():
        raise InstanceError("empty line; every line must hold one instance")
    if dtype.kind == "O":
        return line
    tokens = [t for t in _SEPARATORS.split(line.strip()) if t]
    parse = int if dtype.kind in "iu" else float
    values = []
    for token in tokens:
        try:
            values.append(parse(token))
        except ValueError as exc:
            if too_many_digits(exc):
                raise InstanceError(f"{token[:20]}...: {too_many_digits(exc)}") from None
            raise InstanceError(f"{token[:40]!r} is not a number ({name} takes "
                                f"{dtype.name} values separated by commas or spaces)") \
                from None
    return values[0] if len(values) == 1 else values


__all__ = ["read_source", "split_lines", "parse_json", "parse_json_bytes", "json_instances",
           "json_request", "request_instances", "text_instances", "text_value"]
