"""Custom containers, as Cloud ML's ReplicaConfig has them: `imageUri`, `containerCommand`
and `containerArgs` per replica type, and gcloud's `--master-image-uri`,
`--worker-image-uri` and `--parameter-server-image-uri`.

Cloud ML's rules: a worker, parameter server or evaluator without its own `imageUri`
runs the master's; a replica with a container installs no package (nothing is built or
staged unless --package-path or --packages ask for it); `containerArgs`, when given,
replace the trainer arguments (`args` and `--job-dir`), which are otherwise the
container's arguments. The Kubeflow and Vertex renderers run the image as given; the
local runner runs each replica as a container (`submit.local.containers`); Ray refuses
it (`submit.runners.ray`).
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from submit.errors import ConfigError, UsageError

# an image reference: [registry[:port]/]path[:tag][@digest], no spaces or controls
IMAGE = re.compile(r"[a-z0-9][a-z0-9._\-/:]*[a-z0-9](:[\w][\w.-]{0,127})?"
                   r"(@sha256:[0-9a-f]{64})?", re.ASCII)
FLAGS = {"master_image_uri": ("masterConfig", "--master-image-uri"),
         "worker_image_uri": ("workerConfig", "--worker-image-uri"),
         "parameter_server_image_uri": ("parameterServerConfig",
                                        "--parameter-server-image-uri")}
MAX_WORDS = 1000   # containerCommand, containerArgs (submit.jobdef.config_schema)


def check_image(uri: Any, where: str, error: type = ConfigError) -> str:
    if not isinstance(uri, str) or len(uri) > 1024 or not IMAGE.fullmatch(uri):
        raise error(f"{where} {uri!r:.80} is not a container image; write "
                    "REGISTRY/PATH[:TAG], e.g. gcr.io/my-project/trainer:1")
    return uri


def check_config(config: Mapping[str, Any], key: str) -> None:
    """What the schema cannot say of a replica config's container (its keys, the image's
    syntax and the word lists are `submit.jobdef.config_schema.ReplicaConfig`'s)."""
    if config.get("containerCommand") == []:
        raise ConfigError(f"trainingInput.{key}.containerCommand is empty; leave it "
                          "out to run the image's entrypoint")


def apply_flags(ti: dict, **flags: str | None) -> None:
    """gcloud's --*-image-uri flags into their replica configs (over the config's)."""
    for name, uri in flags.items():
        if uri is None:
            continue
        key, flag = FLAGS[name]
        ti[key] = {**(ti.get(key) or {}), "imageUri": check_image(uri, flag, UsageError)}


def master_image(ti: Mapping[str, Any]) -> str | None:
    return (ti.get("masterConfig") or {}).get("imageUri")


def with_images(groups: tuple, ti: Mapping[str, Any], config_keys: Mapping[str, str]) \
        -> tuple:
    """Each group with its container: its own config's, else the master's image."""
    master = master_image(ti)
    out = []
    for group in groups:
        config = ti.get(config_keys[group.task_type]) or {}
        image = config.get("imageUri") or master
        if image is None:
            if any(k in config for k in ("containerCommand", "containerArgs")):
                raise UsageError(f"trainingInput.{config_keys[group.task_type]} has "
                                 "containerCommand or containerArgs but no image; add "
                                 "imageUri (or masterConfig.imageUri)")
            out.append(group)
            continue
        args = config.get("containerArgs")
        out.append(dataclasses.replace(
            group, image_uri=image, container_command=tuple(config.get("containerCommand")
                                                            or ()),
            container_args=None if args is None else tuple(args)))
    if any(g.image_uri for g in out) and not master:
        given = next(k for k in config_keys.values()
                     if (ti.get(k) or {}).get("imageUri"))
        raise UsageError(f"trainingInput.{given}.imageUri needs the master's image too: "
                         "give --master-image-uri (or masterConfig.imageUri); Cloud ML "
                         "runs every replica of a job in containers or none")
    return tuple(out)


def kubelet_literal(text: str) -> str:
    """text as a pod's command, args or env value must hold it to reach the container
    unchanged: the kubelet expands `$(VAR)` there and turns `$$` into `$`, so every `$`
    is written `$$` (`--w=$(CLOUD_ML_JOB_ID)` stays literal, as on the local runner)."""
    return text.replace("$", "$$")


def args_for(group, trainer_args: tuple[str, ...]) -> list[str]:
    """The container's arguments: containerArgs, else the trainer args."""
    return list(group.container_args if group.container_args is not None else trainer_args)
