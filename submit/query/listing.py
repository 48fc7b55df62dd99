"""`jobs list --filter --sort-by --limit`: gcloud's forms over the local index.

A filter is gcloud's expression language (`submit.query.filter_expr`): `KEY=VALUE` (states
compare without case), `!=`, `<`, `<=`, `>`, `>=`, `KEY:PATTERN` (`*` matches
anything, as gcloud's `jobId:job1*`; `labels.KEY:*` a label that is set), `~` regular
expressions, joined by spaces, `AND`, `OR`, `NOT` and parentheses. Keys are the record's
fields in gcloud's camelCase or as stored (`jobId`, `state`, `runner`, `scaleTier`,
`jobDir`, `createTime`...) and `labels.KEY`. `--sort-by FIELD` sorts by a field, `~FIELD`
in reverse (`createTime`, `jobId`, `state`, ...); several are comma-separated.
"""
from __future__ import annotations

from typing import Any

from submit.query import filter_expr
from submit.errors import UsageError
from submit.jobs import JobRecord

FIELDS = {"jobId": "job_id", "state": "state", "runner": "runner", "scaleTier": "scale_tier",
          "jobDir": "job_dir", "createTime": "create_time", "startTime": "start_time",
          "endTime": "end_time", "module": "module"}
FIELDS.update({stored: stored for stored in list(FIELDS.values())})


def _value(record: JobRecord, key: str, where: str) -> Any:
    if key.startswith("labels."):
        return record.labels.get(key[len("labels."):])
    if key not in FIELDS:
        raise UsageError(f"{where} names unknown field {key!r}; use one of jobId, state, "
                         "runner, scaleTier, jobDir, createTime or labels.KEY")
    return getattr(record, FIELDS[key])


def _filter_value(record: JobRecord | None, key: str) -> Any:
    if record is None:  # parse time: the key is checked
        _value(JobRecord(""), key, "--filter")
        return None
    return _value(record, key, "--filter")


def select(records: list[JobRecord], *, filter_text: str | None = None,
           sort_by: str | None = None, limit: int | None = None) -> list[JobRecord]:
    """The records that match the filter, sorted, at most `limit` of them."""
    if limit is not None and limit < 1:
        raise UsageError(f"--limit {limit} must be 1 or more")
    if filter_text:
        wanted = filter_expr.parse(filter_text, _filter_value)
        records = [r for r in records if wanted(r)]
    for key in reversed([k.strip() for k in (sort_by or "").split(",") if k.strip()]):
        field = key.lstrip("~")
        _value(JobRecord(""), field, "--sort-by")  # an unknown field is an error
        records = sorted(records, key=lambda r: _sort_key(_value(r, field, "")),
                         reverse=key.startswith("~"))
    return records[:limit] if limit else records


def _sort_key(value: Any) -> tuple:
    """Missing values last; a field's values are all numbers or all strings."""
    return (value is None, 0 if value is None else value)
