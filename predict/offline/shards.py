"""Shards of a batch prediction's input: whole files, and byte ranges of large text files.

A shard is what one worker predicts into one `prediction.results-0000i-of-0000N` and
`prediction.errors_stats-0000i-of-0000N` pair. TFRecord files (plain or gzip) are whole
shards: their framing can only be followed from the start. A text file larger than
`split_bytes` is cut into ranges of about that size; a range [start, end) holds every
line that *starts* in it (the first line starting at or after `start`, up to the last
line starting before `end`), so a line cut by a boundary belongs to the range it starts
in and every line is read exactly once.

Reading a shard yields (label, instance thunk): `line N` for a whole file, `offset N`
(the line's first byte) for a range, where the line number is not known without reading
everything before it.
"""
from __future__ import annotations

import dataclasses
import gzip
import os
import zlib

from mljob import storage
from mljob.errors import first_line
from predict.runtime import instances, records
from predict.errors import InstanceError, UsageError

DATA_FORMATS = ("text", "tf-record", "tf-record-gzip")
# Text files above this are cut into ranges (overridden by MLJOB_PREDICTION_SPLIT_BYTES).
SPLIT_BYTES = 16 * 1024 * 1024
SPLIT_ENV = "MLJOB_PREDICTION_SPLIT_BYTES"


@dataclasses.dataclass(frozen=True)
class Shard:
    url: str
    data_format: str
    start: int = 0
    end: int | None = None      # None: to the end of the file
    size: int = 0               # bytes this shard reads (for progress)

    @property
    def ranged(self) -> bool:
        return self.start > 0 or self.end is not None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Shard":
        return cls(**data)


def split_bytes() -> int:
    text = os.environ.get(SPLIT_ENV)
    if text is None:
        return SPLIT_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(f"{SPLIT_ENV}={text!r:.40} is not a positive byte count; unset "
                         "it or give e.g. 16777216")
    return value


def plan(files: list, data_format: str, *, parts: int = 1,
         split: int | None = None) -> list[Shard]:
    """Shards for the sorted input files. A text file is cut into ranges of at least
    `split` bytes, into no more ranges than `parts` * 4 over all files (enough for
    parts workers to share one big file evenly)."""
    if data_format not in DATA_FORMATS:
        raise UsageError(f"--data-format {data_format!r:.40} is not one of "
                         f"{', '.join(DATA_FORMATS)}")
    split = split or split_bytes()
    sizes = [_size(url) for url in files]
    total = sum(sizes)
    target = max(split, -(-total // max(1, parts * 4)))
    shards = []
    for url, size in zip(files, sizes, strict=True):
        if data_format != "text" or size <= target:
            shards.append(Shard(url, data_format, size=size))
            continue
        count = -(-size // target)
        edges = [size * i // count for i in range(count + 1)]
        shards += [Shard(url, data_format, start=a, end=None if b == size else b,
                         size=b - a) for a, b in zip(edges, edges[1:], strict=False)]
    return shards


def _size(url: str) -> int:
    fs, path = storage.filesystem(url)
    try:
        return int(storage.retry(lambda: fs.size(path), f"read the size of {url}") or 0)
    except FileNotFoundError:
        raise UsageError(f"input file {url} disappeared; check --input-paths") from None


class _Counted:
    """A binary file whose reads are counted (`position`), and whose gzip or zlib
    damage becomes a CorruptRecordError naming it."""

    def __init__(self, f, raw=None):
        self.f = f
        self.raw = raw if raw is not None else f

    @property
    def position(self) -> int:
        try:
            return int(self.raw.tell())
        except (OSError, ValueError):
            return 0

    def read(self, n: int = -1) -> bytes:
        try:
            return self.f.read(n)
        except (OSError, EOFError, zlib.error) as exc:
            if isinstance(exc, storage.StorageError):
                raise
            raise records.CorruptRecordError(
                f"damaged gzip data ({first_line(exc)}); the rest of the file was "
                "skipped; check that the file is gzip-compressed TFRecords "
                "(--data-format tf-record for plain ones)") from None


class Reader:
    """Reads one shard: iterate for (label, raw instance or thunk); `position` is how
    many bytes of the shard's file have been consumed (for progress)."""

    def __init__(self, shard: Shard, sig):
        self.shard = shard
        self.sig = sig
        self.consumed = 0

    def __iter__(self):
        shard = self.shard
        try:
            f = storage.open_input(shard.url)
        except storage.StorageError as exc:  # a device, pipe or link loop the glob matched
            raise UsageError(first_line(exc)) from None
        with f:
            if shard.data_format == "text":
                yield from self._text(f)
                return
            counted = (_Counted(gzip.GzipFile(fileobj=f, mode="rb"), raw=f)
                       if shard.data_format == "tf-record-gzip" else _Counted(f))
            number = 0
            try:
                for number, record in enumerate(records.read_tfrecords(counted), start=1):
                    self.consumed = counted.position
                    yield f"record {number}", (lambda r=record: records.to_instance(r,
                                                                                   self.sig))
            except records.CorruptRecordError as exc:
                yield f"record {number + 1}", (lambda e=exc: _raise(e))
            self.consumed = counted.position

    def _text(self, f):
        shard = self.shard
        offset = 0
        lines = lines_of(f, instances.MAX_LINE_BYTES)
        if shard.start > 0:
            f.seek(shard.start - 1)
            offset = shard.start - 1
            first = next(lines, b"")  # the end of the line the range starts inside
            if first is None:         # ... too long to find: that range reports it
                return
            offset += len(first)
        number = 0
        for raw in lines:
            if shard.end is not None and offset >= shard.end:
                return
            number += 1
            label = f"offset {offset}" if shard.ranged else f"line {number}"
            if raw is None:
                yield label, (lambda: _raise(line_too_long(shard.ranged)))
                return
            offset += len(raw)
            self.consumed = offset - shard.start
            yield label, (lambda b=raw: json_line(b))


def lines_of(f, limit: int, chunk_size: int = 1 << 20):
    """Each line's bytes (newline kept), or None for a line longer than `limit`, after
    which nothing more is read (fsspec's files have no readline(size))."""
    buffer = b""
    while True:
        chunk = f.read(chunk_size)
        buffer += chunk
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            if end - start >= limit:
                yield None
                return
            yield buffer[start:end + 1]
            start = end + 1
        buffer = buffer[start:]
        if len(buffer) > limit:
            yield None
            return
        if not chunk:
            if buffer:
                yield buffer
            return


def line_too_long(ranged: bool = False) -> InstanceError:
    rest = "shard" if ranged else "file"
    return InstanceError(f"line longer than {instances.MAX_LINE_BYTES} bytes; the rest of "
                         f"the {rest} was skipped (one instance a line)")


def json_line(raw: bytes):
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InstanceError("not valid UTF-8 text") from None
    return instances.parse_json(text.rstrip("\r\n"))


def _raise(exc: Exception):
    raise exc


__all__ = ["DATA_FORMATS", "Shard", "Reader", "plan", "split_bytes", "lines_of",
           "json_line", "line_too_long"]
