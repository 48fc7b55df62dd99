"""The job index's summary: what `jobs list` needs of every record, kept in one file.

Listing 10,000 jobs by reading, parsing and checking 10,000 record files (and looking
for 10,000 `jobs update` label files) takes seconds. The summary,
`$MLJOB_HOME/jobs.summary`, keeps each record's listing fields (its id, state, times,
folders, runner and supervisor) and its current labels, each beside the identity of the
files they came from: inode, size, and modification and change times in nanoseconds of
the record and of its labels file. A listing stats the index folders (one `scandir`
each), reads again only the records whose files changed since, whoever wrote them (the
supervisor, `jobs update`, a hand edit: records are replaced by a rename, which always
gives a new inode), drops the records that are gone, and rewrites the summary when
anything changed. A file's identity is taken before it is read, so a summary can only
hold content newer than the identity beside it: a change in between is read again next
time, never missed.

The summary is a cache: one that is damaged, from another version, or whose digest does
not match its entries is rebuilt from the records (a warning-free fallback), and one that
cannot be written (a read-only MLJOB_HOME) only costs speed. `MLJOB_JOB_INDEX=0` reads
every record instead (the benchmark compares the two side by side).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import stat

from mljob import storage
from submit import jobs
from submit.home import mljob_home

log = logging.getLogger(__name__)
VERSION = 1
FILE = "jobs.summary"
ENV = "MLJOB_JOB_INDEX"
# What `jobs list` reads of a record: its filter and sort keys, the state's supervisor
# check, --uri (the runner and an engine's resource name).
FIELDS = ("job_id", "state", "create_time", "start_time", "end_time", "job_dir",
          "scale_tier", "module", "runner", "supervisor_pid", "supervisor_stamp")


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def summary_path() -> str:
    return os.path.join(mljob_home(), FILE)


def _identity(info: os.stat_result) -> list[int]:
    return [info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


def _scan(folder: str) -> dict[str, os.stat_result]:
    """name -> stat (symlinks followed, as the readers open them) of `*.json` in folder."""
    out: dict[str, os.stat_result] = {}
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return out
    for entry in entries:
        if entry.name.endswith(".json"):
            try:
                out[entry.name] = entry.stat()
            except OSError:
                continue
    return out


def load_summary(path: str) -> dict | None:
    """The entries of a sound summary, or None (missing, damaged, another version)."""
    try:
        with open(path, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            head, _, body = f.read(jobs.MAX_RECORD_BYTES).partition(b"\n")
        header = json.loads(head)
        if not isinstance(header, dict) or header.get("version") != VERSION \
                or header.get("digest") != hashlib.sha256(body).hexdigest():
            return None
        entries = json.loads(body)
    except (OSError, ValueError):
        return None
    return entries if isinstance(entries, dict) else None


def _write_summary(path: str, entries: dict) -> None:
    body = json.dumps(entries, separators=(",", ":"), sort_keys=True).encode()
    header = json.dumps({"version": VERSION, "digest": hashlib.sha256(body).hexdigest()})
    try:
        storage.write_bytes(path, header.encode() + b"\n" + body)
    except (OSError, storage.StorageError) as exc:  # a cache: only speed is lost
        log.debug("cannot write the job index summary %s: %s", path, exc)


def _light(record: jobs.JobRecord, labels: dict[str, str]) -> dict:
    data = {key: getattr(record, key) for key in FIELDS}
    data["labels"] = labels
    data["engine"] = {k: v for k, v in record.engine.items() if k in ("name", "region")}
    return data


def _record(light: dict) -> jobs.JobRecord:
    """TypeError or ValueError for an entry the record checks would refuse."""
    jobs.check_record(light)
    return jobs.JobRecord(**light)


def summaries() -> list[jobs.JobRecord]:
    """Every record in the index, oldest first, with its current labels and only its listing
    fields (`jobs.load` gives the whole record). Damaged
    records are skipped with one warning each, as `jobs.list_all` does."""
    from submit import resource
    home = mljob_home()
    folder = os.path.join(home, "jobs")
    if not enabled():
        return [resource.with_current_labels(r) for r in jobs.list_all()]
    path = summary_path()
    old = load_summary(path)
    changed = old is None
    old = old or {}
    files = _scan(folder)
    label_files = _scan(os.path.join(home, "labels"))
    entries: dict[str, dict] = {}
    out: list[jobs.JobRecord] = []
    for name in sorted(files):
        info = files[name]
        ident = _identity(info)
        labels_info = label_files.get(name)
        labels_ident = _identity(labels_info) if labels_info is not None else None
        entry = old.get(name)
        if not (isinstance(entry, dict) and entry.get("file") == ident
                and entry.get("labels_file") == labels_ident):
            entry = _read_entry(folder, name, info, ident, labels_ident)
            changed = True
        entries[name] = entry
        if entry.get("damaged"):
            log.warning("skipping the damaged job record %s (%s); remove it",
                        os.path.join(folder, name), entry["damaged"])
            continue
        try:
            out.append(_record(entry["record"]))
        except (TypeError, KeyError, ValueError):  # not of our making: read the file
            entries[name] = entry = _read_entry(folder, name, info, ident, labels_ident)
            changed = True
            if entry.get("record") is not None:
                out.append(_record(entry["record"]))
    if changed or len(entries) != len(old):
        _write_summary(path, entries)
    return sorted(out, key=lambda r: r.create_time)


def _read_entry(folder: str, name: str, info: os.stat_result, ident: list[int],
                labels_ident: list[int] | None) -> dict:
    from submit import resource
    path = os.path.join(folder, name)
    entry: dict = {"file": ident, "labels_file": labels_ident}
    if not stat.S_ISREG(info.st_mode):
        return {**entry, "damaged": "it is not a regular file"}
    try:
        record = jobs.JobRecord.from_json(jobs._read_regular(path))
        if f"{record.job_id}.json" != name:
            raise ValueError(f"it names job {record.job_id!r:.40}")
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        return {**entry, "damaged": jobs._why(exc)}
    return {**entry, "record": _light(record, resource.current_labels(record))}
