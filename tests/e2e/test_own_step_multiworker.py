"""keras.io's VAE (its own train_step, a Sampling layer with a SeedGenerator, trackers)
with a test_step of the user's, through `training.main` as a user package on a chief and
a worker (MultiWorkerMirroredStrategy, real processes over gRPC): it trains, the chief
evaluates it alone between chunks without the worker (no collective the worker never
joins), and the eval line is Keras's `evaluate` of the checkpointed weights on one node."""
from __future__ import annotations

import re
import sys

import numpy as np
import pytest

from submit import jobs as records
from tests.support.submit_cli import run as submit
from tests.support.vae_package import write_vae_package

pytestmark = pytest.mark.slow

CHIEF_AND_WORKER = ("trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
                    "  workerType: standard\n  workerCount: 1\n")


def test_a_models_own_steps_train_and_evaluate_on_a_chief_and_a_worker(capsys, tmp_path,
                                                                       monkeypatch):
    pkg = write_vae_package(str(tmp_path / "vae"))
    config = tmp_path / "mwms.yaml"
    config.write_text(CHIEF_AND_WORKER)
    job = tmp_path / "vae01"
    status, out, err = submit(capsys, "vae01", "--package-path", pkg, "--module-name",
                              "vaepkg.task", "--job-dir", str(job), "--config", str(config))
    assert status == 0, err[-3000:] + out[-3000:]
    assert records.load("vae01").state == records.SUCCEEDED
    evals = dict(re.findall(r"master-replica-0\teval step=(\d+) loss=(\d+\.\d+)", out))
    assert set(evals) == {"30", "60"}, out[-3000:]

    import tensorflow as tf
    from mljob.training import export as export_lib
    from mljob.training.checkpoints import CheckpointStore
    monkeypatch.syspath_prepend(pkg)
    sys.modules.pop("vaepkg", None)
    from vaepkg import model as user
    model = export_lib.built(user.model_fn)  # named as the run names its model
    store = CheckpointStore(str(job / "checkpoints"), keep=5, writer=False)
    try:
        assert store.restore(tf.train.Checkpoint(
            model={w.path: w.value for w in model.weights}), partial=True) == 60
    finally:
        store.close()
    expected = model.evaluate(user.eval_dataset_fn(), verbose=0, return_dict=True)["loss"]
    assert np.isclose(float(evals["60"]), expected, rtol=1e-6, atol=1e-4), (evals, expected)
