"""The instance key is optional in every predict path (local, batch, REST rows and
columns; gRPC in test_predict_grpc.py): without it the client gets its predictions, with
it the key comes back. And what an export accepts comes from its signature only: a
user's model whose input is named `image` takes 0-255 pixels when it rescales them."""
import json

import httpx
import numpy as np
import pytest

from predict.__main__ import main
from tests.support.predict_models import images, saved_model_export, start_server


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    return saved_model_export(str(tmp_path_factory.mktemp("exports") / "model"), seed=5)


def _lines(imgs, keys):
    """JSON lines; a key of None is left out of its instance."""
    return "".join(json.dumps({"image": img.tolist(), **({} if k is None else {"key": k})})
                   + "\n" for img, k in zip(imgs, keys, strict=True))


def test_local_batch_and_rest_answer_with_or_without_the_key(export_dir, tmp_path, capsys,
                                                            reaper):
    imgs = images(3, seed=4)
    keys = [None, 42, None]
    (tmp_path / "in.json").write_text(_lines(imgs, keys))
    assert main(["local", "--model-dir", export_dir, "--json-instances",
                 str(tmp_path / "in.json")]) == 0
    local = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert main(["batch", "--model-dir", export_dir, "--input-paths",
                 str(tmp_path / "in.json"), "--data-format", "text", "--output-path",
                 str(tmp_path / "out")]) == 0
    with open(tmp_path / "out" / "prediction.results-00000-of-00001") as f:
        batch = [json.loads(line) for line in f]
    proc, url = start_server(reaper.popen, export_dir)
    rows = httpx.post(f"{url}/v1/models/default:predict", timeout=60, json={
        "instances": [json.loads(line) for line in _lines(imgs, keys).splitlines()]})
    assert rows.status_code == 200, rows.text
    bare = httpx.post(f"{url}/v1/models/default:predict", timeout=60,
                      json={"instances": imgs.tolist()})  # TF Serving's plain client
    assert bare.status_code == 200, bare.text
    keyless = httpx.post(f"{url}/v1/models/default:predict", timeout=60,
                         json={"inputs": {"image": imgs.tolist()}})
    keyed = httpx.post(f"{url}/v1/models/default:predict", timeout=60,
                       json={"inputs": {"image": imgs.tolist(), "key": [7, 8, 9]}})
    assert keyless.status_code == keyed.status_code == 200, keyless.text + keyed.text

    for name, answer in (("local", local), ("batch", batch),
                         ("rows", rows.json()["predictions"])):
        assert ["key" in r for r in answer] == [False, True, False], name
        assert answer[1]["key"] == 42, name
        assert [sorted(r) for r in answer][0] == ["classes", "scores"], name
        assert answer == local, name
    assert [sorted(r) for r in bare.json()["predictions"]] == [["classes", "scores"]] * 3
    assert [r["classes"] for r in bare.json()["predictions"]] == [r["classes"] for r in local]
    assert "key" not in keyless.json()["outputs"]
    assert keyed.json()["outputs"]["key"] == [7, 8, 9]
    assert keyless.json()["outputs"]["classes"] == keyed.json()["outputs"]["classes"] \
        == [r["classes"] for r in local]


