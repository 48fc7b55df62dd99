"""trainingInput.hyperparameters (Cloud ML's HyperparameterSpec): a good spec is read
field by field; every mistake is one `error:` line naming the field, exit 2, nothing
staged or recorded."""
from __future__ import annotations

import os

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from submit.jobdef import spec as specs
from submit.jobdef import tuning_spec
from submit.errors import ConfigError
from tests.support.submit_cli import files_under, run

GOOD = {"goal": "MAXIMIZE", "hyperparameterMetricTag": "accuracy", "maxTrials": 8,
        "maxParallelTrials": 2, "maxFailedTrials": 3, "enableTrialEarlyStopping": True,
        "algorithm": "ALGORITHM_UNSPECIFIED",
        "params": [{"parameterName": "learning_rate", "type": "DOUBLE", "minValue": 1e-4,
                    "maxValue": 0.1, "scaleType": "UNIT_LOG_SCALE"},
                   {"parameterName": "hidden-units", "type": "INTEGER", "minValue": 16,
                    "maxValue": 256},
                   {"parameterName": "model", "type": "CATEGORICAL",
                    "categoricalValues": ["cnn", "mlp"]},
                   {"parameterName": "batch_size", "type": "DISCRETE",
                    "discreteValues": [32, 64, 128]}]}


def test_a_good_spec_is_read_field_by_field():
    spec = tuning_spec.parse(GOOD, job_dir="/jobs/x")
    assert (spec.goal, spec.metric_tag, spec.max_trials, spec.max_parallel_trials,
            spec.max_failed_trials, spec.early_stopping) == ("MAXIMIZE", "accuracy", 8, 2,
                                                             3, True)
    assert spec.maximize and spec.resume_from is None
    lr, units, model, batch = spec.params
    assert (lr.low, lr.high, lr.scale) == (1e-4, 0.1, "UNIT_LOG_SCALE")
    assert units.type == "INTEGER" and model.values == ("cnn", "mlp")
    assert batch.values == (32, 64, 128)
    assert lr.flag(0.001) == "--learning_rate=0.001" and units.flag(20) == \
        "--hidden-units=20"
    defaults = tuning_spec.parse({"goal": "MINIMIZE", "params": GOOD["params"][:1]},
                                 job_dir="/j")
    assert defaults.metric_tag == "training/hptuning/metric"
    assert (defaults.max_trials, defaults.max_parallel_trials) == (1, 1)
    assert defaults.max_failed_trials is None and not defaults.early_stopping


def test_grid_search_enumerates_integer_and_listed_values():
    spec = tuning_spec.parse({"goal": "MAXIMIZE", "algorithm": "GRID_SEARCH",
                              "params": GOOD["params"][1:]}, job_dir="/j")
    assert spec.grid()["hidden-units"][:3] == [16, 17, 18]
    assert spec.grid_size() == 241 * 2 * 3


def with_(**changes):
    hp = dict(GOOD)
    hp.update(changes)
    return {k: v for k, v in hp.items() if v is not DROP}


def param(i=0, **changes):
    params = [dict(p) for p in GOOD["params"]]
    params[i].update(changes)
    params[i] = {k: v for k, v in params[i].items() if v is not DROP}
    return with_(params=params)


