"""predict.offline.shards: byte ranges of text files hold every line exactly once, wherever the
boundaries fall; TFRecord files are whole shards; labels name the line or its offset."""
import gzip
import json
import random

import pytest

from predict.runtime import records
from predict.offline import shards
from predict.errors import InstanceError, UsageError


def read_all(shard_list):
    got = []
    for shard in shard_list:
        for label, thunk in shards.Reader(shard, None):
            try:
                got.append((label, thunk()))
            except InstanceError as exc:
                got.append((label, f"error: {exc}"))
    return got


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize("trailing", [True, False])
def test_every_line_once_for_every_split(tmp_path, newline, trailing):
    rng = random.Random(5)
    values = [{"k": i, "pad": "x" * rng.randrange(0, 40)} for i in range(60)]
    text = newline.join(json.dumps(v) for v in values) + (newline if trailing else "")
    path = tmp_path / "a.json"
    path.write_text(text, newline="")
    size = len(text.encode())
    for split in (1, 2, 3, 7, 31, 64, 100, 999, size - 1, size, size + 1):
        planned = shards.plan([str(path)], "text", parts=1000, split=split)
        assert sum(s.size for s in planned) == size
        assert [s.start for s in planned] == sorted(s.start for s in planned)
        got = read_all(planned)
        assert [v for _, v in got] == values, split
        if len(planned) > 1:  # ranged labels are byte offsets of the line's start
            for label, value in got:
                kind, offset = label.split()
                assert kind == "offset"
                assert text.encode()[int(offset):].startswith(json.dumps(value).encode())


def test_whole_files_label_lines_and_empty_file_has_no_instances(tmp_path):
    (tmp_path / "a.json").write_text('{"k": 1}\n\n{"k": 2}\n')
    (tmp_path / "b.json").write_text("")
    planned = shards.plan([str(tmp_path / "a.json"), str(tmp_path / "b.json")], "text")
    assert len(planned) == 2 and not any(s.ranged for s in planned)
    got = read_all(planned)
    assert got == [("line 1", {"k": 1}),
                   ("line 2", "error: empty line; every line must hold one instance"),
                   ("line 3", {"k": 2})]


def test_parts_cut_one_big_file_for_many_workers(tmp_path):
    path = tmp_path / "big.json"
    path.write_text("".join(json.dumps({"k": i}) + "\n" for i in range(2000)))
    size = path.stat().st_size
    assert len(shards.plan([str(path)], "text", parts=1, split=size)) == 1
    four = shards.plan([str(path)], "text", parts=4, split=1000)
    assert len(four) == 16  # parts x 4, so a slow range does not hold the job back
    assert [v["k"] for _, v in read_all(four)] == list(range(2000))


def test_tfrecords_are_whole_shards_and_gzip_damage_is_one_error(tmp_path):
    payloads = [json.dumps({"k": i}).encode() for i in range(5)]
    with gzip.open(tmp_path / "a.gz", "wb") as f:
        records.write_tfrecords(f, payloads)
    with open(tmp_path / "b.tfrecord", "wb") as f:
        records.write_tfrecords(f, payloads)
    planned = shards.plan([str(tmp_path / "a.gz")], "tf-record-gzip", parts=8, split=1)
    assert len(planned) == 1 and not planned[0].ranged
    assert [v for _, v in read_all(planned)] == [{"k": i} for i in range(5)]
    plain = shards.plan([str(tmp_path / "b.tfrecord")], "tf-record")
    assert [v for _, v in read_all(plain)] == [{"k": i} for i in range(5)]
    as_gzip = shards.plan([str(tmp_path / "b.tfrecord")], "tf-record-gzip")
    assert read_all(as_gzip) == [("record 1", "error: damaged gzip data (Not a gzipped "
                                  "file (b'\\x08\\x00')); the rest of the file was skipped; "
                                  "check that the file is gzip-compressed TFRecords "
                                  "(--data-format tf-record for plain ones)")]


def test_split_size_from_the_environment_is_checked(monkeypatch):
    monkeypatch.setenv(shards.SPLIT_ENV, "0")
    with pytest.raises(UsageError, match="not a positive byte count"):
        shards.split_bytes()
    monkeypatch.setenv(shards.SPLIT_ENV, "12")
    assert shards.split_bytes() == 12
