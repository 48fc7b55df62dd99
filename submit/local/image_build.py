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
    try:
        log(f"building {name}: Debian {suite} from {mirror}, wheels by pip")
        # the wheels download while debootstrap works
        pip = subprocess.Popen(
            [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
             "-d", wheels, *REQUIREMENTS], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            _run(["debootstrap", "--variant=minbase",
                  "--include=" + ",".join(DEBIAN_PACKAGES), f"--cache-dir={debs}",
                  suite, rootfs, mirror], "debootstrap")
        finally:
            pip_out, _ = pip.communicate()
        if pip.returncode != 0:
            raise UsageError(f"pip download of the base image's wheels failed "
                             f"({ce.first_line(pip_out)})")
        with contextlib.suppress(FileNotFoundError):  # pip installs into the image's own
            os.remove(glob.glob(os.path.join(rootfs, "usr/lib/python3*/EXTERNALLY-MANAGED"))[0])
        reqs = " ".join(f"'{r}'" for r in REQUIREMENTS)
        _run(engine.argv("run", "--rm", "--network", "none", "-v", f"{wheels}:/wheels:ro",
                         "--rootfs", rootfs, "sh", "-c",
                         "python3 $(ls /wheels/pip-*.whl | tail -1)/pip install -q "
                         "--no-index --find-links /wheels --no-cache-dir "
                         f"--root-user-action=ignore {reqs} && pip --version"),
             "pip install in the base image")
        tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
        try:
            _run(engine.argv("import", "--change", 'CMD ["python3"]', "-", name),
                 f"{engine.kind} import", stdin=tar.stdout)
        finally:
            assert tar.stdout is not None
            tar.stdout.close()
            tar.wait()
        log(f"built {name} in {time.monotonic() - started:.0f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


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


def set_entrypoint(engine: ce.Engine, name: str, entrypoint: list[str]) -> None:
    """`name` again, with a layer that only sets its entrypoint."""
    import json
    with tempfile.TemporaryDirectory() as context:
        with open(os.path.join(context, "Dockerfile"), "w") as f:
            f.write(f"FROM {name}\nENTRYPOINT {json.dumps(entrypoint)}\nCMD []\n")
        _run(engine.argv("build", "--pull=never" if engine.kind == "podman" else "--pull=false",
                         "-t", name, context), f"{engine.kind} build of {name}'s entrypoint")
