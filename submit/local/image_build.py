"""Images made on this machine, for machines that reach no registry: the base image
(`localhost/mljob-base:TAG`: a Debian root filesystem from Debian's own packages, with
Python, pip, TensorFlow and mljob's core pip-installed), and a job's image built from the
Dockerfile the Kubeflow runner writes (`submit.runners.kubeflow_render.dockerfile`), the
user's staged sdist installed on a base.

The base is built once per recipe: its tag is a hash of everything that goes into it (the
Debian suite and mirror, the Debian packages, the pip requirements, this recipe's
version), and a build finds the image already there when nothing changed. Building it:
`debootstrap --variant=minbase` from the mirror this machine's apt uses (its .debs kept
in the cache folder), the wheels fetched by this machine's pip into the cache folder
(its own index settings apply), installed inside the new root by its own Python (`run
--rootfs`, no network) and compiled (without the .pyc files every container compiled
TensorFlow's modules as it started: a STANDARD_1-shaped test job took 93 s to 130 s
instead of 52 s), and the tree imported as the image. The cache folder is
`$MLJOB_IMAGE_CACHE`, else `~/.cache/mljob/images`.

`python -m submit JOB --build-image NAME [--base-image IMAGE]` builds a package's image
here and runs the job in it. Users with a registry and base images of their own need none
of this: they build the Kubeflow runner's Dockerfile on their base and push it.
"""
from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from submit.jobdef.containers import check_image
from submit.errors import UsageError
from submit.local import build_progress as bp
from submit.local import container_engine as ce

RECIPE = 2
DEBIAN_PACKAGES = ("python3", "python-is-python3", "ca-certificates")
REQUIREMENTS = ("tensorflow-cpu==2.21.*", "fsspec>=2024.2", "gcsfs>=2024.2", "psutil>=5.9",
                "tenacity>=8.2", "tensorboard>=2.20", "pip", "setuptools>=61", "wheel")
BASE_NAME = "localhost/mljob-base"
DEFAULT_MIRROR = "http://deb.debian.org/debian"


