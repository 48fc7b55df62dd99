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
import unicodedata
from collections.abc import Mapping
from typing import Any, overload

import yaml

from mljob import machines, storage
from mljob.errors import first_line, too_many_digits
from mljob.contracts import CHIEF, EVALUATOR, MASTER, PS, WORKER  # noqa: F401
from submit import containers, engine_keys, spellings, tuning_spec
from submit.errors import ConfigError, UsageError

MAX_CONFIG_BYTES = 1024 * 1024
MAX_CONFIG_DEPTH = 50  # a job config nests 4 deep; parsers recurse per level
# Each runner owns its own limit (the local runner's is 64 per type); this one only
# catches a count that cannot be meant, such as a pasted timestamp.
MAX_REPLICAS_PER_TYPE = 10_000
JOB_ID = spellings.JOB_ID
MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")  # fullmatch
URL_SCHEMES = ("file", "memory", "gs")
RESTART_POLICIES = ("Never", "OnFailure", "ExitCode", "Always")
VERSIONS = {"region": re.compile(r"[a-z]+(-[a-z]+)+[0-9]{1,2}"),
            "runtimeVersion": re.compile(r"[0-9]+\.[0-9]+"),
            "pythonVersion": re.compile(r"[0-9]\.[0-9]+")}


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

# trainingInput keys: name -> expected type(s) (bool is checked apart from int).
TRAINING_INPUT_KEYS: dict[str, tuple] = {
    "scaleTier": (str,), "masterType": (str,), "workerType": (str,),
    "parameterServerType": (str,), "evaluatorType": (str,),
    "workerCount": (int,), "parameterServerCount": (int,), "evaluatorCount": (int,),
    "masterConfig": (dict,), "workerConfig": (dict,), "parameterServerConfig": (dict,),
    "evaluatorConfig": (dict,), "args": (list,), "jobDir": (str,), "region": (str,),
    "runtimeVersion": (str,), "pythonVersion": (str,), "packageUris": (list,),
    "pythonModule": (str,), "hyperparameters": (dict,), "useChiefInTfConfig": (bool,),
    "scheduling": (dict,),
    # the cluster engines' keys: submit/engine_keys.py
    **engine_keys.TRAINING_INPUT_KEYS,
}
TOP_LEVEL_KEYS = ("trainingInput", "labels", "jobId")
# Per replica type: its GPUs, and (as Kubeflow's replica specs) when it is restarted.
REPLICA_CONFIG_KEYS = ("acceleratorConfig", "restartPolicy", "maxRestarts", "imageUri",
                       "containerCommand", "containerArgs")
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
    # a custom container (Cloud ML's ReplicaConfig.imageUri): the image, its entrypoint
    # (containerCommand; empty: the image's own) and its args (None: the trainer args)
    image_uri: str | None = None
    container_command: tuple[str, ...] = ()
    container_args: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """The resolved job: the cluster's replica groups and where everything goes.

    `args` are the user's trainer arguments; `trainer_args` adds `--job-dir` as Cloud ML
    does. `training_input` is the resolved trainingInput that replicas see as TF_CONFIG's
    `job`. `use_chief` names the chief `chief` in TF_CONFIG (else the legacy `master`).
    `labels` are the job's labels (config.yaml's, then --labels over them).
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


def load_config(path: str) -> dict:
    """Read config.yaml or JSON into its trainingInput mapping, refusing anything odd."""
    document = _read_document(path)
    training_input = document.get("trainingInput", {})
    if not isinstance(training_input, dict):
        raise ConfigError(f"--config {path}: trainingInput must be a mapping, not "
                          f"{type(training_input).__name__}")
    spellings.int64_fields(training_input, spellings.INT64_KEYS, "trainingInput")
    for key in CONFIG_KEYS.values():  # acceleratorConfig.count is int64 too
        accel = (training_input.get(key) or {}) if isinstance(training_input.get(key),
                                                              dict) else {}
        if isinstance(accel.get("acceleratorConfig"), dict):
            spellings.int64_fields(accel["acceleratorConfig"], ("count",),
                                   f"trainingInput.{key}.acceleratorConfig")
    check_training_input(training_input)
    return training_input


def load_labels(path: str) -> dict[str, str]:
    """The config's top-level `labels` (Cloud ML's Job.labels), checked."""
    labels = _read_document(path).get("labels")
    if labels is None:
        return {}
    if not isinstance(labels, dict):
        raise ConfigError(f"--config {path}: labels must be a mapping of KEY: VALUE, not "
                          f"{type(labels).__name__}")
    return check_labels(labels, "labels in --config")


def _read_document(path: str) -> dict:
    """The whole config file (a mapping of known top-level keys), refusing anything odd."""
    data = _read_config(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--config {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} "
                          f"at offset {exc.start}); save it as UTF-8") from None
    if path.endswith(".json"):
        try:
            document = json.loads(text, object_pairs_hook=_unique_keys)
        except _RepeatedKey as exc:
            raise ConfigError(f"--config {path} repeats the key {exc.key!r:.60}; give each "
                              "key once (the last one would silently win)") from None
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
    # `x-` keys hold YAML anchors for the rest (docker-compose's convention)
    document = {k: v for k, v in document.items()
                if not (isinstance(k, str) and k.startswith("x-"))}
    _no_unknown(document, TOP_LEVEL_KEYS, f"--config {path}")
    if "jobId" in document:
        if not isinstance(document["jobId"], str):
            raise ConfigError(f"--config {path}: jobId must be a string like job01, not "
                              f"{_type_name((type(document['jobId']),))}")
        check_job_id(document["jobId"])
    return document


class _RepeatedKey(Exception):
    def __init__(self, key, line: int | None = None):
        super().__init__(key)
        self.key, self.line = key, line


def _unique_keys(pairs: list) -> dict:
    """json's object_pairs_hook: a key given twice is an error, not last-wins."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKey(key)
        out[key] = value
    return out


