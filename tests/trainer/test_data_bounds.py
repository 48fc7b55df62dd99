"""trainer.data against hostile files: reads bounded by what the IDX header promises
(gzip bombs, endless devices, named pipes, trailing bytes, lying npz headers), symbolic
link loops named as such, and the decoder's pixel order checked on a hand-built file."""
from __future__ import annotations

import gzip
import io
import os
import tracemalloc
import zipfile

import numpy as np
import pytest

from trainer import data
from trainer.errors import DataError

MB = 1024 * 1024


def _idx(magic: int, dims: list[int], body: bytes = b"") -> bytes:
    return b"".join(int(v).to_bytes(4, "big") for v in [magic, *dims]) + body


def _bomb(header: bytes, expanded_mb: int) -> bytes:
    """A gzip file of a few hundred KB that expands to `expanded_mb` MB: the header and
    zeros in a first member, then the same 1 MB member of zeros repeated (gzip allows
    any number of members, and readers must go on through all of them)."""
    zeros = gzip.compress(bytes(MB), compresslevel=9)
    return gzip.compress(header + bytes(MB)) + zeros * (expanded_mb - 1)


def _error(fn, *args) -> str:
    with pytest.raises(DataError) as info:
        fn(*args)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.timeout(60)
def test_gzip_bomb_stops_at_the_header_size(tmp_path):
    """10 images by the header, 1 GB once expanded: refused after the header's 7,856
    bytes and one more, never expanded whole (a whole gunzip needs 1 GB)."""
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(_bomb(_idx(data.IMAGES_MAGIC, [10, 28, 28]), expanded_mb=1024))
    assert path.stat().st_size < 2 * MB
    tracemalloc.start()
    try:
        message = _error(data.read_idx, str(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "has bytes after the 7856 its header promises" in message
    assert peak < 32 * MB


@pytest.mark.timeout(60)
def test_header_promising_more_than_memory_is_refused_before_reading(tmp_path):
    path = tmp_path / "images.gz"
    path.write_bytes(_bomb(_idx(data.IMAGES_MAGIC, [2**32 - 1, 28, 28]), expanded_mb=64))
    message = _error(data.read_idx, str(path))
    assert f"more than the {data.MAX_DATA_BYTES} the trainer reads into memory" in message


def test_trailing_bytes_after_the_payload_are_refused(tmp_path):
    labels = _idx(data.LABELS_MAGIC, [3], bytes([1, 2, 3]))
    for name, content in (("raw", labels + b"\x00"), ("gz", gzip.compress(labels + b"junk")),
                          ("second member", gzip.compress(labels) + gzip.compress(b"x"))):
        path = tmp_path / name
        path.write_bytes(content)
        assert "has bytes after the 11 its header promises" in _error(data.read_idx,
                                                                      str(path)), name
    exact = tmp_path / "exact"
    exact.write_bytes(labels)
    np.testing.assert_array_equal(data.read_idx(str(exact)), [1, 2, 3])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_endless_devices_are_refused(tmp_path, device):
    """As named files and behind a data dir's standard names (a symbolic link)."""
    assert "is a device, not a regular file" in _error(
        data.load, None, [device, device], [device, device])
    folder = tmp_path / "data"
    folder.mkdir()
    for name in (data.TRAIN_IMAGES, data.TRAIN_LABELS, data.TEST_IMAGES, data.TEST_LABELS):
        os.symlink(device, folder / name)
    assert "is a device, not a regular file" in _error(data.load, str(folder))


@pytest.mark.timeout(60)
def test_named_pipe_does_not_hang(tmp_path):
    """Nobody writes to the pipe: opening it would block for ever."""
    pipe = tmp_path / "train-images-idx3-ubyte"
    os.mkfifo(pipe)
    message = _error(data.read_idx, str(pipe))
    assert "is a named pipe, not a regular file" in message


def test_symlink_loop_is_named_as_a_loop(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    os.symlink(folder / "b", folder / "train-images-idx3-ubyte.gz")
    os.symlink(folder / "train-images-idx3-ubyte.gz", folder / "b")
    message = _error(data.load, str(folder))
    assert "symbolic link loop" in message and "missing" not in message
    assert "symbolic link loop" in _error(data.read_idx, str(folder / "b"))
    looped_dir = tmp_path / "looped"
    os.symlink(looped_dir, looped_dir)  # --data-dir itself is the loop
    message = _error(data.load, str(looped_dir))
    assert "symbolic link loop" in message and "missing" not in message


def test_npz_whose_array_header_lies_is_refused_before_allocation(tmp_path):
    """An .npy header may claim any shape; numpy would allocate it before reading."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        for key in ("x_train", "y_train", "x_test", "y_test"):
            member = io.BytesIO()
            np.lib.format.write_array_header_1_0(
                member, {"descr": "|u1", "fortran_order": False,
                         "shape": (2**40, 28, 28) if key == "x_train" else (3,)})
            member.write(bytes(3))
            archive.writestr(f"{key}.npy", member.getvalue())
    path = tmp_path / "mnist.npz"
    path.write_bytes(buf.getvalue())
    message = _error(data.read_npz, str(path))
    assert "x_train promises" in message and "download it again" in message


def test_npz_that_expands_beyond_memory_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "MAX_DATA_BYTES", MB)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("x_train.npy", bytes(2 * MB))
    path = tmp_path / "mnist.npz"
    path.write_bytes(buf.getvalue())
    assert f"expands to more than {MB} bytes" in _error(data.read_npz, str(path))


def test_hand_built_idx_decodes_pixel_for_pixel(tmp_path):
    """Every pixel distinct and asymmetric, so a transposed, flipped or shifted decoder
    fails: pixel (i, r, c) = (7 * i + 3 * r + c) % 256 in row-major order, as the IDX
    format stores it (the last dimension changes fastest)."""
    n = 5
    expected = np.fromfunction(lambda i, r, c: (7 * i + 3 * r + c) % 256,
                               (n, 28, 28), dtype=np.int64).astype(np.uint8)
    body = bytearray()
    for i in range(n):
        for r in range(28):
            for c in range(28):
                body.append((7 * i + 3 * r + c) % 256)
    labels = [3, 1, 4, 1, 5]
    folder = tmp_path / "data"
    folder.mkdir()
    for images, label_file in ((data.TRAIN_IMAGES, data.TRAIN_LABELS),
                               (data.TEST_IMAGES, data.TEST_LABELS)):
        (folder / f"{images}.gz").write_bytes(
            gzip.compress(_idx(data.IMAGES_MAGIC, [n, 28, 28], bytes(body))))
        (folder / label_file).write_bytes(_idx(data.LABELS_MAGIC, [n], bytes(labels)))
    ds = data.load(str(folder))
    np.testing.assert_array_equal(ds.train_images, expected)
    np.testing.assert_array_equal(ds.test_labels, labels)
    assert ds.train_images[0, 0, 1] == 1 and ds.train_images[0, 1, 0] == 3
    # What the models see: 784 values, row after row, scaled to [0, 1].
    flat = data.to_float(ds.train_images)
    assert flat[2, 28 * 5 + 9] == pytest.approx(((7 * 2 + 3 * 5 + 9) % 256) / 255.0)
