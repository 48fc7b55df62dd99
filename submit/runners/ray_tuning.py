"""`--runner ray` for a tuning job (`trainingInput.hyperparameters`): the study runs here,
driven by the local runner's tuner (`submit.local.tuner`: Optuna, the same algorithms,
trial records, maxTrials / maxParallelTrials / maxFailedTrials, early stopping,
resumePreviousJobId and Cloud ML's trainingOutput), and each trial is a Ray job that
`submit.runners.ray` renders: its own placement group, one actor per replica, its own
TF_CONFIG (with `task.trial`), the parameters as `--<name>=<value>` flags after the
user's arguments and `--job-dir <job-dir>/<trialId>`. `maxParallelTrials` is how many
trials' Ray jobs are in flight at once.

Why not Ray Tune: a Cloud ML trial is a whole multi-replica job (chief, workers, ps,
each a process with its own TF_CONFIG), and Ray Tune's trial is one trainable (a
function or class in an actor); the spec's algorithms, `maxFailedTrials`, the trial ids
and resumePreviousJobId are Optuna journal semantics mljob already has, and its trials
table is Cloud ML's. See docs/engine-ray.md.

Where a trial's metric comes from: each replica writes its cloudml-hypertune reports
to a file of its own on its node (`ray_driver` sets CLOUD_ML_HP_METRIC_FILE under the
replica's folder), the driver relays every new report line into the Ray job's log
(`hypertune LABEL {json}`), and the trial's thread here appends them to the trial's
metrics file under the run folder, which the tuner reads as on the local runner. So
the metric needs no shared storage; the job dir still does (checkpoints, exports and
the TensorBoard summaries a trial without reports is judged by, read when it is a
local path).

The job's record is owned by the process that runs the study (`record_owner =
SUPERVISOR`): the submitting process when attached, `python -m submit
_supervise ray-tuning` with --async. It keeps the running trials' Ray submission ids in
`engine["trials"]`; `jobs cancel` signals the study's process, which stops every
running trial's Ray job (`ray job stop`: the driver stops its replicas), and stops any
the record still names if that process is gone. Each trial's Ray log is copied into
`<log dir>/<trialId>/<label>.log` as it arrives, so `jobs stream-logs` and
`--task-name 3/master-replica-0` work as for a local tuning job.
"""
from __future__ import annotations

import copy
import json
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from mljob import contracts, storage
from submit import jobs, logs
from submit.errors import SubmitError, UsageError
from submit.local import entry
from submit.local import plan as plans
from submit.local.tuner import Tuner
from submit.home import mljob_home
from submit.packaging.package import Package
from submit.runners import ray as rayrunner
from submit.runners import ray_driver
from submit.runners.local import recorded_logs
from submit.runners.engine import SUPERVISOR, EngineOptions, EngineStatus, Rendered, \
    ReplicaStatus
from submit.jobdef.spec import JobSpec

BODY_FILE = "ray-tuning.json"
METRIC_FILE = "hypertune/output.metrics"  # under each replica's folder on its node
POLL_S = 1.0


def supervise_here(rendered: Rendered, record: jobs.JobRecord) -> str:
    """Run an attached tuning job's study to its end in this process (Ctrl-C cancels)."""
    return run(rendered.body, record, stream=True)


def run(body: Mapping[str, Any], record: jobs.JobRecord, *, stream: bool) -> str:
    """Run the study in this process, which becomes the job's supervisor (its lock held,
    its record owned); the final state."""
    return entry.supervise(record, lambda terminal: RayTuner(
        plans.JobPlan.from_dict(body["plan"]), record, trial=body["trial"],
        terminal=terminal).run(), stream=stream)


