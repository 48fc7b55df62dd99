"""keras.io's models that bring their own steps, through a whole run of the library on
one node (`training.fit`: checkpoints, the progress lines, evaluation with the model's
own `test_step`, the export): the custom `train_step` model, the lower-level one (no
loss in compile), and a GAN that serves its generator."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from mljob import cluster, training  # noqa: E402
from mljob.training import export as export_lib  # noqa: E402
from tests.mljob import equivalence_models as zoo  # noqa: E402


def _data(row):
    x, y, _ = zoo.data(row)
    return lambda context=None: tf.data.Dataset.from_tensor_slices((x, y)).batch(8)


def _fit(tmp_path, row, capsys, evaluate=True, **kwargs):
    train = _data(row)
    status = training.fit(zoo.model_fn(row), lambda ctx: train().repeat(),
                          eval_dataset_fn=train if evaluate else None,
                          config=training.RunConfig(job_dir=str(tmp_path / "job"),
                                                    train_steps=6, batch_size=8,
                                                    log_every=3, eval_every=0),
                          info=cluster.from_environment({}), **kwargs)
    assert status == 0
    return capsys.readouterr().out


def test_a_custom_train_step_model_trains_evaluates_and_exports(tmp_path, capsys):
    out = _fit(tmp_path, "custom_train_step", capsys,
               serving=training.Serving(key=None))
    assert "step 3/6 loss=" in out and " mae=" in out
    eval_line = next(line for line in out.splitlines() if line.startswith("eval step=6"))
    assert " mae=" in eval_line
    # The counter only the model's own step moves was trained, checkpointed and exported.
    loaded = export_lib.load(str(tmp_path / "job" / "model"))
    counters = [v for v in loaded.model_variables if "steps_run" in v.name]
    assert counters and float(counters[0].numpy()) == 6.0


def test_the_lower_level_model_without_a_compiled_loss_trains(tmp_path, capsys):
    out = _fit(tmp_path, "lower_level", capsys)  # no "no loss: pass loss=..." refusal
    assert next(line for line in out.splitlines() if line.startswith("eval step=6"))


def test_a_gan_trains_both_models_and_serves_its_generator(tmp_path, capsys):
    with pytest.raises(training.UsageError, match="cannot be evaluated"):
        _fit(tmp_path / "evaluated", "gan", capsys)
    out = _fit(tmp_path, "gan", capsys, evaluate=False, serving=training.Serving(
        key=None, model_fn=lambda: zoo.model_fn("gan")().generator))
    assert " d_loss=" in out and " g_loss=" in out
    loaded = export_lib.load(str(tmp_path / "job" / "model"))
    fresh = zoo.model_fn("gan")().generator
    z = np.ones((2, 2), np.float32)
    served = next(iter(loaded.signatures["serving_default"](
        tf.constant(z)).values()))
    # Trained: the export answers otherwise than the untrained generator.
    assert not np.allclose(np.asarray(served), np.asarray(fresh(z)))