DROP = object()
CASES = {
    "not a mapping": ([1, 2], "trainingInput.hyperparameters must be a mapping, not a "
                              "list"),
    "unknown key": (with_(maxTrial=3), "hyperparameters has unknown key 'maxTrial'; "
                                      "allowed keys are goal"),
    "no goal": (with_(goal=DROP), "hyperparameters.goal must be MAXIMIZE or MINIMIZE, "
                                  "not None"),
    "lower-case goal": (with_(goal="maximize"), "goal must be MAXIMIZE or MINIMIZE"),
    "bad metric tag": (with_(hyperparameterMetricTag="acc uracy"),
                       "hyperparameterMetricTag 'acc uracy' is not a metric tag"),
    "zero trials": (with_(maxTrials=0), "maxTrials must be an integer from 1 to 10000, "
                                        "not 0"),
    "string trials": (with_(maxTrials="eight"), "maxTrials must be an integer from 1 to "
                                                "10000, not a string 'eight'"),
    "bool parallel": (with_(maxParallelTrials=True), "maxParallelTrials must be an "
                                                      "integer"),
    "parallel over trials": (with_(maxParallelTrials=9), "maxParallelTrials 9 is more "
                                                          "than maxTrials 8"),
    "negative failed": (with_(maxFailedTrials=-1), "maxFailedTrials must be an integer "
                                                   "from 0"),
    "early stopping string": (with_(enableTrialEarlyStopping="yes"),
                              "enableTrialEarlyStopping must be true or false"),
    "bad resume id": (with_(resumePreviousJobId="../tune01"),
                      "resumePreviousJobId '../tune01' is not a job id"),
    "unknown algorithm": (with_(algorithm="BAYESIAN"), "algorithm must be one of "
                                                       "ALGORITHM_UNSPECIFIED, GRID_SEARCH"),
    "no params": (with_(params=DROP), "params must be a non-empty list"),
    "empty params": (with_(params=[]), "params must be a non-empty list"),
    "param not a mapping": (with_(params=["lr"]), "params[0] must be a mapping"),
    "unknown param key": (param(minvalue=1), "params[0] (learning_rate) has unknown key "
                                             "'minvalue'"),
    "bad param name": (param(parameterName="--lr"), "parameterName '--lr' is not a flag "
                                                    "name"),
    "job_dir param": (param(parameterName="job-dir"), "would replace the trial's own "
                                                      "--job-dir"),
    "duplicate name": (param(1, parameterName="learning-rate"),
                       "parameterName 'learning-rate' is given twice"),
    "unknown type": (param(type="FLOAT"), "(learning_rate).type must be one of DOUBLE"),
    "min not below max": (param(minValue=0.1, maxValue=0.1),
                          "minValue 0.1 must be less than maxValue 0.1"),
    "missing max": (param(maxValue=DROP), "(learning_rate).maxValue must be a finite "
                                          "number, not None"),
    "NaN bound": (param(minValue=float("nan")), "minValue must be a finite number"),
    "float INTEGER bound": (param(1, minValue=1.5), "(hidden-units).minValue must be an "
                                                    "integer"),
    "log scale from 0": (param(minValue=0), "UNIT_LOG_SCALE needs minValue above 0"),
    "unknown scale": (param(scaleType="LOG"), "scaleType must be one of "
                                              "UNIT_LINEAR_SCALE"),
    "values on DOUBLE": (param(categoricalValues=["a"]), "categoricalValues does not "
                                                         "apply to a DOUBLE parameter"),
    "bounds on CATEGORICAL": (param(2, minValue=1), "minValue does not apply to a "
                                                    "CATEGORICAL parameter"),
    "numbers as categories": (param(2, categoricalValues=[1, 2]),
                              "categoricalValues must be a non-empty list of strings"),
    "repeated category": (param(2, categoricalValues=["cnn", "cnn"]), "repeats a value"),
    "unsorted discrete": (param(3, discreteValues=[64, 32]), "must be in increasing "
                                                             "order"),
    "string discrete": (param(3, discreteValues=["32"]), "discreteValues must be a "
                                                         "non-empty list of numbers"),
    "grid over DOUBLE": (with_(algorithm="GRID_SEARCH"), "GRID_SEARCH cannot search "
                                                         "DOUBLE parameter 'learning_rate'"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_specs_exit_2_with_one_line_and_write_nothing(capsys, tmp_path, pkg, name):
    hp, message = CASES[name]
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"trainingInput": {"hyperparameters": hp}}))
    job_dir, staging = tmp_path / "job", tmp_path / "staging"
    status, _, err = run(capsys, "tune01", "--config", str(config), "--job-dir",
                         str(job_dir), "--staging-bucket", str(staging),
                         "--package-path", pkg)
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert message in lines[0]
    assert files_under(job_dir, staging) == []
    assert not os.path.exists(os.path.join(os.environ["MLJOB_HOME"], "jobs"))


def test_tuning_needs_a_job_dir(capsys, tmp_path, pkg):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"trainingInput": {"hyperparameters": GOOD}}))
    status, _, err = run(capsys, "tune01", "--config", str(config), "--staging-bucket",
                         str(tmp_path / "staging"), "--package-path", pkg)
    assert status == 2 and "hyperparameter tuning needs --job-dir" in err
    assert err.count("\n") == 1


LEAVES = (st.none() | st.booleans() | st.integers(-5, 300) | st.floats()
          | st.text(max_size=8) | st.sampled_from(
              ["MAXIMIZE", "DOUBLE", "INTEGER", "CATEGORICAL", "DISCRETE", "GRID_SEARCH",
               "UNIT_LOG_SCALE", "UNIT_REVERSE_LOG_SCALE", "lr", "accuracy"]))
PARAMS = st.dictionaries(st.sampled_from(tuning_spec.PARAM_KEYS + ("x",)),
                         LEAVES | st.lists(LEAVES, max_size=4), max_size=6)
SPECS = st.dictionaries(st.sampled_from(tuning_spec.KEYS + ("bogus",)),
                        LEAVES | st.lists(PARAMS | LEAVES, max_size=3), max_size=9)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hp=SPECS)
def test_any_hyperparameters_parse_or_are_one_line_config_errors(hp):
    try:
        spec = specs.resolve(specs.Flags("tune01", job_dir="/jobs/tune01"),
                             specs.training_config({"hyperparameters": hp}))
    except ConfigError as exc:
        assert str(exc).startswith("trainingInput.hyperparameters") and "\n" not in str(exc)
        return
    parsed = tuning_spec.parse(spec.training_input["hyperparameters"], job_dir="/j")
    assert 1 <= parsed.max_parallel_trials <= parsed.max_trials and parsed.params
