"""`--runner local`: the six verbs (`submit.runners.engine`) over the local wing
(`submit.local`), which runs one process per replica on this machine.

Its rendered job is the plan `--dry-run` prints: a training job's (`submit.local.plan`)
or a batch prediction job's shard plan (`submit.prediction.plan`, whose worker
processes share the shards). It declares that its supervisor owns the job record
(`record_owner = SUPERVISOR`): an attached job (the default, streaming) is supervised in
the submitting process (`supervise_here`), a detached one (`--async`) by the `python -m
submit _supervise KIND FILE` process `create` starts (KIND `job` or `prediction`), whose
PID the record keeps. `status` and `logs` read what the supervisor writes; `cancel`
signals it.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

from mljob import contracts, storage
from submit import jobs, logs
from submit.errors import UsageError
from submit.local import containers, entry
from submit.local import plan as plans
from submit.local.plan import JobPlan
from submit.home import mljob_home
from submit.packaging.package import Package
from submit.runners.engine import SUPERVISOR, EngineOptions, EngineStatus, Rendered, \
    ReplicaStatus, Runner
from submit.jobdef.spec import JobSpec, check_gpus, local_gpu_count
from submit.prediction.spec import PredictionSpec

MAX_REPLICAS_PER_TYPE = 64  # one process per replica on this machine


def supervise_here(rendered: Rendered, record: jobs.JobRecord) -> str:
    """Run an attached job to its end in this process (Ctrl-C cancels it)."""
    if rendered.prediction:
        from submit.prediction import job as prediction_job
        return prediction_job.run(_prediction_plan(rendered), record, stream=True)
    return entry.run(JobPlan.from_dict(rendered.body), record, stream=True)


def _prediction_plan(rendered: Rendered):
    """A rendered batch prediction job's plan, written where its workers read it (and
    a later --resume finds it)."""
    from submit.prediction.job import PredictionPlan
    plan = PredictionPlan.from_json(rendered.text)
    os.makedirs(plan.run_dir, exist_ok=True)
    storage.write_bytes(plan.job_file, rendered.text.encode())
    return plan


def recorded_logs(job_id: str, task_name: str | None, follow: bool, use) -> Iterator[str]:
    """The log lines of a job whose supervisor runs here (its record names the log
    folder), following them until the job ends or its supervisor is gone; a task name
    that names none of the record's replicas is a UsageError ending "use
    {use(labels)}"."""
    record = jobs.load(job_id)
    labels = [r.label for r in record.replicas]
    if task_name is not None and not logs.names_a_task(task_name, labels):
        raise UsageError(f"--task-name {task_name!r:.60} names no replica of job "
                         f"{job_id}; use {use(labels)}")

    def done() -> bool:
        current = jobs.load(job_id)
        return not follow or current.done or not current.supervisor_alive()

    return logs.follow(jobs.own_log_dir(record), task_name=task_name, done=done)


class LocalEngine(Runner):
    """The local runner. `ports` and `source_dir` serve `local train`: fixed ports, and
    the working tree run in place instead of a staged package."""

    name = "local"
    max_replicas_per_type = MAX_REPLICAS_PER_TYPE
    record_owner = SUPERVISOR
    supervise_here = staticmethod(supervise_here)
    preflight = staticmethod(containers.preflight)

    def __init__(self, options: EngineOptions, *, ports: list[int] | None = None,
                 source_dir: str | None = None):
        super().__init__(options)
        self.ports = ports
        self.source_dir = source_dir

    def check(self, spec: JobSpec) -> None:
        super().check(spec)
        if containers.uses_containers(spec):
            containers.check(spec)
        entry.check(spec)
        if spec.gpus_needed:
            check_gpus(spec, local_gpu_count())

    def render(self, spec: JobSpec, package: Package | None) -> Rendered:
        plan = plans.build(spec, package, home=mljob_home(), ports=self.ports,
                           source_dir=self.source_dir,
                           gpus_available=local_gpu_count() if spec.gpus_needed else 0)
        if containers.uses_containers(spec):
            plan = containers.containerize(plan, spec, containers.engine_for_render(
                self.options.container_engine))
        record = dict(  # the record as the plan has it (its job dir, args and mode)
            job_dir=plan.job_dir, scale_tier=plan.scale_tier, package_url=plan.package_url,
            package_sha256=plan.package_sha256, module=plan.module,
            trainer_args=list(plan.trainer_args), training_input=dict(plan.training_input),
            log_dir=plan.log_dir, mode=plan.mode, labels=dict(plan.labels),
            replicas=[jobs.ReplicaRecord(r.label) for r in plan.replicas])
        return Rendered(body=plan.to_dict(), text=plan.to_json(),
                        handle={"job_id": plan.job_id}, record=record)

    def render_prediction(self, spec: PredictionSpec) -> Rendered:
        """The shard plan, everything checked (the job id, model, inputs and output)."""
        from submit.prediction.plan import build_plan
        plan = build_plan(spec, resume=spec.resume)
        text = plan.to_json()
        return Rendered(body=json.loads(text), text=text, handle={"job_id": plan.job_id},
                        record={**spec.record(), "log_dir": plan.log_dir})

    def create(self, rendered: Rendered) -> Mapping[str, Any]:
        """Start `python -m submit _supervise` in its own session; it runs the job and
        owns its record (saved before: it reads it)."""
        if rendered.prediction:
            pplan = _prediction_plan(rendered)
            pid = entry.detach("prediction", pplan.job_id, pplan.run_dir, pplan.job_file)
            return {"job_id": pplan.job_id, "supervisor_pid": pid}
        plan = JobPlan.from_dict(rendered.body)
        os.makedirs(plan.run_dir, exist_ok=True)
        plan_file = os.path.join(plan.run_dir, "plan.json")
        storage.write_bytes(plan_file, rendered.text.encode())
        pid = entry.detach("job", plan.job_id, plan.run_dir, plan_file)
        return {"job_id": plan.job_id, "supervisor_pid": pid}

    def status(self, handle: Mapping[str, Any]) -> EngineStatus:
        record = jobs.load(handle["job_id"])
        return EngineStatus(record.state, record.error_message, tuple(
            ReplicaStatus(r.label, r.state, r.exit_code, r.restarts)
            for r in record.replicas))

    def logs(self, handle: Mapping[str, Any], *, task_name: str | None = None,
             follow: bool = True) -> Iterator[str]:
        return recorded_logs(handle["job_id"], task_name, follow, lambda labels: (
            f"one of {', '.join(labels) or contracts.LABEL_HINT}, or {logs.SERVICE} "
            "for the supervisor's events"))

    def cancel(self, handle: Mapping[str, Any]) -> str:
        return entry.cancel(handle["job_id"])
