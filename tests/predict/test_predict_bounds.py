"""The predictor's readers of user files are bounded: a TFRecord length field in the
exabytes, an endless device or a named pipe as input, a line that never ends."""
from __future__ import annotations

import io
import json
import os
import struct

import pytest

from predict.runtime import instances, records
from predict.__main__ import main
from tests.support.predict_models import images, instance_lines, saved_model_export


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    return saved_model_export(str(tmp_path_factory.mktemp("exports") / "model"))


def _huge_record_header(length: int) -> bytes:
    """A well-formed header (its CRC is right) claiming `length` bytes of data."""
    header = struct.pack("<Q", length)
    return header + struct.pack("<I", records._masked_crc(header))


@pytest.mark.parametrize("length", [2**62, records.MAX_RECORD_BYTES + 1])
def test_a_tfrecord_length_in_the_exabytes_is_refused_before_allocation(length):
    """Before: f.read(2**62) asked for the memory and died with MemoryError or
    OverflowError (a traceback)."""
    stream = io.BytesIO()
    records.write_tfrecords(stream, [b'{"key": 1}'])
    stream.write(_huge_record_header(length) + b"tiny")
    stream.seek(0)
    got = records.read_tfrecords(stream)
    assert next(got) == b'{"key": 1}'
    with pytest.raises(records.CorruptRecordError, match=f"claims {length} bytes, more "
                       f"than the {records.MAX_RECORD_BYTES} one instance may hold"):
        next(got)


def test_batch_records_the_huge_record_and_goes_on(export_dir, tmp_path, capsys):
    imgs = images(3, seed=5)
    first = tmp_path / "a.tfrecord"
    with open(first, "wb") as f:
        records.write_tfrecords(f, [json.dumps({"image": imgs[0].tolist(), "key": 1})
                                    .encode()])
        f.write(_huge_record_header(2**62))
    (tmp_path / "b.tfrecord").write_bytes(b"")
    with open(tmp_path / "b.tfrecord", "wb") as f:
        records.write_tfrecords(f, [json.dumps({"image": im.tolist(), "key": k}).encode()
                                    for k, im in ((2, imgs[1]), (3, imgs[2]))])
    out = tmp_path / "out"
    status = main(["batch", "--model-dir", export_dir, "--input-paths",
                   str(tmp_path / "*.tfrecord"), "--data-format", "tf-record",
                   "--output-path", str(out)])
    assert status == 0
    assert capsys.readouterr().out.strip() == "4 instances: 3 predicted, 1 failed"
    errors = (out / "prediction.errors_stats-00000-of-00002").read_text().splitlines()
    assert len(errors) == 1 and "claims 4611686018427387904 bytes" in errors[0]


def test_batch_line_longer_than_the_bound_is_an_error_and_the_file_ends(
        export_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(instances, "MAX_LINE_BYTES", 40_000)
    imgs = images(2, seed=6)
    (tmp_path / "in.json").write_text(instance_lines(imgs[:1], keys=[1]) + "7" * 100_000)
    out = tmp_path / "out"
    status = main(["batch", "--model-dir", export_dir, "--input-paths",
                   str(tmp_path / "in.json"), "--data-format", "text",
                   "--output-path", str(out)])
    assert status == 0
    assert capsys.readouterr().out.strip() == "2 instances: 1 predicted, 1 failed"
    error = json.loads((out / "prediction.errors_stats-00000-of-00001").read_text())
    assert error["line"] == 2 and "line longer than 40000 bytes" in error["error"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["/dev/zero", "named pipe", "link loop"])
def test_local_input_that_never_ends_or_blocks_is_exit_2(export_dir, tmp_path, capsys,
                                                         kind):
    source = str(tmp_path / "in.json")
    if kind == "named pipe":
        os.mkfifo(source)
        words = "is a named pipe, not a regular file"
    elif kind == "link loop":
        os.symlink(source, source)
        words = "symbolic link loop"
    else:
        source, words = kind, "is a device, not a regular file"
    status = main(["local", "--model-dir", export_dir, "--json-instances", source])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert words in err


def test_local_input_beyond_the_bound_is_exit_2(export_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(instances, "MAX_INPUT_BYTES", 1000)
    source = tmp_path / "in.json"
    source.write_text(instance_lines(images(1, seed=1), keys=[1]))
    status = main(["local", "--model-dir", export_dir, "--json-instances", str(source)])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert "holds more than 1000 bytes" in err and "use predict batch" in err
