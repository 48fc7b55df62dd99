"""`--mixed-precision`: a single-node run computing in bfloat16 (the default `auto` on a
CPU with AVX512_BF16, its flags injected) keeps float32 variables, so its checkpoints
and its export are those of a float32 run (what the real `saved_model_cli` shows);
`auto` on a CPU without is float32; an unknown value is a usage error."""
from __future__ import annotations

import contextlib
import io
import subprocess

import numpy as np
from trainer import task
from tests.support.trainer_runs import FAST


def _cpu(monkeypatch, tmp_path, flags: str) -> None:
    from mljob.training import precision
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nflags\t\t: fpu sse2 avx2 {flags}\n")
    monkeypatch.setattr(precision, "CPUINFO", str(info))


def test_auto_on_a_bf16_cpu_trains_bfloat16_and_exports_float32(tmp_path, monkeypatch):
    _cpu(monkeypatch, tmp_path, "avx512f avx512_bf16")
    from trainer import model as model_lib
    built = []  # the precision of every model the run builds (training, export)
    build = model_lib.build
    monkeypatch.setattr(model_lib, "build", lambda *a, **k: built.append(
        k.get("precision", "off")) or build(*a, **k))
    job = tmp_path / "job"
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):  # no --mixed-precision: the default, auto
        status = task.main([*FAST, "--job-dir", str(job), "--train-steps", "40",
                            "--log-every", "20", "--eval-every", "0",
                            "--checkpoint-every", "0"])
    out = buffer.getvalue()
    assert status == 0, out
    decided = [line for line in out.splitlines() if line.startswith("mixed precision:")]
    assert len(decided) == 1 and "mixed_bfloat16" in decided[0] \
        and "avx512_bf16" in decided[0], out
    started = next(line for line in out.splitlines() if line.startswith("training started"))
    assert "mixed_precision=mixed_bfloat16" in started
    assert built[0] == "mixed_bfloat16" and built[-1] == "off", built  # trained; exported
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


def test_auto_on_a_cpu_without_bf16_computes_float32(tmp_path, monkeypatch):
    _cpu(monkeypatch, tmp_path, "avx512f avx512_vnni")
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        status = task.main([*FAST, "--job-dir", str(tmp_path / "job"), "--train-steps",
                            "2", "--eval-every", "0", "--checkpoint-every", "0"])
    out = buffer.getvalue()
    assert status == 0, out
    assert "mixed precision: off (float32 compute" in out
    started = next(line for line in out.splitlines() if line.startswith("training started"))
    assert "mixed_precision=off" in started


def test_unknown_precision_is_a_usage_error(capsys):
    assert task.main(["--mixed-precision", "float16"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "--mixed-precision" in err and "mixed_bfloat16" in err


def test_policy_is_per_layer_and_logits_stay_float32():
    import keras

    from trainer import model
    from mljob.training import precision
    assert task.PRECISIONS == precision.PRECISIONS  # what auto resolves to, model builds
    assert set(model.PRECISIONS) == set(precision.PRECISIONS) - {precision.AUTO}
    mixed = model.build("mlp", precision="mixed_bfloat16")
    assert mixed.get_layer("hidden").compute_dtype == "bfloat16"
    assert mixed.get_layer("logits").compute_dtype == "float32"
    assert {w.dtype for w in mixed.weights} == {"float32"}
    assert mixed(np.zeros([1, 784], np.float32)).dtype == "float32"
    # Not a global policy: a model built next (the export's) is float32 throughout.
    assert keras.mixed_precision.global_policy().name == "float32"
    assert model.build("mlp").get_layer("hidden").compute_dtype == "float32"
