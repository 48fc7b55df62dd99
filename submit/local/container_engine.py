"""The container engine the local runner runs custom containers with: podman, or docker
where that is what the user has. Pure command lines (`run_argv`, `gpu_flags`, ...) and the
few calls that ask the engine something (`detect`, `image_exists`, `probe`, `leftovers`),
each a one-line UsageError when the engine cannot do what a job needs.

Choosing the engine: `--container-engine` (or `$MLJOB_CONTAINER_ENGINE`) names podman,
docker or a path to either; unnamed, podman when it is on PATH, else docker when its
daemon answers. A docker client without a daemon (a CLI-only install) is not an engine.

Every container and network a job makes carries the label `mljob.job=<job id>`, so that
what a job left (`leftovers`) can be listed, and removed, by the engine itself.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from submit.errors import UsageError

ENGINES = ("podman", "docker")
ENGINE_ENV = "MLJOB_CONTAINER_ENGINE"
JOB_LABEL = "mljob.job"
REPLICA_LABEL = "mljob.replica"
PORT = 2222          # every replica's TF_CONFIG port, as on Cloud ML and Kubeflow
PROBE_COMMAND = "/mljob-no-such-command"
INSTALL_HINT = ("install podman (Debian: apt-get install podman runc) or docker, or name "
                "one with --container-engine")
# What the engine says when it cannot start any container, and what fixes it
# (containers.conf: /etc/containers/containers.conf, or $CONTAINERS_CONF).
FIXES = (
    (re.compile(r"rlimit|ulimit|RLIMIT", re.I),
     "set `default_ulimits = []` under [containers] in containers.conf (the engine's "
     "default open-files limit is above what this machine allows)"),
    (re.compile(r"cgroup|systemd|dbus", re.I),
     "set `cgroup_manager = \"cgroupfs\"` (and `runtime = \"runc\"`: crun refuses hybrid "
     "cgroups) under [engine] in containers.conf"),
)
NAME_BAD = re.compile(r"[^a-zA-Z0-9_.-]")


@dataclasses.dataclass(frozen=True)
class Engine:
    kind: str      # "podman" or "docker"
    path: str      # the executable

    def argv(self, *args: str) -> list[str]:
        return [self.path, *args]


def detect(choice: str | None = None, environ: Mapping[str, str] | None = None) -> Engine:
    """The engine to use: `choice` (a name or path), else $MLJOB_CONTAINER_ENGINE, else
    podman, else a docker whose daemon answers; a UsageError naming the fix otherwise."""
    environ = os.environ if environ is None else environ
    choice = choice or environ.get(ENGINE_ENV) or None
    if choice is not None:
        kind = os.path.basename(choice)
        if kind not in ENGINES:
            raise UsageError(f"--container-engine {choice!r:.80} is neither podman nor "
                             "docker; give podman, docker or the path to either")
        path = shutil.which(choice)
        if path is None:
            raise UsageError(f"container engine {choice} is not installed here; "
                             + INSTALL_HINT)
        engine = Engine(kind, path)
        if kind == "docker":
            _docker_daemon(engine)
        return engine
    podman = shutil.which("podman")
    if podman:
        return Engine("podman", podman)
    docker = shutil.which("docker")
    if docker:
        engine = Engine("docker", docker)
        _docker_daemon(engine)
        return engine
    raise UsageError("custom containers need a container engine and none is installed "
                     "here; " + INSTALL_HINT)


def _docker_daemon(engine: Engine) -> None:
    out = call(engine, "version", "--format", "{{.Server.Version}}")
    if out.returncode != 0 or not out.stdout.strip():
        raise UsageError(f"{engine.path} is a docker client whose daemon does not answer "
                         f"({first_line(out.stderr) or 'no server'}); start dockerd, or "
                         "install podman and pass --container-engine podman")


def call(engine: Engine, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(engine.argv(*args), capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(engine.argv(*args), 125, "", str(e))


def first_line(text: str) -> str:
    """The engine's message: its last non-empty line (podman prints warnings first),
    without its `Error: ` prefix."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    line = lines[-1] if lines else ""
    return re.sub(r"^(Error|error|docker): ", "", line)[:300]


def image_exists(engine: Engine, image: str) -> bool:
    if engine.kind == "podman":
        return call(engine, "image", "exists", image).returncode == 0
    return call(engine, "image", "inspect", image).returncode == 0


def check_images(engine: Engine, images: Sequence[str]) -> None:
    for image in dict.fromkeys(images):
        if not image_exists(engine, image):
            raise UsageError(f"image {image} is not in {engine.kind}'s local images; build "
                             f"it (python -m submit ... --build-image {image}) or "
                             f"`{engine.kind} pull`/`{engine.kind} load` it first")


def probe(engine: Engine, image: str) -> None:
    """Start a container of `image` once, with a command that does not exist: an engine
    that can start containers gets as far as looking for it (exit 126 or 127 and "no such
    file"); one that cannot (its cgroups or ulimits refused) fails before, and the job is
    refused in one line naming the fix."""
    out = call(engine, "run", "--rm", "--pull", "never", "--network", "none",
                "--entrypoint", PROBE_COMMAND, image, timeout=120)
    text = out.stderr or ""
    if PROBE_COMMAND in text and re.search(r"no such file|not found", text, re.I):
        return
    message = first_line(text) or f"exit status {out.returncode}"
    for pattern, fix in FIXES:
        if pattern.search(text):
            raise UsageError(f"{engine.kind} cannot start containers here ({message}); "
                             f"{fix}")
    raise UsageError(f"{engine.kind} cannot start a container of {image} ({message}); "
                     f"check that `{engine.kind} run --rm {image}` works")