class _ConfigLoader(yaml.SafeLoader):
    """yaml's safe loader, stricter: a key given twice in a mapping is an error (not
    last-wins), and YAML 1.1's base-60 numbers (`1:30` is 90) stay the text written."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and \
                    key_node.tag != "tag:yaml.org,2002:merge":  # `<<: *base`
                key = self.construct_object(key_node)
                try:
                    if key in seen:
                        raise _RepeatedKey(key, key_node.start_mark.line + 1)
                    seen.add(key)
                except TypeError:  # unhashable: the safe loader refuses it below
                    continue
        return super().construct_mapping(node, deep)

    def construct_base60(self, node):
        if ":" in str(node.value):
            return self.construct_scalar(node)
        tag = node.tag.rsplit(":", 1)[-1]
        return (yaml.SafeLoader.construct_yaml_int if tag == "int"
                else yaml.SafeLoader.construct_yaml_float)(self, node)


for _tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float"):
    _ConfigLoader.add_constructor(_tag, _ConfigLoader.construct_base60)


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
    """yaml.safe_load, after refusing deep nesting (the loader recurses once per level:
    thousands overflow the stack) and aliases that expand too far (a few lines of them
    expand to gigabytes); anchors and aliases within the bound are YAML as written."""
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
        loader = _ConfigLoader(text)  # a SafeLoader, stricter
        try:
            node = loader.get_single_node()
            spellings.check_expansion(node, path, MAX_CONFIG_DEPTH)  # anchors, bounded
            return None if node is None else loader.construct_document(node)
        finally:
            loader.dispose()
    except _RepeatedKey as exc:
        raise ConfigError(f"--config {path} line {exc.line} repeats the key {exc.key!r:.60}; "
                          "give each key once (the last one would silently win)") from None
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
    for where, text in _strings(dict(ti), "trainingInput"):
        check_text(text, where, ConfigError)
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
        containers.check_config(config, key)
        accel = config.get("acceleratorConfig", {})
        if not isinstance(accel, dict):
            raise ConfigError(f"trainingInput.{key}.acceleratorConfig must be a mapping "
                              "like {count: 1, type: NVIDIA_TESLA_T4}")
        _no_unknown(accel, ACCELERATOR_KEYS, f"trainingInput.{key}.acceleratorConfig")
        count = accel.get("count", 0)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError(f"trainingInput.{key}.acceleratorConfig.count must be a "
                              f"non-negative integer, not {count!r:.60}")
        if not isinstance(accel.get("type", ""), str):
            raise ConfigError(f"trainingInput.{key}.acceleratorConfig.type must be a string "
                              f"like NVIDIA_TESLA_T4, not {accel['type']!r:.60}")


def resolve(job_id: str, training_input: Mapping[str, Any], *, scale_tier=None,
            worker_count=None, parameter_server_count=None, evaluator_count=None,
            job_dir=None, staging_bucket=None, package_path=None, module_name=None,
            args=None, restart_policy=None, max_restarts=None,
            labels=None, config_labels=None, master_machine_type=None,
            worker_machine_type=None, parameter_server_machine_type=None,
            master_accelerator=None, worker_accelerator=None,
            parameter_server_accelerator=None, use_chief_in_tf_config=None,
            master_image_uri=None, worker_image_uri=None, parameter_server_image_uri=None,
            packages=None, region=None, runtime_version=None, python_version=None,
            staged=True) -> JobSpec:
    """Merge flags (None when not given) over trainingInput and check the result.

    Restarts: --restart-policy/--max-restarts, when given, apply to every replica type;
    otherwise each type's `<type>Config.restartPolicy/maxRestarts` (default Never; a
    policy other than Never allows DEFAULT_MAX_RESTARTS when no maximum is given).
    gcloud's per-type flags (--master-machine-type, --worker-accelerator, ...) go into
    trainingInput as their keys; `labels` (--labels) go over `config_labels`.

    `packages` (--packages) are sdists or wheels, paths or URLs, installed with the
    package; given alone (no --package-path), the first is the job's package.
    --region, --runtime-version and --python-version are recorded in trainingInput (the
    local runner runs on this machine's TensorFlow and Python).

    staged=False is `local train`: the working tree runs, nothing needs a staging place.
    """
    check_job_id(job_id)
    if package_path is not None:
        check_text(package_path, "--package-path")
    ti = dict(training_input)
    check_training_input(ti)
    for _flag, key, value in (("--worker-count", "workerCount", worker_count),
                              ("--parameter-server-count", "parameterServerCount",
                               parameter_server_count),
                              ("--evaluator-count", "evaluatorCount", evaluator_count)):
        if value is not None:
            ti[key] = value
    containers.apply_flags(ti, master_image_uri=master_image_uri,
                           worker_image_uri=worker_image_uri,
                           parameter_server_image_uri=parameter_server_image_uri)
    type_keys = apply_type_flags(
        ti, master_machine_type=master_machine_type, worker_machine_type=worker_machine_type,
        parameter_server_machine_type=parameter_server_machine_type,
        master_accelerator=master_accelerator, worker_accelerator=worker_accelerator,
        parameter_server_accelerator=parameter_server_accelerator,
        use_chief_in_tf_config=use_chief_in_tf_config)
    tier_name = spellings.enum_value(scale_tier or ti.get("scaleTier") or "BASIC",
                                     SCALE_TIERS, "scale tier", REFUSED_TIERS)
    ti["scaleTier"] = tier_name
    if job_dir is not None:
        ti["jobDir"] = job_dir
    job_dir = _normalise_url(ti.get("jobDir"), "--job-dir")
    if job_dir:
        ti["jobDir"] = job_dir
    if "hyperparameters" in ti:  # Cloud ML's HyperparameterSpec: submit/tuning_spec.py
        tuning_spec.parse(ti["hyperparameters"], job_dir=job_dir)
    staging_bucket = _normalise_url(staging_bucket, "--staging-bucket")
    if module_name is not None:
        ti["pythonModule"] = module_name
    module = ti.setdefault("pythonModule", "trainer.task")
    if not isinstance(module, str) or not MODULE.fullmatch(module):
        raise UsageError(f"--module-name {module!r} is not a Python module name; "
                         "write it like trainer.task")
    if args is not None:
        ti["args"] = list(args)
    user_args = tuple(ti.get("args", ()))
    for i, arg in enumerate(user_args):
        check_text(arg, f"trainer argument {i + 1}")
    if any(a == "--job-dir" or a.startswith("--job-dir=") for a in user_args):
        raise UsageError("--job-dir is among the trainer arguments; give it to submit "
                         "(before `--`), which passes it on to the trainer")
    for flag, key, value, what, example in (
            ("--region", "region", region, "Google Cloud region", "us-central1"),
            ("--runtime-version", "runtimeVersion", runtime_version, "runtime version",
             "MAJOR.MINOR, e.g. 2.11 or 1.15"),
            ("--python-version", "pythonVersion", python_version, "Python version",
             "3.7")):
        if value is not None:
            ti[key] = value
        if key in ti and not VERSIONS[key].fullmatch(ti[key]):
            name = flag if value is not None else f"trainingInput.{key}"
            raise UsageError(f"{name} {ti[key]!r:.60} is not a {what}; write {example}")
    package_uri: str | None = None
    extras: tuple[str, ...] = ()
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
    if staged and local_archives and not job_dir and not staging_bucket:
        raise UsageError("If local packages are provided, the --staging-bucket or "
                         "--job-dir flag must be given.")
    if restart_policy is not None:  # Never, OnFailure, on-failure, ON_FAILURE, ...
        restart_policy = spellings.enum_value(restart_policy, RESTART_POLICIES,
                                              "--restart-policy")
    if max_restarts is not None and (isinstance(max_restarts, bool) or
                                     not 0 <= max_restarts <= MAX_RESTARTS):
        raise UsageError(f"--max-restarts {max_restarts} is out of range; use 0 to "
                         f"{MAX_RESTARTS}")
    from_flags = {key for key, value in (("workerCount", worker_count),
                                         ("parameterServerCount", parameter_server_count),
                                         ("evaluatorCount", evaluator_count))
                  if value is not None} | type_keys
    groups = containers.with_images(tuple(
        _with_restarts(g, ti, restart_policy, max_restarts)
        for g in _groups(SCALE_TIERS[tier_name], ti, from_flags)), ti, CONFIG_KEYS)
    restart_policy = restart_policy or "Never"
    max_restarts = default_max_restarts(restart_policy, max_restarts)
    use_chief = default_use_chief(ti)
    ti["useChiefInTfConfig"] = use_chief
    max_running_time, max_wait_time = check_scheduling(ti)
    engine_keys.check(ti, parse_duration)  # the cluster engines' keys
    return JobSpec(job_id=job_id, scale_tier=tier_name, groups=groups, job_dir=job_dir,
                   staging_bucket=staging_bucket, package_path=package_path,
                   package_uri=package_uri, module_name=module, args=user_args,
                   use_chief=use_chief, training_input=ti, restart_policy=restart_policy,
                   max_restarts=max_restarts,
                   labels=merge_labels(config_labels or {}, parse_labels_flag(labels)),
                   max_running_time=max_running_time, max_wait_time=max_wait_time,
                   extra_packages=extras)


def _archive(path: str, flag: str) -> str:
    """A package archive: an sdist (.tar.gz) or a wheel (.whl), as a path or URL."""
    if not isinstance(path, str) or not path.endswith((".tar.gz", ".whl")):
        raise UsageError(f"{flag} {path!r:.80} is not an sdist or a wheel; give "
                         "NAME-VERSION.tar.gz or .whl files")
    return _normalise_url(path, flag)


def _with_restarts(group: ReplicaGroup, ti: dict, policy, most) -> ReplicaGroup:
    """The group with its restart policy: the flags', else its type's config's."""
    key = CONFIG_KEYS[group.task_type]
    config = ti.get(key) or {}
    policy = policy or config.get("restartPolicy", "Never")
    return dataclasses.replace(group, restart_policy=policy, max_restarts=default_max_restarts(
        policy, most if most is not None else config.get("maxRestarts")))


CONFIG_KEYS = {CHIEF: "masterConfig", **{t: cfg for t, _, _, cfg in GROUP_KEYS}}


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
    groups = [ReplicaGroup(CHIEF, 1, master_type, _gpus(ti, "masterConfig", master_type))]
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


check_job_id = spellings.check_job_id


@overload
def _normalise_url(url: str, flag: str) -> str: ...


@overload
def _normalise_url(url: None, flag: str) -> None: ...


def _normalise_url(url: str | None, flag: str) -> str | None:
    """Check the scheme and the path; plain paths and relative `file://` URLs become
    absolute (replicas run elsewhere), so the record, package, logs, model and
    checkpoints all land in the one place the user named."""
    if url is None:
        return None
    if not isinstance(url, str) or not url.strip():
        raise UsageError(f"{flag} {url!r} is empty; give a path or URL, or leave it out")
    check_text(url, flag)
    scheme, sep, _ = url.partition("://")  # as fsspec reads it: anything before :// is one
    if sep:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.\-]*", scheme) \
                or scheme.lower() not in URL_SCHEMES:
            raise UsageError(f"{flag} {url!r} has unknown URL scheme {scheme!r}; use a local "
                             "path, file://, memory:// or gs://")
        scheme = scheme.lower()
        url = scheme + url[len(scheme):]  # fsspec knows its schemes in lower case
        if scheme == "gs":
            check_bucket(url, flag)
        stripped = url.rstrip("/")
        url = url if stripped.endswith(":") else stripped
    try:
        return storage.absolute_url(url)
    except storage.StorageError as exc:
        raise UsageError(f"{flag}: {exc}") from None


