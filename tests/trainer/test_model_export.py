"""trainer.model and trainer.export: both models' shapes; the SavedModel's signatures as
TensorFlow's loader and the real `saved_model_cli` see them; no device placement; export
to memory:// and gs://; re-exports replace the old one whole, and a failed export leaves
the old one intact."""
from __future__ import annotations

import os
import re
import subprocess

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from mljob import storage
from trainer import data, export, model
from tests.support.common import ROOT
from trainer.errors import TrainerError, UsageError

SAMPLE = os.path.join(ROOT, "trainer", "sample")


@pytest.fixture(scope="module")
def sample():
    return data.load(SAMPLE)


@pytest.fixture(scope="module")
def trained(sample):
    """An MLP trained for one short epoch on the sample, so its classes vary."""
    mlp = model.build("mlp", seed=3)
    mlp.compile(optimizer=tf.keras.optimizers.Adam(0.01),
                loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    mlp.fit(data.to_float(sample.train_images), sample.train_labels, batch_size=100,
            epochs=1, verbose=0)
    return mlp


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    url = str(tmp_path_factory.mktemp("job") / "model")
    assert export.export("mlp", trained.get_weights(), url) == url
    return url


def _classes(keras_model, images: np.ndarray) -> np.ndarray:
    return np.argmax(keras_model(images, training=False).numpy(), axis=1)


def _cli(*args: str) -> str:
    proc = subprocess.run(["saved_model_cli", *args], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


# ---- models ----------------------------------------------------------------------------

@pytest.mark.parametrize("name, params", [("cnn", 3_274_634), ("mlp", 79_510)])
def test_models_map_pixels_to_ten_logits(name, params):
    net = model.build(name, seed=1)
    logits = net(np.random.RandomState(0).rand(3, 784).astype(np.float32), training=False)
    assert logits.shape == (3, 10)
    assert model.num_parameters(name) == params == net.count_params()
    assert model.weights_bytes(name) == 4 * params
    again = model.build(name, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(net.get_weights(), again.get_weights()))


def test_models_build_inside_a_strategy_scope():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        net = model.build("mlp")
    assert isinstance(net.weights[0].value, tf.distribute.DistributedValues)


def test_unknown_model_and_bad_dropout_are_usage_errors():
    with pytest.raises(UsageError, match="use --model with one of cnn, mlp"):
        model.build("resnet")
    with pytest.raises(UsageError, match="--dropout"):
        model.build("cnn", dropout=1.5)


# ---- the export as TensorFlow and saved_model_cli see it ----------------------------

def test_export_loads_and_matches_the_keras_model(exported, trained, sample):
    images = data.to_float(sample.test_images[:50])
    loaded = export.load(exported)
    serve = loaded.signatures["serving_default"]
    out = serve(image=tf.constant(images), key=tf.range(100, 150, dtype=tf.int64))
    assert set(out) == {"key", "scores", "classes"}
    assert out["key"].dtype == tf.int64
    assert list(out["key"].numpy()) == list(range(100, 150))
    assert out["classes"].dtype == tf.int64 and out["scores"].shape == (50, 10)
    np.testing.assert_allclose(out["scores"].numpy().sum(axis=1), 1.0, rtol=1e-5)
    expected = _classes(trained, images)
    assert len(set(expected)) > 2  # a trained model, not one constant answer
    np.testing.assert_array_equal(out["classes"].numpy(), expected)
    bare = loaded.signatures["predict_images"](image=tf.constant(images))
    assert set(bare) == {"scores", "classes"}
    np.testing.assert_array_equal(bare["classes"].numpy(), expected)


def test_saved_model_cli_shows_the_signatures(exported):
    text = _cli("show", "--all", "--dir", exported)
    blocks = dict(re.findall(r"signature_def\['(\w+)'\]:(.*?)Method name", text, re.S))
    serving = blocks["serving_default"]
    inputs, outputs = serving.split("output(s):")
    assert sorted(re.findall(r"inputs\['(\w+)'\]", inputs)) == ["image", "key"]
    assert sorted(re.findall(r"outputs\['(\w+)'\]", outputs)) == ["classes", "key",
                                                                   "scores"]

    def tensor(kind, name, dtype, shape=""):
        return rf"{kind}\['{name}'\] tensor_info:\s+dtype: {dtype}\s+shape: {shape}"

    assert re.search(tensor("inputs", "image", "DT_FLOAT", r"\(-1, 784\)"), inputs)
    assert re.search(tensor("inputs", "key", "DT_INT64", r"\(-1\)"), inputs)
    assert re.search(tensor("outputs", "key", "DT_INT64", r"\(-1\)"), outputs)
    assert re.search(tensor("outputs", "scores", "DT_FLOAT", r"\(-1, 10\)"), outputs)
    assert re.search(tensor("outputs", "classes", "DT_INT64", r"\(-1\)"), outputs)
    bare_in, bare_out = blocks["predict_images"].split("output(s):")
    assert re.findall(r"inputs\['(\w+)'\]", bare_in) == ["image"]
    assert sorted(re.findall(r"outputs\['(\w+)'\]", bare_out)) == ["classes", "scores"]


def test_saved_model_cli_run_gives_the_keras_classes(exported, trained, sample):
    # --input_exprs takes Python literals only: spell the two images out.
    images = np.round(data.to_float(sample.test_images[:2]), 3)
    literal = repr(images.tolist()).replace(" ", "")
    text = _cli("run", "--dir", exported, "--tag_set", "serve",
                "--signature_def", "serving_default",
                "--input_exprs", f"image={literal};key=[7,9]")
    results = dict(re.findall(r"Result for output key (\w+):\n(\[[^\]]*\])", text))
    assert results["key"] == "[7 9]"
    classes = [int(c) for c in results["classes"].strip("[]").split()]
    assert classes == list(_classes(trained, images))


def _devices(saved_model_dir: str) -> dict[str, set[str]]:
    """Device strings in the SavedModel's graph, by function ('' for the top level)."""
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(saved_model_dir, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    graph = proto.meta_graphs[0].graph_def
    found = {"": {n.device for n in graph.node if n.device}}
    for function in graph.library.function:
        found[function.signature.name] = {n.device for n in function.node_def if n.device}
    return found


def test_export_has_no_device_placement_whatever_the_callers_scope(trained, tmp_path):
    # The chief may call export inside a strategy scope or under a device naming a job
    # that exists only in its cluster; neither may leak into the export.
    url = str(tmp_path / "model")
    weights = trained.get_weights()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope(), tf.device("/job:worker/replica:0/task:1/device:CPU:0"):
        export.export("mlp", weights, url)
    devices = _devices(url)
    everything = set().union(*devices.values())
    assert not any(part in d for d in everything for part in ("job:", "task:", "GPU"))
    # TensorFlow's own save/restore functions pin to the local host CPU; the model's
    # functions name no device at all.
    assert everything <= {"/device:CPU:0", "/device:CPU:*"}
    for name, found in devices.items():
        if found and name:
            assert "_traced_save_" in name or "_traced_restore_" in name, (name, found)
    proto_vars = os.listdir(os.path.join(url, "variables"))
    assert sorted(proto_vars) == ["variables.data-00000-of-00001", "variables.index"]


def test_cnn_export_round_trips(sample, tmp_path):
    cnn = model.build("cnn", seed=5)
    url = export.export("cnn", cnn.get_weights(), f"file://{tmp_path}/cnn-model")
    images = data.to_float(sample.test_images[:8])
    out = export.load(url).signatures["predict_images"](image=tf.constant(images))
    expected = tf.nn.softmax(cnn(images, training=False)).numpy()
    np.testing.assert_allclose(out["scores"].numpy(), expected, atol=1e-5)


def test_wrong_weights_are_refused(tmp_path):
    with pytest.raises(TrainerError, match="do not fit model 'cnn'"):
        export.export("cnn", model.build("mlp").get_weights(), str(tmp_path / "m"))
    assert not os.path.exists(tmp_path / "m")


def test_load_of_a_missing_export_names_the_fix(tmp_path):
    with pytest.raises(UsageError, match=r"no SavedModel at .*saved_model.pb is missing"):
        export.load(str(tmp_path / "nothing"))


# ---- storage: object stores, whole replacement, atomic publish ---------------------------

def _check_classes(url: str, trained, images: np.ndarray) -> None:
    out = export.load(url).signatures["predict_images"](image=tf.constant(images))
    np.testing.assert_array_equal(out["classes"].numpy(), _classes(trained, images))


def test_export_to_memory_replaces_the_old_one_whole(trained, sample, memfs):
    url = "memory://jobs/j1/model"
    export.export("mlp", model.build("mlp").get_weights(), url)
    memfs.pipe("/jobs/j1/model/variables/stale.data-00001-of-00002", b"old shard")
    memfs.pipe("/jobs/j1/model/assets/old-vocab.txt", b"old")
    export.export("mlp", trained.get_weights(), url)
    files = sorted(p.split("/model/")[1] for p in memfs.find("/jobs/j1/model"))
    assert files == ["fingerprint.pb", "saved_model.pb",
                     "variables/variables.data-00000-of-00001", "variables/variables.index"]
    _check_classes(url, trained, data.to_float(sample.test_images[:20]))


def test_export_to_gcs(trained, sample, gcs_emulator):
    url = "gs://mljob-test/export-test/model"
    export.export("mlp", trained.get_weights(), url)
    fs, path = storage.filesystem(url)
    assert fs.exists(f"{path}/saved_model.pb")
    _check_classes(url, trained, data.to_float(sample.test_images[:20]))


def test_local_reexport_replaces_stale_files(trained, tmp_path):
    url = str(tmp_path / "model")
    export.export("mlp", model.build("mlp").get_weights(), url)
    stale = tmp_path / "model" / "variables" / "variables.data-00001-of-00002"
    stale.write_bytes(b"left over from a sharded export")
    export.export("mlp", trained.get_weights(), url)
    assert not stale.exists()
    assert sorted(os.listdir(tmp_path)) == ["model"]  # no temporary copies beside it


def test_failed_export_leaves_the_old_one_intact(trained, sample, tmp_path, monkeypatch):
    url = str(tmp_path / "model")
    export.export("mlp", trained.get_weights(), url)
    before = {p: (tmp_path / "model" / p).read_bytes()
              for p in ("saved_model.pb", "variables/variables.index")}
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    real_save = tf.saved_model.save

    def save_then_crash(obj, path, **kwargs):
        real_save(obj, path, **kwargs)  # files written, then the process "dies"
        raise OSError("No space left on device")

    monkeypatch.setattr(tf.saved_model, "save", save_then_crash)
    with pytest.raises(OSError, match="No space left"):
        export.export("mlp", model.build("mlp", seed=9).get_weights(), url)
    for p, content in before.items():
        assert (tmp_path / "model" / p).read_bytes() == content
    assert os.listdir(scratch) == []  # the half-made export was cleaned away
    assert sorted(os.listdir(tmp_path)) == ["model", "scratch"]
    _check_classes(url, trained, data.to_float(sample.test_images[:20]))


def test_interrupted_upload_never_shows_a_half_export(trained, memfs, monkeypatch):
    # Object stores have no rename: the marker goes last, so a reader either finds the
    # whole export or none, never new variables under an old graph.
    url = "memory://jobs/j2/model"
    export.export("mlp", trained.get_weights(), url)
    real_put = type(memfs).put_file

    def put_file(self, lpath, rpath, *args, **kwargs):
        if rpath.endswith("saved_model.pb"):
            raise RuntimeError("connection lost")
        return real_put(self, lpath, rpath, *args, **kwargs)

    monkeypatch.setattr(type(memfs), "put_file", put_file)
    with pytest.raises(storage.StorageError, match="connection lost"):
        export.export("mlp", model.build("mlp").get_weights(), url)
    with pytest.raises(UsageError, match="saved_model.pb is missing"):
        export.load(url)
