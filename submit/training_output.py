"""Cloud ML's `trainingOutput` of a hyperparameter tuning job, in one place: the trials
ranked best first, `jobs describe --summarize`'s table of them, and the plot of the
objective. The local tuner (`submit.local.tuner`, from its Optuna study), Vertex AI
(`submit.runners.vertex`, from a HyperparameterTuningJob's trials) and `jobs describe`
(from the record) all use it, so a trial looks the same wherever it ran.

A trial is Cloud ML's dict: `trialId`, `state` (SUCCEEDED, FAILED, CANCELLED, RUNNING),
`hyperparameters` (name to text), `allMetrics` and `finalMetric` (`trainingStep`,
`objectiveValue`), `isTrialStoppedEarly`, and optionally `startTime`, `endTime` and
`errorMessage`.
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any
from mljob.errors import ascii_digits

# Trial states as Cloud ML's trainingOutput shows them.
SUCCEEDED, FAILED, CANCELLED, RUNNING = "SUCCEEDED", "FAILED", "CANCELLED", "RUNNING"
PLOT = "objective.png"


def output_of(trials: list[dict], *, metric_tag: str, maximize: bool) -> dict:
    """trainingOutput around trials, ranked best first: those that ran to their end by
    objective, then those stopped early, then failed and running ones."""
    sign = -1.0 if maximize else 1.0

    def rank(t):
        metric = t.get("finalMetric")
        group = (0 if metric and not t.get("isTrialStoppedEarly") else 1 if metric else 2)
        trial_id = t["trialId"]
        return (group, sign * metric["objectiveValue"] if metric else 0.0,
                int(trial_id) if ascii_digits(str(trial_id)) else 0, str(trial_id))

    trials = sorted(trials, key=rank)
    completed = sum(1 for t in trials if t["state"] == SUCCEEDED)
    return {"isHyperparameterTuningJob": True, "hyperparameterMetricTag": metric_tag,
            "completedTrialCount": str(completed), "trials": trials}


def trials_table(output: Mapping[str, Any]) -> str:
    """`jobs describe --summarize`'s table of trials, best first."""
    trials = output.get("trials") or []
    names = sorted({k for t in trials for k in t.get("hyperparameters", {})})
    tag = output.get("hyperparameterMetricTag", "objective")
    rows = [["TRIAL", "STATE", tag.upper(), "STEP", *names]]
    for t in trials:
        metric = t.get("finalMetric") or {}
        state = t["state"] + (" (stopped early)" if t.get("isTrialStoppedEarly") else "")
        value = metric.get("objectiveValue")
        rows.append([t["trialId"], state, "-" if value is None else f"{value:.6g}",
                     metric.get("trainingStep", "-"),
                     *(t.get("hyperparameters", {}).get(n, "-") for n in names)])
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True))
                     .rstrip() for row in rows)


def write_plot(output: Mapping[str, Any], path: str, *, maximize: bool) -> str | None:
    """Objective against trial, and the best so far, as a PNG; None without trials."""
    points = sorted((int(t["trialId"]), t["finalMetric"]["objectiveValue"],
                     t.get("isTrialStoppedEarly", False))
                    for t in output.get("trials", []) if t.get("finalMetric"))
    if not points:
        return None
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    best, so_far = math.nan, []
    for _, value, stopped in points:
        if not stopped:
            better = max if maximize else min
            best = value if math.isnan(best) else better(best, value)
        so_far.append(best)
    fig, ax = plt.subplots(figsize=(7, 4))
    ran = [(i, v) for i, v, s in points if not s]
    stopped = [(i, v) for i, v, s in points if s]
    if ran:
        ax.scatter(*zip(*ran, strict=True), label="trial", color="tab:blue")
    if stopped:
        ax.scatter(*zip(*stopped, strict=True), label="stopped early", color="tab:gray",
                   marker="x")
    ax.step([i for i, _, _ in points], so_far, where="post", color="tab:orange",
            label="best so far")
    ax.set_xlabel("trial")
    goal = "maximize" if maximize else "minimize"
    ax.set_ylabel(f"{output.get('hyperparameterMetricTag')} ({goal})")
    ax.legend()
    ax.grid(alpha=0.3)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path
