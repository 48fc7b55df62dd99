"""`models` and `versions` as gcloud's, over a base path `predict serve` watches, and
gcloud's online `predict` against a running server: the default version moved live."""
from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
import yaml

from mljob import model_meta
from submit import models
from tests.support.predict_models import images, saved_model_export, start_server
from tests.support.submit_cli import one_error_line, run

IMAGES = images(2, seed=5)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Two exports with different weights (the trainer's own exporter), and the scores
    each gives for IMAGES, computed in-process with its signature."""
    import tensorflow as tf
    root = tmp_path_factory.mktemp("exports")
    out = {}
    for seed in (1, 2):
        path = saved_model_export(str(root / f"seed{seed}"), seed=seed)
        fn = tf.saved_model.load(path).signatures["serving_default"]
        scores = fn(image=tf.constant(IMAGES),
                    key=tf.constant(np.arange(2), tf.int64))["scores"].numpy()
        out[seed] = (path, scores)
    return out


def ok(capsys, *argv) -> str:
    status, out, err = run(capsys, *argv)
    assert status == 0, err
    return out


def test_models_and_versions_life(capsys, tmp_path, exports):
    base = tmp_path / "served" / "fashion"
    assert ok(capsys, "models", "create", "fashion", "--base-path", str(base),
              "--description", "shoes", "--labels", "team=vision", "--regions",
              "us-central1") == f"Created model [fashion] at {base}.\n"
    ok(capsys, "models", "create", "other")   # default base path under $MLJOB_HOME
    assert models.base_path("other") == os.path.join(os.environ["MLJOB_HOME"], "serving",
                                                     "other")
    out = ok(capsys, "models", "list")
    assert out.splitlines()[0].split() == ["NAME", "DEFAULT_VERSION_NAME"]
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["fashion", "other"]

    out = ok(capsys, "versions", "create", "v1", "--model", "fashion", "--origin",
             exports[1][0], "--labels", "stage=prod")
    assert "as version 1" in out
    ok(capsys, "versions", "create", "candidate", "--model", "fashion", "--origin",
       exports[2][0])
    assert (base / "1" / "saved_model.pb").exists() and (base / "2" / "saved_model.pb").exists()

    model = yaml.safe_load(ok(capsys, "models", "describe", "fashion"))
    assert model["name"] == "fashion" and model["description"] == "shoes"
    assert model["labels"] == {"team": "vision"} and model["regions"] == ["us-central1"]
    assert model["defaultVersion"]["name"] == "v1"   # the first version is the default
    versions = json.loads(ok(capsys, "versions", "list", "--model", "fashion", "--format",
                             "json"))
    assert [(v["name"], v["mljob"]["number"], v["isDefault"], v["state"])
            for v in versions] == [("v1", 1, True, "READY"), ("candidate", 2, False, "READY")]
    assert versions[0]["deploymentUri"] == str(base / "1")
    assert versions[0]["labels"] == {"stage": "prod"}
    assert versions[0]["createTime"].endswith("Z")
    assert ok(capsys, "versions", "describe", "candidate", "--model", "fashion",
              "--format", "value(mljob.origin)").strip() == exports[2][0]

    ok(capsys, "versions", "set-default", "candidate", "--model", "fashion")
    assert model_meta.version_labels(model_meta.read(str(base))) == {"default": 2}
    # the default cannot go while others exist; a model with versions cannot go
    status, _, err = run(capsys, "versions", "delete", "candidate", "--model", "fashion")
    assert status == 2 and "make another the default first" in one_error_line(err)
    status, _, err = run(capsys, "models", "delete", "fashion")
    assert status == 2 and "has versions; delete them first" in one_error_line(err)
    ok(capsys, "versions", "delete", "v1", "--model", "fashion")
    assert not (base / "1").exists() and (base / "2" / "saved_model.pb").exists()
    ok(capsys, "versions", "delete", "candidate", "--model", "fashion")
    assert model_meta.read(str(base))["defaultVersion"] is None
    ok(capsys, "models", "delete", "fashion")
    assert not (base / model_meta.MODEL_FILE).exists()
    assert ok(capsys, "models", "list", "--format", "value(name)") == "other\n"


def test_a_folder_predict_publish_made_is_version_v_n(capsys, tmp_path, exports):
    base = tmp_path / "base"
    ok(capsys, "models", "create", "m1", "--base-path", str(base))
    from predict.models import publish
    assert publish.publish(exports[1][0], str(base)) == 1   # not through `versions`
    out = ok(capsys, "versions", "list", "--model", "m1", "--format", "value(name,state)")
    assert out == "v1\tREADY\n"
    ok(capsys, "versions", "set-default", "v1", "--model", "m1")
    # `v3` asks for number 3 when it is free; a taken number gets the next one
    assert "as version 3" in ok(capsys, "versions", "create", "v3", "--model", "m1",
                                "--origin", exports[2][0])
    assert "as version 4" in ok(capsys, "versions", "create", "v2b", "--model", "m1",
                                "--origin", exports[2][0])


@pytest.mark.parametrize("argv,words", [
    (["models", "create", "2fast"], "invalid model name '2fast'"),
    (["models", "create", "m-1"], "e.g. m_1"),
    (["models", "create", "m2", "--base-path", "s3://b/x"], "unknown URL scheme 's3'"),
    (["models", "create", "m2", "--regions", "mars"], "is not a Google Cloud region"),
    (["models", "create", "m2", "--labels", "Bad=1"], "is not a Google Cloud label key"),
    (["models", "create", "m1"], "model 'm1' already exists"),
    (["models", "describe", "nope"], "no model 'nope' in the local index"),
    (["versions", "create", "v1", "--model", "m1", "--origin", "{missing}"],
     "does not exist"),
    (["versions", "create", "v 1", "--model", "m1", "--origin", "{missing}"],
     "invalid version name 'v 1'"),
    (["versions", "create", "v1", "--model", "m1"], "give the export to publish: --origin"),
    (["versions", "set-default", "v9", "--model", "m1"], "model 'm1' has no version 'v9'"),
    (["versions", "delete", "v9", "--model", "m1"], "model 'm1' has no version 'v9'"),
    (["predict", "--model", "m1", "--json-instances", "{lines}", "--endpoint",
      "ftp://x"], "is not a server's address"),
    (["predict", "--model", "m1"], "give exactly one of --json-instances"),
    (["predict", "--model", "m1", "--json-instances", "{bad_lines}"],
     "--json-instances line 2 is not JSON"),
    (["predict", "--model", "m1", "--json-instances", "{many}"],
     "holds 101 instances; online prediction takes at most 100"),
    (["predict", "--model", "m1", "--json-instances", "{empty}"], "holds no instances"),
    (["predict", "--model", "m1", "--json-request", "{bad_lines}"],
     "--json-request is not JSON"),
    (["predict", "--model", "m1", "--json-request", "{lines}"],
     '--json-request must be {"instances": [...]}'),
    (["predict", "--model", "m1", "--version", "v9", "--json-instances", "{lines}"],
     "model 'm1' has no version 'v9'"),
    (["predict", "--model", "zz", "--version", "best", "--json-instances", "{lines}"],
     "only numbered versions (3 or v3)"),
])
def test_models_versions_and_predict_mistakes_are_one_line(capsys, tmp_path, argv, words):
    ok(capsys, "models", "create", "m1", "--base-path", str(tmp_path / "m1"))
    before = (tmp_path / "m1" / model_meta.MODEL_FILE).read_bytes()
    files = {"missing": tmp_path / "nothing", "lines": tmp_path / "lines.json",
             "bad_lines": tmp_path / "bad.json", "many": tmp_path / "many.json",
             "empty": tmp_path / "empty.json"}
    files["lines"].write_text('{"image": [0.0]}\n')
    files["bad_lines"].write_text('{"image": [0.0]}\n{"image": \n')
    files["many"].write_text('{"x": 1}\n' * 101)
    files["empty"].write_text("\n\n")
    argv = [str(files[a[1:-1]]) if a.startswith("{") else a for a in argv]
    status, out, err = run(capsys, *argv)
    assert status == 2 and out == ""
    assert words in one_error_line(err)
    assert (tmp_path / "m1" / model_meta.MODEL_FILE).read_bytes() == before
    assert sorted(os.listdir(tmp_path / "m1")) == [model_meta.MODEL_FILE]


def which(exports, index: int, scores) -> int | None:
    return next((seed for seed, (_, want) in exports.items()
                 if np.allclose(scores, want[index], rtol=1e-5, atol=1e-7)), None)


def test_online_predict_follows_set_default_live(capsys, tmp_path, exports, reaper):
    """The server started as docs/predict.md says (no version policy) serves every
    READY version of a model, the default through its label: v1 stays the default after
    v2 is created and answers, as Cloud ML served every version it created; set-default
    and delete are followed at the next poll of the base path."""
    import httpx
    from tests.support.predict_models import states
    base = tmp_path / "base"
    ok(capsys, "models", "create", "fashion", "--base-path", str(base))
    ok(capsys, "versions", "create", "v1", "--model", "fashion", "--origin", exports[1][0])
    ok(capsys, "versions", "create", "v2", "--model", "fashion", "--origin", exports[2][0])
    proc, url = start_server(reaper.popen, str(base), "--model-name", "fashion",
                             flag="--model-base-path")   # polls every second (default)
    instances = tmp_path / "instances.json"
    instances.write_text("".join(json.dumps({"image": img.tolist(), "key": i}) + "\n"
                                 for i, img in enumerate(IMAGES)))

    def predict(*extra):
        out = ok(capsys, "predict", "--model", "fashion", "--json-instances",
                 str(instances), "--endpoint", url, *extra)
        predictions = json.loads(out)["predictions"]
        assert [p["key"] for p in predictions] == [0, 1]
        return [which(exports, i, p["scores"]) for i, p in enumerate(predictions)]

    assert predict() == [1, 1]                 # the default: v1, though v2 is newer
    assert predict("--version", "v1") == [1, 1]
    assert predict("--version", "v2") == [2, 2]
    ok(capsys, "versions", "set-default", "v2", "--model", "fashion")
    deadline = time.monotonic() + 60
    while predict() != [2, 2]:                 # moved live, at the server's next poll
        assert time.monotonic() < deadline, "the default never moved"
        time.sleep(0.2)
    assert proc.poll() is None                 # the same server, never restarted
    out = ok(capsys, "predict", "--model", "fashion", "--json-instances", str(instances),
             "--endpoint", url, "--format", "value(key)")
    assert out == "0\n1\n"

    def served_after(what: str) -> dict:
        """{version: state} once the change shows: within one poll (1 s), and slack."""
        started, before = time.monotonic(), states(client.get(
            "/v1/models/fashion").json()["model_version_status"])
        while True:
            now = states(client.get("/v1/models/fashion").json()["model_version_status"])
            if now != before:
                took[what] = round(time.monotonic() - started, 2)
                return now
            assert time.monotonic() - started < 6, f"{what} never followed: {now}"
            time.sleep(0.05)

    took: dict[str, float] = {}
    with httpx.Client(base_url=url, timeout=30) as client:
        ok(capsys, "versions", "delete", "v1", "--model", "fashion")
        assert served_after("delete v1") == {2: "AVAILABLE", 1: "END"}
        assert client.post("/v1/models/fashion/versions/1:predict", json={
            "instances": [{"image": IMAGES[0].tolist(), "key": 0}]}).status_code == 404
        assert predict() == [2, 2]
        ok(capsys, "versions", "delete", "v2", "--model", "fashion")  # the only one
        assert served_after("delete v2") == {2: "END", 1: "END"}
    status, _, err = run(capsys, "predict", "--model", "fashion", "--json-instances",
                         str(instances), "--endpoint", url)
    assert status == 1 and "answered HTTP 404" in one_error_line(err)
    status, _, err = run(capsys, "predict", "--model", "nosuch", "--json-instances",
                         str(instances), "--endpoint", url)
    assert status == 1 and "answered HTTP 404" in one_error_line(err)
    with capsys.disabled():
        print(f"served set followed in: {took}")
    proc.terminate()
    proc.wait(30)
    status, _, err = run(capsys, "predict", "--model", "fashion", "--json-instances",
                         str(instances), "--endpoint", url)
    assert status == 1 and "cannot reach" in one_error_line(err)


def test_local_predict_is_gclouds_local_predict(capsys, tmp_path, exports):
    instances = tmp_path / "instances.json"
    instances.write_text("".join(json.dumps({"image": img.tolist(), "key": i}) + "\n"
                                 for i, img in enumerate(IMAGES)))
    out = ok(capsys, "local", "predict", "--model-dir", exports[2][0], "--json-instances",
             str(instances))
    predictions = [json.loads(line) for line in out.splitlines()]   # one a line
    assert [which(exports, i, p["scores"]) for i, p in enumerate(predictions)] == [2, 2]
    status, _, err = run(capsys, "local", "predict", "--model-dir", exports[2][0])
    assert status == 2 and "give exactly one of" in one_error_line(err)


def test_a_model_on_an_object_store_url(capsys, exports, memfs):
    """Any fsspec URL is a base path: versions published marker last, the record beside
    them, deleted marker first."""
    from mljob import storage
    ok(capsys, "models", "create", "mem", "--base-path", "memory://served/mem")
    ok(capsys, "versions", "create", "v1", "--model", "mem", "--origin", exports[1][0])
    assert storage.exists("memory://served/mem/1/saved_model.pb")
    assert model_meta.version_labels(model_meta.read("memory://served/mem")) == {
        "default": 1}
    out = ok(capsys, "versions", "list", "--model", "mem", "--format",
             "value(name,deploymentUri,state,isDefault)")
    assert out == "v1\tmemory://served/mem/1\tREADY\tTrue\n"
    ok(capsys, "versions", "delete", "v1", "--model", "mem")
    assert not storage.exists("memory://served/mem/1")
    ok(capsys, "models", "delete", "mem")
    assert not storage.exists("memory://served/mem/" + model_meta.MODEL_FILE)


def test_named_pipes_in_the_index_are_never_opened(capsys, tmp_path):
    """A named pipe where a model entry or a job's label file should be would block a
    reader for ever: both are refused or passed over, never opened."""
    from submit import jobs as records, resource
    os.makedirs(os.path.join(os.environ["MLJOB_HOME"], "models"))
    os.mkfifo(models.index_path("piped"))
    status, _, err = run(capsys, "models", "describe", "piped")
    assert status == 1 and "is damaged; remove it" in one_error_line(err)
    record = records.JobRecord("job01", labels={"team": "vision"})
    record.set_state(records.SUCCEEDED)
    records.save(record)
    os.makedirs(os.path.dirname(resource.labels_path("job01")))
    os.mkfifo(resource.labels_path("job01"))
    out = ok(capsys, "jobs", "describe", "job01", "--format", "value(labels.team)")
    assert out == "vision\n"
