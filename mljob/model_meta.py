"""A served model's own record, `BASE/mljob-model.json`, beside its version folders.

`python -m submit models/versions` (gcloud's Model and Version resources) write it; the
prediction server reads its version labels at every poll of the base path, so
`versions set-default` moves the `default` label live, without a restart. It holds:

    {"name": "fashion", "description": "...", "labels": {...}, "createTime": "...",
     "defaultVersion": "v2",
     "versions": {"v2": {"number": 2, "createTime": "...", "origin": "...",
                         "labels": {...}, "description": "..."}}}

A version's name (gcloud's VERSION) maps to the number of its folder (TF Serving's
version); `versionLabels()` gives the server `{"default": number}`.
"""
from __future__ import annotations

import json
from typing import Any

from mljob import storage

MODEL_FILE = "mljob-model.json"
DEFAULT_LABEL = "default"
MAX_BYTES = 1024 * 1024


def url(base_path: str) -> str:
    return storage.join(base_path, MODEL_FILE)


def read(base_path: str) -> dict[str, Any] | None:
    """The record, or None where there is none (a plain TF Serving base path)."""
    try:
        data = storage.read_bytes(url(base_path), limit=MAX_BYTES)
    except FileNotFoundError:
        return None
    try:
        record = json.loads(data)
    except RecursionError:
        raise ValueError(f"{url(base_path)} is nested too deep to be a model record") \
            from None
    try:
        check(record)
    except ValueError as exc:
        raise ValueError(f"{url(base_path)} is not a model record ({exc})") from None
    return record


_TEXT = (str, type(None))
_FIELDS: dict[str, tuple] = {"name": _TEXT, "description": _TEXT, "createTime": _TEXT,
                             "defaultVersion": _TEXT, "labels": (dict, type(None)),
                             "regions": (list, type(None)), "versions": (dict,),
                             "onlinePredictionLogging": (bool, type(None)),
                             "onlinePredictionConsoleLogging": (bool, type(None))}
_VERSION_FIELDS: dict[str, tuple] = {"createTime": _TEXT, "origin": _TEXT,
                                     "description": _TEXT, "labels": (dict, type(None)),
                                     "settings": (dict, type(None))}
MAX_VERSION = 2 ** 63 - 1  # TF Serving's versions are int64


def check(record: Any) -> None:
    """ValueError naming the first field of a model record that is not what the
    commands and the server read: a record edited by hand, or written by something
    else, is refused in one line, never a traceback in `versions list`."""
    if not isinstance(record, dict):
        raise ValueError(f"it holds a JSON {type(record).__name__}, not an object")
    _fields(record, _FIELDS, "its")
    _labels(record.get("labels"), "its labels")
    if not all(isinstance(r, str) for r in record.get("regions") or []):
        raise ValueError("its regions are not all text")
    for name, version in record.get("versions", {}).items():
        where = f"version {name[:40]!r}"
        if not isinstance(version, dict):
            raise ValueError(f"its {where} is not an object")
        number = version.get("number")
        if not (isinstance(number, int) and not isinstance(number, bool)
                and 0 < number <= MAX_VERSION):
            raise ValueError(f"its {where} number {json.dumps(number)[:40]} is not a "
                             f"version number (1..{MAX_VERSION})")
        _fields(version, _VERSION_FIELDS, f"its {where}")
        _labels(version.get("labels"), f"its {where} labels")
        if not all(isinstance(k, str) for k in (version.get("settings") or {})):
            raise ValueError(f"its {where} settings are not named")


def _fields(data: dict, types: dict[str, tuple], where: str) -> None:
    for key, allowed in types.items():
        value = data.get(key)
        if key in data and (not isinstance(value, allowed)
                            or isinstance(value, bool) and bool not in allowed):
            raise ValueError(f"{where} {key} is {json.dumps(value)[:40]}")


def _labels(labels: Any, where: str) -> None:
    if labels and not all(isinstance(k, str) and isinstance(v, str)
                          for k, v in labels.items()):
        raise ValueError(f"{where} are not text")


def encode(record: dict[str, Any]) -> bytes:
    """The record's bytes as `write` writes them (UTF-8 text as it is: a description's
    length in bytes is what it adds)."""
    return json.dumps(record, indent=2, sort_keys=True, ensure_ascii=False).encode()


def write(base_path: str, record: dict[str, Any]) -> None:
    """Write the record (atomically); ValueError, and nothing written, for one that
    `read` would refuse as larger than MAX_BYTES."""
    data = encode(record)
    if len(data) > MAX_BYTES:
        raise ValueError(f"{url(base_path)} would hold {len(data)} bytes, more than the "
                         f"{MAX_BYTES} its readers take")
    storage.write_bytes(url(base_path), data)


def version_labels(record: dict[str, Any] | None) -> dict[str, int]:
    """The labels the server serves: `default` -> the default version's number."""
    if not record:
        return {}
    default = record.get("defaultVersion")
    number = (record.get("versions") or {}).get(default, {}).get("number") \
        if isinstance(default, str) else None
    if isinstance(number, int) and not isinstance(number, bool) and number > 0:
        return {DEFAULT_LABEL: number}
    return {}
