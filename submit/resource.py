"""A job record as Cloud ML's Job resource, the shape `gcloud ai-platform jobs describe`
prints and `--format json | jq` pipelines read.

camelCase keys, RFC 3339 times, int64 fields as strings (as the REST API writes them),
`trainingOutput` with a tuning job's trials best first. What Cloud ML's Job has no field
for (the runner, replicas with their PIDs, exit codes and restarts, log paths, the
engine's handle) lives under the one key `mljob`.

Labels changed by `jobs update` while a local job's supervisor owns its record are kept
beside the index (`$MLJOB_HOME/labels/<job-id>.json`) and win over the record's.
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime
import hashlib
import json
import os
import re
from collections.abc import Iterator
from typing import Any

from mljob import storage
from submit import jobs as records
from submit.home import exclusive, mljob_home
from submit.jobdef.spellings import INT64_KEYS

OWN_KEY = "mljob"
REPLICA_CONFIG_KEYS = ("masterConfig", "workerConfig", "parameterServerConfig",
                       "evaluatorConfig")


def rfc3339(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


def camel(name: str) -> str:
    return re.sub(r"_([a-z0-9])", lambda m: m[1].upper(), name)


def _camel_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {camel(k) if isinstance(k, str) else k: _camel_keys(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_camel_keys(v) for v in value]
    return value


def training_input(ti: dict[str, Any], package_url: str | None) -> dict[str, Any]:
    """trainingInput as the REST API writes it: int64 counts as strings."""
    out = json.loads(json.dumps(ti))  # a deep copy of JSON values
    for key in INT64_KEYS:
        if isinstance(out.get(key), int) and not isinstance(out[key], bool):
            out[key] = str(out[key])
    for key in REPLICA_CONFIG_KEYS:
        accel = (out.get(key) or {}).get("acceleratorConfig")
        if isinstance(accel, dict) and isinstance(accel.get("count"), int):
            accel["count"] = str(accel["count"])
    if package_url and not out.get("packageUris"):
        out["packageUris"] = [package_url]
    return out


def labels_path(job_id: str) -> str:
    records.index_path(job_id)  # checks the id
    return os.path.join(mljob_home(), "labels", f"{job_id}.json")


def current_labels(record: records.JobRecord) -> dict[str, str]:
    """The job's labels: `jobs update`'s, when it changed them, else the record's."""
    try:  # storage's reader: a named pipe or device here is refused, never opened
        labels = json.loads(storage.read_bytes(labels_path(record.job_id), limit=64 * 1024))
    except (OSError, ValueError, storage.StorageError):
        return dict(record.labels)
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                               for k, v in labels.items()):
        return dict(record.labels)
    return labels


def with_current_labels(record: records.JobRecord) -> records.JobRecord:
    return dataclasses.replace(record, labels=current_labels(record))


def job(record: records.JobRecord, state: str | None = None) -> dict[str, Any]:
    """Cloud ML's Job for a record (None fields left out, as the API leaves them)."""
    out: dict[str, Any] = {
        "jobId": record.job_id,
        "labels": current_labels(record),
        "createTime": rfc3339(record.create_time),
        "startTime": rfc3339(record.start_time),
        "endTime": rfc3339(record.end_time),
        "state": state or record.state,
        "errorMessage": record.error_message,
    }
    prediction_input = getattr(record, "prediction_input", None)
    if prediction_input:
        out["predictionInput"] = _camel_keys(dict(prediction_input))
        out["predictionOutput"] = _camel_keys(dict(getattr(record, "prediction_output",
                                                           None) or {}))
    else:
        out["trainingInput"] = training_input(record.training_input, record.package_url)
        output = dict(record.training_output)
        if output.get("trials") is not None:
            output.setdefault("isHyperparameterTuningJob", True)
            output.setdefault("completedTrialCount", str(sum(
                1 for t in output["trials"] if t.get("state") == "SUCCEEDED")))
        out["trainingOutput"] = output
    out["etag"] = etag(out)
    out[OWN_KEY] = own_fields(record)
    return {k: v for k, v in out.items() if v is not None}