class RayTuningEngine(rayrunner.RayEngine):
    """A tuning job on Ray (the registry picks it: `submit.runners.TUNING`)."""

    record_owner = SUPERVISOR
    supervise_here = staticmethod(supervise_here)

    def check(self, spec: JobSpec) -> None:
        super().check(spec)
        hp = spec.tuning
        assert hp is not None  # the registry picks this runner for tuning jobs
        from submit.local import resume, study
        study.check_installed()
        if hp.resume_from:
            resume.check_resumable(hp.resume_from)

    def render(self, spec: JobSpec, package: Package | None) -> Rendered:
        trial = super().render(spec, package)
        run_dir, log_dir, job_dir, mirrors = plans.folders(spec, mljob_home())
        plan = plans.JobPlan(
            job_id=spec.job_id, mode="cloud", scale_tier=spec.scale_tier,
            job_dir=spec.job_dir, replica_job_dir=job_dir, run_dir=run_dir,
            log_dir=log_dir, mirrors=tuple(mirrors),
            package_url=package.url if package else None,
            package_sha256=package.sha256 if package else None, package_top_dir=None,
            python_path="", cwd=run_dir, module=spec.module_name,
            trainer_args=spec.trainer_args, cluster={},
            training_input=dict(spec.training_input), replicas=(),
            labels=dict(spec.labels), tuning=spec.tuning)
        body = {"plan": plan.to_dict(), "trial": dict(trial.body)}
        return Rendered(body=body, text=json.dumps(body, indent=2, sort_keys=True),
                        handle=dict(trial.handle), record={"log_dir": log_dir,
                                                           "replicas": []})

    @staticmethod
    def _fits_trials(rendered: Rendered) -> None:
        """A trial fits the cluster (else one line), and so do maxParallelTrials of
        them at once: a trial whose placement group waited for room longer than
        maxWaitTime would fail and count against maxFailedTrials."""
        trial = rendered.body["trial"]
        rayrunner.RayEngine._fits(Rendered(body=trial, text="", handle={}))
        parallel = rendered.body["plan"]["tuning"]["max_parallel_trials"]
        nodes = rayrunner._nodes(rayrunner._client(trial["address"]), trial["address"])
        bundles = [r["bundle"] for r in trial["job"]["replicas"]]
        held = max_trials_at_once(bundles, nodes, parallel)
        if held < parallel:
            raise UsageError(
                f"trainingInput.hyperparameters.maxParallelTrials {parallel} is more "
                f"trials than the Ray cluster at {trial['address']} holds at once "
                f"({held}, each trial {len(bundles)} replica(s)); lower it to {held}, "
                "or add nodes")

    preflight = _fits_trials

    def create(self, rendered: Rendered) -> Mapping[str, Any]:
        """Start `python -m submit _supervise ray-tuning` in its own session: it runs
        the study and owns the record (saved before: it reads it)."""
        run_dir = rendered.body["plan"]["run_dir"]
        job_id = rendered.body["plan"]["job_id"]
        os.makedirs(run_dir, exist_ok=True)
        body_file = os.path.join(run_dir, BODY_FILE)
        storage.write_bytes(body_file, rendered.text.encode())
        pid = entry.detach("ray-tuning", job_id, run_dir, body_file)
        return {**rendered.handle, "supervisor_pid": pid}

    def status(self, handle: Mapping[str, Any]) -> EngineStatus:
        record = jobs.load(handle["job_id"])
        return EngineStatus(record.state, record.error_message, tuple(
            ReplicaStatus(r.label, r.state, r.exit_code, r.restarts)
            for r in record.replicas), training_output=record.training_output)

    def logs(self, handle: Mapping[str, Any], *, task_name: str | None = None,
             follow: bool = True) -> Iterator[str]:
        return recorded_logs(handle["job_id"], task_name, follow, lambda _labels: (
            f"a trial's replica ({contracts.LABEL_HINT} after its trial id: "
            f"1/master-replica-0), or {logs.SERVICE}"))

    def cancel(self, handle: Mapping[str, Any]) -> str:
        """Signal the study's process, which stops every running trial's Ray job; the
        trials it could not stop (it was gone) are stopped here."""
        state = entry.cancel(handle["job_id"])
        left = jobs.load(handle["job_id"]).engine.get("trials") or {}
        engine = rayrunner.RayEngine(EngineOptions())
        for submission_id in left.values():
            try:
                engine.cancel({"address": handle["address"],
                               "submission_id": submission_id})
            except SubmitError:
                pass  # the cluster is gone: so are its jobs
        return state


