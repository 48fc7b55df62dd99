"""`python -m predict local`: gcloud's local predict formats on both export formats."""
import json
import subprocess
import sys

import numpy as np
import pytest

from predict.offline import local as local_mode
from predict.runtime import model as models
from predict.__main__ import main
from tests.support.predict_models import (images, instance_lines, legacy_export, legacy_reference,
                             saved_model_export)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    return {"saved": saved_model_export(str(root / "model")),
            "legacy": legacy_export(str(root / "legacy"))}


def run_local(capsys, *args):
    status = main(["local", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_the_three_input_formats_agree(exports, tmp_path, capsys):
    imgs = images(5)
    (tmp_path / "in.json").write_text(instance_lines(imgs, keys=[10, 11, 12, 13, 14]))
    (tmp_path / "req.json").write_text(json.dumps({"instances": [
        {"image": img.reshape(28, 28).tolist(), "key": k}  # 28x28 nested lists
        for img, k in zip(imgs, [10, 11, 12, 13, 14])]}))
    (tmp_path / "in.txt").write_text("".join(" ".join(map(str, img.tolist())) + "\n"
                                             for img in imgs))
    model = ["--model-dir", exports["saved"]]
    status, out, _ = run_local(capsys, *model, "--json-instances", str(tmp_path / "in.json"))
    assert status == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["key"] for r in rows] == [10, 11, 12, 13, 14]
    assert all(list(r) == ["key", "classes", "scores"] for r in rows)
    status, out, _ = run_local(capsys, *model, "--json-request", str(tmp_path / "req.json"))
    assert status == 0 and [json.loads(line) for line in out.splitlines()] == rows
    status, out, _ = run_local(capsys, *model, "--text-instances", str(tmp_path / "in.txt"),
                               "--signature-name", "predict_images")
    text_rows = [json.loads(line) for line in out.splitlines()]
    assert status == 0 and [r["classes"] for r in text_rows] == [r["classes"] for r in rows]
    np.testing.assert_allclose([r["scores"] for r in text_rows],
                               [r["scores"] for r in rows], rtol=1e-6)
    status, out, _ = run_local(capsys, *model, "--json-instances", str(tmp_path / "in.json"),
                               "--format", "table")
    lines = out.splitlines()
    assert status == 0 and lines[0].split() == ["KEY", "CLASSES", "SCORES"]
    assert [line.split()[0] for line in lines[1:]] == ["10", "11", "12", "13", "14"]


def test_legacy_export_answers_through_the_same_command(exports, tmp_path, capsys):
    imgs = images(3, seed=4)
    (tmp_path / "in.json").write_text(instance_lines(imgs, keys=[7, 8, 9]))
    status, out, _ = run_local(capsys, "--model-dir", exports["legacy"], "--json-instances",
                               str(tmp_path / "in.json"))
    rows = [json.loads(line) for line in out.splitlines()]
    assert status == 0 and [r["key"] for r in rows] == [7, 8, 9]
    np.testing.assert_allclose([r["scores"] for r in rows],
                               legacy_reference(exports["legacy"], imgs), rtol=1e-5)


def test_bad_lines_are_named_and_exit_2(exports, tmp_path, capsys):
    good = instance_lines(images(1)).strip()
    cases = {
        "empty line": (f"{good}\n{good}\n\n", "error: line 3: empty line"),
        "malformed JSON": (f"{good}\n{{\"image\": [0.5,\n", "error: line 2: malformed JSON"),
        "short image": (f"{good}\n" + json.dumps({"image": [0.5] * 10, "key": 1}) + "\n",
                        "error: line 2: image has shape [10], the signature wants [784]"),
    }
    for name, (text, message) in cases.items():
        (tmp_path / "in.json").write_text(text)
        status, out, err = run_local(capsys, "--model-dir", exports["saved"],
                                     "--json-instances", str(tmp_path / "in.json"))
        assert (status, out) == (2, ""), name
        assert err.strip() == message or err.startswith(message), (name, err)


def test_missing_or_unrecognised_model_dir_is_a_usage_error(exports, tmp_path, capsys):
    (tmp_path / "in.json").write_text(instance_lines(images(1)))
    status, _, err = run_local(capsys, "--model-dir", str(tmp_path), "--json-instances",
                               str(tmp_path / "in.json"))
    assert status == 2
    assert "looked for saved_model.pb (a SavedModel) and export.meta" in err
    status, _, err = run_local(capsys, "--model-dir", exports["saved"], "--json-instances",
                               str(tmp_path / "in.json"), "--signature-name", "nope")
    assert status == 2 and "no signature 'nope'" in err and "predict_images" in err


def test_stdin_and_exit_status_in_a_real_process(exports):
    imgs = images(2, seed=9)
    done = subprocess.run([sys.executable, "-m", "predict", "local", "--model-dir",
                           exports["saved"], "--json-instances", "-"],
                          input=instance_lines(imgs, keys=[5, 6]), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["key"] for line in done.stdout.splitlines()] == [5, 6]
    bad = subprocess.run([sys.executable, "-m", "predict", "local", "--model-dir",
                          exports["saved"], "--json-instances", "-"],
                         input="not json\n", capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "error: line 1: malformed JSON" in bad.stderr
    assert "Traceback" not in bad.stderr and bad.stdout == ""


def test_batches_never_exceed_the_limit_and_keep_order(exports):
    model = models.load(exports["saved"])
    sizes = []
    real_predict = model.predict

    def recording(batch, signature_name=None):
        sizes.append(len(batch["key"]))
        return real_predict(batch, signature_name)

    model.predict = recording
    imgs = images(600, seed=2)
    labelled = [(f"line {i + 1}", {"image": img.tolist(), "key": 1000 + i})
                for i, img in enumerate(imgs)]
    rows = list(local_mode.predict_instances(model, labelled))
    assert sizes == [256, 256, 88] and max(sizes) <= local_mode.MAX_BATCH
    assert [r["key"] for r in rows] == list(range(1000, 1600))
    whole = real_predict({"image": imgs, "key": np.arange(600)})
    np.testing.assert_allclose([r["scores"] for r in rows], whole["scores"], rtol=1e-5,
                               atol=1e-7)


def test_model_at_a_memory_url_is_downloaded_first(exports, memfs, tmp_path, capsys):
    from mljob import storage
    storage.upload_tree(exports["legacy"], "memory://models/legacy")
    (tmp_path / "in.json").write_text(instance_lines(images(2), keys=[1, 2]))
    status, out, err = run_local(capsys, "--model-dir", "memory://models/legacy",
                                 "--json-instances", str(tmp_path / "in.json"))
    assert status == 0, err
    assert [json.loads(line)["key"] for line in out.splitlines()] == [1, 2]
