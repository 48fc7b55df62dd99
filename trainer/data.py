"""Reading MNIST-format data from any storage URL, and the tf.data pipelines over it.

Formats, told apart by their first bytes rather than by their names:
- MNIST's IDX files (images magic 2051, labels magic 2049), plain or gzipped;
- Keras's `mnist.npz` (arrays x_train, y_train, x_test, y_test).

A data dir holds the four standard IDX names (with or without `.gz`) or `mnist.npz`;
alternatively `--train-files`/`--eval-files` name an images file and a labels file each
(in either order: the magic number says which is which), or one `.npz` each.

Everything is read into memory once (Fashion-MNIST is 55 MB as uint8), validated, and the
pipelines are built from those arrays with `from_tensor_slices`: under
ParameterServerStrategy the chief traces each worker's `dataset_fn`, so a worker never
needs the chief's files. Every problem is a one-line `DataError` naming the file and
the fix.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import os
import zipfile
import zlib
from collections.abc import Sequence

import numpy as np

from mljob import storage
from mljob.errors import first_line
from trainer.errors import DataError

IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049
ROWS = COLS = 28
NUM_CLASSES = 10
DEBIAN_FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
TRAIN_IMAGES, TRAIN_LABELS = "train-images-idx3-ubyte", "train-labels-idx1-ubyte"
TEST_IMAGES, TEST_LABELS = "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"
NPZ_NAME = "mnist.npz"
_GZIP_MAGIC = b"\x1f\x8b"
_ZIP_MAGIC = b"PK"  # an .npz is a zip archive
# The most bytes one data file may hold (decompressed): everything is read into memory,
# and Fashion-MNIST's training images are 47 MB, so 4 GiB is room for any MNIST-format
# set while a header or archive that promises more is refused before it is expanded.
MAX_DATA_BYTES = 4 * 1024**3


@dataclasses.dataclass(frozen=True)
class Dataset:
    """Training and test split as uint8 images [N, 28, 28] and int64 labels [N]."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    source: str  # where it came from, for the log line

    def __repr__(self) -> str:
        return (f"Dataset({len(self.train_labels)} train, {len(self.test_labels)} test "
                f"from {self.source})")


def default_data_dir() -> str:
    """Debian's Fashion-MNIST when installed (dataset-fashion-mnist), else the 3,000-image
    sample packaged with the trainer, so a job with no data flags always runs."""
    if all(os.path.exists(os.path.join(DEBIAN_FASHION_MNIST, f"{name}.gz"))
           for name in (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS)):
        return DEBIAN_FASHION_MNIST
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "sample")


def load(data_dir: str | None = None, train_files: Sequence[str] | str | None = None,
         eval_files: Sequence[str] | str | None = None) -> Dataset:
    """Read and validate a dataset from a data dir, explicit files, or the default."""
    if data_dir and (train_files or eval_files):
        raise DataError("give either --data-dir or --train-files/--eval-files, not both")
    if train_files or eval_files:
        if not (train_files and eval_files):
            missing = "--eval-files" if train_files else "--train-files"
            raise DataError(f"--train-files and --eval-files go together; add {missing}")
        train_files, eval_files = _split_list(train_files), _split_list(eval_files)
        train = _read_split(train_files, "train", "--train-files")
        test = _read_split(eval_files, "test", "--eval-files")
        return Dataset(*train, *test,
                       source=f"{','.join(train_files)} + {','.join(eval_files)}")
    data_dir = data_dir or default_data_dir()
    return _load_dir(data_dir)


def _split_list(files: Sequence[str] | str) -> list[str]:
    if isinstance(files, str):
        files = files.split(",")
    return [f.strip() for f in files if f.strip()]


def _load_dir(data_dir: str) -> Dataset:
    names = {}
    for name in (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS):
        for candidate in (f"{name}.gz", name):
            if _exists(storage.join(data_dir, candidate)):
                names[name] = storage.join(data_dir, candidate)
                break
    if len(names) == 4:
        train = _read_pair(names[TRAIN_IMAGES], names[TRAIN_LABELS])
        test = _read_pair(names[TEST_IMAGES], names[TEST_LABELS])
        return Dataset(*train, *test, source=data_dir)
    npz = storage.join(data_dir, NPZ_NAME)
    if not names and _exists(npz):
        arrays = read_npz(npz)
        return Dataset(*arrays["train"], *arrays["test"], source=npz)
    wanted = [f"{n}[.gz]" for n in (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS)
              if n not in names]
    raise DataError(f"{data_dir} is missing {', '.join(wanted)}"
                    + ("" if names else f" (or {NPZ_NAME})")
                    + "; point --data-dir at a folder holding MNIST-format files")