def cache_dir() -> str:
    return os.environ.get("MLJOB_IMAGE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "mljob", "images")


def debian_mirror(root: str = "/etc/apt") -> str:
    """The Debian archive this machine's apt uses (its first `.../debian` source)."""
    files = [os.path.join(root, "sources.list"),
             *sorted(glob.glob(os.path.join(root, "sources.list.d", "*")))]
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            continue
        for url in re.findall(r"^(?:URIs:\s*|deb\s+(?:\[[^]]*\]\s+)?)(\S+)", text, re.M):
            if url.rstrip("/").endswith("/debian"):
                return url.rstrip("/")
    return DEFAULT_MIRROR


def debian_suite() -> str:
    try:
        with open("/etc/os-release", encoding="utf-8") as f:
            match = re.search(r"^VERSION_CODENAME=\"?(\w+)", f.read(), re.M)
    except OSError:
        match = None
    return match[1] if match else "bookworm"


def base_tag(suite: str, mirror: str) -> str:
    recipe = repr((RECIPE, suite, mirror, DEBIAN_PACKAGES, REQUIREMENTS,
                   f"{sys.version_info[0]}.{sys.version_info[1]}"))
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def base_image(engine: ce.Engine, *, log=print) -> str:
    """`localhost/mljob-base:TAG`, built when missing (one build at a time)."""
    suite, mirror = debian_suite(), debian_mirror()
    name = f"{BASE_NAME}:{base_tag(suite, mirror)}"
    if ce.image_exists(engine, name):
        return name
    os.makedirs(cache_dir(), exist_ok=True)
    with open(os.path.join(cache_dir(), ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ce.image_exists(engine, name):
            _build_base(engine, name, suite, mirror, log)
    return name


def _run(argv: list[str], what: str, stdin=subprocess.DEVNULL) -> None:
    out = subprocess.run(argv, stdin=stdin, capture_output=True, text=True)
    if out.returncode != 0:
        raise UsageError(f"{what} failed ({ce.first_line(out.stderr or out.stdout)}); "
                         f"the command was: {' '.join(argv)[:200]}")


def _build_base(engine: ce.Engine, name: str, suite: str, mirror: str, log) -> None:
    if shutil.which("debootstrap") is None:
        raise UsageError("building the base image needs debootstrap; install it "
                         "(apt-get install debootstrap) or give a base image of your own")
    started = time.monotonic()
    debs, wheels = (os.path.join(cache_dir(), d) for d in ("debs", "wheels"))
    os.makedirs(debs, exist_ok=True)
    os.makedirs(wheels, exist_ok=True)
    work = tempfile.mkdtemp(prefix="base-", dir=cache_dir())
    rootfs = os.path.join(work, "rootfs")
    progress = bp.Progress(log, phases=3)
    try:
        log(f"building {name} ({bp.FIRST_BUILD}): Debian {suite} from {mirror}, "
            "wheels by pip")
        # the wheels download while debootstrap works
        pip = subprocess.Popen(
            [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
             "-d", wheels, *REQUIREMENTS], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deb = bp.Debootstrap()
        try:
            with progress.phase(f"debootstrap of Debian {suite} ({', '.join(DEBIAN_PACKAGES)}"
                                f" and what they need) and pip download of "
                                f"{', '.join(REQUIREMENTS)}",
                                lambda: f"{deb.status(debs)}; {bp.wheels_status(wheels)}"):
                _debootstrap(["debootstrap", "--variant=minbase",
                              "--include=" + ",".join(DEBIAN_PACKAGES),
                              f"--cache-dir={debs}", suite, rootfs, mirror], deb)
                pip_out, _ = pip.communicate()
        finally:
            if pip.poll() is None:
                pip.kill()
                pip.wait()
        if pip.returncode != 0:
            raise UsageError(f"pip download of the base image's wheels failed "
                             f"({ce.first_line(pip_out)})")
        with contextlib.suppress(IndexError, FileNotFoundError):  # pip installs into it
            os.remove(glob.glob(os.path.join(rootfs, "usr/lib/python3*/EXTERNALLY-MANAGED"))[0])
        reqs = " ".join(f"'{r}'" for r in REQUIREMENTS)
        files, size = bp.folder_size(wheels)
        with progress.phase(f"pip install of {files} wheels ({bp.megabytes(size)}) in the "
                            "new root, no network, and their .pyc files compiled",
                            lambda: f"root filesystem {bp.megabytes(bp.folder_size(rootfs)[1])}"):
            _run(engine.argv("run", "--rm", "--network", "none", "-v", f"{wheels}:/wheels:ro",
                             "--rootfs", rootfs, "sh", "-c",
                             "python3 $(ls /wheels/pip-*.whl | tail -1)/pip install -q "
                             "--no-index --find-links /wheels --no-cache-dir "
                             f"--root-user-action=ignore {reqs} && pip --version"),
                 "pip install in the base image")
        size = bp.folder_size(rootfs)[1]
        tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
        try:
            with progress.phase(f"{engine.kind} import of the root filesystem "
                                f"({bp.megabytes(size)})"):
                _run(engine.argv("import", "--change", 'CMD ["python3"]', "-", name),
                     f"{engine.kind} import", stdin=tar.stdout)
        finally:
            assert tar.stdout is not None
            tar.stdout.close()
            tar.wait()
        log(f"built {name} in {time.monotonic() - started:.0f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _debootstrap(argv: list[str], progress: bp.Debootstrap) -> None:
    """debootstrap, its lines fed to `progress` as they come; its last ones name a
    failure."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        progress.feed(line)
        tail = [*tail[-19:], line]
    if proc.wait() != 0:
        raise UsageError(f"debootstrap failed ({ce.first_line(''.join(tail))}); the "
                         f"command was: {' '.join(argv)[:200]}")


def build_job_image(engine: ce.Engine, context: str, name: str, base: str | None,
                    *, log=print) -> None:
    """`build` of the Kubeflow Dockerfile in `context` as `name`, on `base` (the
    Dockerfile's own FROM when None)."""
    check_image(name, "--build-image", UsageError)
    started = time.monotonic()
    argv = engine.argv("build", "--network", "host", "-t", name)
    if base is not None:
        if not ce.image_exists(engine, base):
            raise UsageError(f"base image {base} is not in {engine.kind}'s local images; "
                             "build it first or name another with --base-image")
        if engine.kind == "podman":
            argv += ["--from", base, "--pull=never"]
        else:
            with open(os.path.join(context, "Dockerfile"), encoding="utf-8") as f:
                text = re.sub(r"^FROM .*$", f"FROM {base}", f.read(), count=1, flags=re.M)
            with open(os.path.join(context, "Dockerfile.local"), "w") as f:
                f.write(text)
            argv += ["-f", os.path.join(context, "Dockerfile.local")]
    with pip_settings(engine) as mounts:
        _run(argv + mounts + [context], f"{engine.kind} build of {name}")
    log(f"built {name} from {context}/Dockerfile in {time.monotonic() - started:.0f} s")


# pip's settings the build's pip is given (`pip config list`'s names)
PIP_KEYS = ("index-url", "extra-index-url", "find-links", "no-index", "cert", "constraint",
            "trusted-host", "timeout", "default-timeout", "proxy")
PIP_PATH_KEYS = ("index-url", "extra-index-url", "find-links", "cert", "constraint")


def pip_conf(settings: dict[str, str]) -> tuple[str, list[str]]:
    """The pip.conf a build's pip reads for this machine's pip `settings`, and the local
    folders and files it names (index folders, find-links folders, the CA bundle, the
    constraints file), which the build's steps get mounted read-only at the same paths.
    Paths that do not exist here are left out, as this machine's pip ignores them."""
    lines, paths = ["[global]"], []
    for key in PIP_KEYS:
        if key not in settings:
            continue
        kept = []
        for value in settings[key].split() if key in PIP_PATH_KEYS else [settings[key]]:
            path = value[len("file://"):] if value.startswith("file://") else value
            if key in PIP_PATH_KEYS and path.startswith("/"):
                if not os.path.exists(path):
                    continue
                paths.append(path)
            kept.append(value)
        if kept:
            lines.append(f"{key} = {' '.join(kept)}")
    return "\n".join(lines) + "\n", list(dict.fromkeys(paths))


@contextlib.contextmanager
def pip_settings(engine: ce.Engine):
    """The build's pip finds and trusts what this machine's pip does: its index settings,
    find-links, constraints and CA bundle (pip's configuration files and PIP_*
    variables), given to the build's steps as /etc/pip.conf with the local folders
    and files it names, all mounted read-only (not left in the image). podman only:
    `docker build` takes no mounts, and its pip uses the image's own settings."""
    if engine.kind != "podman":
        yield []
        return
    from submit.packaging.pipconfig import pip_settings as settings_here
    text, paths = pip_conf(settings_here())
    with tempfile.NamedTemporaryFile("w", suffix=".conf") as conf:
        conf.write(text)
        conf.flush()
        yield [*(a for p in paths for a in ("--volume", f"{p}:{p}:ro")),
               "--volume", f"{conf.name}:/etc/pip.conf:ro"]


def finish_image(engine: ce.Engine, name: str, entrypoint: list[str] | None,
                 requirements: list[str], requirements_file: str | None = None) -> None:
    """`name` again, with a layer that pip-installs `requirements` (and a requirements
    file's) with this machine's pip settings (`pip_settings`), and sets its entrypoint."""
    import json
    import shlex
    with tempfile.TemporaryDirectory() as context:
        lines = [f"FROM {name}"]
        if requirements_file:
            shutil.copyfile(requirements_file, os.path.join(context, "requirements.txt"))
            lines += ["COPY requirements.txt /tmp/mljob-requirements.txt",
                      "RUN pip install --no-cache-dir -r /tmp/mljob-requirements.txt"
                      " && rm /tmp/mljob-requirements.txt"]
        if requirements:
            lines.append("RUN pip install --no-cache-dir "
                         + " ".join(shlex.quote(r) for r in requirements))
        if entrypoint:
            lines += [f"ENTRYPOINT {json.dumps(entrypoint)}", "CMD []"]
        with open(os.path.join(context, "Dockerfile"), "w") as f:
            f.write("\n".join(lines) + "\n")
        argv = engine.argv("build", "--pull=never" if engine.kind == "podman"
                           else "--pull=false", "--network", "host", "-t", name)
        with pip_settings(engine) as mounts:
            _run(argv + mounts + [context], f"{engine.kind} build of {name}'s last layer")
