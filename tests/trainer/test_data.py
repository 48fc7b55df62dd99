"""trainer.data: the IDX and npz readers on the packaged Fashion-MNIST sample, over local,
file://, memory:// and gs:// URLs; every malformed input; the sharded pipelines."""
from __future__ import annotations

import gzip
import io
import os

import numpy as np
import pytest
import tensorflow as tf

from trainer import data
from tests.support.common import ROOT
from trainer.errors import DataError

SAMPLE = os.path.join(ROOT, "trainer", "sample")
NAMES = (data.TRAIN_IMAGES, data.TRAIN_LABELS, data.TEST_IMAGES, data.TEST_LABELS)


@pytest.fixture(scope="module")
def sample():
    return data.load(SAMPLE)


def _gz(name: str) -> bytes:
    with open(os.path.join(SAMPLE, f"{name}.gz"), "rb") as f:
        return f.read()


def _raw(name: str) -> bytes:
    return gzip.decompress(_gz(name))


def _idx(magic: int, dims: list[int], body: bytes) -> bytes:
    return b"".join(int(v).to_bytes(4, "big") for v in [magic, *dims]) + body


def _write_dir(path, files: dict[str, bytes]) -> str:
    os.makedirs(path, exist_ok=True)
    for name, content in files.items():
        with open(os.path.join(path, name), "wb") as f:
            f.write(content)
    return str(path)


