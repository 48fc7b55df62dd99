"""One conformance suite for mljob.storage, run against every backend: a plain path,
file://, memory:// and gs:// (the real GCS emulator). Every backend must give the same
results and fail with the same standard types."""
from __future__ import annotations

import logging
import os
import uuid

import pytest

from mljob import storage
from mljob.storage import StorageError

BACKENDS = ("path", "file", "memory", "gs")
MARKER = "saved_model.pb"


@pytest.fixture(params=BACKENDS)
def base(request, tmp_path):
    """A fresh, empty location on one backend."""
    kind = request.param
    if kind == "path":
        return str(tmp_path / "store")
    if kind == "file":
        return f"file://{tmp_path / 'store'}"
    token = uuid.uuid4().hex[:8]
    if kind == "memory":
        request.getfixturevalue("memfs")
        return f"memory://conformance-{token}"
    request.getfixturevalue("gcs_emulator")
    return f"gs://mljob-test/conformance-{token}"


def make_tree(root, files: dict[str, bytes]) -> str:
    for rel, data in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    return str(root)


def read_tree(root) -> dict[str, bytes]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


NESTED = {
    "top.txt": b"top",
    "empty.bin": b"",
    "variables/variables.index": b"\x00index",
    "variables/variables.data-00000-of-00001": os.urandom(70_000),
    "assets/deeper/still/more.txt": b"deep",
}


def test_write_read_and_overwrite(base):
    url = storage.join(base, "a", "b.bin")
    assert not storage.exists(url)
    storage.write_bytes(url, b"first")
    assert storage.exists(url)
    assert storage.read_bytes(url) == b"first"
    storage.write_bytes(url, b"second, longer")
    assert storage.read_bytes(url) == b"second, longer"


def test_local_write_is_atomic_and_leaves_no_temp_file(base):
    if not storage.is_local(base):
        pytest.skip("object stores write whole objects")
    url = storage.join(base, "state")
    storage.write_bytes(url, b"1")
    storage.write_bytes(url, b"2")
    assert os.listdir(os.path.dirname(storage.local_path(url))) == ["state"]


