"""`predict batch`: Cloud ML batch prediction over files on any fsspec filesystem.

Every input file is streamed in batches; an instance that does not fit the signature
(or whose batch the model refuses) is written to the errors file with its file, line
and reason, and the others go on. Input file i (of N, sorted) gives
`prediction.results-0000i-of-0000N` and `prediction.errors_stats-0000i-of-0000N`.

Publishing: the files are written to a local scratch folder and appear in the output
path only when finished: renamed into place for a local output path (the scratch
folder is inside it, so the rename is atomic), uploaded whole for object stores (an
object appears whole or not at all). An output path that already holds predictions is
refused rather than mixed with new ones.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import tempfile
import uuid
from dataclasses import dataclass

from predict.runtime import decode, loop
from predict.offline import shards
from predict.errors import InstanceError, UsageError
from predict.runtime.model import Model
from mljob import storage
from mljob.errors import first_line


@dataclass
class Summary:
    instances: int = 0
    predicted: int = 0
    failed: int = 0

    def line(self) -> str:
        return f"{self.instances} instances: {self.predicted} predicted, {self.failed} failed"


def expand_inputs(patterns: str) -> list:
    """Sorted URLs matching a glob or comma-separated globs; none matching is an error."""
    found = []
    for pattern in [p.strip() for p in patterns.split(",") if p.strip()]:
        fs, path = storage.filesystem(pattern)
        matches = storage.retry(functools.partial(fs.glob, path), f"list {pattern}")
        matches = [m for m in matches if not fs.isdir(m)]
        found += [fs.unstrip_protocol(m) if "file" not in _protocols(fs) else m
                  for m in sorted(matches)]
    if not found:
        raise UsageError(f"no input file matched --input-paths {patterns}; check the glob")
    return sorted(dict.fromkeys(found))


def run(model: Model, files: list, data_format: str, output_path: str, *,
        batch_size: int = 64, signature_name: str | None = None,
        progress=None) -> Summary:
    sig = model.signature(signature_name)
    _refuse_existing(output_path)
    local_out = storage.is_local(output_path)
    if local_out:
        final_dir = storage.local_path(output_path)
        try:
            os.makedirs(final_dir, exist_ok=True)
        except OSError as exc:  # a file on the way, or no permission
            raise UsageError(f"cannot create --output-path {output_path}: "
                             f"{exc.strerror}; name a folder you can write") from None
        scratch = os.path.join(final_dir, f".prediction-tmp-{uuid.uuid4().hex[:8]}")
        os.makedirs(scratch)
    else:
        scratch = tempfile.mkdtemp(prefix="mljob-batch-")
    progress = progress if progress is not None else _Progress(sys.stderr)
    summary = Summary()
    try:
        names = []
        for index, url in enumerate(files):
            shard = f"{index:05d}-of-{len(files):05d}"
            results, errors = f"prediction.results-{shard}", f"prediction.errors_stats-{shard}"
            with open(os.path.join(scratch, results), "w") as res, \
                    open(os.path.join(scratch, errors), "w") as err:
                predict_shard(model, sig, shards.Reader(shards.Shard(url, data_format), sig),
                              batch_size, res, err, summary, progress)
            names += [results, errors]
        progress.done()
        for name in names:
            src = os.path.join(scratch, name)
            if local_out:
                os.replace(src, os.path.join(final_dir, name))
            else:
                storage.upload_file(src, storage.join(output_path, name))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return summary


def predict_shard(model, sig, reader: shards.Reader, batch_size, res, err, summary,
                  progress=None):
    """Predict one shard's instances into the open results and errors files."""
    url = reader.shard.url
    pending: list = []  # (label, decoded instance)

    def fail(label, reason):
        kind, number = label.split()
        err.write(json.dumps({"input": url, kind: int(number), "error": reason}) + "\n")
        summary.failed += 1

    def flush():
        if not pending:
            return
        try:
            rows = loop.predict_rows(model, [d for _, d in pending], sig)
        except Exception as exc:  # the model refused this batch only
            reason = f"the model failed on this batch: {first_line(exc)}"
            for label, _ in pending:
                fail(label, reason)
        else:
            for row in rows:
                res.write(json.dumps(row) + "\n")
            summary.predicted += len(pending)
        pending.clear()
        if progress is not None:
            progress.update(summary)

    for label, raw in reader:
        summary.instances += 1
        try:
            value = raw() if callable(raw) else raw
            pending.append((label, decode.decode_instance(value, sig)))
        except InstanceError as exc:
            fail(label, str(exc))
        if len(pending) >= batch_size:
            flush()
    flush()


class _Progress:
    """A one-line counter on stderr, only when stderr is a terminal."""

    def __init__(self, stream):
        self.stream = stream
        self.active = stream.isatty()

    def update(self, summary: Summary) -> None:
        if self.active:
            self.stream.write(f"\r{summary.line()}")
            self.stream.flush()

    def done(self) -> None:
        if self.active:
            self.stream.write("\n")


def _refuse_existing(output_path: str) -> None:
    fs, path = storage.filesystem(output_path)
    if storage.retry(lambda: fs.isfile(path), f"check {output_path}"):
        raise UsageError(f"--output-path {output_path} is a file; batch prediction writes "
                         "a folder of results, name a new or empty folder")
    try:
        existing = storage.retry(lambda: fs.glob(f"{path.rstrip('/')}/prediction.*"),
                                 f"list {output_path}")
    except FileNotFoundError:
        return
    if existing:
        raise UsageError(f"{output_path} already holds predictions "
                         f"({os.path.basename(existing[0])}); choose an empty --output-path")


def _protocols(fs) -> tuple:
    return fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)


__all__ = ["Summary", "expand_inputs", "predict_shard", "run"]