CONTROL_CATEGORIES = ("Cc", "Zl", "Zp")  # C0, DEL, C1, and the Unicode line breaks


def check_text(value: str, what: str, error: type = UsageError) -> None:
    """Refuse control characters (NUL, newlines, escapes): no path, URL, argument or
    name needs one, and NUL cannot even reach a process (exec refuses it)."""
    bad = next((c for c in value if unicodedata.category(c) in CONTROL_CATEGORIES), None)
    if bad is not None:
        raise error(f"{what} {value[:60]!r} holds the control character {bad!r}; "
                    "remove it")


def _strings(value: Any, where: str):
    """(where, text) for every string in a config value, keys included."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k, where)
            yield from _strings(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{where}[{i}]")


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


# -- labels, deadlines, gcloud's per-type flags, restart and TF_CONFIG defaults ----------

# Google Cloud's label rules: at most 64 labels; keys 1 to 63 characters, starting with a
# lower-case letter; keys and values (0 to 63) of lower-case letters, digits, `_` and `-`.
# International letters, which Google Cloud also takes, are refused: Kubernetes' labels
# (where the TFJob carries them) take only ASCII.
MAX_LABELS = 64
LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")
RESERVED_LABEL_PREFIX = "mljob"   # the engines' own labels (mljob-job-id, ...)
DEFAULT_MAX_RESTARTS = 6          # Kubernetes Job's backoffLimit default
CHIEF_SINCE_RUNTIME = (2, 1)      # Cloud ML named the chief `master` before runtime 2.1
_DURATION = re.compile(r"([0-9]{1,12})(\.[0-9]{1,9})?s")
TYPE_FLAGS = {  # flag (as resolve's keyword) -> (trainingInput key, the flag's name)
    "master_machine_type": ("masterType", "--master-machine-type"),
    "worker_machine_type": ("workerType", "--worker-machine-type"),
    "parameter_server_machine_type": ("parameterServerType",
                                      "--parameter-server-machine-type"),
    "master_accelerator": ("masterConfig", "--master-accelerator"),
    "worker_accelerator": ("workerConfig", "--worker-accelerator"),
    "parameter_server_accelerator": ("parameterServerConfig",
                                     "--parameter-server-accelerator"),
}
TYPE_FLAG_NAMES = {key: flag for key, flag in TYPE_FLAGS.values()}
ACCELERATOR_FLAG_HINT = "write it as count=N,type=TYPE, e.g. count=1,type=nvidia-tesla-t4"


def check_labels(labels: Mapping, where: str) -> dict[str, str]:
    """Labels as Google Cloud takes them; a one-line error names the first bad one."""
    if len(labels) > MAX_LABELS:
        raise UsageError(f"{where}: {len(labels)} labels are more than Google Cloud's "
                         f"{MAX_LABELS}; drop some")
    out = {}
    for key, value in labels.items():
        if not isinstance(key, str) or not LABEL_KEY.fullmatch(key):
            raise UsageError(f"{where}: label key {key!r:.70} is not a Google Cloud label "
                             "key; use 1 to 63 lower-case letters, digits, '_' or '-', "
                             "starting with a letter")
        if key.startswith(RESERVED_LABEL_PREFIX):
            raise UsageError(f"{where}: label key {key!r} starts with "
                             f"{RESERVED_LABEL_PREFIX!r}, which mljob keeps for its own "
                             "labels; pick another key")
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise UsageError(f"{where}: label {key}'s value must be a string, not "
                             f"{_type_name((type(value),))}")
        value = str(value)
        if not LABEL_VALUE.fullmatch(value):
            raise UsageError(f"{where}: label {key}={value!r:.70} has a value Google Cloud "
                             "refuses; use at most 63 lower-case letters, digits, '_' "
                             "or '-'")
        out[key] = value
    return out


def parse_labels_flag(values) -> dict[str, str]:
    """`--labels team=vision,env=dev` (the flag may be repeated) as a mapping."""
    if values is None:
        return {}
    if isinstance(values, Mapping):
        return check_labels(values, "--labels")
    if isinstance(values, str):
        values = (values,)
    labels: dict[str, str] = {}
    for text in values:
        for item in text.split(","):
            key, eq, value = item.partition("=")
            if not eq:
                raise UsageError(f"--labels {item!r:.70} is not KEY=VALUE; write "
                                 "--labels team=vision,env=dev")
            labels[key.strip()] = value.strip()
    return check_labels(labels, "--labels")


def merge_labels(config_labels: Mapping[str, str],
                 flag_labels: Mapping[str, str]) -> dict[str, str]:
    """gcloud's rule: --labels add to the config's labels, and win where keys meet."""
    merged = {**config_labels, **flag_labels}
    return check_labels(merged, "--labels with the config's labels")


def parse_duration(value: Any, where: str) -> float:
    """A Duration as Google's APIs write it (`7200s`, `1.5s`) in seconds."""
    match = _DURATION.fullmatch(value) if isinstance(value, str) else None
    if match is None or float(value[:-1]) <= 0:
        raise ConfigError(f"{where} {value!r:.60} is not a duration; write seconds with an "
                          "'s', greater than 0, e.g. 7200s")
    return float(value[:-1])


