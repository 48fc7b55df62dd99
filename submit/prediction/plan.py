"""A batch prediction job's plan: the job id, model, inputs and output path checked, and
the input cut into shards (`predict.offline.shards`), before anything is recorded or written.
`--resume` keeps the shards of the job's earlier run, so a published shard keeps its
name."""
from __future__ import annotations

import os

from mljob import contracts, storage
from submit import jobs
from submit.prediction import spec as prediction_spec
from submit.errors import JobNotFoundError, UsageError
from submit.home import mljob_home
from submit.prediction.job import PredictionPlan
from submit.prediction.output import check_output, read_marker


def build_plan(spec: prediction_spec.PredictionSpec, *, resume: bool) -> PredictionPlan:
    """Everything checked (the job id, model, inputs and output) and the shards planned;
    --resume keeps the shards of the job's earlier run."""
    from predict.offline import batch, shards
    from predict.errors import PredictError
    home = mljob_home()
    for flag, url in [("--input-paths", p) for p in spec.input_paths] + [
            ("--output-path", spec.output_path), ("--model-dir", spec.model_dir or "")]:
        if url.startswith("memory://"):
            raise UsageError(f"{flag} {url}: a memory:// store lives in one process and "
                             "the job's workers are processes of their own; use a path "
                             "or gs:// URL")
    _check_job_id(spec, resume)
    model_dir = prediction_spec.local_model_dir(spec)
    run_dir = os.path.join(home, "runs", spec.job_id)
    try:
        _check_model(model_dir)
        check_output(spec.output_path, spec.job_id, resume)
        earlier = _earlier_plan(run_dir, spec) if resume else None
        if earlier is not None:
            planned = earlier.shards
        else:
            if resume and read_marker(spec.output_path) is not None:
                raise UsageError(f"cannot resume job {spec.job_id}: its shard plan in "
                                 f"{run_dir} is gone; choose a new --output-path")
            files = batch.expand_inputs(",".join(spec.input_paths))
            planned = [s.to_dict() for s in shards.plan(files, spec.data_format,
                                                        parts=spec.max_worker_count)]
    except PredictError as exc:
        raise UsageError(str(exc)) from None
    return PredictionPlan(
        job_id=spec.job_id, model_dir=model_dir, output_path=spec.output_path,
        data_format=spec.data_format, shards=planned, workers=spec.max_worker_count,
        batch_size=spec.batch_size, signature_name=spec.signature_name, run_dir=run_dir,
        log_dir=os.path.join(run_dir, "logs"), prediction_input=spec.prediction_input())


def _check_job_id(spec: prediction_spec.PredictionSpec, resume: bool) -> None:
    try:
        old = jobs.load(spec.job_id)
    except JobNotFoundError:
        return
    old.refuse_if_running()
    earlier_output = old.prediction_input.get("outputPath")
    if not resume or earlier_output != spec.output_path:
        again = (f", or pass --resume with --output-path {earlier_output} to finish it"
                 if earlier_output and old.state != jobs.SUCCEEDED else "")
        raise UsageError(f"job id {spec.job_id!r} already exists ({old.state}); pick "
                         f"another job id{again}")
    earlier_inputs = old.prediction_input.get("inputPaths")
    if isinstance(earlier_inputs, list) and earlier_inputs != list(spec.input_paths):
        # its shards were planned over those files: others would be silently ignored
        raise UsageError(f"--resume finishes job {spec.job_id} over the --input-paths it "
                         f"recorded, {','.join(map(str, earlier_inputs))[:300]}; give "
                         "those, or pick a new job id for other inputs")


def _check_model(model_dir: str) -> None:
    names = (contracts.SAVED_MODEL_MARKER, contracts.LEGACY_EXPORT_MARKER)
    if not any(storage.exists(storage.join(model_dir, n)) for n in names):
        raise UsageError(f"--model-dir {model_dir} holds no export ({' or '.join(names)} "
                         "missing); pass the export folder, <job-dir>/model")


def _earlier_plan(run_dir: str, spec) -> PredictionPlan | None:
    try:
        with open(os.path.join(run_dir, "prediction.json"), "rb") as f:
            earlier = PredictionPlan.from_json(f.read())
    except (OSError, ValueError, TypeError):
        return None
    return earlier if earlier.output_path == spec.output_path else None
