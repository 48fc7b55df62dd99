"""A tuning job on Kubeflow: the Katib Experiment (kubeflow.org/v1beta1) around the
rendered TFJob, pure rendering as `kubeflow_render` is (see `submit.runners.kubeflow` for
the choices: Katib's File collector on the cloudml-hypertune file, tpe for
ALGORITHM_UNSPECIFIED, medianstop for early stopping)."""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from mljob import contracts
from submit.jobdef import containers, tuning_spec
from submit.runners.kubeflow_render import CONTAINER, GROUP

KATIB_VERSION, EXPERIMENTS = "v1beta1", "experiments"
EXPERIMENT = "Experiment"  # the handle's kind for a tuning job (else a TFJob)
# Where a trial's container writes its cloudml-hypertune metrics for Katib's collector.
KATIB_METRICS_FILE = "/var/log/katib/hypertune/output.metrics"
KATIB_ALGORITHMS = {"ALGORITHM_UNSPECIFIED": "tpe", "RANDOM_SEARCH": "random",
                    "GRID_SEARCH": "grid"}
KATIB_TYPES = {"DOUBLE": "double", "INTEGER": "int", "CATEGORICAL": "categorical",
               "DISCRETE": "discrete"}


def experiment(tfjob: Mapping[str, Any], tuning: tuning_spec.TuningSpec,
               job_dir: str) -> dict:
    """The Katib Experiment around a rendered TFJob (see the module docstring)."""
    trial_job = json.loads(json.dumps(tfjob))
    metadata = trial_job.pop("metadata")
    trial_job["metadata"] = {"labels": metadata["labels"]}  # Katib names each trial
    trial_env = [{"name": contracts.TRIAL_ID_ENV, "value": "${trialSpec.Name}"},
                 {"name": contracts.HP_METRIC_TAG_ENV, "value": tuning.metric_tag},
                 {"name": contracts.HP_METRIC_FILE_ENV, "value": KATIB_METRICS_FILE}]
    flags = [f"--{p.name}=${{trialParameters.{p.name}}}" for p in tuning.params]
    for replica in trial_job["spec"]["tfReplicaSpecs"].values():
        container = replica["template"]["spec"]["containers"][0]
        args = list(container["args"])
        if len(args) >= 2 and args[-2] == "--job-dir":
            args = args[:-2]
        # Katib fills its `${...}` in before the kubelet reads `$$` as `$`
        container["args"] = args + flags + [
            "--job-dir", f"{containers.kubelet_literal(job_dir)}/${{trialSpec.Name}}"]
        container["env"] = container["env"] + trial_env
    parameters = []
    for p in tuning.params:
        space: dict[str, str | list[str]]
        if p.type in ("DOUBLE", "INTEGER"):
            space = {"min": str(p.low), "max": str(p.high), "distribution":
                     "logUniform" if p.scale == "UNIT_LOG_SCALE" else "uniform"}
        else:
            space = {"list": [str(v) for v in p.values]}
        parameters.append({"name": p.name, "parameterType": KATIB_TYPES[p.type],
                           "feasibleSpace": space})
    spec: dict[str, Any] = {
        "objective": {"type": "maximize" if tuning.maximize else "minimize",
                      "objectiveMetricName": tuning.metric_tag},
        "algorithm": {"algorithmName": KATIB_ALGORITHMS[tuning.algorithm]},
        "parallelTrialCount": tuning.max_parallel_trials,
        "maxTrialCount": tuning.max_trials,
        "parameters": parameters,
        "metricsCollectorSpec": {
            "collector": {"kind": "File"},
            "source": {"fileSystemPath": {"path": KATIB_METRICS_FILE, "kind": "File",
                                          "format": "JSON"}}},
        "trialTemplate": {
            "primaryContainerName": CONTAINER,
            "primaryPodLabels": {"training.kubeflow.org/job-role": "master"},
            "successCondition": 'status.conditions.#(type=="Succeeded")#|#(status=="True")#',
            "failureCondition": 'status.conditions.#(type=="Failed")#|#(status=="True")#',
            "trialParameters": [{"name": p.name, "reference": p.name,
                                 "description": f"--{p.name}"} for p in tuning.params],
            "trialSpec": trial_job}}
    if tuning.max_failed_trials:
        spec["maxFailedTrialCount"] = tuning.max_failed_trials
    if tuning.early_stopping:
        spec["earlyStopping"] = {"algorithmName": "medianstop", "algorithmSettings": [
            {"name": "min_trials_required", "value": "2"}]}
    body = {"apiVersion": f"{GROUP}/{KATIB_VERSION}", "kind": EXPERIMENT,
            "metadata": metadata, "spec": spec}
    return json.loads(json.dumps(body))  # no shared objects: YAML would alias them
