"""JobSpec: what the user asked for, from flags and config.yaml, checked and resolved.

config.yaml (or JSON) is shaped like Cloud ML's Job resource: a mapping with
`trainingInput` (and optionally `labels`). Flags override the file. Everything is
validated here, before anything is built or staged; mistakes raise `ConfigError` /
`UsageError` naming the key and the fix.
"""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shutil
import stat
import subprocess
from typing import Any
from collections.abc import Mapping

import yaml

from mljob import machines
from mljob.errors import first_line, too_many_digits
from mljob.contracts import CHIEF, EVALUATOR, MASTER, PS, WORKER  # noqa: F401
from submit.errors import ConfigError, UsageError

MAX_CONFIG_BYTES = 1024 * 1024
MAX_CONFIG_DEPTH = 50  # a job config nests 4 deep; parsers recurse per level
# Each runner owns its own limit (the local runner's is 64 per type); this one only
# catches a count that cannot be meant, such as a pasted timestamp.
MAX_REPLICAS_PER_TYPE = 10_000
JOB_ID = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")  # whole string: fullmatch
URL_SCHEMES = ("file", "memory", "gs")
RESTART_POLICIES = ("Never", "OnFailure", "ExitCode", "Always")


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

# Cloud ML's legacy machine names (and Compute Engine's n1 types): mljob/machines.py.
MACHINE_TYPES = machines.LEGACY_NAMES

# trainingInput keys: name -> expected type(s) (bool is checked apart from int).
TRAINING_INPUT_KEYS: dict[str, tuple] = {
    "scaleTier": (str,), "masterType": (str,), "workerType": (str,),
    "parameterServerType": (str,), "evaluatorType": (str,),
    "workerCount": (int,), "parameterServerCount": (int,), "evaluatorCount": (int,),
    "masterConfig": (dict,), "workerConfig": (dict,), "parameterServerConfig": (dict,),
    "evaluatorConfig": (dict,), "args": (list,), "jobDir": (str,), "region": (str,),
    "runtimeVersion": (str,), "pythonVersion": (str,), "packageUris": (list,),
    "pythonModule": (str,), "hyperparameters": (dict,), "useChiefInTfConfig": (bool,),
}
TOP_LEVEL_KEYS = ("trainingInput", "labels", "jobId")
# Per replica type: its GPUs, and (as Kubeflow's replica specs) when it is restarted.
REPLICA_CONFIG_KEYS = ("acceleratorConfig", "restartPolicy", "maxRestarts")
MAX_RESTARTS = 100
ACCELERATOR_KEYS = ("count", "type")
# (task type, count key, machine type key, replica config key)
GROUP_KEYS = ((WORKER, "workerCount", "workerType", "workerConfig"),
              (PS, "parameterServerCount", "parameterServerType", "parameterServerConfig"),
              (EVALUATOR, "evaluatorCount", "evaluatorType", "evaluatorConfig"))


