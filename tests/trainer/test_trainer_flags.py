"""The trainer's flags in both spellings: tuning services pass each parameter as
`--<parameterName>=<value>` (`--learning_rate=0.01`) and the original samples' flags were
underscored, so every flag is taken with underscores too; --help shows the dashed form."""
from __future__ import annotations

import re

import pytest

from trainer import task
from tests.support.trainer_runs import SAMPLE, read, start, wait_exit


@pytest.mark.parametrize("argv", [
    ["--learning_rate", "0.01", "--train_steps", "7"],
    ["--learning_rate=0.01", "--train_steps=7"],
    ["--learning-rate", "0.01", "--train_steps=7"],
])
def test_underscore_spelling_sets_the_same_flag(argv):
    args = task.parser().parse_args(argv)
    assert args.learning_rate == 0.01 and args.train_steps == 7


def test_every_flag_has_an_underscore_spelling():
    parser = task.parser()
    dashed = {s for a in parser._actions for s in a.option_strings
              if s.startswith("--") and "-" in s[2:]}
    assert len(dashed) > 15
    for flag in dashed:
        assert parser._dashed([flag.replace("-", "_").replace("__", "--", 1)]) == [flag]


def test_only_the_flag_name_is_respelled():
    args = task.parser().parse_args(["--job_dir=/tmp/my_job", "--data_dir", "/data/fashion_mnist",
                                     "--no_ps_local_steps", "--ps_hosts", "h_1:2222",
                                     "--task_index", "0"])
    assert args.job_dir == "/tmp/my_job" and args.data_dir == "/data/fashion_mnist"
    assert args.ps_local_steps is False and args.ps_hosts == "h_1:2222"
    assert args.task_index == 0


def test_help_shows_the_dashed_form_only():
    text = task.parser().format_help()
    assert "--learning-rate" in text and "--train-steps" in text
    assert re.findall(r"--\w*_[\w_]*", text) == []


@pytest.mark.parametrize("argv, words", [
    (["--learning_rat=0.1"], "unrecognized arguments: --learning_rat=0.1"),
    (["--train_step", "3"], "unrecognized arguments: --train_step"),  # no abbreviations
    (["--learning_rate", "fast"], "argument --learning-rate: 'fast' is not a number"),
    (["--train_steps=0"], "argument --train-steps: 0 is less than 1"),
])
def test_bad_underscore_flags_fail_with_one_line(capsys, argv, words):
    assert task.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert words in err


def test_a_real_run_takes_the_tuning_spelling(reaper, tmp_path):
    log = tmp_path / "trainer.log"
    job = tmp_path / "job"
    proc = start(reaper, log, ["--model", "mlp", f"--data_dir={SAMPLE}", "--seed", "1",
                               f"--job_dir={job}", "--train_steps=3",
                               "--learning_rate=0.01", "--lr_schedule=constant",
                               "--log_every", "1", "--eval_every=0"])
    assert wait_exit(proc, 180, log) == 0, read(log)[-3000:]
    out = read(log)
    assert "training started: strategy=single step=0 train_steps=3 model=mlp" in out
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert [s.split()[1] for s in steps] == ["1/3", "2/3", "3/3"]
    assert all("lr=0.01" in s for s in steps), steps
    assert (job / "model" / "saved_model.pb").exists()
