"""Round 4's bad inputs to the job index: records whose types are right but whose values
are not (times past any date, NaN and Infinity, objective values that are text, a trial
id `²`, parameters that are not a mapping, negative restarts, usage that is text, JSON
nested past the parser's depth). Each is named in the one warning `jobs list` prints and
skipped, the rest stay listed, and `jobs describe` says it is damaged in one line
(before: tracebacks in both)."""
from __future__ import annotations

import json
import logging
import os

import pytest

from submit import jobs as records
from tests.support.submit_cli import one_error_line, run


def _index(name: str) -> str:
    folder = os.path.join(os.environ["MLJOB_HOME"], "jobs")
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, name)


def _trials(**trial) -> dict:
    one = {"trialId": "1", "state": "SUCCEEDED", "hyperparameters": {"x": "0.5"},
           "finalMetric": {"trainingStep": "2", "objectiveValue": 0.9}}
    one.update(trial)
    return {"training_output": {"isHyperparameterTuningJob": True, "trials": [one]}}


DAMAGED = {
    "create time 1e20": {"create_time": 1e20},
    "create time -1e20": {"create_time": -1e20},
    "create time NaN": {"create_time": float("nan")},
    "end time Infinity": {"end_time": float("inf")},
    "objective a string": _trials(finalMetric={"objectiveValue": "0.9"}),
    "objective NaN": _trials(finalMetric={"objectiveValue": float("nan")}),
    "trial id ²": _trials(trialId="²"),
    "trial step text": _trials(finalMetric={"trainingStep": "two", "objectiveValue": 1}),
    "trial parameter nested": _trials(hyperparameters={"x": {"y": [1]}}),
    "spec hyperparameters a list": {"training_input": {"hyperparameters": ["x"]}},
    "restarts negative": {"replicas": [{"label": "master-replica-0", "restarts": -1}]},
    "exit codes text": {"replicas": [{"label": "master-replica-0", "exit_codes": ["1"]}]},
    "usage text": {"usage": {"master-replica-0": {"cpuPeak": "high"}}},
    "supervisor pid negative": {"supervisor_pid": -5},
}


def _good(job_id: str, **fields) -> dict:
    data = json.loads(records.JobRecord(job_id, state=records.SUCCEEDED, start_time=5.0,
                                        end_time=9.0).to_json())
    data.update(fields)
    return data


@pytest.mark.parametrize("case", list(DAMAGED))
def test_a_record_with_values_out_of_range_is_skipped_and_named(capsys, caplog, case):
    records.save(records.JobRecord("good01", state=records.SUCCEEDED, start_time=5.0))
    with open(_index("bad01.json"), "w") as f:
        json.dump(_good("bad01", **DAMAGED[case]), f)  # NaN and Infinity as json writes them
    for argv in (["jobs", "list"], ["jobs", "list", "--sort-by", "endTime"],
                 ["jobs", "list", "--format", "json"]):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            status, out, err = run(capsys, *argv)
        assert status == 0 and "Traceback" not in err, (argv, err)
        assert "good01" in out and "bad01" not in out
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 1 and warned[0].startswith(
            f"skipping the damaged job record {_index('bad01.json')} (its "), warned
    status, _, err = run(capsys, "jobs", "describe", "bad01")
    assert status == 1 and f"record {_index('bad01.json')} is damaged (its " in \
        one_error_line(err)


def test_a_record_nested_past_the_parsers_depth_is_damaged(capsys, caplog):
    with open(_index("deep01.json"), "w") as f:
        f.write('{"job_id": "deep01", "engine": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with caplog.at_level(logging.WARNING):
        status, out, err = run(capsys, "jobs", "list")
    assert status == 0 and "Traceback" not in err
    assert any("nested too deep" in r.getMessage() for r in caplog.records)
    status, _, err = run(capsys, "jobs", "describe", "deep01")
    assert status == 1 and "nested too deep to be a job record" in one_error_line(err)


def test_extreme_but_finite_values_are_kept():
    """What a trial can report itself, and times at the ends of the range, are values."""
    data = _good("edge01", create_time=0, end_time=253402300799.0,
                 **_trials(finalMetric={"objectiveValue": -1e308, "trainingStep": 7},
                           trialId=3, hyperparameters={"lr": 5e-324, "opt": "adam",
                                                        "bn": True}))
    records.check_record(data)


def test_resume_with_other_input_paths_is_refused_naming_the_recorded_ones(capsys,
                                                                          tmp_path):
    """Before: the earlier shard plan was kept and the new --input-paths ignored."""
    out = str(tmp_path / "out")
    records.save(records.JobRecord("pred01", state=records.CANCELLED, mode="prediction",
                                   prediction_input={"inputPaths": ["/data/a-*.json"],
                                                     "outputPath": out}))
    argv = ["jobs", "submit", "prediction", "pred01", "--model-dir", str(tmp_path / "m"),
            "--output-path", out, "--data-format", "text", "--region", "us-central1",
            "--resume"]
    status, _, err = run(capsys, *argv, "--input-paths", "/data/b-*.json")
    assert status == 2 and one_error_line(err).endswith(
        "--resume finishes job pred01 over the --input-paths it recorded, "
        "/data/a-*.json; give those, or pick a new job id for other inputs")
    status, _, err = run(capsys, *argv, "--input-paths", "/data/a-*.json")
    assert status == 2 and "--input-paths it recorded" not in err  # on to the next check


def test_every_commands_name_is_reserved_as_a_job_id(capsys, tmp_path):
    """`console` was a valid job id that `python -m submit console` could never submit."""
    from submit.__main__ import cli
    from submit.jobdef.spellings import JOB_ID, RESERVED_WORDS
    names = [n for n in cli.commands if JOB_ID.fullmatch(n)]
    assert "console" in names and set(names) <= RESERVED_WORDS
    status, _, err = run(capsys, "jobs", "submit", "training", "console", "--job-dir",
                         str(tmp_path / "job"))
    assert status == 2 and "'console' is a command's name, never a job id; pick " \
        "another, e.g. console_1" in one_error_line(err)
    assert not os.path.exists(tmp_path / "job")


def test_a_job_id_still_running_is_refused_for_training_and_prediction(capsys, tmp_path):
    """A running job's id (a cluster job: running while not ended) is not submitted
    again, as a training job or as a batch prediction job, with or without --resume."""
    records.save(records.JobRecord("busy01", state=records.RUNNING, runner="vertex"))
    expected = ("job 'busy01' is still RUNNING; cancel it with `python -m submit jobs "
                "cancel busy01` or pick another id")
    for resume in ((), ("--resume",)):
        status, _, err = run(capsys, "jobs", "submit", "training", "busy01", "--job-dir",
                             str(tmp_path / "job"), *resume)
        assert status == 2 and one_error_line(err).endswith(expected), err
        status, _, err = run(capsys, "jobs", "submit", "prediction", "busy01",
                             "--model-dir", str(tmp_path / "m"), "--input-paths",
                             "/data/a-*.json", "--output-path", str(tmp_path / "out"),
                             "--data-format", "text", "--region", "us-central1", *resume)
        assert status == 2 and one_error_line(err).endswith(expected), err
    assert records.load("busy01").state == records.RUNNING
    assert not os.path.exists(tmp_path / "out")