def test_a_users_model_with_an_image_input_takes_0_255_pixels(tmp_path, capsys):
    """The model rescales 0-255 pixels itself (Keras's Rescaling): its export says
    float32 [None, 4] and nothing about the range, so 0-255 values are its to take."""
    import keras
    import tensorflow as tf
    inputs = keras.Input((4,), name="image")
    outputs = keras.layers.Dense(2, activation="softmax", name="scores")(
        keras.layers.Rescaling(1 / 255)(inputs))
    model = keras.Model(inputs, outputs)

    class Export(tf.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="image")])
        def serve(self, image):
            return {"scores": self.model(image, training=False)}

    module = Export()
    tf.saved_model.save(module, str(tmp_path / "model"),
                        signatures={"serving_default": module.serve})
    pixels = [[0.0, 128.0, 255.0, 64.0], [255.0, 255.0, 0.0, 1.0]]
    (tmp_path / "in.json").write_text("".join(json.dumps({"image": p}) + "\n" for p in pixels))
    assert main(["local", "--model-dir", str(tmp_path / "model"), "--json-instances",
                 str(tmp_path / "in.json")]) == 0
    out, err = capsys.readouterr()
    got = [json.loads(line) for line in out.splitlines()]
    want = model(np.float32(pixels)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert "1/255" not in err


def test_a_tabular_model_takes_string_int_and_float_inputs(tmp_path, capsys, reaper):
    """docs/predict.md's census-style example: a scalar float, a string and an int64
    column and a key; instances with and without the key, rows and columns over REST."""
    import keras
    import tensorflow as tf
    age = keras.Input((), name="age")
    education = keras.Input((), dtype="string", name="education")
    hours = keras.Input((), dtype="int64", name="hours")
    ids = keras.layers.StringLookup(vocabulary=["Bachelors", "HS-grad"])(education)
    features = keras.layers.Concatenate()([
        keras.layers.Flatten()(keras.layers.Embedding(3, 2)(ids)),
        keras.layers.Reshape((1,))(age / 100.0),
        keras.layers.Reshape((1,))(keras.ops.cast(hours, "float32") / 100.0)])
    model = keras.Model([age, education, hours],
                        keras.layers.Dense(1, activation="sigmoid")(features))
    specs = [tf.TensorSpec([None], tf.float32, name="age"),
             tf.TensorSpec([None], tf.string, name="education"),
             tf.TensorSpec([None], tf.int64, name="hours"),
             tf.TensorSpec([None], tf.int64, name="key")]

    class Export(tf.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        @tf.function(input_signature=specs)
        def serve(self, age, education, hours, key):
            return {"probability": self.model([age, education, hours], training=False),
                    "key": tf.identity(key)}

    module = Export()
    tf.saved_model.save(module, str(tmp_path / "census"),
                        signatures={"serving_default": module.serve})
    lines = ('{"age": 39.0, "education": "Bachelors", "hours": 40, "key": 1}\n'
             '{"age": 50.5, "education": "HS-grad", "hours": 13}\n')
    (tmp_path / "in.json").write_text(lines)
    assert main(["local", "--model-dir", str(tmp_path / "census"), "--json-instances",
                 str(tmp_path / "in.json")]) == 0
    local = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    want = model([np.float32([39.0, 50.5]), np.array([b"Bachelors", b"HS-grad"]),
                  np.int64([40, 13])]).numpy()
    assert local[0]["key"] == 1 and sorted(local[1]) == ["probability"]
    np.testing.assert_allclose([r["probability"] for r in local], want, rtol=1e-5)
    proc, url = start_server(reaper.popen, str(tmp_path / "census"))
    rows = httpx.post(f"{url}/v1/models/default:predict", timeout=60, json={"instances": [
        {"age": 39.0, "education": "Bachelors", "hours": 40}]})
    columns = httpx.post(f"{url}/v1/models/default:predict", timeout=60, json={"inputs": {
        "age": [39.0, 50.5], "education": ["Bachelors", "HS-grad"], "hours": [40, 13]}})
    assert rows.status_code == columns.status_code == 200, rows.text + columns.text
    np.testing.assert_allclose(rows.json()["predictions"][0]["probability"], want[0],
                               rtol=1e-5)
    assert sorted(columns.json()["outputs"]) == ["probability"]
    np.testing.assert_allclose(columns.json()["outputs"]["probability"], want, rtol=1e-5)
    for bad, words in (({"age": 39.0, "education": "Bachelors", "hours": 40.0},
                        "hours must hold integers (int64), got floats"),
                       ({"age": 39.0, "education": 3, "hours": 40},
                        "education must hold strings, got int")):
        answer = httpx.post(f"{url}/v1/models/default:predict", timeout=60,
                            json={"instances": [bad]})
        assert answer.status_code == 400 and words in answer.text, answer.text