def etag(job_fields: dict[str, Any]) -> str:
    """Cloud ML's etag: base64 bytes that change whenever the job does (its state,
    labels, end or error), so `jobs update --etag` can refuse to change a job that
    changed since it was read."""
    seen = {k: job_fields.get(k) for k in ("jobId", "state", "labels", "endTime",
                                           "errorMessage", "createTime")}
    digest = hashlib.sha256(json.dumps(seen, sort_keys=True).encode()).digest()
    return base64.b64encode(digest[:8]).decode()


def own_fields(record: records.JobRecord) -> dict[str, Any]:
    """What Cloud ML's Job has no field for, in camelCase."""
    data = dataclasses.asdict(record)
    for key in ("job_id", "labels", "create_time", "start_time", "end_time", "state",
                "error_message", "training_input", "training_output", "prediction_input",
                "prediction_output", "supervisor_stamp", "supervisor_create_time"):
        data.pop(key, None)
    for replica in data.get("replicas", []):
        replica.pop("stamp", None)  # start ticks and command lines: the supervisor's
    data["recordUrl"] = (records.record_url(record.job_dir, record.job_id)
                         if record.job_dir else records.index_path(record.job_id))
    if not record.done and record.supervisor_pid and not record.supervisor_alive():
        data["supervisorGone"] = True  # `jobs cancel` cleans up
    return {k: v for k, v in _camel_keys(data).items() if v not in (None, [], {})}


def uri(record: records.JobRecord) -> str:
    """`jobs list --uri`: where the job's record is (an engine's job: its resource)."""
    name = record.engine.get("name") if record.runner == "vertex" else None
    if name and record.engine.get("region"):
        return f"https://{record.engine['region']}-aiplatform.googleapis.com/v1/{name}"
    if record.job_dir:
        url = records.record_url(record.job_dir, record.job_id)
        return url if "://" in url else "file://" + url
    return "file://" + records.index_path(record.job_id)


@contextlib.contextmanager
def labels_lock(job_id: str) -> Iterator[None]:
    """Held while `jobs update` reads the job, compares its etag and writes its labels:
    two updates of one job take turns, so an etag is a compare-and-set and no update's
    labels are lost to another's read-change-write."""
    with exclusive(labels_path(job_id)[:-len(".json")] + ".lock"):
        yield


def save_labels(record: records.JobRecord, labels: dict[str, str]) -> None:
    """Keep `jobs update`'s labels beside the index (atomically)."""
    storage.write_bytes(labels_path(record.job_id),
                        json.dumps(labels, sort_keys=True).encode())


# Cloud ML's REST JSON writes int64 fields as strings and a trial's hyperparameters as
# text; the Python API gives them as numbers (what Vertex's SDK gives in Python)
COUNT_KEYS = frozenset({*INT64_KEYS, "count", "completedTrialCount", "trainingStep",
                        "predictionCount", "errorCount", "maxTrials", "maxParallelTrials",
                        "maxFailedTrials"})
_INT = re.compile(r"-?[0-9]{1,18}")
_NUMBER = re.compile(r"-?([0-9]{1,40}\.?[0-9]{0,40}|\.[0-9]{1,40})([eE][-+]?[0-9]{1,3})?")


def with_numbers(value: Any, key: str = "") -> Any:
    """A resource with its counts (`COUNT_KEYS`: replica counts, trial counts,
    `trainingStep`, prediction counts) and its trials' numeric hyperparameters as
    numbers; ids, names, times and categorical values stay text."""
    if isinstance(value, dict):
        if key == "hyperparameters":
            return {k: _number(v) for k, v in value.items()}
        return {k: with_numbers(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [with_numbers(v, key) for v in value]
    if key in COUNT_KEYS and isinstance(value, str) and _INT.fullmatch(value):
        return int(value)
    return value


def _number(value: Any) -> Any:
    """A hyperparameter's text as the number it spells (an int when it is whole
    digits), else as it is."""
    if not isinstance(value, str) or not _NUMBER.fullmatch(value):
        return value
    return int(value) if _INT.fullmatch(value) else float(value)