def _same(a: data.Dataset, b: data.Dataset) -> None:
    for field in ("train_images", "train_labels", "test_images", "test_labels"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


def _npz_bytes(ds: data.Dataset, **override) -> bytes:
    arrays = dict(x_train=ds.train_images, y_train=ds.train_labels,
                  x_test=ds.test_images, y_test=ds.test_labels)
    arrays.update(override)
    arrays = {k: v for k, v in arrays.items() if v is not None}
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


# ---- reading -------------------------------------------------------------------------

def test_sample_has_the_documented_shape(sample):
    assert sample.train_images.shape == (3000, 28, 28)
    assert sample.train_images.dtype == np.uint8
    assert sample.train_labels.dtype == np.int64
    assert sample.test_images.shape == (1000, 28, 28)
    assert set(np.unique(sample.train_labels)) == set(range(10))
    assert sample.train_images.max() > 200  # real pixels, not zeros


def test_raw_and_gzipped_idx_read_the_same(sample, tmp_path):
    raw = _write_dir(tmp_path / "raw", {n: _raw(n) for n in NAMES})
    _same(data.load(raw), sample)
    # gzip is detected by its magic bytes, not the name: gzipped files without .gz
    disguised = _write_dir(tmp_path / "disguised", {n: _gz(n) for n in NAMES})
    _same(data.load(f"file://{disguised}"), sample)


def test_memory_url_and_explicit_files_in_any_order(sample, memfs):
    for name in NAMES:
        memfs.pipe(f"/mnist/{name}.gz", _gz(name))
    _same(data.load("memory://mnist"), sample)
    url = "memory://mnist/{}.gz".format
    loaded = data.load(train_files=f"{url(data.TRAIN_LABELS)},{url(data.TRAIN_IMAGES)}",
                       eval_files=[url(data.TEST_IMAGES), url(data.TEST_LABELS)])
    _same(loaded, sample)


def test_npz_local_and_memory(sample, tmp_path, memfs):
    _write_dir(tmp_path, {data.NPZ_NAME: _npz_bytes(sample)})
    _same(data.load(str(tmp_path)), sample)
    memfs.pipe("/keras/mnist.npz", _npz_bytes(sample))
    _same(data.load("memory://keras"), sample)
    loaded = data.load(train_files="memory://keras/mnist.npz",
                       eval_files="memory://keras/mnist.npz")
    _same(loaded, sample)


def test_gcs_idx_and_npz(sample, gcs_emulator):
    from mljob import storage
    for name in NAMES:
        storage.write_bytes(f"gs://mljob-test/data-test/idx/{name}.gz", _gz(name))
    storage.write_bytes("gs://mljob-test/data-test/npz/mnist.npz", _npz_bytes(sample))
    _same(data.load("gs://mljob-test/data-test/idx"), sample)
    _same(data.load("gs://mljob-test/data-test/npz"), sample)


def test_default_is_debian_fashion_mnist_else_the_sample(monkeypatch):
    expected = data.DEBIAN_FASHION_MNIST if os.path.isdir(data.DEBIAN_FASHION_MNIST) \
        else SAMPLE
    assert os.path.samefile(data.default_data_dir(), expected)
    monkeypatch.setattr(data, "DEBIAN_FASHION_MNIST", "/nonexistent/fashion-mnist")
    assert os.path.samefile(data.default_data_dir(), SAMPLE)
    assert len(data.load().train_labels) == 3000


def test_to_float():
    images = np.array([[[0] * 28] * 28, [[255] * 28] * 28], dtype=np.uint8)
    pixels = data.to_float(images)
    assert pixels.shape == (2, 784) and pixels.dtype == np.float32
    assert pixels[0].max() == 0.0 and pixels[1].min() == 1.0


# ---- malformed input: one line, the file named, the fix said ----------------------------

def _error(tmp_path, files: dict[str, bytes]) -> str:
    d = _write_dir(tmp_path / "bad", {n: _raw(n) for n in NAMES} | files)
    with pytest.raises(DataError) as info:
        data.load(d)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_missing_file(tmp_path):
    d = _write_dir(tmp_path / "partial", {n: _raw(n) for n in NAMES[:3]})
    with pytest.raises(DataError, match=rf"missing {data.TEST_LABELS}\[\.gz\].*--data-dir"):
        data.load(d)
    with pytest.raises(DataError, match=r"nowhere/x.gz does not exist; check"):
        data.load(train_files=f"{tmp_path}/nowhere/x.gz,{tmp_path}/y",
                  eval_files=f"{tmp_path}/z,{tmp_path}/w")
    with pytest.raises(DataError, match=r"add --eval-files"):
        data.load(train_files="a,b")


def test_wrong_magic(tmp_path):
    msg = _error(tmp_path, {data.TRAIN_IMAGES: _raw(data.TRAIN_LABELS)})
    assert data.TRAIN_IMAGES in msg and "magic number 2049, expected 2051" in msg
    msg = _error(tmp_path, {data.TEST_LABELS: b"PK\x03\x04" + b"\0" * 40})
    assert data.TEST_LABELS in msg and "not an MNIST labels file" in msg


def test_truncated(tmp_path):
    msg = _error(tmp_path, {data.TRAIN_IMAGES: _raw(data.TRAIN_IMAGES)[:5000]})
    assert data.TRAIN_IMAGES in msg and "truncated" in msg and "download it again" in msg
    msg = _error(tmp_path, {data.TEST_LABELS: _raw(data.TEST_LABELS)[:6]})
    assert "truncated" in msg
    msg = _error(tmp_path, {data.TRAIN_LABELS: _gz(data.TRAIN_LABELS)[:-100]})
    assert data.TRAIN_LABELS in msg and "damaged gzip" in msg


def test_count_mismatch(tmp_path):
    msg = _error(tmp_path, {data.TRAIN_LABELS: _raw(data.TEST_LABELS)})
    assert "3000 images" in msg and "1000 labels" in msg and data.TRAIN_LABELS in msg


def test_wrong_image_size(tmp_path):
    images = _idx(data.IMAGES_MAGIC, [3000, 32, 32], bytes(3000 * 32 * 32))
    msg = _error(tmp_path, {data.TRAIN_IMAGES: images})
    assert "32x32" in msg and "28x28" in msg and data.TRAIN_IMAGES in msg


def test_empty(tmp_path):
    msg = _error(tmp_path, {data.TEST_IMAGES: _idx(data.IMAGES_MAGIC, [0, 28, 28], b""),
                            data.TEST_LABELS: _idx(data.LABELS_MAGIC, [0], b"")})
    assert "no images" in msg and data.TEST_IMAGES in msg


def test_label_out_of_range(tmp_path):
    labels = bytearray(_raw(data.TRAIN_LABELS))
    labels[8 + 17] = 12
    msg = _error(tmp_path, {data.TRAIN_LABELS: bytes(labels)})
    assert "label 12 outside 0-9" in msg and data.TRAIN_LABELS in msg


@pytest.mark.parametrize("content, expected", [
    (b"not a zip at all", "not an .npz archive"),
    (b"PK\x03\x04 broken", "damaged .npz"),
    ("missing-key", "lacks y_test"),
    ("bad-shape", "x_train has shape (3000, 784)"),
    ("bad-labels", "label 10 outside 0-9"),
])
def test_bad_npz(sample, tmp_path, content, expected):
    if content == "missing-key":
        content = _npz_bytes(sample, y_test=None)
    elif content == "bad-shape":
        content = _npz_bytes(sample, x_train=sample.train_images.reshape(3000, 784))
    elif content == "bad-labels":
        content = _npz_bytes(sample, y_test=np.full(1000, 10))
    d = _write_dir(tmp_path / "npz", {data.NPZ_NAME: content})
    with pytest.raises(DataError, match=r"mnist\.npz") as info:
        data.load(d)
    assert expected in str(info.value) and "\n" not in str(info.value)


# ---- pipelines -----------------------------------------------------------------------

def _epoch(ds, batches: int) -> np.ndarray:
    """The example ids (carried in the labels) of the first `batches` batches."""
    return np.stack([y.numpy() for _, y in ds.take(batches)])


def test_shards_are_disjoint_and_differently_shuffled(sample):
    ids = np.arange(1200, dtype=np.int64)  # labels stand in for example ids
    images = sample.train_images[:1200]
    per_shard = []
    for shard in range(2):
        ds = data.train_dataset(images, ids, 100, shard_index=shard, num_shards=2, seed=7)
        per_shard.append(_epoch(ds, 6))  # one epoch of this shard's 600 examples
    assert set(per_shard[0].ravel()).isdisjoint(per_shard[1].ravel())
    assert sorted(np.concatenate([p.ravel() for p in per_shard])) == list(range(1200))
    assert all(i % 2 == 0 for i in per_shard[0].ravel())
    # Same seed, same shard: the same sequence (restarts are reproducible) ...
    again = data.train_dataset(images, ids, 100, shard_index=0, num_shards=2, seed=7)
    np.testing.assert_array_equal(_epoch(again, 6), per_shard[0])
    # Each shard's shuffle is seeded by its index: the two shards do not walk their
    # examples in the same pattern (position within the shard differs).
    assert not np.array_equal(per_shard[0] // 2, per_shard[1] // 2)


def test_every_epoch_is_a_new_full_shuffle_and_batches_run_across_epochs(sample):
    # 300 examples, 2 shards of 150, batches of 40: the stream is epoch after epoch of
    # the shard, each a permutation of its own, cut into batches that straddle epochs.
    ids = np.arange(300, dtype=np.int64)
    ds = data.train_dataset(sample.train_images[:300], ids, 40, shard_index=1,
                            num_shards=2, seed=3)
    stream = _epoch(ds, 15).ravel()  # 600 examples: four epochs of 150
    epochs = stream.reshape(4, 150)
    for epoch in epochs:
        assert sorted(epoch) == list(range(1, 300, 2))
    assert len({tuple(epoch) for epoch in epochs}) == 4  # reshuffled every epoch


def test_shard_index_may_be_a_tensor_as_in_a_ps_dataset_fn(sample):
    # Under ParameterServerStrategy the chief traces dataset_fn with the worker index as
    # a tensor; the stream must be the one the Python int gives.
    ids = np.arange(600, dtype=np.int64)
    images = sample.train_images[:600]

    @tf.function
    def dataset_fn(worker_index):
        return data.train_dataset(images, ids, 50, shard_index=worker_index, num_shards=3,
                                  seed=2)

    traced = _epoch(dataset_fn(tf.constant(2)), 4)
    plain = _epoch(data.train_dataset(images, ids, 50, shard_index=2, num_shards=3,
                                      seed=2), 4)
    np.testing.assert_array_equal(traced, plain)
    assert all(i % 3 == 2 for i in traced.ravel())


def test_train_batches_are_fixed_size_float_and_repeat(sample):
    ds = data.train_dataset(sample.train_images[:250], sample.train_labels[:250], 64)
    batches = list(ds.take(10))  # 10 x 64 > 250: it repeats, never a short batch
    for pixels, labels in batches:
        assert pixels.shape == (64, 784) and pixels.dtype.name == "float32"
        assert labels.shape == (64,) and labels.dtype.name == "int64"
        assert 0.0 <= float(pixels.numpy().min()) and float(pixels.numpy().max()) <= 1.0


def test_pixels_match_their_labels(sample):
    ids = np.arange(300, dtype=np.int64)
    pixels, got = next(iter(data.train_dataset(sample.train_images[:300], ids, 32)))
    expected = data.to_float(sample.train_images[got.numpy()])
    np.testing.assert_allclose(pixels.numpy(), expected)


def test_too_many_shards_for_the_data(sample):
    with pytest.raises(DataError, match="cannot feed 5 workers"):
        data.train_dataset(sample.train_images[:3], sample.train_labels[:3], 1,
                           shard_index=4, num_shards=5)


def test_eval_dataset_sees_every_example_once_in_order(sample):
    ds = data.eval_dataset(sample.test_images, sample.test_labels, 300)
    sizes = [int(x.shape[0]) for x, _ in ds]
    assert sizes == [300, 300, 300, 100]
    labels = np.concatenate([y.numpy() for _, y in ds])
    np.testing.assert_array_equal(labels, sample.test_labels)