def safe_name(text: str) -> str:
    return NAME_BAD.sub("-", text)


def network_name(job_id: str) -> str:
    return safe_name(f"mljob-{job_id}")


def container_name(job_id: str, label: str) -> str:
    return safe_name(f"mljob-{job_id}-{label}")


def network_create_argv(engine: Engine, job_id: str) -> list[str]:
    return engine.argv("network", "create", "--label", f"{JOB_LABEL}={job_id}",
                       network_name(job_id))


def network_rm_argv(engine: Engine, job_id: str) -> list[str]:
    return engine.argv("network", "rm", *(["-f"] if engine.kind == "podman" else []),
                       network_name(job_id))


def rm_argv(engine: Engine, names: Sequence[str]) -> list[str]:
    """Remove containers at once, killing the running ones (no stop timeout)."""
    extra = ["-t", "0", "--ignore"] if engine.kind == "podman" else []
    return engine.argv("rm", "-f", *extra, *names)


def gpu_flags(engine: Engine, gpus: int, devices: str | None = None) -> list[str]:
    """What a replica with `gpus` GPUs (acceleratorConfig.count) is started with: the
    devices CUDA_VISIBLE_DEVICES names on this machine (`devices`, e.g. "0,1"), else the
    first `gpus`. podman takes NVIDIA's CDI names (`nvidia-ctk cdi generate`), docker the
    NVIDIA container toolkit's `--gpus`."""
    if gpus <= 0:
        return []
    ids = devices.split(",") if devices else [str(i) for i in range(gpus)]
    if engine.kind == "podman":
        return [f"--device=nvidia.com/gpu={i}" for i in ids]
    return ["--gpus", f"\"device={','.join(ids)}\""]


def run_argv(engine: Engine, *, job_id: str, label: str, image: str, hostname: str,
             env_keys: Sequence[str], mounts: Sequence[str], entrypoint: Sequence[str],
             args: Sequence[str], gpus: Sequence[str] = (), workdir: str | None = None,
             cpu_shares: int | None = None) -> list[str]:
    """`run` of one replica, attached (its output on the engine's stdout and stderr, its
    exit status the engine's), named, labelled, on the job's network under its TF_CONFIG
    host name. `env_keys` are passed by name: their values come from the environment the
    engine is started with (none of the host's others reach the container).
    `cpu_shares`: its CPU weight against this machine's other processes (1024 is one
    busy thread's)."""
    name = container_name(job_id, label)
    # --init: a small init is PID 1 and the replica its child, so a SIGTERM reaches the
    # replica as on a machine (PID 1 ignores the signals it has no handler for)
    argv = engine.argv("run", "--rm", "--init", "--pull", "never", "--name", name,
                       "--label", f"{JOB_LABEL}={job_id}",
                       "--label", f"{REPLICA_LABEL}={label}",
                       "--network", network_name(job_id), "--hostname", hostname,
                       "--network-alias", hostname)
    if engine.kind == "podman":
        argv += ["--replace"]    # a restart's name is the replica's, as before
    if cpu_shares is not None:
        argv += ["--cpu-shares", str(cpu_shares)]
    for key in env_keys:
        argv += ["--env", key]
    for mount in mounts:
        argv += ["--volume", f"{mount}:{mount}"]
    if workdir:
        argv += ["--workdir", workdir]
    argv += list(gpus)
    if entrypoint:
        # the first word replaces the entrypoint; the rest go before the args
        argv += ["--entrypoint", entrypoint[0]]
    argv.append(image)
    argv += [*entrypoint[1:], *args]
    return argv


def cgroup_parent(engine: Engine, cgroup_file: str = "/proc/self/cgroup") -> str | None:
    """Where a replica's container goes among this machine's cgroups so that it competes
    for CPU as a replica process does: beside this process's own cgroup's processes
    (under cgroup v1 with podman's cgroupfs manager, whose default parent, libpod_parent,
    holds every container under one weight of 1024: all of a job's containers together
    got what one busy thread of a process gets). None where the engine's own placement
    stands (cgroup v2, systemd's manager, docker)."""
    if engine.kind != "podman":
        return None
    out = call(engine, "info", "--format", "{{.Host.CgroupManager}} {{.Host.CgroupsVersion}}")
    if out.stdout.split() != ["cgroupfs", "v1"]:
        return None
    try:
        with open(cgroup_file, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if "cpu" in controllers.split(",") and path.startswith("/"):
            return path
    return None


def leftovers(engine: Engine, job_id: str) -> tuple[list[str], list[str]]:
    """The containers (any state) and networks labelled with the job, by name."""
    label = f"label={JOB_LABEL}={job_id}"
    ps = call(engine, "ps", "-a", "--filter", label, "--format", "{{.Names}}")
    nets = call(engine, "network", "ls", "--filter", label, "--format", "{{.Name}}")
    return ps.stdout.split(), nets.stdout.split()


def remove_job(engine: Engine, job_id: str) -> None:
    """Remove every container and the network of a job (the ones it left)."""
    names, nets = leftovers(engine, job_id)
    if names:
        call(engine, *rm_argv(engine, names)[1:])
    if nets:
        call(engine, *network_rm_argv(engine, job_id)[1:])
