"""`bench.time_to_accuracy --mljob-flags`: the variant's flags reach mljob's designs, after
their own, and never a baseline (Keras `fit` and TF1 would reject or ignore them)."""
from __future__ import annotations

import shlex

import pytest

from bench import time_to_accuracy as race


@pytest.fixture
def flags(monkeypatch):
    monkeypatch.setattr(race, "MLJOB_FLAGS", shlex.split("--steps-per-execution 10"))


def test_mljob_designs_get_the_flags_last(flags):
    for design in ("mljob single", "mljob ps", "mljob single float32"):
        module, args = race.command("cnn", design, 1, "/jobs/x")
        assert module == "trainer.task"
        assert args[-2:] == ["--steps-per-execution", "10"], (design, args)
    _, args = race.command("cnn", "mljob single float32", 1, "/jobs/x")
    assert args.index("--mixed-precision") < args.index("--steps-per-execution")


def test_baselines_never_get_them(flags):
    for design in ("keras fit", "tf1 single", "tf1 ps"):
        _, args = race.command("cnn", design, 1, "/jobs/x")
        assert "--steps-per-execution" not in args, (design, args)


def test_without_the_flag_the_commands_are_the_defaults():
    _, args = race.command("mlp", "mljob single", 2, "/jobs/x")
    assert args == ["--model", "mlp", "--train-steps", "2000", "--batch-size", "100",
                    "--log-every", "250", "--eval-every", "250", "--job-dir", "/jobs/x",
                    "--seed", "2", "--checkpoint-every", "20000"]