@dataclasses.dataclass(frozen=True)
class ReplicaGroup:
    """Replicas of one task type: `chief` (one), `worker`, `ps` or `evaluator`."""

    task_type: str
    count: int
    machine_type: str
    gpus: int = 0
    restart_policy: str = "Never"   # Never, OnFailure, ExitCode, Always
    max_restarts: int = 0


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """The resolved job: the cluster's replica groups and where everything goes.

    `args` are the user's trainer arguments; `trainer_args` adds `--job-dir` as Cloud ML
    does. `training_input` is the resolved trainingInput that replicas see as TF_CONFIG's
    `job`. `use_chief` names the chief `chief` in TF_CONFIG (else the legacy `master`).
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

    def count(self, task_type: str) -> int:
        return sum(g.count for g in self.groups if g.task_type == task_type)

    def group(self, task_type: str) -> ReplicaGroup | None:
        return next((g for g in self.groups if g.task_type == task_type), None)

    @property
    def gpus_needed(self) -> int:
        return max((g.gpus for g in self.groups), default=0)

    @property
    def trainer_args(self) -> tuple[str, ...]:
        return self.args + (("--job-dir", self.job_dir) if self.job_dir else ())


def load_config(path: str) -> dict:
    """Read config.yaml or JSON into its trainingInput mapping, refusing anything odd."""
    text = _read_config(path).decode("utf-8", errors="replace")
    if path.endswith(".json"):
        try:
            document = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"--config {path} is not valid JSON: "
                              f"{too_many_digits(exc) or exc}") from None
        except RecursionError:
            raise ConfigError(f"--config {path} nests values too deeply; a job config "
                              f"needs at most {MAX_CONFIG_DEPTH} levels") from None
    else:
        document = _safe_yaml(text, path)
    if not isinstance(document, dict):
        raise ConfigError(f"--config {path} must be a mapping with a 'trainingInput' key, "
                          f"not {type(document).__name__}")
    _no_unknown(document, TOP_LEVEL_KEYS, f"--config {path}")
    training_input = document.get("trainingInput", {})
    if not isinstance(training_input, dict):
        raise ConfigError(f"--config {path}: trainingInput must be a mapping, not "
                          f"{type(training_input).__name__}")
    check_training_input(training_input)
    return training_input


def _read_config(path: str) -> bytes:
    """At most MAX_CONFIG_BYTES of a regular file: a device (/dev/zero) never ends and a
    named pipe blocks until written, so only regular files are opened, and the read
    stops one byte past the limit whatever the file claims its size is."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            kind = "folder" if stat.S_ISDIR(mode) else \
                "named pipe" if stat.S_ISFIFO(mode) else "device or socket"
            raise ConfigError(f"cannot read --config {path}: it is a {kind}, not a "
                              "regular file; pass a config.yaml or JSON file")
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        reason = ("a symbolic link loop" if exc.errno == errno.ELOOP
                  else exc.strerror or first_line(exc))
        raise ConfigError(f"cannot read --config {path}: {reason}") from None
    if len(data) > MAX_CONFIG_BYTES:
        size = max(os.path.getsize(path), len(data))
        raise ConfigError(f"--config {path} is {size} bytes; the limit is "
                          f"{MAX_CONFIG_BYTES} (a job config is a few lines)")
    return data


