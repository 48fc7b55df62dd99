"""keras.io's GAN (two Adam optimizers given to its own `compile`, built lazily by their
first `apply_gradients` in its `train_step`) on one node: the checkpoint holds every
optimizer the step uses, moments and all (they were missing, so a resumed job restarted
them at zero), and a job resumed from it starts from them."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from mljob import cluster, training  # noqa: E402
from mljob.training import model_optimizers  # noqa: E402
from mljob.training.checkpoints import CheckpointStore  # noqa: E402
from mljob.training.config import Program, RunConfig  # noqa: E402
from mljob.training.loop import Replica  # noqa: E402
from tests.mljob import keras_io_models as zoo  # noqa: E402

BATCH = 16


def _fit(job, steps: int, capsys) -> str:
    status = training.fit(
        zoo.gan, lambda ctx: tf.data.Dataset.from_tensor_slices(zoo.gan_data())
        .batch(ctx.batch_size, drop_remainder=True).repeat(),
        info=cluster.from_environment({}),
        config=training.RunConfig(job_dir=str(job), train_steps=steps, batch_size=BATCH,
                                  log_every=2, eval_every=0, checkpoint_every=0))
    assert status == 0
    return capsys.readouterr().out


def _saved(job, steps: int) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(str(job / "checkpoints" / f"ckpt-{steps}"))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
            if not k.startswith("_CHECKPOINTABLE") and "OBJECT_GRAPH" not in k}


def test_every_optimizer_the_step_applies_is_built_and_found_by_its_attribute():
    model = zoo.gan()
    assert not model.d_optimizer.built and not model.g_optimizer.built
    spec = tf.data.Dataset.from_tensor_slices(zoo.gan_data()).batch(BATCH).element_spec
    used = model_optimizers.build_in_step(model, spec)
    # Not the RMSprop `super().compile()` made, which the step never applies.
    assert [name for name, _ in used] == ["d_optimizer", "g_optimizer"]
    assert all(o.built for _, o in used)
    assert model_optimizers.attribute_of(model, model.g_optimizer) == "g_optimizer"


def test_a_gan_s_checkpoint_holds_both_optimizers_moments_and_resumes_exactly(tmp_path,
                                                                              capsys):
    _fit(tmp_path / "resumed", 4, capsys)
    saved = _saved(tmp_path / "resumed", 4)
    moments = [k for k in saved if k.startswith("optimizer/")
               and saved[k].ndim >= 1]  # the moment tensors, not the counts and rates
    model = zoo.gan()
    weights = len(model.discriminator.trainable_weights) + len(
        model.generator.trainable_weights)
    assert len(moments) == 2 * weights  # two moments a weight, over both optimizers
    assert all(np.any(saved[k] != 0) for k in moments)
    # A resumed run's model restores them (before its first step) from the checkpoint.
    program = Program(model_fn=zoo.gan, train_dataset_fn=lambda ctx: tf.data.Dataset
                      .from_tensor_slices(zoo.gan_data()).batch(ctx.batch_size))
    replica = Replica(tf.distribute.get_strategy(), None, program,
                      RunConfig(job_dir="unused", train_steps=8, batch_size=BATCH))
    store = CheckpointStore(str(tmp_path / "resumed" / "checkpoints"), keep=5, writer=False)
    try:
        assert store.restore(replica.checkpoint) == 4
    finally:
        store.close()
    restored = [np.asarray(v) for _, o in model_optimizers.named(replica.model)
                for v in o.variables if len(v.shape) >= 1]
    assert len(restored) == len(moments)
    assert sorted(float(np.sum(v)) for v in restored) == pytest.approx(
        sorted(float(np.sum(saved[k])) for k in moments), rel=1e-6)


def test_a_gan_s_lines_show_its_own_logs_and_each_optimizer_it_steps(tmp_path, capsys):
    out = _fit(tmp_path / "lines", 4, capsys)
    lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert lines
    for line in lines:
        # Its logs are d_loss and g_loss: no loss=nan; the rates are the two Adams' it
        # steps (0.0003), not the RMSprop `super().compile()` made (0.001).
        assert " d_loss=" in line and " g_loss=" in line and "loss=nan" not in line
        assert "d_optimizer_lr=0.0003 g_optimizer_lr=0.0003" in line
        assert " lr=" not in line
    finished = next(line for line in out.splitlines() if line.startswith("training finished"))
    assert "loss=nan" not in finished and " d_loss=" in finished
    from mljob import contracts
    assert contracts.parse_progress(lines[-1]).step == 4  # the launcher still reads it


def test_a_refusal_names_the_optimizer_by_the_attribute_holding_it():
    from mljob.training import own_steps
    model = zoo.gan()  # both Adams unbuilt, both named adam
    program = Program(model_fn=lambda: model, train_dataset_fn=lambda ctx: None)
    with pytest.raises(training.UsageError, match=r"optimizer d_optimizer \(adam[_0-9]*\) is "
                                                  r"not built"):
        own_steps.check(model, program, parameter_servers=False, replicas=2)
