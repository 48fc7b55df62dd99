"""The values a job definition is made of, each checked on its own: text without control
characters, storage URLs and bucket names, labels, durations, gcloud's per-type flags
(--master-machine-type, --worker-accelerator count=N,type=T, ...), and the defaults
Cloud ML derives (restarts, the chief's name in TF_CONFIG). `submit.jobdef.spec` puts them
together.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import unicodedata
from collections.abc import Mapping
from typing import Any, overload

from mljob import storage
from submit.jobdef.vocabulary import type_name
from submit.errors import ConfigError, UsageError

URL_SCHEMES = ("file", "memory", "gs")
ACCELERATOR_KEYS = ("count", "type")



@overload
def normalise_url(url: str, flag: str) -> str: ...


@overload
def normalise_url(url: None, flag: str) -> None: ...


def normalise_url(url: str | None, flag: str) -> str | None:
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


def strings(value: Any, where: str):
    """(where, text) for every string in a config value, keys included."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings(k, where)
            yield from strings(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from strings(v, f"{where}[{i}]")


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
TYPE_FLAGS = {  # flag (as a Flags field) -> (trainingInput key, the flag's name)
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
                             f"{type_name(value)}")
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