def check_scheduling(ti: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """trainingInput.scheduling: (maxRunningTime, maxWaitTime) in seconds, or None."""
    scheduling = ti.get("scheduling")
    if scheduling is None:
        return None, None
    _no_unknown(scheduling, ("maxRunningTime", "maxWaitTime", *engine_keys.SCHEDULING_KEYS),
                "trainingInput.scheduling")
    running, waiting = (parse_duration(scheduling[key], f"trainingInput.scheduling.{key}")
                        if key in scheduling else None
                        for key in ("maxRunningTime", "maxWaitTime"))
    return running, waiting


def parse_accelerator_flag(text: str, flag: str) -> dict:
    """gcloud's `--master-accelerator count=1,type=nvidia-tesla-t4` as an
    acceleratorConfig (`{count: 1, type: NVIDIA_TESLA_T4}`)."""
    fields: dict[str, str] = {}
    for item in text.split(","):
        key, eq, value = (part.strip() for part in item.partition("="))
        if not eq or key not in ACCELERATOR_KEYS or key in fields:
            raise UsageError(f"{flag} {text!r:.70}: {item!r:.40} is not count=N or "
                             f"type=TYPE; {ACCELERATOR_FLAG_HINT}")
        fields[key] = value
    if "count" not in fields or "type" not in fields:
        missing = "count" if "count" not in fields else "type"
        raise UsageError(f"{flag} {text!r:.70} has no {missing}; {ACCELERATOR_FLAG_HINT}")
    if not re.fullmatch(r"[1-9][0-9]{0,1}", fields["count"]):
        raise UsageError(f"{flag} count={fields['count']!r:.20} is not a number of GPUs "
                         f"from 1 to 99; {ACCELERATOR_FLAG_HINT}")
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{1,40}", fields["type"]):
        raise UsageError(f"{flag} type={fields['type']!r:.40} is not an accelerator type; "
                         f"{ACCELERATOR_FLAG_HINT}")
    return {"count": int(fields["count"]),
            "type": fields["type"].upper().replace("-", "_")}


def apply_type_flags(ti: dict, **flags) -> set[str]:
    """gcloud's per-type flags over trainingInput: machine types, accelerators (kept with
    the type's other replica settings) and --use-chief-in-tf-config. Returns the keys
    the flags set (so that a mistake names the flag, not a config key)."""
    given: set[str] = set()
    use_chief = flags.pop("use_chief_in_tf_config", None)
    if use_chief is not None:
        ti["useChiefInTfConfig"] = bool(use_chief)
    for name, value in flags.items():
        if value is None:
            continue
        key, flag = TYPE_FLAGS[name]
        if key.endswith("Config"):
            ti[key] = {**(ti.get(key) or {}),
                       "acceleratorConfig": parse_accelerator_flag(value, flag)}
        else:
            ti[key] = value
        given.add(key)
    return given


def default_max_restarts(policy: str, most: int | None) -> int:
    """A policy other than Never with no maximum allows DEFAULT_MAX_RESTARTS."""
    if most is not None:
        return most
    return 0 if policy == "Never" else DEFAULT_MAX_RESTARTS


def default_use_chief(ti: Mapping[str, Any]) -> bool:
    """useChiefInTfConfig as given, else by runtimeVersion as Cloud ML did: before 2.1
    TF_CONFIG named the chief `master`."""
    if "useChiefInTfConfig" in ti:
        return ti["useChiefInTfConfig"]
    version = ti.get("runtimeVersion")
    if version is None:
        return True
    major, minor = version.split(".")  # checked by resolve against VERSIONS
    return (int(major), int(minor)) >= CHIEF_SINCE_RUNTIME


def check_bucket(url: str, flag: str) -> None:
    """A gs:// URL's bucket by Cloud Storage's naming rules, each broken one said."""
    bucket = url[len("gs://"):].split("/", 1)[0]
    if not bucket:
        raise UsageError(f"{flag} {url!r:.80} names no bucket; write gs://BUCKET/PATH")
    rule = None
    if not re.fullmatch(r"[a-z0-9._-]+", bucket):
        rule = "bucket names use only lower-case letters, digits, '-', '_' and '.'"
    elif not (3 <= len(bucket) <= 63 or "." in bucket and len(bucket) <= 222
              and all(len(part) <= 63 for part in bucket.split("."))):
        rule = ("bucket names are 3 to 63 characters (up to 222 with dots, 63 between "
                "dots)")
    elif not (bucket[0].isalnum() and bucket[-1].isalnum()):
        rule = "bucket names start and end with a letter or digit"
    elif re.fullmatch(r"[0-9]+(\.[0-9]+){3}", bucket):
        rule = "bucket names cannot be IP addresses"
    elif bucket.startswith("goog") or "google" in bucket:
        rule = "bucket names cannot start with 'goog' or contain 'google'"
    if rule:
        raise UsageError(f"{flag} {url!r:.80}: {bucket!r:.70} is not a valid bucket name "
                         f"({rule}); write gs://BUCKET/PATH")