def _read_split(files: list[str], split: str, flag: str) -> tuple[np.ndarray, np.ndarray]:
    """One split from `flag`'s files: an images and a labels IDX file, or one npz."""
    if len(files) == 1:
        arrays = read_npz(files[0])
        return arrays[split]
    if len(files) != 2:
        raise DataError(f"{flag} takes an images file and a labels file (or one .npz), "
                        f"got {len(files)} files")
    first, second = (read_idx(f) for f in files)
    if first.ndim == 1 and second.ndim == 3:
        first, second = second, first
        files = files[::-1]
    if first.ndim != 3 or second.ndim != 1:
        raise DataError(f"{flag} needs one images file (magic {IMAGES_MAGIC}) and one "
                        f"labels file (magic {LABELS_MAGIC}); got {', '.join(files)}")
    return _checked(first, second, files[0], files[1])


def _read_pair(images_url: str, labels_url: str) -> tuple[np.ndarray, np.ndarray]:
    images = read_idx(images_url, expect=IMAGES_MAGIC)
    labels = read_idx(labels_url, expect=LABELS_MAGIC)
    return _checked(images, labels, images_url, labels_url)


def read_idx(url: str, expect: int | None = None) -> np.ndarray:
    """An IDX file's array (uint8 images [N, 28, 28] or int64 labels [N]), gzipped or not.

    expect: the magic number the caller needs (IMAGES_MAGIC or LABELS_MAGIC); None
    accepts either.

    The header says how many bytes follow, so that is all that is read (decompressed
    incrementally): a gzip member that expands far beyond it, or bytes after the
    payload, are refused without being expanded.
    """
    with _open(url) as stream:
        return _read_idx_stream(stream, url, expect)


def _read_idx_stream(stream, url: str, expect: int | None) -> np.ndarray:
    data = _take(stream, 8, url)
    if len(data) < 8:
        raise DataError(f"{url} is truncated ({len(data)} bytes, not even an IDX header); "
                        "download it again")
    magic = int.from_bytes(data[:4], "big")
    if magic not in (IMAGES_MAGIC, LABELS_MAGIC) or (expect and magic != expect):
        what = {IMAGES_MAGIC: "images", LABELS_MAGIC: "labels"}.get(expect, "IDX") \
            if expect else "IDX"
        wanted = expect or f"{IMAGES_MAGIC} or {LABELS_MAGIC}"
        raise DataError(f"{url} is not an MNIST {what} file (magic number {magic}, "
                        f"expected {wanted}); check the file name and format")
    ndim = 3 if magic == IMAGES_MAGIC else 1
    header = 4 + 4 * ndim
    data += _take(stream, header - 8, url)
    if len(data) < header:
        raise DataError(f"{url} is truncated (header cut short); download it again")
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    if magic == IMAGES_MAGIC and dims[1:] != [ROWS, COLS]:
        raise DataError(f"{url} holds {dims[1]}x{dims[2]} images; the models take "
                        f"{ROWS}x{COLS} (MNIST or Fashion-MNIST)")
    payload = int(np.prod(dims, dtype=object))
    if header + payload > MAX_DATA_BYTES:
        raise DataError(f"{url}'s header promises {header + payload} bytes, more than the "
                        f"{MAX_DATA_BYTES} the trainer reads into memory; check the file")
    body = _take(stream, payload, url)
    if len(body) < payload:
        raise DataError(f"{url} is truncated: its header promises {header + payload} "
                        f"bytes, it has {header + len(body)}; download it again")
    if _take(stream, 1, url):
        raise DataError(f"{url} has bytes after the {header + payload} its header "
                        "promises; it is damaged or not an IDX file, download it again")
    array = np.frombuffer(body, dtype=np.uint8)
    if magic == IMAGES_MAGIC:
        return array.reshape(dims)
    return array.astype(np.int64)