def _safe_yaml(text: str, path: str) -> Any:
    """yaml.safe_load, after refusing aliases (a few lines of them expand to gigabytes)
    and deep nesting (the loader recurses once per level: thousands overflow the stack)."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_CONFIG_DEPTH:
                    raise ConfigError(
                        f"--config {path} line {event.start_mark.line + 1} nests values "
                        f"more than {MAX_CONFIG_DEPTH} levels deep; a job config needs 4")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
            if isinstance(event, yaml.AliasEvent):
                line = event.start_mark.line + 1
                raise ConfigError(f"--config {path} line {line} uses the YAML alias "
                                  f"*{event.anchor}; aliases are refused, write the value out")
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())  # one line
        raise ConfigError(f"--config {path} is not valid YAML{where}: {problem}") from None
    except ValueError as exc:  # yaml converts digits with int()
        if not too_many_digits(exc):
            raise
        raise ConfigError(f"--config {path} holds {too_many_digits(exc)}") from None


def check_training_input(ti: Mapping[str, Any]) -> None:
    """Unknown keys and wrong value types are errors that name the key."""
    _no_unknown(ti, TRAINING_INPUT_KEYS, "trainingInput")
    for key, value in ti.items():
        types = TRAINING_INPUT_KEYS[key]
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            raise ConfigError(f"trainingInput.{key} must be {_type_name(types)}, not "
                              f"{_type_name((type(value),))} {value!r:.60}")
    for key in ("args", "packageUris"):
        if not all(isinstance(v, str) for v in ti.get(key, [])):
            raise ConfigError(f"trainingInput.{key} must be a list of strings")
    for key in ("masterConfig", "workerConfig", "parameterServerConfig", "evaluatorConfig"):
        config = ti.get(key)
        if config is None:
            continue
        _no_unknown(config, REPLICA_CONFIG_KEYS, f"trainingInput.{key}")
        policy = config.get("restartPolicy", "Never")
        if policy not in RESTART_POLICIES:
            raise ConfigError(f"trainingInput.{key}.restartPolicy must be one of "
                              f"{', '.join(RESTART_POLICIES)}, not {policy!r:.60}")
        most = config.get("maxRestarts", 0)
        if isinstance(most, bool) or not isinstance(most, int) or not 0 <= most <= MAX_RESTARTS:
            raise ConfigError(f"trainingInput.{key}.maxRestarts must be an integer from 0 "
                              f"to {MAX_RESTARTS}, not {most!r:.60}")
        accel = config.get("acceleratorConfig", {})
        if not isinstance(accel, dict):
            raise ConfigError(f"trainingInput.{key}.acceleratorConfig must be a mapping "
                              "like {count: 1, type: NVIDIA_TESLA_T4}")
        _no_unknown(accel, ACCELERATOR_KEYS, f"trainingInput.{key}.acceleratorConfig")
        count = accel.get("count", 0)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError(f"trainingInput.{key}.acceleratorConfig.count must be a "
                              f"non-negative integer, not {count!r}")


def resolve(job_id: str, training_input: Mapping[str, Any], *, scale_tier=None,
            worker_count=None, parameter_server_count=None, evaluator_count=None,
            job_dir=None, staging_bucket=None, package_path=None, module_name=None,
            args=None, restart_policy=None, max_restarts=None,
            staged=True) -> JobSpec:
    """Merge flags (None when not given) over trainingInput and check the result.

    Restarts: --restart-policy/--max-restarts, when given, apply to every replica type;
    otherwise each type's `<type>Config.restartPolicy/maxRestarts` (default Never, 0).

    staged=False is `local train`: the working tree runs, nothing needs a staging place.
    """
    check_job_id(job_id)
    ti = dict(training_input)
    check_training_input(ti)
    if ti.get("hyperparameters"):
        raise ConfigError("trainingInput.hyperparameters: hyperparameter tuning is not run "
                          "by the local runner; remove the key and submit one job per trial")
    for flag, key, value in (("--worker-count", "workerCount", worker_count),
                             ("--parameter-server-count", "parameterServerCount",
                              parameter_server_count),
                             ("--evaluator-count", "evaluatorCount", evaluator_count)):
        if value is not None:
            ti[key] = value
    tier_name = (scale_tier or ti.get("scaleTier") or "BASIC").upper()
    if tier_name not in SCALE_TIERS:
        raise UsageError(f"unknown scale tier {tier_name!r}; use one of "
                         f"{', '.join(SCALE_TIERS)}")
    ti["scaleTier"] = tier_name
    if job_dir is not None:
        ti["jobDir"] = job_dir
    job_dir = _normalise_url(ti.get("jobDir"), "--job-dir")
    if job_dir:
        ti["jobDir"] = job_dir
    staging_bucket = _normalise_url(staging_bucket, "--staging-bucket")
    if module_name is not None:
        ti["pythonModule"] = module_name
    module = ti.setdefault("pythonModule", "trainer.task")
    if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$", module):
        raise UsageError(f"--module-name {module!r} is not a Python module name; "
                         "write it like trainer.task")
    if args is not None:
        ti["args"] = list(args)
    user_args = tuple(ti.get("args", ()))
    if any(a == "--job-dir" or a.startswith("--job-dir=") for a in user_args):
        raise UsageError("--job-dir is among the trainer arguments; give it to submit "
                         "(before `--`), which passes it on to the trainer")
    package_uri = None
    if ti.get("packageUris"):
        if len(ti["packageUris"]) != 1 or package_path is not None:
            raise ConfigError("trainingInput.packageUris: give one staged package (a .tar.gz "
                              "URL), or none and --package-path")
        package_uri = _normalise_url(ti["packageUris"][0], "trainingInput.packageUris")
    elif staged and not job_dir and not staging_bucket:
        raise UsageError("If local packages are provided, the --staging-bucket or "
                         "--job-dir flag must be given.")
    if restart_policy is not None and restart_policy not in RESTART_POLICIES:
        raise UsageError(f"unknown --restart-policy {restart_policy!r}; use one of "
                         f"{', '.join(RESTART_POLICIES)}")
    if max_restarts is not None and (isinstance(max_restarts, bool) or
                                     not 0 <= max_restarts <= MAX_RESTARTS):
        raise UsageError(f"--max-restarts {max_restarts} is out of range; use 0 to "
                         f"{MAX_RESTARTS}")
    groups = tuple(_with_restarts(g, ti, restart_policy, max_restarts)
                   for g in _groups(SCALE_TIERS[tier_name], ti))
    restart_policy = restart_policy or "Never"
    max_restarts = max_restarts or 0
    use_chief = ti.get("useChiefInTfConfig", True)
    ti["useChiefInTfConfig"] = use_chief
    return JobSpec(job_id=job_id, scale_tier=tier_name, groups=groups, job_dir=job_dir,
                   staging_bucket=staging_bucket, package_path=package_path,
                   package_uri=package_uri, module_name=module, args=user_args,
                   use_chief=use_chief, training_input=ti, restart_policy=restart_policy,
                   max_restarts=max_restarts)


def _with_restarts(group: ReplicaGroup, ti: dict, policy, most) -> ReplicaGroup:
    """The group with its restart policy: the flags', else its type's config's."""
    key = CONFIG_KEYS[group.task_type]
    config = ti.get(key) or {}
    return dataclasses.replace(
        group, restart_policy=policy or config.get("restartPolicy", "Never"),
        max_restarts=most if most is not None else config.get("maxRestarts", 0))