def max_trials_at_once(bundles: list[dict], nodes: list[dict], parallel: int) -> int:
    """How many trials (each these bundles, packed) the nodes hold at once, up to
    `parallel`."""
    held = 0
    for k in range(1, parallel + 1):
        try:
            ray_driver.fit(bundles * k, nodes, spread=False)
        except ValueError:
            break
        held = k
    return held


def trial_body(base: Mapping[str, Any], trial_id: str, flags: list[str],
               metric_tag: str, job_dir: str | None) -> dict:
    """The rendered Ray job as trial `trial_id`'s: its flags after the user's arguments,
    its own job dir, placement group and submission id, the trial in TF_CONFIG and the
    environment, and its replicas' reports relayed (see the module docstring)."""
    body = copy.deepcopy(dict(base))
    job = body["job"]
    args = list(job["args"])
    if len(args) >= 2 and args[-2] == "--job-dir":
        args = args[:-2]
    args += flags
    if job_dir:
        args += ["--job-dir", os.path.join(job_dir, trial_id) if storage.is_local(job_dir)
                 else storage.join(job_dir, trial_id)]
    job.update(args=args, trial=trial_id, hp_metric_file=METRIC_FILE,
               job_id=f"{job['job_id']}-trial-{trial_id}",
               env={**job["env"], contracts.TRIAL_ID_ENV: trial_id,
                    contracts.HP_METRIC_TAG_ENV: metric_tag})
    body["metadata"] = {**body["metadata"], "mljob_trial_id": trial_id}
    return body


class RayTuner(Tuner):
    """The local tuner's study with each trial a Ray job (`RayTrial`)."""

    PRESTART = False  # a trial's processes are Ray's, on its nodes

    def __init__(self, plan: plans.JobPlan, record: jobs.JobRecord, *,
                 trial: Mapping[str, Any], terminal: logs.Terminal | None = None,
                 seed: int | None = None):
        super().__init__(plan, record, terminal=terminal, seed=seed)
        self.trial_body = trial
        self.engine = rayrunner.RayEngine(EngineOptions(ray_address=trial["address"]))

    def _launch(self, trial_id: str, params: Mapping[str, Any],
                metric_file: str) -> "RayTrial":
        flags = [p.flag(params[p.name]) for p in self.spec.params]
        body = trial_body(self.trial_body, trial_id, flags, self.spec.metric_tag,
                          self.plan.replica_job_dir)
        job_dir = body["job"]["args"][-1] if self.plan.replica_job_dir else None
        return RayTrial(self, trial_id, body, metric_file, job_dir)

    def _trial_submitted(self, trial_id: str, submission_id: str | None) -> None:
        """Keep the running trials' Ray jobs in the record (None: it ended)."""
        with self._lock:
            trials = dict(self.record.engine.get("trials") or {})
            if submission_id is None:
                trials.pop(trial_id, None)
            else:
                trials[trial_id] = submission_id
            self.record.engine = {**self.record.engine, "trials": trials}
            self._save()