def read_npz(url: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Keras's mnist.npz: {'train': (images, labels), 'test': (images, labels)}."""
    data = _read_file(url)
    if not data.startswith(_ZIP_MAGIC):
        raise DataError(f"{url} is not an .npz archive; use Keras's mnist.npz layout "
                        "(x_train, y_train, x_test, y_test)")
    try:
        _check_npz_sizes(data, url)
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            missing = [k for k in ("x_train", "y_train", "x_test", "y_test")
                       if k not in npz.files]
            if missing:
                raise DataError(f"{url} lacks {', '.join(missing)}; an mnist.npz holds "
                                "x_train, y_train, x_test and y_test")
            arrays = {k: npz[k] for k in ("x_train", "y_train", "x_test", "y_test")}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise DataError(f"{url} is a damaged .npz ({first_line(exc, 200)}); "
                        "download it again") from None
    out = {}
    for split, x, y in (("train", "x_train", "y_train"), ("test", "x_test", "y_test")):
        images, labels = arrays[x], arrays[y]
        if images.ndim != 3 or images.shape[1:] != (ROWS, COLS):
            raise DataError(f"{url}: {x} has shape {images.shape}; the models take "
                            f"[N, {ROWS}, {COLS}] images")
        if images.dtype != np.uint8:
            if images.size and (images.min() < 0 or images.max() > 255):
                raise DataError(f"{url}: {x} values are outside 0-255; store uint8 pixels")
            images = images.astype(np.uint8)
        labels = labels.reshape(-1) if labels.ndim == 2 and labels.shape[1] == 1 else labels
        if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
            raise DataError(f"{url}: {y} must be integer class ids of shape [N], "
                            f"got {labels.dtype} {labels.shape}")
        out[split] = _checked(images, labels.astype(np.int64), f"{url}:{x}", f"{url}:{y}")
    return out


def _checked(images: np.ndarray, labels: np.ndarray, images_name: str,
             labels_name: str) -> tuple[np.ndarray, np.ndarray]:
    if len(images) != len(labels):
        raise DataError(f"{images_name} has {len(images)} images but {labels_name} has "
                        f"{len(labels)} labels; use files from the same split")
    if len(images) == 0:
        raise DataError(f"{images_name} holds no images; use a non-empty dataset")
    bad = (labels < 0) | (labels >= NUM_CLASSES)
    if bad.any():
        raise DataError(f"{labels_name} has label {int(labels[bad][0])} outside 0-"
                        f"{NUM_CLASSES - 1}; the models have {NUM_CLASSES} classes")
    return images, labels


def _check_npz_sizes(data: bytes, url: str) -> None:
    """Refuse an npz whose arrays would not fit what the trainer reads into memory, or
    whose array headers promise more than their members hold, before numpy allocates."""
    total = 0
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            total += info.file_size
            if total > MAX_DATA_BYTES:
                raise DataError(f"{url} expands to more than {MAX_DATA_BYTES} bytes, more "
                                "than the trainer reads into memory; check the file")
            if not info.filename.endswith(".npy"):
                continue
            with archive.open(info) as member:
                version = np.lib.format.read_magic(member)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, _, dtype = read_header(member)
            needed = int(np.prod(shape, dtype=object)) * dtype.itemsize
            if needed > info.file_size:
                raise DataError(f"{url}: {info.filename[:-4]} promises {needed} bytes of "
                                f"{dtype} {tuple(shape)} but holds {info.file_size}; "
                                "download it again")


def _read_file(url: str) -> bytes:
    """A whole file's bytes, at most MAX_DATA_BYTES."""
    with _data_errors(url):
        return storage.read_bytes(url, limit=MAX_DATA_BYTES)


@contextlib.contextmanager
def _data_errors(url: str):
    """Storage's errors on opening or reading a data file, as one-line DataErrors."""
    try:
        yield
    except FileNotFoundError:
        raise DataError(f"{url} does not exist; check --data-dir / --train-files / "
                        "--eval-files") from None
    except storage.TooLargeError:
        raise DataError(f"{url} holds more than {MAX_DATA_BYTES} bytes, more than the "
                        "trainer reads into memory; check the file") from None
    except storage.StorageError as exc:
        raise DataError(first_line(exc)) from None
    except IsADirectoryError:
        raise DataError(f"{url} is a folder; name a data file") from None


@contextlib.contextmanager
def _open(url: str):
    """A binary stream of the file's bytes, gunzipped as they are read when the file
    starts with gzip's magic; storage and gzip errors are DataErrors naming the file.
    A remote file is fetched whole (its size bounded): streamed, each of gzip's small
    reads would be a request."""
    if storage.is_local(url):
        with _data_errors(url):
            raw = storage.open_input(url)
    else:
        raw = io.BytesIO(_read_file(url))
    with raw:
        head = _take(raw, len(_GZIP_MAGIC), url)
        raw.seek(0)
        if head == _GZIP_MAGIC:
            with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
                yield unzipped
        else:
            yield raw


def _take(stream, size: int, url: str) -> bytes:
    """Up to `size` bytes (fewer only at the end of the stream)."""
    try:
        return stream.read(size)
    except (EOFError, OSError, zlib.error) as exc:
        if isinstance(exc, storage.StorageError):
            raise DataError(first_line(exc)) from None
        if isinstance(stream, gzip.GzipFile):
            raise DataError(f"{url} is a damaged gzip file ({first_line(exc, 200)}); "
                            "download it again") from None
        raise DataError(f"cannot read {url}: {first_line(exc, 200)}") from None


def _exists(url: str) -> bool:
    try:
        return storage.exists(url)
    except storage.StorageError as exc:  # its message names the URL
        raise DataError(first_line(exc)) from None



# ---- pipelines -------------------------------------------------------------------------

def to_float(images: np.ndarray) -> np.ndarray:
    """uint8 [N, 28, 28] -> float32 [N, 784] in [0, 1]: what the models and the serving
    signature take."""
    return images.reshape(len(images), ROWS * COLS).astype(np.float32) / 255.0


def _to_float_batch(images, labels):
    import tensorflow as tf
    pixels = tf.cast(tf.reshape(images, [-1, ROWS * COLS]), tf.float32) / 255.0
    return pixels, labels


def train_dataset(images: np.ndarray, labels: np.ndarray, batch_size: int, *,
                  shard_index=0, num_shards: int = 1, seed: int = 0):
    """This shard's endless, shuffled stream of (float32 [B, 784], int64 [B]) batches.

    shard_index is a Python int or a scalar integer tensor: under ParameterServerStrategy
    the worker's index is known only as a tensor while the chief traces `dataset_fn`
    (`tf.distribute.coordinator.experimental_get_current_worker_index()`).

    Each shard takes every num_shards-th example and shuffles with a seed derived from
    its index, so no two workers see the same batch sequence. Batches have a fixed size
    (drop_remainder), which the strategies need; the uint8 -> float conversion happens
    per batch, vectorised, so the dataset holds only the compact uint8 arrays.
    """
    import tensorflow as tf
    if batch_size < 1:
        raise DataError(f"--batch-size must be at least 1, got {batch_size}")
    if len(labels) < num_shards:
        raise DataError(f"{len(labels)} training examples cannot feed {num_shards} "
                        "workers; use fewer workers or more data")
    if isinstance(shard_index, int) and not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index {shard_index} is not in [0, {num_shards})")
    # Shuffle indices, not examples, a whole epoch at a time: each element of the stream
    # is one epoch's permutation of this shard's indices (seeded by the seed, the shard
    # and the epoch), cut into batches that run on across epochs; each batch is then one
    # vectorised gather from the uint8 arrays. Nothing here costs per example: a
    # worker's pipeline takes 1.4 CPU-µs an example, against 4.1 for tf.data's shuffle
    # and batch of single indices (bench/input_pipeline.py).
    # Made eagerly even while ParameterServerStrategy traces `dataset_fn` on the chief:
    # the traced function then captures them, and each worker gets the arrays once as
    # its input. As constants inside the graph, the 47 MB of images were copied into
    # the function's definition and serialized again at each step of registering and
    # sending it (about 4 s of the chief's start at a load of 8).
    with tf.init_scope():
        all_images = tf.constant(images)
        all_labels = tf.constant(labels, dtype=tf.int64)
    shard_index = tf.cast(shard_index, tf.int64)
    shard = tf.range(shard_index, len(labels), num_shards, dtype=tf.int64)
    shuffle_seed = (seed * 1_000_003 + shard_index) % (2**31 - 1)

    def epoch_order(epoch):
        return tf.random.experimental.stateless_shuffle(
            shard, seed=tf.stack([shuffle_seed, epoch]))

    def fetch(indices):
        return _to_float_batch(tf.gather(all_images, indices),
                               tf.gather(all_labels, indices))

    ds = tf.data.Dataset.range(2**62).map(epoch_order)  # endless: epoch after epoch
    ds = ds.rebatch(batch_size, drop_remainder=True)
    ds = ds.map(fetch, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


def eval_dataset(images: np.ndarray, labels: np.ndarray, batch_size: int):
    """Every example once, in order, as (float32 [b, 784], int64 [b]) batches (the last
    one may be smaller)."""
    import tensorflow as tf
    ds = tf.data.Dataset.from_tensor_slices((images, labels)).batch(batch_size)
    ds = ds.map(_to_float_batch, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


__all__ = ["Dataset", "DataError", "default_data_dir", "load", "read_idx", "read_npz",
           "to_float", "train_dataset", "eval_dataset", "IMAGES_MAGIC", "LABELS_MAGIC",
           "NPZ_NAME"]