CONFIG_KEYS = {CHIEF: "masterConfig", **{t: cfg for t, _, _, cfg in GROUP_KEYS}}


def _groups(tier: ScaleTier, ti: dict) -> tuple[ReplicaGroup, ...]:
    custom = tier.name == "CUSTOM"
    if not custom:
        # A fixed tier fixes counts, machines and GPUs; restart settings are free.
        given = [k for _, c, t, cfg in GROUP_KEYS for k in (c, t, cfg) if k in ti
                 and (k != cfg or "acceleratorConfig" in (ti[k] or {}))]
        given += [k for k in ("masterType", "masterConfig") if k in ti
                  and (k != "masterConfig" or "acceleratorConfig" in (ti[k] or {}))]
        if given:
            flag = {"workerCount": "--worker-count", "parameterServerCount":
                    "--parameter-server-count", "evaluatorCount": "--evaluator-count"}
            name = flag.get(given[0], given[0])
            raise UsageError(f"{name} needs --scale-tier CUSTOM (scale tier {tier.name} "
                             "fixes the cluster's shape); use CUSTOM or drop it")
        groups = [ReplicaGroup(CHIEF, 1, "standard_gpu" if tier.master_gpus else "standard",
                               tier.master_gpus)]
        for task_type, count in ((WORKER, tier.workers), (PS, tier.parameter_servers)):
            if count:
                groups.append(ReplicaGroup(task_type, count, "standard"))
        return tuple(groups)
    if "masterType" not in ti:
        raise UsageError("scale tier CUSTOM needs trainingInput.masterType (e.g. "
                         "masterType: standard) in --config")
    master_type = _machine(ti["masterType"], "masterType")
    groups = [ReplicaGroup(CHIEF, 1, master_type, _gpus(ti, "masterConfig", master_type))]
    for task_type, count_key, type_key, config_key in GROUP_KEYS:
        count = ti.get(count_key, 0)
        flag = "--" + re.sub(r"([A-Z])", r"-\1", count_key).lower()
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
                                       _gpus(ti, config_key, machine)))
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


def _gpus(ti: dict, config_key: str, machine: str) -> int:
    count = ti.get(config_key, {}).get("acceleratorConfig", {}).get("count", 0)
    return machines.gpus(machine, count)


def check_job_id(job_id: str) -> None:
    if not JOB_ID.fullmatch(job_id or ""):  # `$` would let "job01\n" through
        raise UsageError(f"invalid job id {job_id!r}: use letters, digits and underscores, "
                         "starting with a letter, at most 128 characters (e.g. job01)")


def _normalise_url(url: str | None, flag: str) -> str | None:
    """Check the scheme; plain relative paths become absolute (replicas run elsewhere)."""
    if url is None or url == "":
        return None
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.\-]*)://", url)
    if match:
        scheme = match.group(1).lower()
        if scheme not in URL_SCHEMES:
            raise UsageError(f"{flag} {url!r} has unknown URL scheme {scheme!r}; use a local "
                             "path, file://, memory:// or gs://")
        if scheme == "gs" and not re.match(r"^gs://[a-z0-9][a-z0-9._\-]{1,220}", url):
            raise UsageError(f"{flag} {url!r} names no bucket; write gs://BUCKET/PATH")
        stripped = url.rstrip("/")
        return url if stripped.endswith(":") else stripped
    return os.path.abspath(url)


def local_gpu_count() -> int:
    """GPUs visible here, asked of nvidia-smi (importing TensorFlow would take seconds)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return 0
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def check_gpus(spec: JobSpec, available: int) -> None:
    needed = spec.gpus_needed
    if needed > available:
        raise UsageError(f"scale tier {spec.scale_tier} needs {needed} GPU(s) per replica "
                         f"and this machine has {available}; use --scale-tier BASIC or "
                         "CUSTOM without acceleratorConfig")


def _no_unknown(mapping: Mapping, allowed, where: str) -> None:
    unknown = [k for k in mapping if k not in allowed]
    if unknown:
        raise ConfigError(f"{where} has unknown key {unknown[0]!r}; allowed keys are "
                          f"{', '.join(allowed)}")


def _type_name(types) -> str:
    names = {str: "a string", int: "an integer", bool: "true or false", list: "a list",
             dict: "a mapping", float: "a number", type(None): "empty"}
    return " or ".join(names.get(t, t.__name__) for t in types)
