"""`--mixed-precision mixed_bfloat16`: a single-node run computes in bfloat16 yet keeps
float32 variables, so its checkpoints and its export are those of a float32 run (what
the real `saved_model_cli` shows); an unknown value is a usage error."""
from __future__ import annotations

import contextlib
import io
import subprocess

import numpy as np
from trainer import task
from tests.support.trainer_runs import FAST


def test_mixed_bfloat16_trains_and_exports_float32(tmp_path):
    job = tmp_path / "job"
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        status = task.main([*FAST, "--job-dir", str(job), "--mixed-precision",
                            "mixed_bfloat16", "--train-steps", "40", "--log-every", "20",
                            "--eval-every", "0", "--checkpoint-every", "0"])
    out = buffer.getvalue()
    assert status == 0, out
    assert "mixed_precision=mixed_bfloat16" in out.splitlines()[0]
    evals = [line for line in out.splitlines() if line.startswith("eval step=")]
    assert float(evals[-1].rsplit("accuracy=", 1)[1]) > 0.5  # it learned in bfloat16

    import tensorflow as tf

    # The checkpoint holds float32 variables, as a float32 run's would.
    reader = tf.train.load_checkpoint(str(job / "checkpoints"))
    dtypes = reader.get_variable_to_dtype_map()
    kernels = [name for name in dtypes if "kernel" in name and "optimizer" not in name]
    assert kernels and all(dtypes[name] == tf.float32 for name in kernels), dtypes

    from trainer import export
    loaded = export.load(str(job / "model"))
    scores = loaded.signatures["predict_images"](
        image=tf.zeros([2, 784], tf.float32))["scores"]
    assert scores.dtype == tf.float32
    np.testing.assert_allclose(scores.numpy().sum(axis=1), 1.0, rtol=1e-5)

    shown = subprocess.run(
        ["saved_model_cli", "show", "--dir", str(job / "model"), "--tag_set", "serve",
         "--signature_def", "serving_default"],
        capture_output=True, text=True, timeout=120, check=True).stdout
    for name in ("image", "scores"):
        block = shown.split(f"['{name}'] tensor_info:", 1)[1].split("name:", 1)[0]
        assert "dtype: DT_FLOAT" in block, shown


def test_unknown_precision_is_a_usage_error(capsys):
    assert task.main(["--mixed-precision", "float16"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "--mixed-precision" in err and "mixed_bfloat16" in err


def test_policy_is_per_layer_and_logits_stay_float32():
    import keras

    from trainer import model
    assert task.PRECISIONS == model.PRECISIONS  # repeated in task.py to keep TF unloaded
    mixed = model.build("mlp", precision="mixed_bfloat16")
    assert mixed.get_layer("hidden").compute_dtype == "bfloat16"
    assert mixed.get_layer("logits").compute_dtype == "float32"
    assert {w.dtype for w in mixed.weights} == {"float32"}
    assert mixed(np.zeros([1, 784], np.float32)).dtype == "float32"
    # Not a global policy: a model built next (the export's) is float32 throughout.
    assert keras.mixed_precision.global_policy().name == "float32"
    assert model.build("mlp").get_layer("hidden").compute_dtype == "float32"
