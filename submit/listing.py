"""`jobs list --filter --sort-by --limit`: gcloud's simple forms over the local index.

A filter is terms joined by spaces or `AND`, each `KEY=VALUE` (equal; states compare
without case) or `KEY:PATTERN` (`*` matches anything, as gcloud's `jobId:job1*`). Keys
are the record's fields in gcloud's camelCase or as stored (`jobId`, `state`, `runner`,
`scaleTier`, `jobDir`) and `labels.KEY`. `--sort-by FIELD` sorts by a field, `~FIELD`
in reverse (`createTime`, `jobId`, `state`, ...); several are comma-separated.
"""
from __future__ import annotations

import fnmatch
import re
from typing import Any

from submit.errors import UsageError
from submit.jobs import JobRecord

FIELDS = {"jobId": "job_id", "state": "state", "runner": "runner", "scaleTier": "scale_tier",
          "jobDir": "job_dir", "createTime": "create_time", "startTime": "start_time",
          "endTime": "end_time", "module": "module"}
FIELDS.update({stored: stored for stored in list(FIELDS.values())})
_TERM = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\.[a-z][a-z0-9_-]*)?)(=|:)(.*)")


def _value(record: JobRecord, key: str, where: str) -> Any:
    if key.startswith("labels."):
        return record.labels.get(key[len("labels."):])
    if key not in FIELDS:
        raise UsageError(f"{where} names unknown field {key!r}; use one of jobId, state, "
                         "runner, scaleTier, jobDir, createTime or labels.KEY")
    return getattr(record, FIELDS[key])


def _terms(text: str) -> list[tuple[str, str, str]]:
    terms: list[tuple[str, str, str]] = []
    for word in re.split(r"\s+(?:AND\s+)?", text.strip()):
        match = _TERM.fullmatch(word)
        if not match:
            raise UsageError(f"--filter {word!r:.60} is not KEY=VALUE or KEY:PATTERN; write "
                             "e.g. --filter 'state=RUNNING labels.team=vision'")
        terms.append((match[1], match[2], match[3]))
    return terms


def _matches(record: JobRecord, key: str, op: str, wanted: str) -> bool:
    value = _value(record, key, "--filter")
    if value is None:
        return False
    value = str(value)
    if key == "state":
        value, wanted = value.upper(), wanted.upper()
    return value == wanted if op == "=" else fnmatch.fnmatchcase(value, wanted)


def select(records: list[JobRecord], *, filter_text: str | None = None,
           sort_by: str | None = None, limit: int | None = None) -> list[JobRecord]:
    """The records that match the filter, sorted, at most `limit` of them."""
    if limit is not None and limit < 1:
        raise UsageError(f"--limit {limit} must be 1 or more")
    if filter_text:
        terms = _terms(filter_text)
        records = [r for r in records if all(_matches(r, *t) for t in terms)]
    for key in reversed([k.strip() for k in (sort_by or "").split(",") if k.strip()]):
        field = key.lstrip("~")
        _value(JobRecord(""), field, "--sort-by")  # an unknown field is an error
        records = sorted(records, key=lambda r: _sort_key(_value(r, field, "")),
                         reverse=key.startswith("~"))
    return records[:limit] if limit else records


def _sort_key(value: Any) -> tuple:
    """Missing values last; a field's values are all numbers or all strings."""
    return (value is None, 0 if value is None else value)
