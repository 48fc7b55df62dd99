"""The three modes (local, batch, serve) and TensorFlow's own `saved_model_cli run`
answer the same instances of the trainer's export with the same predictions."""
import json
import subprocess

import httpx
import numpy as np
import pytest

from predict.__main__ import main
from tests.support.predict_models import images, instance_lines, saved_model_export, start_server

KEYS = [21, 22, 23, 24]


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    return saved_model_export(str(tmp_path_factory.mktemp("exports") / "model"), seed=11)


def saved_model_cli(export_dir, imgs, outdir):
    """`saved_model_cli run` with Python-literal inputs; returns its outputs by name."""
    expr = f"image={imgs.tolist()!r};key={KEYS!r}"
    done = subprocess.run(["saved_model_cli", "run", "--dir", export_dir, "--tag_set", "serve",
                           "--signature_def", "serving_default", "--input_exprs", expr,
                           "--outdir", str(outdir)], capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return {name: np.load(outdir / f"{name}.npy") for name in ("key", "scores", "classes")}


def test_local_batch_serve_and_saved_model_cli_agree(export_dir, tmp_path, capsys, reaper):
    imgs = images(len(KEYS), seed=21)
    lines = instance_lines(imgs, KEYS)
    (tmp_path / "in.json").write_text(lines)

    assert main(["local", "--model-dir", export_dir, "--json-instances",
                 str(tmp_path / "in.json")]) == 0
    local = [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    assert main(["batch", "--model-dir", export_dir, "--input-paths",
                 str(tmp_path / "in.json"), "--data-format", "text", "--output-path",
                 str(tmp_path / "out")]) == 0
    with open(tmp_path / "out" / "prediction.results-00000-of-00001") as f:
        batch = [json.loads(line) for line in f]

    proc, url = start_server(reaper.popen, export_dir)
    answer = httpx.post(f"{url}/v1/models/default:predict", timeout=60,
                        json={"instances": [json.loads(line) for line in lines.splitlines()]})
    assert answer.status_code == 200, answer.text
    served = answer.json()["predictions"]

    cli = saved_model_cli(export_dir, imgs, tmp_path / "cli")
    assert cli["key"].tolist() == KEYS
    for name, rows in (("local", local), ("batch", batch), ("serve", served)):
        assert [r["key"] for r in rows] == KEYS, name
        assert [r["classes"] for r in rows] == cli["classes"].tolist(), name
        np.testing.assert_allclose([r["scores"] for r in rows], cli["scores"], rtol=1e-5,
                                   atol=1e-7, err_msg=name)
