"""Hyperparameter tuning on the local runner: trials as whole local jobs, suggested by
Optuna, the study kept in the job dir.

A tuning job's plan is the plan of one trial's job (what `--dry-run` prints). Each trial
is that job again, run by a `Supervisor` of its own, with:
- its own free ports (a trial of a CUSTOM or STANDARD_1 job is a whole cluster);
- its own output folder `<job-dir>/<trialId>/` as `--job-dir`, its logs in
  `<log dir>/<trialId>/` (labels `3/master-replica-0`, which `jobs stream-logs
  --task-name` takes);
- each parameter as `--<parameterName>=<value>` after the user's arguments;
- TF_CONFIG's `task.trial`, and CLOUD_ML_TRIAL_ID, CLOUD_ML_HP_METRIC_TAG and
  CLOUD_ML_HP_METRIC_FILE (a file of its own under the run folder: parallel trials must
  not share the library's default `/tmp/hypertune/output.metrics`).

The tuner starts up to `maxParallelTrials` trials at once and reads each trial's metrics
file as it is written (`mljob.hypertune`). The last report is the trial's objective. A
trial that wrote no such file but TensorBoard summaries of the metric's tag under its job
dir is judged by those when it ends, as Cloud ML read them.
With `enableTrialEarlyStopping`, every report is given to Optuna's median pruner; a
trial it calls hopeless is stopped as any job is (SIGTERM to each replica, the grace
period, SIGKILL) and marked `isTrialStoppedEarly`.

Samplers: ALGORITHM_UNSPECIFIED is Optuna's TPE (Bayesian optimisation over any mix of
DOUBLE, INTEGER, CATEGORICAL and DISCRETE parameters; `constant_liar` keeps parallel
trials from asking for the same point; Optuna's GP sampler would need PyTorch);
RANDOM_SEARCH its random sampler; GRID_SEARCH its grid sampler, ending when the grid is
exhausted. UNIT_REVERSE_LOG_SCALE, which Optuna lacks, is a log scale mirrored onto
[min, max] (dense near maxValue).

The study is an Optuna journal file, `<job dir>/hptuning/optuna-journal.log` (under the
run folder for gs:// job dirs, copied to `<job-dir>/hptuning/` when the job ends): every
finished trial is appended as it ends, so a launcher that dies loses nothing.
`resumePreviousJobId` starts the study from the earlier job's finished trials (they are
not run again) and `maxTrials` counts them. `maxFailedTrials` N ends the job FAILED once N
trials failed; unset (or 0), the job fails only when no trial succeeded.

The record's `trainingOutput` is Cloud ML's (`isHyperparameterTuningJob`, `trials` best
first, ...; `submit.training_output`, which Vertex AI's trials and `jobs describe` share),
and `objective.png` beside the study plots objective against trial and the best so far.
The sampler, pruner and Optuna's trials as Cloud ML's are `submit.local.study`.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

from mljob import contracts, hypertune, storage
from mljob import prestart as mljob_prestart
from mljob.startup import LIBRARY_ENV, seen_name
from mljob.procs import free_ports
from submit import jobs, logs
from submit.jobdef import hparams
from submit.local import prestart, usage
from submit.local import study as studies
from submit.local.joblife import JobLife
from submit.local.plan import JobPlan
from submit.local.resume import journal_of
from submit.local.study import STUDY_NAME, iso
from submit.local.supervisor import Supervisor, replica_env, spawn
from submit.training_output import CANCELLED, PLOT, write_plot
from submit.jobdef.tuning_spec import HP_DIR, JOURNAL, TuningSpec, format_value

log = logging.getLogger(__name__)
POLL_S = 0.5


def hp_dir(plan: JobPlan) -> str:
    """The local folder of the study and its plot: in the job dir when replicas write it
    locally (a path, or memory://'s mirrored scratch folder), else the run folder."""
    local = plan.replica_job_dir
    if local and storage.is_local(local):
        return os.path.join(storage.local_path(local), HP_DIR)
    return os.path.join(plan.run_dir, HP_DIR)


# --- one trial's job ----------------------------------------------------------------------

def trial_plan(base: JobPlan, trial_id: str, params: Mapping[str, Any], spec: TuningSpec,
               metric_file: str) -> JobPlan:
    """The base plan as trial `trial_id`: new ports, its own job dir, logs and metrics
    file, the parameters as flags, and the trial in TF_CONFIG and the environment."""
    addresses = [a for hosts in base.cluster.values() for a in hosts]
    fresh = [f"127.0.0.1:{p}" for p in free_ports(len(addresses))] if addresses else []
    remap = dict(zip(addresses, fresh, strict=True))
    cluster = {k: tuple(remap[a] for a in v) for k, v in base.cluster.items()}
    args = list(base.trainer_args)
    if len(args) >= 2 and args[-2] == "--job-dir":
        args = args[:-2]
    args += [p.flag(params[p.name]) for p in spec.params]
    replica_job_dir = None
    if base.replica_job_dir:
        replica_job_dir = (os.path.join(base.replica_job_dir, trial_id)
                           if storage.is_local(base.replica_job_dir)
                           else storage.join(base.replica_job_dir, trial_id))
        args += ["--job-dir", replica_job_dir]
    log_dir = os.path.join(base.log_dir, trial_id)
    env = {contracts.TRIAL_ID_ENV: trial_id, contracts.HP_METRIC_TAG_ENV: spec.metric_tag,
           contracts.HP_METRIC_FILE_ENV: metric_file}
    replicas = []
    for r in base.replicas:
        tf_config = {**r.tf_config, "cluster": {k: list(v) for k, v in cluster.items()},
                     "task": {**r.tf_config["task"], "trial": trial_id}}
        replicas.append(dataclasses.replace(
            r, label=f"{trial_id}/{r.label}",
            address=remap.get(r.address) if r.address else None,
            command=(*r.command[:len(r.command) - len(base.trainer_args)], *args),
            env={**r.env, **env, "TF_CONFIG": _json(tf_config)}, tf_config=tf_config,
            log_file=os.path.join(log_dir, os.path.basename(r.log_file))))
    return dataclasses.replace(
        base, job_dir=storage.join(base.job_dir, trial_id) if base.job_dir else None,
        replica_job_dir=replica_job_dir, run_dir=os.path.dirname(metric_file),
        log_dir=log_dir, mirrors=(), trainer_args=tuple(args), cluster=cluster,
        replicas=tuple(replicas))


def _json(value) -> str:
    import json
    return json.dumps(value, sort_keys=True)


class TrialRun(Protocol):
    """One trial's job as a runner runs it: `run()` to its end in the trial's thread
    (the final state and its error), `cancel()` from any thread; `job_dir` is where its
    replicas write (its TensorBoard summaries), or None."""

    job_dir: str | None

    def run(self) -> tuple[str, str | None]: ...

    def cancel(self) -> None: ...


class LocalTrial:
    """A trial on this machine: its plan run by a `Supervisor` of its own."""

    def __init__(self, plan: JobPlan, supervisor: Supervisor):
        self.plan, self.supervisor = plan, supervisor
        self.job_dir = plan.replica_job_dir

    def run(self) -> tuple[str, str | None]:
        state = self.supervisor.run()
        return state, self.supervisor.record.error_message

    def cancel(self) -> None:
        self.supervisor.cancel()


@dataclasses.dataclass
class Trial:
    """A trial while it runs: Optuna's trial, our id, its job and thread."""

    optuna_trial: Any
    trial_id: str
    params: dict
    job: TrialRun
    metric_file: str
    thread: threading.Thread | None = None
    state: str | None = None          # the supervisor's final state
    error: str | None = None
    reported_steps: set = dataclasses.field(default_factory=set)
    # every report read so far, by (timestamp, step): the library rewrites its file in
    # place, so a trial stopped during a rewrite leaves a short or empty file behind
    seen: dict = dataclasses.field(default_factory=dict)
    stopped_early: bool = False
    start_time: float = dataclasses.field(default_factory=time.time)


class Tuner(JobLife):
    """Runs a tuning job's trials to the end; `run()` returns the job's final state."""

    PRESTART = True  # the next trial's processes started ahead (trials on this machine)

    def __init__(self, plan: JobPlan, record: jobs.JobRecord, *,
                 terminal: logs.Terminal | None = None, seed: int | None = None,
                 publish=jobs.save, grace: float | None = None):
        super().__init__(plan, record, publish=publish, terminal=terminal)
        assert plan.tuning is not None  # the supervisor runs a Tuner for tuning plans
        self.spec = plan.tuning
        self.seed = seed
        self.grace = grace
        self.dir = hp_dir(plan)
        self.running: list[Trial] = []
        self.failures = 0
        self._wake = threading.Event()  # a trial ended: look now, not at the next poll
        # the next trial's processes, started while trials run (MLJOB_PRESTART=0: none)
        self.pool = prestart.job_pool(
            len(plan.replicas) * self.spec.max_parallel_trials, mljob_prestart.setting(),
            spawn, self._event) if self.PRESTART else None
        self._ahead: list[prestart.Wanted] | None = None
        self._library_seen = os.path.join(plan.run_dir, "prestart")  # mljob.prestart
        if self.pool is not None:  # each trial's replicas say if they use mljob.training
            self.plan = dataclasses.replace(plan, replicas=tuple(
                dataclasses.replace(r, env={**r.env, LIBRARY_ENV: self._library_seen})
                for r in plan.replicas))

    # --- the job ---------------------------------------------------------------------

    def _live(self) -> tuple[str, str | None]:
        self.record.replicas = []
        self._prepare_folders(self.dir, self.plan.run_dir, self.plan.log_dir)
        if self.pool is not None:  # an earlier run of the same job id says nothing here
            shutil.rmtree(self._library_seen, ignore_errors=True)
            os.makedirs(self._library_seen)
        self.study = self._study()
        self.board = hparams.Board(self.spec, self.plan.replica_job_dir or
                                   os.path.join(self.dir, "tensorboard"))
        self.board.start()
        self._publish_output()
        self._set(jobs.RUNNING)
        return self._loop()

    def _study(self):
        import optuna
        from optuna.storages.journal import JournalFileBackend, JournalStorage
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage_ = JournalStorage(JournalFileBackend(os.path.join(self.dir, JOURNAL)))
        study = optuna.create_study(
            storage=storage_, study_name=STUDY_NAME, load_if_exists=True,
            direction="maximize" if self.spec.maximize else "minimize",
            sampler=studies.sampler(self.spec, self.seed),
            pruner=studies.pruner(self.spec))
        if self.spec.resume_from and not study.trials:
            earlier = jobs.load(self.spec.resume_from)
            old = optuna.load_study(study_name=STUDY_NAME, storage=JournalStorage(
                JournalFileBackend(journal_of(earlier))))
            kept = [t for t in old.trials if t.state in (optuna.trial.TrialState.COMPLETE,
                                                         optuna.trial.TrialState.PRUNED)]
            for frozen in kept:
                study.add_trial(frozen)
            self.terminal.note(f"resuming the study of job {earlier.job_id}: "
                               f"{len(kept)} finished trial(s) are not run again")
        return study

    def _loop(self) -> tuple[str, str | None]:
        next_mirror = time.monotonic() + 5.0
        while True:
            self._wake.clear()  # before looking: an end after this wakes the wait below
            if self._cancel.is_set():
                return jobs.CANCELLED, None
            for trial in list(self.running):
                self._read_reports(trial)
                if trial.thread is not None and not trial.thread.is_alive():
                    self._read_reports(trial)
                    self._end(trial)
            limit = self.spec.max_failed_trials
            if limit and self.failures >= limit:
                return jobs.FAILED, (f"{self.failures} trial(s) failed, the job's "
                                     f"maxFailedTrials; see the trials' logs in "
                                     f"{self.plan.log_dir}")
            while len(self.running) < self.spec.max_parallel_trials and self._more():
                self._start_trial()
            self._prestart()
            if not self.running:
                done = [t for t in self._trials() if t.state.name == "COMPLETE"]
                if not done:
                    return jobs.FAILED, ("no trial reported its metric "
                                         f"{self.spec.metric_tag!r} and succeeded; see the "
                                         f"trials' logs in {self.plan.log_dir}")
                return jobs.SUCCEEDED, None
            if time.monotonic() >= next_mirror:
                self._mirror(final=False)
                next_mirror = time.monotonic() + 5.0
            self._wake.wait(POLL_S)

    def _trials(self) -> list:
        """The study's trials, not copied (Optuna copies each one otherwise: 0.3 s a
        call at 1,000 trials, and the loop asks every poll)."""
        return self.study.get_trials(deepcopy=False)

    def _more(self) -> bool:
        if self._cancel.is_set() or len(self._trials()) >= self.spec.max_trials:
            return False
        if self.spec.algorithm == "GRID_SEARCH":
            return not self.study.sampler.is_exhausted(self.study) and \
                len(self._trials()) < self.spec.grid_size()
        return True

    # --- trials ------------------------------------------------------------------------

    def _start_trial(self) -> None:
        optuna_trial = self.study.ask(studies.distributions(self.spec))
        trial_id = str(1 + max([int(t.user_attrs.get("trialId", t.number + 1))
                                for t in self._trials() if t.number !=
                                optuna_trial.number] + [0]))
        params = {p.name: studies.from_optuna(p, optuna_trial.params[p.name])
                  for p in self.spec.params}
        optuna_trial.set_user_attr("trialId", trial_id)
        optuna_trial.set_user_attr("hyperparameters", {k: format_value(v)
                                                       for k, v in params.items()})
        optuna_trial.set_user_attr("startTime", iso(time.time()))
        if (earlier := studies.same_parameters(self._trials(), optuna_trial)) is not None:
            self._event(f"trial {trial_id} " + studies.reuse(self._tell, optuna_trial, earlier))
            return self._publish_output()
        metric_file = os.path.join(self.plan.run_dir, "trials", trial_id,
                                   "output.metrics")
        if os.path.exists(metric_file):
            os.remove(metric_file)  # an earlier run of the same job id
        trial = Trial(optuna_trial, trial_id, params,
                      self._launch(trial_id, params, metric_file), metric_file)
        trial.thread = threading.Thread(target=self._run_trial, args=(trial,), daemon=True,
                                        name=f"trial-{trial_id}")
        self.running.append(trial)
        flags = " ".join(p.flag(params[p.name]) for p in self.spec.params)
        self._event(f"trial {trial_id} started: {flags}")
        trial.thread.start()
        self.board.started(trial_id, trial.job.job_dir, params, trial.start_time)
        self._publish_output()

    def _prestart(self) -> None:
        """Keep the next trial's processes ready while another trial will start
        (`Pool.keep_ready`); from this thread, which lives as long as the job (the
        processes die with it)."""
        if self.pool is None:
            return
        if not self._more():
            self.pool.drain()  # no trial is left to start
            return
        if self._ahead is None:  # started as each trial's supervisor starts its replicas
            parent = os.getpid()
            self._ahead = [prestart.Wanted(r.label, r.command, replica_env(r.env, parent)[0],
                                           os.path.join(self._library_seen, seen_name(r.env)))
                           for r in self.plan.replicas]
        self.pool.keep_ready(
            [r for t in self.running for r in getattr(getattr(t.job, "supervisor", None),
                                                      "replicas", ())],
            self._ahead, self.plan.cwd)

    def _launch(self, trial_id: str, params: Mapping[str, Any],
                metric_file: str) -> TrialRun:
        """The trial's job, not started: on this machine, a supervisor of its own."""
        plan = trial_plan(self.plan, trial_id, params, self.spec, metric_file)
        trial_record = jobs.JobRecord(job_id=self.plan.job_id)
        options = {} if self.grace is None else {"grace": self.grace}
        return LocalTrial(plan, Supervisor(plan, trial_record, terminal=self.terminal,
                                           publish=self._trial_changed, **options,
                                           pool=self.pool.reserve() if self.pool else None))

    def _run_trial(self, trial: Trial) -> None:
        try:
            trial.state, trial.error = trial.job.run()
        except BaseException as exc:  # the trial fails, the tuner goes on
            trial.state, trial.error = jobs.FAILED, str(exc) or type(exc).__name__
        finally:
            self._wake.set()

    def _reports(self, trial: Trial) -> list[hypertune.Report]:
        """The trial's reports so far, oldest first: the file's now and every one read
        before, which a rewrite cut short by the trial's end must not lose."""
        for r in hypertune.read_reports(trial.metric_file, self.spec.metric_tag):
            trial.seen[(r.timestamp, r.step)] = r
        return sorted(trial.seen.values(), key=lambda r: (r.timestamp, r.step))

    def _read_reports(self, trial: Trial) -> None:
        reports = self._reports(trial)
        new = [r for r in reports if r.step not in trial.reported_steps]
        for report in new:
            trial.reported_steps.add(report.step)
            trial.optuna_trial.report(report.value, report.step)
        if reports:
            trial.optuna_trial.set_user_attr("allMetrics", [
                {"trainingStep": str(r.step), "objectiveValue": r.value} for r in reports])
        if (new and self.spec.early_stopping and not trial.stopped_early
                and trial.thread is not None and trial.thread.is_alive()
                and trial.optuna_trial.should_prune()):
            trial.stopped_early = True
            self._event(f"trial {trial.trial_id} stopped early at step "
                        f"{new[-1].step}: {self.spec.metric_tag}={new[-1].value:g} "
                        "is worse than the median of earlier trials")
            trial.job.cancel()

    def _end(self, trial: Trial) -> None:
        import optuna
        states = optuna.trial.TrialState
        self.running.remove(trial)
        reports = self._reports(trial)
        if not reports and trial.job.job_dir and storage.is_local(trial.job.job_dir):
            # no cloudml-hypertune reports: TensorBoard summaries of the metric's tag
            reports = hypertune.read_summaries(
                storage.local_path(trial.job.job_dir), self.spec.metric_tag)
            if reports:
                trial.optuna_trial.set_user_attr("allMetrics", [
                    {"trainingStep": str(r.step), "objectiveValue": r.value}
                    for r in reports])
        t = trial.optuna_trial
        t.set_user_attr("endTime", iso(time.time()))
        if trial.stopped_early and reports:
            t.set_user_attr("isTrialStoppedEarly", True)
            self._tell(t, state=states.PRUNED)
            outcome = "stopped early"
        elif trial.state == jobs.SUCCEEDED and reports:
            final = reports[-1]
            t.set_user_attr("trainingStep", str(final.step))
            self._tell(t, final.value)
            outcome = f"SUCCEEDED {self.spec.metric_tag}={final.value:g} at step {final.step}"
        elif trial.state == jobs.CANCELLED or self._cancel.is_set():
            t.set_user_attr("state", CANCELLED)
            self._tell(t, state=states.FAIL)
            outcome = "CANCELLED"
        else:
            why = trial.error or self._missing_metric(trial)
            t.set_user_attr("error", why)
            self._tell(t, state=states.FAIL)
            self.failures += 1
            outcome = f"FAILED: {why}"
        self._event(f"trial {trial.trial_id} {outcome}")
        self.board.ended(trial.trial_id, trial.job.job_dir, reports,
                         succeeded=bool(reports) and not outcome.startswith(("FAILED",
                                                                             "CANCELLED")))
        self._publish_output()

    def _missing_metric(self, trial: Trial) -> str:
        """Why a trial that ran to its end has no objective: no report carries the tag."""
        tags = [t for t in hypertune.reported_tags(trial.metric_file)
                if t != self.spec.metric_tag]
        did = (f"it reported {', '.join(tags)}" if tags else
               "it reported no metric (report it with cloudml-hypertune, see docs/submit.md)")
        return (f"no report carries the hyperparameterMetricTag "
                f"{self.spec.metric_tag!r}; {did}")

    def _tell(self, trial, *args, **kwargs) -> None:
        try:
            self.study.tell(trial, *args, **kwargs)
        except RuntimeError as exc:
            # The grid sampler calls study.stop() after the last grid point, which only
            # works inside study.optimize; the trial is stored before that (Optuna's
            # `finally`), and `_more` ends the job when the grid is exhausted.
            if "Study.stop" not in str(exc):
                raise

    def _trial_changed(self, trial_record: jobs.JobRecord) -> None:
        """A trial's supervisor changed its record: copy its replicas into the job's."""
        with self._lock:
            mine = {r.label: r for r in self.record.replicas}
            for r in trial_record.replicas:
                mine[r.label] = r
            self.record.replicas = list(mine.values())
            self._save()

    def _stop_everything(self) -> None:
        if self.pool is not None:
            self.pool.close()
        for trial in list(self.running):
            trial.job.cancel()
        for trial in list(self.running):
            if trial.thread is not None:
                trial.thread.join()
        for trial in list(self.running):
            try:
                self._end(trial)
            except Exception as exc:  # the study may be what failed
                log.warning("cannot record trial %s: %s", trial.trial_id, exc)
                self.running.remove(trial)

    # --- output ------------------------------------------------------------------------

    def _publish_output(self) -> None:
        with self._lock:
            self.record.training_output = studies.training_output(
                self.study, self.spec, running={t.trial_id for t in self.running})
            self._save()

    def _wind_up(self) -> None:
        self.record.usage = usage.summarize(list(usage.read(self.plan.run_dir)))
        if getattr(self, "study", None) is not None:
            try:
                self._publish_output()
                write_plot(self.record.training_output, os.path.join(self.dir, PLOT),
                           maximize=self.spec.maximize)
            except Exception as exc:  # a plot must not fail the job
                log.warning("could not plot the study: %s", exc)

    def _copy_out(self) -> None:
        super()._copy_out()
        self._copy_study()

    def _finish(self, state: str, error: str | None) -> str:
        state = super()._finish(state, error)
        if shutil.which("optuna-dashboard"):
            self.terminal.note(f"Open the study with: optuna-dashboard "
                               f"{os.path.join(self.dir, JOURNAL)}")
        return state

    def _copy_study(self) -> None:
        """A gs:// job dir gets the study and plot its trials' folders sit beside."""
        job_dir = self.plan.job_dir
        if not job_dir or storage.is_local(job_dir) or job_dir.startswith("memory://"):
            return  # written there already, or mirrored there with the job dir
        for name in (JOURNAL, PLOT):
            path = os.path.join(self.dir, name)
            if os.path.exists(path):
                with open(path, "rb") as f:
                    storage.write_bytes(storage.join(job_dir, HP_DIR, name), f.read())