def test_missing_object_is_file_not_found(base, tmp_path):
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(storage.join(base, "nothing-here"))
    with pytest.raises(FileNotFoundError):
        storage.download_tree(storage.join(base, "no-dir"), str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()  # nothing made for it


def test_join_and_locality(base):
    assert storage.join(base + "/", "model/", "/saved_model.pb") == \
        f"{base}/model/saved_model.pb"
    assert storage.join(base) == base
    local = storage.is_local(base)
    assert local == (not base.startswith(("memory://", "gs://")))
    if local:
        assert os.path.isabs(storage.local_path(base))
        assert not storage.local_path(base).startswith("file:")


def test_upload_and_download_tree_round_trip(base, tmp_path):
    src = make_tree(tmp_path / "src", NESTED)
    url = storage.join(base, "job", "tree")
    storage.upload_tree(src, url)
    for rel in NESTED:
        assert storage.exists(storage.join(url, rel))
    storage.download_tree(url, str(tmp_path / "back"))
    assert read_tree(tmp_path / "back") == NESTED


def test_upload_tree_skip_existing_uploads_only_what_grew(base, tmp_path):
    src = make_tree(tmp_path / "src", {"events.out": b"e1", "ckpt-1.data": b"weights"})
    url = storage.join(base, "summaries")
    storage.upload_tree(src, url, skip_existing=True)
    make_tree(tmp_path / "src", {"events.out": b"e1e2", "ckpt-2.data": b"more"})
    storage.upload_tree(src, url, skip_existing=True)
    storage.download_tree(url, str(tmp_path / "back"))
    assert read_tree(tmp_path / "back") == {"events.out": b"e1e2", "ckpt-1.data": b"weights",
                                            "ckpt-2.data": b"more"}


def test_publish_replaces_the_previous_publication_whole(base, tmp_path):
    url = storage.join(base, "model")
    v1 = make_tree(tmp_path / "v1", {MARKER: b"v1", "variables/v1.data": b"1",
                                     "only-in-v1.txt": b"stale"})
    v2 = make_tree(tmp_path / "v2", {MARKER: b"v2", "variables/v2.data": b"22"})
    storage.publish_dir(v1, url, marker=MARKER)
    storage.publish_dir(v2, url, marker=MARKER)
    storage.download_tree(url, str(tmp_path / "back"))
    assert read_tree(tmp_path / "back") == read_tree(v2)  # no stale file survives
    if storage.is_local(base):  # the swap leaves no temporary copies beside it
        assert os.listdir(os.path.dirname(storage.local_path(url))) == ["model"]


def test_failed_publish_is_never_visible_half_way(base, tmp_path):
    """A file vanishing mid-publish (a broken link here) fails the publish. Local: the
    old publication stays whole. Object stores: the marker goes last, so it is absent
    and readers see no publication rather than a mix."""
    url = storage.join(base, "model")
    v1 = make_tree(tmp_path / "v1", {MARKER: b"v1", "variables/v1.data": b"1"})
    storage.publish_dir(v1, url, marker=MARKER)
    v2 = make_tree(tmp_path / "v2", {MARKER: b"v2", "variables/v2.data": b"22"})
    os.symlink(str(tmp_path / "vanished"), os.path.join(v2, "variables", "gone.data"))
    with pytest.raises(OSError):
        storage.publish_dir(v2, url, marker=MARKER)
    if storage.is_local(base):
        storage.download_tree(url, str(tmp_path / "back"))
        assert read_tree(tmp_path / "back") == read_tree(v1)
        assert os.listdir(os.path.dirname(storage.local_path(url))) == ["model"]
    else:
        assert not storage.exists(storage.join(url, MARKER))


def test_publish_marker_goes_last_with_upload_tree_order(base, tmp_path):
    """`last` files follow every other file: with a failure among the others, the files
    named last are never written."""
    src = make_tree(tmp_path / "src", {"a.data": b"a", "checkpoint": b"state",
                                       "index": b"i"})
    os.symlink(str(tmp_path / "vanished"), os.path.join(src, "zz-gone.data"))
    url = storage.join(base, "checkpoints")
    with pytest.raises(OSError):
        storage.upload_tree(src, url, last=["checkpoint", "index"])
    assert storage.exists(storage.join(url, "a.data"))
    assert not storage.exists(storage.join(url, "checkpoint"))
    assert not storage.exists(storage.join(url, "index"))


@pytest.mark.parametrize("call", ["read", "write", "exists", "filesystem", "publish"])
def test_unknown_scheme_is_a_storage_error_naming_the_fix(call, tmp_path):
    url = "nosuch://bucket/job"
    run = {"read": lambda: storage.read_bytes(url),
           "write": lambda: storage.write_bytes(url, b"x"),
           "exists": lambda: storage.exists(url),
           "filesystem": lambda: storage.filesystem(url),
           "publish": lambda: storage.publish_dir(str(tmp_path), url, marker=MARKER)}[call]
    with pytest.raises(StorageError) as err:
        run()
    message = str(err.value)
    assert "nosuch://bucket/job" in message and "gs://" in message and "\n" not in message


@pytest.mark.parametrize("call", ["write", "upload", "publish", "upload_file"])
def test_missing_bucket_is_a_storage_error_naming_the_url(call, gcs_emulator, tmp_path):
    url = f"gs://no-such-bucket-{uuid.uuid4().hex[:6]}/job/model"
    src = make_tree(tmp_path / "src", {MARKER: b"m", "variables/v.data": b"v"})
    run = {"write": lambda: storage.write_bytes(url, b"x"),
           "upload": lambda: storage.upload_tree(src, url),
           "publish": lambda: storage.publish_dir(src, url, marker=MARKER),
           "upload_file": lambda: storage.upload_file(os.path.join(src, MARKER), url)}[call]
    with pytest.raises(StorageError) as err:
        run()
    message = str(err.value)
    assert url.split("/job")[0] in message and "bucket" in message, message
    assert "\n" not in message


def test_missing_bucket_reads_as_missing(gcs_emulator):
    url = f"gs://no-such-bucket-{uuid.uuid4().hex[:6]}/x"
    assert not storage.exists(url)
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(url)


# --- the retry policy itself, on plain functions ---

class Flaky:
    """Fails with the given exceptions in turn, then returns "done"."""

    def __init__(self, *failures):
        self.failures = list(failures)
        self.calls = 0

    def __call__(self):
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "done"


def test_transient_errors_are_retried_with_back_off(caplog):
    flaky = Flaky(ConnectionResetError("reset by peer"), TimeoutError("timed out"))
    with caplog.at_level(logging.WARNING, logger="mljob.storage"):
        assert storage.retry(flaky, "upload to gs://b/x", attempts=3, delay=0.01) == "done"
    assert flaky.calls == 3
    retries = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    assert len(retries) == 2 and "upload to gs://b/x" in retries[0]
    assert "in 0.0s" in retries[0] and "retry 2/2" in retries[1]


def test_retries_run_out_with_a_message_naming_the_operation():
    flaky = Flaky(*[ConnectionRefusedError("Connection refused")] * 5)
    with pytest.raises(StorageError, match=r"cannot write gs://b/x after 3 attempts: "
                                           r"Connection refused; check that the storage"):
        storage.retry(flaky, "write gs://b/x", attempts=3, delay=0)
    assert flaky.calls == 3


def test_environment_sets_the_budget(monkeypatch):
    monkeypatch.setenv("MLJOB_STORAGE_RETRIES", "2")
    monkeypatch.setenv("MLJOB_STORAGE_RETRY_DELAY", "0")
    flaky = Flaky(*[ConnectionResetError("reset")] * 5)
    with pytest.raises(StorageError, match="after 2 attempts"):
        storage.retry(flaky, "write x")
    assert flaky.calls == 2


@pytest.mark.parametrize("error, raised", [
    (FileNotFoundError("gone"), FileNotFoundError),
    (PermissionError("no"), StorageError),
    (ValueError("Bad Request: invalid name"), StorageError),
    (IsADirectoryError("a dir"), StorageError),
])
def test_permanent_errors_are_not_retried(error, raised):
    flaky = Flaky(error)
    with pytest.raises(raised):
        storage.retry(flaky, "read x", attempts=5, delay=0)
    assert flaky.calls == 1


def test_http_status_decides_what_is_transient():
    from gcsfs.retry import HttpError
    assert storage._transient(HttpError({"code": 503, "message": "Service Unavailable"}))
    assert storage._transient(HttpError({"code": 429, "message": "slow down"}))
    assert not storage._transient(HttpError({"code": 400, "message": "bad"}))
    assert not storage._transient(HttpError({"code": 403, "message": "Forbidden"}))


@pytest.mark.parametrize("url", ["gs://bucket/job/../x", "memory://a/../b", "file:///tmp/a/..",
                                 "memory://..", "gs://b/a/..\\x"])
def test_dot_dot_in_a_url_is_refused(url):
    with pytest.raises(storage.StorageError, match="has a '..' segment"):
        storage.filesystem(url)
    with pytest.raises(storage.StorageError, match="has a '..' segment"):
        storage.absolute_url(url)
    assert storage.absolute_url("/tmp/a/../b") == "/tmp/b"  # a plain path is the user's
    assert storage.absolute_url("memory://a/..b") == "memory://a/..b"