class RayTrial:
    """One trial's Ray job, submitted, followed and stopped from the trial's thread."""

    def __init__(self, tuner: RayTuner, trial_id: str, body: dict, metric_file: str,
                 job_dir: str | None):
        self.tuner, self.trial_id, self.body = tuner, trial_id, body
        self.metric_file, self.job_dir = metric_file, job_dir
        self.log_dir = os.path.join(tuner.plan.log_dir, trial_id)
        self.stop = threading.Event()
        self.seen = 0               # characters of the Ray job's log taken
        self.reports: set[str] = set()
        self.record = jobs.JobRecord(job_id=tuner.plan.job_id)

    def cancel(self) -> None:
        self.stop.set()

    def run(self) -> tuple[str, str | None]:
        if self.stop.is_set():
            return jobs.CANCELLED, None
        engine = self.tuner.engine
        job = self.body["job"]
        handle: dict[str, Any] = {"address": self.body["address"], "job_id": job["job_id"]}
        try:
            handle = dict(engine.create(Rendered(body=self.body, text="", handle=handle)))
        except SubmitError as exc:
            return jobs.FAILED, str(exc)
        self.tuner._trial_submitted(self.trial_id, handle["submission_id"])
        self._line(logs.SERVICE, f"Ray job {handle['submission_id']} submitted")
        try:
            return self._follow(engine, handle)
        finally:
            self.tuner._trial_submitted(self.trial_id, None)

    def _follow(self, engine: rayrunner.RayEngine,
                handle: Mapping[str, Any]) -> tuple[str, str | None]:
        failing_since = None
        client = None
        while True:
            if self.stop.is_set():
                engine.cancel(handle)  # ray job stop: the driver stops every replica
                try:
                    self._take(rayrunner._get_logs(
                        client or rayrunner._client(handle["address"]), handle), final=True)
                except SubmitError:
                    pass
                return jobs.CANCELLED, None
            try:
                client = client or rayrunner._client(handle["address"])
                state, message, text = self._status(client, handle)
                failing_since = None
            except SubmitError:  # a dashboard busy or restarting: for a while
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since > rayrunner.FOLLOW_OUTAGE_S:
                    raise
                client = None
                self.stop.wait(POLL_S)
                continue
            final = state in jobs.FINAL_STATES
            self._take(text, final=final)
            if final:
                return state, message
            self.stop.wait(POLL_S)

    def _status(self, client, handle: Mapping[str, Any]) -> tuple[str, str | None, str]:
        """The Ray job's state, its failure, and its log (RayEngine.status's reading,
        one client for the trial's life)."""
        try:
            info = client.get_job_info(handle["submission_id"])
        except Exception as exc:
            if "does not exist" in str(exc):
                return jobs.CANCELLED, "the trial's Ray job is gone from the cluster", ""
            raise SubmitError(f"cannot read the Ray job {handle['submission_id']}: "
                              f"{rayrunner._one_line(exc)}") from None
        state = rayrunner.STATES.get(info.status, jobs.QUEUED)
        text = rayrunner._get_logs(client, handle)
        replicas, result = rayrunner._replicas(text)
        self._replicas(replicas)
        message = None
        if state == jobs.FAILED:
            message = (result[1] if result and result[1] else
                       rayrunner._one_line(info.message or "the Ray job failed"))
        return state, message, text

    def _take(self, text: str, *, final: bool) -> None:
        """The Ray job's new log lines: reports into the metrics file, the rest into the
        trial's log folder (and the terminal), labelled `<trialId>/<label>`."""
        cut = len(text) if final else text.rfind("\n", self.seen) + 1
        new = text[self.seen:cut].splitlines() if cut > self.seen else []
        self.seen = max(self.seen, cut)
        reports = []
        for line in new:
            metric = rayrunner.parse_metric(line)
            if metric is not None:
                if metric[1] not in self.reports:
                    self.reports.add(metric[1])
                    reports.append(metric[1])
                continue
            parts = line.split("\t", 3)
            if len(parts) == 4:
                self._line(parts[2], parts[3], parts[0])
            elif line.strip():
                self._line(logs.SERVICE, line)  # Ray's own lines
        if reports:
            os.makedirs(os.path.dirname(self.metric_file), exist_ok=True)
            with open(self.metric_file, "a", encoding="utf-8") as f:
                f.writelines(r + "\n" for r in reports)

    def _line(self, label: str, text: str, severity: str = "INFO") -> None:
        full = f"{self.trial_id}/{label}"
        formatted = logs.format_line(full, text, severity)
        try:
            os.makedirs(self.log_dir, exist_ok=True)
            with open(os.path.join(self.log_dir, f"{label}.log"), "a",
                      encoding="utf-8") as f:
                f.write(formatted + "\n")
        except OSError:
            pass  # a full disk must not stop the trial
        self.tuner.terminal.line(full, text, formatted)

    def _replicas(self, replicas: tuple[ReplicaStatus, ...]) -> None:
        now = [jobs.ReplicaRecord(f"{self.trial_id}/{r.label}", state=r.state,
                                  exit_code=r.exit_code, restarts=r.restarts)
               for r in replicas]
        if now and now != self.record.replicas:  # the record is written on a change only
            self.record.replicas = now
            self.tuner._trial_changed(self.record)

