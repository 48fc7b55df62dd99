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
    record = json.loads(data)
    if not isinstance(record, dict) or not isinstance(record.get("versions", {}), dict):
        raise ValueError(f"{url(base_path)} is not a model record")
    return record


def write(base_path: str, record: dict[str, Any]) -> None:
    storage.write_bytes(url(base_path), json.dumps(record, indent=2, sort_keys=True)
                        .encode())


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
