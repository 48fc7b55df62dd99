"""A tuning job's study as Optuna keeps it: the sampler and pruner each algorithm maps
to, the parameters as Optuna's distributions and back, and Optuna's trials as Cloud ML's
(`submit.training_output` ranks them). See `submit.local.tuner` for the algorithms.
Optuna is the `tuning` extra, imported only when a study is made.
"""
from __future__ import annotations

import datetime
from typing import Any

from submit import training_output as outputs
from submit.errors import UsageError
from submit.training_output import CANCELLED, FAILED, RUNNING, SUCCEEDED
from submit.jobdef.tuning_spec import Parameter, TuningSpec

STUDY_NAME = "study"


def check_installed() -> None:
    """Optuna is the `tuning` extra; say how to install it before anything is built.
    Found, not imported: the submitting process (a notebook's kernel) never loads
    Optuna, nor the tqdm it loads, which warns in a kernel without ipywidgets."""
    import importlib.util
    if importlib.util.find_spec("optuna") is None:
        raise UsageError("hyperparameter tuning needs the Python package 'optuna'; install "
                         "it with pip install -e '.[tuning]' in mljob's source folder")


def sampler(spec: TuningSpec, seed: int | None = None):
    """Optuna's sampler for the spec's algorithm (see the module docstring)."""
    import optuna
    if spec.algorithm == "RANDOM_SEARCH":
        return optuna.samplers.RandomSampler(seed=seed)
    if spec.algorithm == "GRID_SEARCH":
        return optuna.samplers.GridSampler(spec.grid(), seed=seed)
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True, multivariate=True,
                                      n_startup_trials=startup_trials(spec))


def startup_trials(spec: TuningSpec) -> int:
    """Random trials before TPE models the objective: a quarter of the budget, 2 to 10."""
    return max(2, min(10, spec.max_trials // 4))


def distributions(spec: TuningSpec) -> dict:
    from optuna.distributions import (CategoricalDistribution, FloatDistribution,
                                      IntDistribution)
    out: dict[str, Any] = {}
    for p in spec.params:
        log_scale = p.scale != "UNIT_LINEAR_SCALE"
        if p.type in ("DOUBLE", "INTEGER"):
            low, high = p.bounds
            out[p.name] = (FloatDistribution(float(low), float(high), log=log_scale)
                           if p.type == "DOUBLE" else
                           IntDistribution(int(low), int(high), log=log_scale))
        else:
            out[p.name] = CategoricalDistribution(list(p.values))
    return out


def from_optuna(p: Parameter, value):
    """Optuna's value as the trial's: a reverse log scale is the log scale mirrored."""
    if p.scale == "UNIT_REVERSE_LOG_SCALE":
        value = sum(p.bounds) - value
    if p.type == "INTEGER":
        return int(value)
    if p.type == "DOUBLE":
        return float(value)
    return value


def pruner(spec: TuningSpec):
    """Hopeless means worse than the median of earlier trials at the same step, once two
    trials have finished to compare with; without early stopping, none."""
    import optuna
    if not spec.early_stopping:
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)


def training_output(study, spec: TuningSpec, running=frozenset()) -> dict:
    """Cloud ML's trainingOutput of the study's trials, best first."""
    # deepcopy=False: Optuna copies every trial otherwise, 0.3 s a call at 1,000 trials
    return outputs.output_of([trial_output(t, running)
                              for t in study.get_trials(deepcopy=False)],
                             metric_tag=spec.metric_tag, maximize=spec.maximize)


def trial_output(t, running) -> dict:
    attrs = t.user_attrs
    trial_id = attrs.get("trialId", str(t.number + 1))
    out = {"trialId": trial_id, "hyperparameters": dict(attrs.get("hyperparameters", {})),
           "allMetrics": list(attrs.get("allMetrics", [])),
           "isTrialStoppedEarly": bool(attrs.get("isTrialStoppedEarly", False))}
    if attrs.get("reusedFromTrialId"):  # ours: Cloud ML's Trial has no such field
        out["mljobReusedFromTrialId"] = attrs["reusedFromTrialId"]
    name = t.state.name
    if name == "COMPLETE":
        out["state"] = SUCCEEDED
        out["finalMetric"] = {"trainingStep": attrs.get("trainingStep", "0"),
                              "objectiveValue": t.value}
    elif name == "PRUNED":
        out["state"] = SUCCEEDED  # it ran, reported, and was stopped: not a failure
        last = out["allMetrics"][-1] if out["allMetrics"] else None
        if last:
            out["finalMetric"] = dict(last)
    elif name == "RUNNING":
        out["state"] = RUNNING if trial_id in running else CANCELLED
    else:
        out["state"] = attrs.get("state", FAILED)
        if attrs.get("error"):
            out["errorMessage"] = attrs["error"]
    for key in ("startTime", "endTime"):
        if attrs.get(key):
            out[key] = attrs[key]
    return out


def same_parameters(trials, trial):
    """A finished trial (succeeded, or stopped early) with exactly `trial`'s parameters,
    or None."""
    return next((t for t in trials if t.number != trial.number and
                 t.state.name in ("COMPLETE", "PRUNED") and t.params == trial.params),
                None)


def reuse(tell, trial, earlier) -> str:
    """Record `trial` with `earlier`'s result, without running it again (as Vizier does
    with a repeated suggestion); `tell` is the tuner's. The outcome, for its event line."""
    import optuna
    earlier_id = earlier.user_attrs.get("trialId", str(earlier.number + 1))
    trial.set_user_attr("reusedFromTrialId", earlier_id)
    for key in ("trainingStep", "allMetrics", "isTrialStoppedEarly"):
        if key in earlier.user_attrs:
            trial.set_user_attr(key, earlier.user_attrs[key])
    trial.set_user_attr("endTime", trial.user_attrs.get("startTime"))
    same = f"the parameters of trial {earlier_id}, not run again"
    if earlier.state.name == "PRUNED":
        tell(trial, state=optuna.trial.TrialState.PRUNED)
        return f"stopped early as trial {earlier_id} was ({same})"
    tell(trial, earlier.value)
    return f"SUCCEEDED {earlier.value:g}, trial {earlier_id}'s result ({same})"


def iso(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")
