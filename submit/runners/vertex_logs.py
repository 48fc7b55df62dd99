"""Reading a Vertex AI job's replica logs from Cloud Logging, as `gcloud ai custom-jobs
stream-logs` does: `entries:list` over REST with Application Default Credentials, or,
with MLJOB_LOGGING_API_ENDPOINT set (e.g. http://127.0.0.1:PORT), anonymously at that
endpoint (the tests point it at a recording HTTP endpoint). Rendering and creating the
job is `submit.runners.vertex`."""
from __future__ import annotations

import calendar
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import google.auth
import requests
from google.auth.credentials import AnonymousCredentials, Credentials
from google.auth.transport.requests import AuthorizedSession

from mljob import contracts
from submit import logs
from submit.errors import SubmitError, UsageError
from submit.runners.google_api import CALL_TIMEOUT_S, FIXES, api_errors, one_line

LOGGING_ENDPOINT_ENV = "MLJOB_LOGGING_API_ENDPOINT"
LOGGING_API = "https://logging.googleapis.com"
LOG_LAG_S = 5.0
POOLS = contracts.VERTEX_POOL_TYPES  # Vertex's pool index per replica type


def read(handle: Mapping[str, Any], *, task_name: str | None, follow: bool,
         ended_now: Callable[[], bool], poll_s: float) -> Iterator[str]:
    """Replica logs from Cloud Logging, as `gcloud ai custom-jobs stream-logs` reads
    them: resource type ml_job, the job's numeric id, one replica by its task name.
    Following polls from the last entry seen until the job has ended and a read finds
    nothing new (Logging may receive the last lines after the job ends); while the job
    runs, the last LOG_LAG_S seconds are left for the next read, as gcloud does, so
    that an entry that arrives late is not passed over. `ended_now()` asks the engine
    whether the job has ended."""
    job_id = handle["name"].rsplit("/", 1)[-1]
    filters = ['resource.type="ml_job"', f'resource.labels.job_id="{job_id}"']
    if task_name:
        filters.append(f'resource.labels.task_name="{vertex_task_name(task_name)}"')
    session, url = _logging_session()
    position = _Position()
    ended = False
    while True:
        if follow and not ended:
            ended = ended_now()
        window = [] if ended or not follow else \
            [f'timestamp<"{_rfc3339(time.time() - LOG_LAG_S)}"']
        new = 0
        for entry in _entries(session, url, handle, filters + position.bounds() + window):
            if position.advance(entry):
                new += 1
                yield from _format(entry)
        if not follow or (ended and not new):
            return
        time.sleep(poll_s)


def vertex_task_name(label: str) -> str:
    """`master-replica-0` -> `workerpool0-0` (Vertex's names pass through)."""
    if re.fullmatch(r"workerpool[0-3]-[0-9]+|service", label):
        return label
    parsed = contracts.parse_label(label)
    if parsed is None:
        raise UsageError(f"--task-name {label!r} names no replica; use "
                         f"{contracts.LABEL_HINT}")
    return f"workerpool{contracts.vertex_pool(parsed[0])}-{parsed[1]}"


def replica_label(task_name: str) -> str:
    """`workerpool1-3` -> `worker-replica-3`, as Cloud ML labelled replicas."""
    match = re.fullmatch(r"workerpool([0-3])-([0-9]+)", task_name)
    return contracts.replica_label(POOLS[int(match[1])], match[2]) if match else task_name


def _logging_session() -> tuple[AuthorizedSession, str]:
    endpoint = os.environ.get(LOGGING_ENDPOINT_ENV)
    credentials: Credentials
    if endpoint:
        credentials = AnonymousCredentials()
    else:
        with api_errors("read the job's logs", {}):
            credentials, _ = google.auth.default(
                scopes=["https://www.googleapis.com/auth/logging.read"])
    return AuthorizedSession(credentials), f"{(endpoint or LOGGING_API).rstrip('/')}" \
                                           "/v2/entries:list"


def _entries(session: AuthorizedSession, url: str, handle: Mapping[str, Any],
             filters: list[str]) -> Iterator[dict]:
    body: dict[str, Any] = {"resourceNames": [f"projects/{handle['project']}"],
                            "filter": " AND ".join(filters), "orderBy": "timestamp asc",
                            "pageSize": 1000}
    while True:
        with api_errors(f"read the logs of job {handle.get('display_name')}", handle):
            response = session.post(url, json=body, timeout=CALL_TIMEOUT_S)
        if response.status_code >= 400:
            raise SubmitError(f"Cloud Logging refused to read the logs of job "
                              f"{handle.get('display_name')}: {response.status_code} "
                              f"{_logging_error(response)}; "
                              f"{FIXES.get(response.status_code, 'try again later')}")
        page = response.json()
        yield from page.get("entries", ())
        if not page.get("nextPageToken"):
            return
        body["pageToken"] = page["nextPageToken"]


def _logging_error(response: requests.Response) -> str:
    try:
        return one_line(str(response.json()["error"]["message"]))[:300]
    except (ValueError, KeyError, TypeError):
        return one_line(response.text)[:300] or response.reason


class _Position:
    """The last entry read (timestamp, insertId): reads ask only for later entries, and
    entries at or before it (a page read twice) are skipped."""

    def __init__(self) -> None:
        self.key: tuple[str, str] | None = None

    def bounds(self) -> list[str]:
        if self.key is None:
            return []
        stamp, insert_id = self.key
        return [f'(timestamp>"{stamp}" OR (timestamp="{stamp}" AND '
                f'insertId>"{insert_id}"))']

    def advance(self, entry: Mapping[str, Any]) -> bool:
        key = (_timestamp(entry.get("timestamp", "")), str(entry.get("insertId", "")))
        if self.key is not None and key <= self.key:
            return False
        self.key = key
        return True


def _rfc3339(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(when)) + \
        f".{int(when % 1 * 1e9):09d}Z"


def _timestamp(stamp: str) -> str:
    """RFC 3339 in UTC with nine fraction digits, so that string order is time order."""
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z", stamp,
                         re.ASCII)
    return f"{match[1]}.{(match[2] or '').ljust(9, '0')}Z" if match else stamp


def _format(entry: Mapping[str, Any]) -> Iterator[str]:
    task = (entry.get("resource", {}).get("labels", {}).get("task_name")
            or entry.get("labels", {}).get("ml.googleapis.com/task_name") or "service")
    payload = entry.get("jsonPayload")
    text = str(payload.get("message") or "") if isinstance(payload, dict) \
        else str(entry.get("textPayload") or "")
    severity = entry.get("severity") or "DEFAULT"
    severity = "INFO" if severity == "DEFAULT" else severity   # as the local runner's
    stamp = entry.get("timestamp", "")
    when = calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) \
        if re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", stamp, re.ASCII) else None
    for line in text.splitlines() or [""]:
        yield logs.format_line(replica_label(task), line, severity, when)
