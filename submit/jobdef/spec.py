"""JobSpec: what the user asked for, from flags and config.yaml, checked and resolved.

config.yaml (or JSON) is shaped like Cloud ML's Job resource: a mapping with
`trainingInput` (and optionally `labels`, `jobId`). The hardened reader
(`submit.jobdef.config_reader`) reads it, the schema (`submit.jobdef.config_schema`) types it, and
`resolve` puts the flags (one frozen `Flags`) over it and resolves everything a runner
needs: every replica group's machine, GPUs and accelerator, restarts and container, the
tuning spec parsed once, the region and the deadlines. Renderers and the tuner read the
JobSpec's fields, never the raw trainingInput. Mistakes raise `ConfigError` /
`UsageError` naming the key or flag and the fix, before anything is built or staged.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mljob import machines
from mljob.contracts import CHIEF, EVALUATOR, MASTER, PS, WORKER  # noqa: F401
from submit.jobdef import config_reader, containers, engine_keys, spellings, tuning_spec
from submit.jobdef.vocabulary import MAX_RESTARTS, RESTART_POLICIES
from submit.jobdef.config_reader import MAX_CONFIG_BYTES as MAX_CONFIG_BYTES
from submit.jobdef.config_reader import MAX_CONFIG_DEPTH as MAX_CONFIG_DEPTH
from submit.errors import ConfigError, UsageError
from submit.jobdef.spec_checks import (
    DEFAULT_MAX_RESTARTS as DEFAULT_MAX_RESTARTS, MAX_LABELS as MAX_LABELS,
    TYPE_FLAG_NAMES, apply_type_flags, check_bucket as check_bucket,
    check_labels as check_labels, check_text as check_text, default_max_restarts,
    default_use_chief, local_gpu_count as local_gpu_count, merge_labels,
    normalise_url, parse_duration, parse_labels_flag as parse_labels_flag, strings)

# Each runner owns its own limit (the local runner's is 64 per type); this one only
# catches a count that cannot be meant, such as a pasted timestamp.
MAX_REPLICAS_PER_TYPE = 10_000
JOB_ID = spellings.JOB_ID
MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")  # fullmatch
VERSIONS = {"region": re.compile(r"[a-z]+(-[a-z]+)+[0-9]{1,2}"),
            "runtimeVersion": re.compile(r"[0-9]+\.[0-9]+"),
            "pythonVersion": re.compile(r"[0-9]\.[0-9]+")}
_normalise_url = normalise_url   # prediction_spec and the models commands check URLs too
check_job_id = spellings.check_job_id

if TYPE_CHECKING:
    from submit.jobdef.config_schema import JobConfig


def __getattr__(name: str) -> Any:
    """TRAINING_INPUT_KEYS: the schema's trainingInput keys, read (with pydantic) only
    when asked for."""
    if name == "TRAINING_INPUT_KEYS":
        from submit.jobdef import config_schema
        return config_schema.keys(config_schema.TrainingInput)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclasses.dataclass(frozen=True)
class ScaleTier:
    """A predefined cluster shape: counts of masters, workers and ps, and master GPUs."""

    name: str
    workers: int = 0
    parameter_servers: int = 0
    master_gpus: int = 0


SCALE_TIERS = {t.name: t for t in (
    ScaleTier("BASIC"),
    ScaleTier("STANDARD_1", workers=4, parameter_servers=3),
    ScaleTier("PREMIUM_1", workers=19, parameter_servers=11),
    ScaleTier("BASIC_GPU", master_gpus=1),
    ScaleTier("CUSTOM"),
)}

# Cloud ML's tiers that cannot run anywhere mljob runs (--scale-tier says why)
REFUSED_TIERS = {"BASIC_TPU": "Cloud TPUs are not available to mljob's runners; use "
                              "basic-gpu, or custom with acceleratorConfig"}

# Cloud ML's legacy machine names (and Compute Engine's n1 types): mljob/machines.py.
MACHINE_TYPES = machines.LEGACY_NAMES


# (task type, count key, machine type key, replica config key)
GROUP_KEYS = ((WORKER, "workerCount", "workerType", "workerConfig"),
              (PS, "parameterServerCount", "parameterServerType", "parameterServerConfig"),
              (EVALUATOR, "evaluatorCount", "evaluatorType", "evaluatorConfig"))
CONFIG_KEYS = {CHIEF: "masterConfig", **{t: cfg for t, _, _, cfg in GROUP_KEYS}}


@dataclasses.dataclass(frozen=True)
class ReplicaGroup:
    """Replicas of one task type: `chief` (one), `worker`, `ps` or `evaluator`.

    `gpus` is what each replica gets (the machine's own, or acceleratorConfig.count);
    `accelerator_type` and `accelerator_count` are acceleratorConfig's as written (None
    and 0 when the config names none: the machine's own accelerator, if any)."""

    task_type: str
    count: int
    machine_type: str
    gpus: int = 0
    restart_policy: str = "Never"   # Never, OnFailure, ExitCode, Always
    max_restarts: int = 0
    # a custom container (Cloud ML's ReplicaConfig.imageUri): the image, its entrypoint
    # (containerCommand; empty: the image's own) and its args (None: the trainer args)
    image_uri: str | None = None
    container_command: tuple[str, ...] = ()
    container_args: tuple[str, ...] | None = None
    accelerator_type: str | None = None
    accelerator_count: int = 0


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """The resolved job: the cluster's replica groups and where everything goes.

    `args` are the user's trainer arguments; `trainer_args` adds `--job-dir` as Cloud ML
    does. `training_input` is the resolved trainingInput that replicas see as TF_CONFIG's
    `job` and the job record keeps (runners read the fields, not it). `use_chief` names
    the chief `chief` in TF_CONFIG (else the legacy `master`). `labels` are the job's
    labels (config.yaml's, then --labels over them). `tuning` is the checked
    hyperparameters spec of a tuning job, else None.
    """

    job_id: str
    scale_tier: str
    groups: tuple[ReplicaGroup, ...]
    job_dir: str | None
    staging_bucket: str | None
    package_path: str | None
    package_uri: str | None
    module_name: str
    args: tuple[str, ...]
    use_chief: bool
    training_input: Mapping[str, Any]
    restart_policy: str = "Never"
    max_restarts: int = 0
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    max_running_time: float | None = None   # seconds: scheduling.maxRunningTime
    max_wait_time: float | None = None      # seconds: scheduling.maxWaitTime
    # archives installed with the package: --packages paths or URLs, packageUris after
    # the first
    extra_packages: tuple[str, ...] = ()
    region: str | None = None               # --region, else trainingInput.region
    tuning: tuning_spec.TuningSpec | None = None
    engine: engine_keys.EngineKeys = engine_keys.EngineKeys()  # the engines' own keys

    def count(self, task_type: str) -> int:
        return sum(g.count for g in self.groups if g.task_type == task_type)

    def group(self, task_type: str) -> ReplicaGroup | None:
        return next((g for g in self.groups if g.task_type == task_type), None)

    @property
    def custom_containers(self) -> bool:
        """Every replica runs its own image (no package is built or installed)."""
        return all(g.image_uri for g in self.groups)

    @property
    def gpus_needed(self) -> int:
        return max((g.gpus for g in self.groups), default=0)

    @property
    def trainer_args(self) -> tuple[str, ...]:
        return self.args + (("--job-dir", self.job_dir) if self.job_dir else ())


@dataclasses.dataclass(frozen=True)
class Flags:
    """The command line of a submission, None where a flag was not given.

    `labels` are --labels' values (each KEY=VALUE,...); `packages` the --packages
    archives; gcloud's per-type flags (--master-machine-type, --worker-accelerator,
    --master-image-uri, --use-chief-in-tf-config, ...) go into trainingInput as their
    keys. `staged=False` is `local train`: the working tree runs, nothing is staged."""

    job_id: str
    scale_tier: str | None = None
    worker_count: int | None = None
    parameter_server_count: int | None = None
    evaluator_count: int | None = None
    job_dir: str | None = None
    staging_bucket: str | None = None
    package_path: str | None = None
    module_name: str | None = None
    args: tuple[str, ...] | None = None
    restart_policy: str | None = None
    max_restarts: int | None = None
    labels: tuple[str, ...] | Mapping[str, str] | None = None
    master_machine_type: str | None = None
    worker_machine_type: str | None = None
    parameter_server_machine_type: str | None = None
    master_accelerator: str | None = None
    worker_accelerator: str | None = None
    parameter_server_accelerator: str | None = None
    use_chief_in_tf_config: bool | None = None
    master_image_uri: str | None = None
    worker_image_uri: str | None = None
    parameter_server_image_uri: str | None = None
    packages: tuple[str, ...] | None = None
    region: str | None = None
    runtime_version: str | None = None
    python_version: str | None = None
    staged: bool = True

    def counts(self) -> dict[str, int]:
        """The replica counts the flags give, by trainingInput key."""
        return {k: v for k, v in (("workerCount", self.worker_count),
                                  ("parameterServerCount", self.parameter_server_count),
                                  ("evaluatorCount", self.evaluator_count))
                if v is not None}


def read_config(path: str) -> JobConfig:
    """config.yaml or JSON, read by the hardened reader and typed by the schema."""
    return parse_config(config_reader.read_document(path), f"--config {path}")


def parse_config(document: Mapping[str, Any], where: str = "config") -> JobConfig:
    """A Job document (a mapping) as the schema types it, or one-line ConfigError."""
    ti = document.get("trainingInput", {})
    if not isinstance(ti, dict):
        raise ConfigError(f"{where}: trainingInput must be a mapping, not "
                          f"{type(ti).__name__}")
    for at, text in strings(ti, "trainingInput"):
        check_text(text, at, ConfigError)
    from submit.jobdef import config_schema  # pydantic: only where a config is read
    config = config_schema.validate(config_schema.JobConfig, document, where)
    if config.job_id is not None:
        check_job_id(config.job_id)
    return config


def training_config(training_input: Mapping[str, Any],
                    labels: Mapping[str, Any] | None = None) -> JobConfig:
    """A config of this trainingInput (and labels), checked as a file's would be."""
    document: dict[str, Any] = {"trainingInput": dict(training_input)}
    if labels is not None:
        document["labels"] = dict(labels)
    return parse_config(document)


def load_config(path: str) -> dict:
    """The config's trainingInput, checked, as a mapping (int64 strings as numbers)."""
    return read_config(path).training_input.to_dict()


def load_labels(path: str) -> dict[str, str]:
    """The config's top-level `labels` (Cloud ML's Job.labels), checked."""
    return config_labels(read_config(path))


def config_labels(config: JobConfig) -> dict[str, str]:
    return {} if config.labels is None else check_labels(config.labels, "labels in --config")


def check_gpus(spec: JobSpec, available: int) -> None:
    needed = spec.gpus_needed
    if needed > available:
        raise UsageError(f"scale tier {spec.scale_tier} needs {needed} GPU(s) per replica "
                         f"and this machine has {available}; use --scale-tier BASIC or "
                         "CUSTOM without acceleratorConfig")


def resolve(flags: Flags, config: JobConfig | None = None) -> JobSpec:
    """The flags over the config, checked and resolved.

    Restarts: --restart-policy/--max-restarts, when given, apply to every replica type;
    otherwise each type's `<type>Config.restartPolicy/maxRestarts` (default Never; a
    policy other than Never allows DEFAULT_MAX_RESTARTS when no maximum is given).
    `--labels` go over the config's labels. `--packages` are sdists or wheels, paths or
    URLs, installed with the package; given alone (no --package-path), the first is the
    job's package. --region, --runtime-version and --python-version are recorded in
    trainingInput (the local runner runs on this machine's TensorFlow and Python).
    """
    if config is None:
        from submit.jobdef.config_schema import JobConfig
        config = JobConfig()
    check_job_id(flags.job_id)
    if flags.package_path is not None:
        check_text(flags.package_path, "--package-path")
    ti = config.training_input.to_dict()
    ti.update(flags.counts())
    containers.apply_flags(ti, master_image_uri=flags.master_image_uri,
                           worker_image_uri=flags.worker_image_uri,
                           parameter_server_image_uri=flags.parameter_server_image_uri)
    for key in CONFIG_KEYS.values():
        if key in ti:
            containers.check_config(ti[key], key)
    type_keys = apply_type_flags(
        ti, master_machine_type=flags.master_machine_type,
        worker_machine_type=flags.worker_machine_type,
        parameter_server_machine_type=flags.parameter_server_machine_type,
        master_accelerator=flags.master_accelerator,
        worker_accelerator=flags.worker_accelerator,
        parameter_server_accelerator=flags.parameter_server_accelerator,
        use_chief_in_tf_config=flags.use_chief_in_tf_config)
    tier_name = spellings.enum_value(flags.scale_tier or ti.get("scaleTier") or "BASIC",
                                     SCALE_TIERS, "scale tier", REFUSED_TIERS)
    ti["scaleTier"] = tier_name
    if flags.job_dir is not None:
        ti["jobDir"] = flags.job_dir
    job_dir = normalise_url(ti.get("jobDir"), "--job-dir")
    if job_dir:
        ti["jobDir"] = job_dir
    hp = config.training_input.hyperparameters   # Cloud ML's HyperparameterSpec
    tuning = None if hp is None else tuning_spec.parse(hp, job_dir=job_dir)
    staging_bucket = normalise_url(flags.staging_bucket, "--staging-bucket")
    module = _module(ti, flags)
    user_args = _trainer_args(ti, flags)
    _versions(ti, flags)
    package_uri, extras = _packages(ti, flags, job_dir, staging_bucket)
    restart_policy, max_restarts = flags.restart_policy, flags.max_restarts
    if restart_policy is not None:  # Never, OnFailure, on-failure, ON_FAILURE, ...
        restart_policy = spellings.enum_value(restart_policy, RESTART_POLICIES,
                                              "--restart-policy")
    if max_restarts is not None and (isinstance(max_restarts, bool) or
                                     not 0 <= max_restarts <= MAX_RESTARTS):
        raise UsageError(f"--max-restarts {max_restarts} is out of range; use 0 to "
                         f"{MAX_RESTARTS}")
    from_flags = set(flags.counts()) | type_keys
    groups = containers.with_images(tuple(
        _with_restarts(g, ti, restart_policy, max_restarts)
        for g in _groups(SCALE_TIERS[tier_name], ti, from_flags)), ti, CONFIG_KEYS)
    restart_policy = restart_policy or "Never"
    use_chief = default_use_chief(ti)
    ti["useChiefInTfConfig"] = use_chief
    scheduling = ti.get("scheduling") or {}
    running, waiting = (parse_duration(scheduling[key], f"trainingInput.scheduling.{key}")
                        if key in scheduling else None
                        for key in ("maxRunningTime", "maxWaitTime"))
    engine = engine_keys.resolve(ti, parse_duration)  # the cluster engines' keys
    return JobSpec(job_id=flags.job_id, scale_tier=tier_name, groups=groups,
                   job_dir=job_dir, staging_bucket=staging_bucket,
                   package_path=flags.package_path, package_uri=package_uri,
                   module_name=module, args=user_args, use_chief=use_chief,
                   training_input=ti, restart_policy=restart_policy,
                   max_restarts=default_max_restarts(restart_policy, max_restarts),
                   labels=merge_labels(config_labels(config),
                                       parse_labels_flag(flags.labels)),
                   max_running_time=running, max_wait_time=waiting, extra_packages=extras,
                   region=ti.get("region"), tuning=tuning, engine=engine)


def _module(ti: dict, flags: Flags) -> str:
    if flags.module_name is not None:
        ti["pythonModule"] = flags.module_name
    module = ti.setdefault("pythonModule", "trainer.task")
    if not isinstance(module, str) or not MODULE.fullmatch(module):
        raise UsageError(f"--module-name {module!r} is not a Python module name; "
                         "write it like trainer.task")
    return module


def _trainer_args(ti: dict, flags: Flags) -> tuple[str, ...]:
    if flags.args is not None:
        ti["args"] = list(flags.args)
    user_args = tuple(ti.get("args", ()))
    for i, arg in enumerate(user_args):
        check_text(arg, f"trainer argument {i + 1}")
    if any(a == "--job-dir" or a.startswith("--job-dir=") for a in user_args):
        raise UsageError("--job-dir is among the trainer arguments; give it to submit "
                         "(before `--`), which passes it on to the trainer")
    return user_args


def _versions(ti: dict, flags: Flags) -> None:
    for flag, key, value, what, example in (
            ("--region", "region", flags.region, "Google Cloud region", "us-central1"),
            ("--runtime-version", "runtimeVersion", flags.runtime_version,
             "runtime version", "MAJOR.MINOR, e.g. 2.11 or 1.15"),
            ("--python-version", "pythonVersion", flags.python_version, "Python version",
             "3.7")):
        if value is not None:
            ti[key] = value
        if key in ti and not VERSIONS[key].fullmatch(ti[key]):
            name = flag if value is not None else f"trainingInput.{key}"
            raise UsageError(f"{name} {ti[key]!r:.60} is not a {what}; write {example}")


def _packages(ti: dict, flags: Flags, job_dir: str | None,
              staging_bucket: str | None) -> tuple[str | None, tuple[str, ...]]:
    """(the staged package's URL, the other archives), checked."""
    package_uri: str | None = None
    extras: tuple[str, ...] = ()
    package_path, packages = flags.package_path, flags.packages
    if containers.master_image(ti) and (package_path is not None or packages is not None
                                        or ti.get("packageUris")):
        raise UsageError("a custom container (--master-image-uri, imageUri) runs its own "
                         "code: give it or a package (--package-path, --packages, "
                         "packageUris), not both")
    if packages is not None:
        extras = tuple(_archive(p, "--packages") for p in packages)
    elif ti.get("packageUris"):
        if package_path is not None:
            raise ConfigError("trainingInput.packageUris: give staged packages (.tar.gz or "
                              ".whl URLs), or --package-path, not both")
        uris = [_archive(u, "trainingInput.packageUris") for u in ti["packageUris"]]
        package_uri, extras = uris[0], tuple(uris[1:])
    local_archives = package_path is not None or any("://" not in e for e in extras) or \
        (package_uri is None and not extras and not containers.master_image(ti))
    if flags.staged and local_archives and not job_dir and not staging_bucket:
        raise UsageError("If local packages are provided, the --staging-bucket or "
                         "--job-dir flag must be given.")
    return package_uri, extras


def _archive(path: str, flag: str) -> str:
    """A package archive: an sdist (.tar.gz) or a wheel (.whl), as a path or URL."""
    if not isinstance(path, str) or not path.endswith((".tar.gz", ".whl")):
        raise UsageError(f"{flag} {path!r:.80} is not an sdist or a wheel; give "
                         "NAME-VERSION.tar.gz or .whl files")
    return normalise_url(path, flag)


def _with_restarts(group: ReplicaGroup, ti: dict, policy, most) -> ReplicaGroup:
    """The group with its restart policy: the flags', else its type's config's."""
    key = CONFIG_KEYS[group.task_type]
    config = ti.get(key) or {}
    policy = policy or config.get("restartPolicy", "Never")
    return dataclasses.replace(group, restart_policy=policy, max_restarts=default_max_restarts(
        policy, most if most is not None else config.get("maxRestarts")))



def _groups(tier: ScaleTier, ti: dict, from_flags=frozenset()) -> tuple[ReplicaGroup, ...]:
    """The replica groups; a mistake names the flag when a flag gave the value, else the
    config key (never a flag the user did not write)."""
    custom = tier.name == "CUSTOM"
    if not custom:
        # A fixed tier fixes counts, machines and GPUs; restart settings are free.
        given = [k for _, c, t, cfg in GROUP_KEYS for k in (c, t, cfg) if k in ti
                 and (k != cfg or "acceleratorConfig" in (ti[k] or {}))]
        given += [k for k in ("masterType", "masterConfig") if k in ti
                  and (k != "masterConfig" or "acceleratorConfig" in (ti[k] or {}))]
        if given:
            flags = {"workerCount": "--worker-count", "parameterServerCount":
                     "--parameter-server-count", "evaluatorCount": "--evaluator-count",
                     **TYPE_FLAG_NAMES}
            name = (flags[given[0]] if given[0] in from_flags
                    else f"trainingInput.{given[0]}")
            raise UsageError(f"{name} needs --scale-tier CUSTOM (scale tier {tier.name} "
                             "fixes the cluster's shape); use CUSTOM or drop it")
        groups = [ReplicaGroup(CHIEF, 1, "standard_gpu" if tier.master_gpus else "standard",
                               tier.master_gpus)]
        for task_type, count in ((WORKER, tier.workers), (PS, tier.parameter_servers)):
            if count:
                groups.append(ReplicaGroup(task_type, count, "standard"))
        return tuple(groups)
    if "masterType" not in ti:
        raise UsageError("scale tier CUSTOM needs the master's machine type; pass "
                         "--master-machine-type (e.g. n1-standard-4 or standard) or set "
                         "trainingInput.masterType in --config")
    master_type = _machine(ti["masterType"], "masterType")
    groups = [ReplicaGroup(CHIEF, 1, master_type, **_accelerator(ti, "masterConfig",
                                                                 master_type))]
    for task_type, count_key, type_key, config_key in GROUP_KEYS:
        count = ti.get(count_key, 0)
        flag = ("--" + re.sub(r"([A-Z])", r"-\1", count_key).lower()
                if count_key in from_flags else f"trainingInput.{count_key}")
        if isinstance(count, bool) or not isinstance(count, int):
            raise UsageError(f"{count_key} must be an integer, not {count!r}")
        if count < 0:
            raise UsageError(f"{flag} {count} is negative; use 0 to {MAX_REPLICAS_PER_TYPE}")
        if count > MAX_REPLICAS_PER_TYPE:
            raise UsageError(f"{flag} {count} is more than {MAX_REPLICAS_PER_TYPE} "
                             "replicas per type; use fewer")
        if count:
            machine = _machine(ti.get(type_key, master_type), type_key)
            groups.append(ReplicaGroup(task_type, count, machine,
                                       **_accelerator(ti, config_key, machine)))
    counts = {g.task_type: g.count for g in groups}
    if counts.get(PS) and not counts.get(WORKER):
        raise UsageError("parameterServerCount needs workerCount of 1 or more: parameter "
                         "servers hold variables for workers to train; add workers")
    return tuple(groups)


def _machine(name: str, key: str) -> str:
    if machines.is_known(name):
        return name
    raise UsageError(f"unknown {key} {name!r}; use one of {', '.join(MACHINE_TYPES)} or "
                     "a Compute Engine type like n1-standard-4")


def _accelerator(ti: dict, config_key: str, machine: str) -> dict[str, Any]:
    """A group's GPUs per replica, and its acceleratorConfig as written."""
    accel = (ti.get(config_key) or {}).get("acceleratorConfig") or {}
    count = accel.get("count", 0)
    return {"gpus": machines.gpus(machine, count), "accelerator_count": count,
            "accelerator_type": accel.get("type")}
