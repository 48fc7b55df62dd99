"""`jobs submit prediction`'s flags, checked into a `PredictionSpec` (Cloud ML's
`PredictionInput`).

gcloud's flags and defaults: exactly one of `--model-dir` (an export's URL) or `--model`
(with an optional `--version`); `--input-paths` globs, comma-separated; `--output-path`;
`--data-format` text, tf-record or tf-record-gzip; `--region` (required, as gcloud
requires it); `--max-worker-count` (Cloud ML's default 10); `--batch-size` (64);
`--signature-name`; `--labels`; `--runtime-version`.

`--model M` names a model of `python -m submit models` (its base path of numbered
versions); `--version V` picks one, the model's default version by default (the highest
published one when it has none). On Vertex,
`--model` is the Model resource (`projects/P/locations/R/models/M`, or its id).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

from submit.jobdef import spec as specs
from submit.errors import UsageError
from mljob.errors import ascii_digits

DATA_FORMATS = {"text": "TEXT", "tf-record": "TF_RECORD", "tf-record-gzip": "TF_RECORD_GZIP"}
DEFAULT_WORKERS = 10            # gcloud: "Defaults to 10 if not specified"
MAX_WORKERS = 1000
MAX_BATCH_SIZE = 4096
NAME = r"[A-Za-z][A-Za-z0-9_]{0,127}"  # Cloud ML's model and version names
MODE = "prediction"             # a batch prediction job's record mode


@dataclasses.dataclass(frozen=True)
class PredictionSpec:
    job_id: str
    input_paths: tuple[str, ...]
    output_path: str
    data_format: str
    region: str
    model_dir: str | None = None
    model: str | None = None
    version: str | None = None
    max_worker_count: int = DEFAULT_WORKERS
    batch_size: int = 64
    signature_name: str | None = None
    runtime_version: str | None = None
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    resume: bool = False        # --resume: continue this job (the local runner's)

    def record(self) -> dict[str, Any]:
        """The job record's fields a runner's render gives a batch prediction job."""
        return {"mode": MODE, "prediction_input": self.prediction_input(),
                "prediction_output": {"outputPath": self.output_path}}

    def prediction_input(self) -> dict[str, Any]:
        """Cloud ML's PredictionInput, as `jobs describe` shows it."""
        data: dict[str, Any] = {
            "dataFormat": DATA_FORMATS[self.data_format],
            "inputPaths": list(self.input_paths), "outputPath": self.output_path,
            "region": self.region, "maxWorkerCount": str(self.max_worker_count),
            "batchSize": str(self.batch_size)}
        if self.model_dir:
            data["uri"] = self.model_dir
        if self.model:
            data["modelName"] = self.model
        if self.version:
            data["versionName"] = self.version
        if self.signature_name:
            data["signatureName"] = self.signature_name
        if self.runtime_version:
            data["runtimeVersion"] = self.runtime_version
        return data


