"""Trainer flags beyond what TensorFlow can hold (int32 sizes, int64 steps, float32
rates), non-finite rates and empty data flags are refused while the flags are parsed:
exit 2, one line naming the flag, nothing written to the job dir."""
from __future__ import annotations

import contextlib
import io
import sys

import pytest

from trainer import task
from tests.support.trainer_runs import FAST, SAMPLE

HUGE = "9" * (sys.get_int_max_str_digits() + 700)


def _main(args) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = task.main(args)
    return status, err.getvalue()


@pytest.mark.parametrize("flags, words", [
    (["--batch-size", str(2**31)], "more than 2147483647"),
    (["--steps-per-execution", str(2**31)], "more than 2147483647"),
    (["--keep-checkpoints", str(2**31)], "more than 2147483647"),
    (["--ps-shards", str(2**31)], "more than 2147483647"),
    (["--train-steps", str(2**63)], "more than 9223372036854775807"),
    (["--seed", str(2**63)], "more than 9223372036854775807"),
    (["--checkpoint-every", str(2**64)], "more than 9223372036854775807"),
    (["--train-steps", HUGE], f"more than {sys.get_int_max_str_digits()} digits"),
    (["--learning-rate", "inf"], "inf is not a positive finite number"),
    (["--learning-rate", "nan"], "nan is not a positive finite number"),
    (["--learning-rate", "1e39"], "a float32 can hold"),
    (["--learning-rate", "1e-46"], "a float32 can hold"),
    (["--dropout", "nan"], "nan is not in [0, 1)"),
    (["--data-dir", ""], "--data-dir is empty"),
    (["--data-dir", "  "], "--data-dir is empty"),
    (["--train-files", "", "--eval-files", ""], "--train-files is empty"),
    (["--train-files", ",", "--eval-files", "x"], "--train-files is empty"),
], ids=lambda v: " ".join(v)[:40] if isinstance(v, list) else None)
def test_values_tensorflow_cannot_hold_exit_2_before_writing(tmp_path, flags, words):
    """Before: --batch-size 2**31 trained until TensorFlow failed on a negative shape,
    after the summaries were written; --learning-rate inf trained; --data-dir '' meant
    the default data."""
    job = tmp_path / "job"
    args = ["--model", "mlp", "--job-dir", str(job), *flags]
    if not any(f in flags for f in ("--data-dir", "--train-files")):
        args += ["--data-dir", SAMPLE]
    status, err = _main(args)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert words in lines[0] and "Traceback" not in err
    assert not job.exists()


def test_batch_larger_than_the_data_exits_2_before_writing(tmp_path):
    job = tmp_path / "job"
    status, err = _main([*FAST, "--job-dir", str(job), "--batch-size", "3001"])
    assert status == 2, err
    assert "error: --batch-size 3001 is more than the 3000 training examples" in err
    assert not job.exists()