def resolve(job_id: str, *, model_dir=None, model=None, version=None, input_paths=None,
            output_path=None, data_format=None, region=None, max_worker_count=None,
            batch_size=None, signature_name=None, runtime_version=None,
            labels=None, resume=False) -> PredictionSpec:
    """The flags, checked; the first mistake is a one-line UsageError naming the flag."""
    specs.check_job_id(job_id)
    if bool(model_dir) == bool(model):
        raise UsageError("give exactly one of --model-dir (an export's URL) or --model "
                         "(a model name, with --version)")
    if version is not None and not model:
        raise UsageError("--version goes with --model; with --model-dir the export is "
                         "the version")
    for flag, value in (("--model", model), ("--version", version)):
        if value is not None:
            specs.check_text(value, flag)
            if not re.fullmatch(NAME, value) and not (flag == "--model" and "/" in value) \
                    and not (flag == "--version" and ascii_digits(value)):
                raise UsageError(f"{flag} {value!r:.60} is not a model or version name; "
                                 "use letters, digits and underscores, starting with a "
                                 "letter")
    if not input_paths:
        raise UsageError("--input-paths is required: the input files, as a glob or "
                         "comma-separated globs")
    specs.check_text(input_paths, "--input-paths")
    paths = tuple(specs._normalise_url(p.strip(), "--input-paths")
                  for p in input_paths.split(",") if p.strip())
    if not paths:
        raise UsageError(f"--input-paths {input_paths!r:.60} names no file; give a glob "
                         "or comma-separated globs")
    if not output_path:
        raise UsageError("--output-path is required: the folder for prediction.results-* "
                         "and prediction.errors_stats-*")
    output = specs._normalise_url(output_path, "--output-path")
    if not data_format:
        raise UsageError(f"--data-format is required: one of {', '.join(DATA_FORMATS)}")
    if data_format not in DATA_FORMATS:
        raise UsageError(f"--data-format {data_format!r:.40} is not one of "
                         f"{', '.join(DATA_FORMATS)}")
    if not region:
        raise UsageError("--region is required (as gcloud requires it), e.g. "
                         "--region us-central1")
    specs.check_text(region, "--region")
    if not specs.VERSIONS["region"].fullmatch(region):
        raise UsageError(f"--region {region!r:.40} is not a region; e.g. us-central1")
    if runtime_version is not None and not specs.VERSIONS["runtimeVersion"].fullmatch(
            runtime_version):
        raise UsageError(f"--runtime-version {runtime_version!r:.40} is not a runtime "
                         "version; e.g. 2.11")
    workers = DEFAULT_WORKERS if max_worker_count is None else max_worker_count
    if not 1 <= workers <= MAX_WORKERS:
        raise UsageError(f"--max-worker-count {workers} is out of range; give 1 to "
                         f"{MAX_WORKERS}")
    size = 64 if batch_size is None else batch_size
    if not 1 <= size <= MAX_BATCH_SIZE:
        raise UsageError(f"--batch-size {size} is out of range; give 1 to {MAX_BATCH_SIZE}")
    if signature_name is not None:
        specs.check_text(signature_name, "--signature-name")
        if not signature_name.strip():
            raise UsageError("--signature-name is empty; name a signature of the export "
                             "or leave it out (serving_default)")
    model_dir_url = specs._normalise_url(model_dir, "--model-dir") if model_dir else None
    return PredictionSpec(
        job_id=job_id, input_paths=paths, output_path=output, data_format=data_format,
        region=region, model_dir=model_dir_url, model=model, version=version,
        max_worker_count=workers, batch_size=size, signature_name=signature_name,
        runtime_version=runtime_version, labels=specs.parse_labels_flag(labels),
        resume=bool(resume))


def local_model_dir(spec: PredictionSpec) -> str:
    """The export a local job predicts with: --model-dir, or a version of --model, a
    model of `python -m submit models` (--version, else its default version, else its
    highest published one)."""
    if spec.model_dir:
        return spec.model_dir
    assert spec.model is not None  # resolve() requires one of them
    if "/" in spec.model:
        raise UsageError(f"--model {spec.model!r:.60} is a Vertex resource name; the local "
                         "runner takes a model name, or pass --runner vertex")
    from submit import models
    base, data = models.record(spec.model)
    folders = models.published(base)
    name = spec.version or data.get("defaultVersion")
    if name is None:
        if not folders:
            raise UsageError(f"model {spec.model!r} has no versions yet; create one with "
                             f"`python -m submit versions create v1 --model {spec.model} "
                             "--origin EXPORT`, or pass --model-dir")
        return folders[max(folders)]
    number = models.find_version(base, data, name, spec.model)["number"]
    if number not in folders:
        raise UsageError(f"version {name!r} of model {spec.model!r} is not published in "
                         f"{base}; create it again, or pass --model-dir")
    return folders[number]
