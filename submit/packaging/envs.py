"""Package environments: a venv per set of staged archives, which still sees this
interpreter's packages (TensorFlow, mljob), with the archives pip-installed with their
dependencies (pip's own configuration: index, proxies).

Environments are cached under `$MLJOB_ENV_CACHE` (default `$MLJOB_HOME/envs`) by the
hash of what they hold, published atomically, and reused by the next job; a cached one
is used only when `submit.packaging.envtrust` finds it is still what was built.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import site
import subprocess
import sys
import time
import uuid
import venv
from collections.abc import Callable, Sequence

from mljob import storage
from mljob.procs import pid_alive, stop_process
from submit.packaging import envtrust
from submit.packaging.archives import Package, _naming, _read_package, check_members, content_hash
from submit.errors import PackageError, PackageUsageError
from submit.home import mljob_home
from submit.packaging.pipconfig import pip_settings, uv_settings

log = logging.getLogger(__name__)

PIP_TIMEOUT_S = 3600
ENV_CACHE_ENV = "MLJOB_ENV_CACHE"
INSTALLER_ENV = "MLJOB_ENV_INSTALLER"  # pip (the default), uv, auto (uv where installed)
ENV_MARKER = "mljob-env.json"   # written last: an environment with it is complete
_BUILD_DIR = envtrust.BUILD_DIR


def env_root(home: str | None = None) -> str:
    """Where package environments are cached: $MLJOB_ENV_CACHE, else $MLJOB_HOME/envs."""
    override = os.environ.get(ENV_CACHE_ENV)
    if override:
        return os.path.abspath(os.path.expanduser(override))
    return os.path.join(home or mljob_home(), "envs")


def environment_key(packages: Sequence[Package], python: str | None = None) -> str:
    """What an environment holds, hashed: the archives' content hashes (in install order)
    and the interpreter it is built on."""
    python = os.path.realpath(python or sys.executable)
    text = json.dumps({"python": python, "version": sys.version,
                       "packages": [[p.file_name, p.sha256] for p in packages]})
    return hashlib.sha256(text.encode()).hexdigest()


def ensure_environment(packages: Sequence[Package], key: str, *, root: str | None = None,
                       cancelled: Callable[[], bool] | None = None) -> tuple[str, bool]:
    """The environment `key` (a venv seeing this interpreter's packages, with `packages`
    pip-installed from their staged URLs), and whether it was built now.

    It is built in a folder of its own (`<key>.<pid>-<random>`) and published by creating the
    symlink `<key>` to it: one atomic step, so `<key>` either does not exist or names a
    complete environment. The built folder never moves (pip writes absolute paths into
    it). A concurrent builder that loses the race removes its copy and uses the winner's.
    """
    root = root or env_root()
    target = os.path.join(root, key)
    if os.path.lexists(target):
        reason = envtrust.untrusted(root, key, ENV_MARKER)
        if reason is None:
            log.info("package environment %s reused", key[:12])
            return target, False
        log.warning("package environment %s is not used: %s; building it again",
                    target, reason)
        os.unlink(target) if os.path.islink(target) else shutil.rmtree(target)
    os.makedirs(root, mode=0o700, exist_ok=True)
    _remove_abandoned_builds(root)
    build_dir = os.path.join(root, f"{key}.{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.makedirs(build_dir)
    published = False
    try:
        files = _download(packages, os.path.join(build_dir, ".archives"))
        tool = installer()
        _create_venv(build_dir, tool)
        _pip_install(build_dir, files, os.path.join(root, f"{key}.pip.log"), cancelled,
                     tool)
        shutil.rmtree(os.path.join(build_dir, ".archives"))
        with open(os.path.join(build_dir, ENV_MARKER), "w") as f:
            json.dump({"packages": [{"url": p.url, "sha256": p.sha256,
                                     "file_name": p.file_name} for p in packages],
                       "python": sys.executable, "created": time.time(), "key": key,
                       "digest": envtrust.installed_digest(build_dir)}, f)
        try:
            os.symlink(os.path.basename(build_dir), target)
            published = True
        except FileExistsError:
            reason = envtrust.untrusted(root, key, ENV_MARKER)
            if reason is not None:
                raise PackageError(f"package environment {target} appeared while it was "
                                   f"built and is not used: {reason}; remove it") from None
            log.info("package environment %s reused (built concurrently)", key[:12])
            return target, False
    finally:
        if not published:
            shutil.rmtree(build_dir, ignore_errors=True)
    log.info("package environment %s created", key[:12])
    return target, True


def _remove_abandoned_builds(root: str) -> None:
    """Folders left by builders that were killed (the pid in their name is gone)."""
    linked = {os.readlink(os.path.join(root, n)) for n in os.listdir(root)
              if os.path.islink(os.path.join(root, n))}
    for name in os.listdir(root):
        match = _BUILD_DIR.fullmatch(name)
        folder = os.path.join(root, name)
        if match and name not in linked and not os.path.islink(folder) \
                and not pid_alive(int(match.group(1))):
            shutil.rmtree(folder, ignore_errors=True)


def _download(packages: Sequence[Package], folder: str) -> list[str]:
    """Each staged archive, checked against the hash it was staged with and for members
    that would land outside its folder."""
    os.makedirs(folder)
    files = []
    for i, pkg in enumerate(packages):
        path = os.path.join(folder, str(i), pkg.file_name)
        os.makedirs(os.path.dirname(path))
        url = pkg.url
        assert url is not None  # an environment installs staged archives only
        try:
            data = _read_package(url)
        except (FileNotFoundError, storage.StorageError, OSError) as exc:
            raise PackageError(f"cannot download the staged package: "
                               f"{_naming(exc, url)}") from None
        with open(path, "wb") as f:
            f.write(data)
        got, _ = content_hash(path)
        if got != pkg.sha256:
            raise PackageError(f"the staged package {pkg.url} changed since it was staged "
                               f"(sha256 {got[:12]}, expected {pkg.sha256[:12]}); submit "
                               "again")
        check_members(path)
        files.append(path)
    return files


def installer() -> str | None:
    """uv's binary when MLJOB_ENV_INSTALLER asks for uv (`uv`, or `auto` where uv is
    installed), else None: venv and pip, the default.

    pip is the default because uv does not look at the packages a venv sees through
    `include-system-site-packages` (astral-sh/uv#4466, #2500): it installs its own copies
    of every dependency this interpreter already has, in the newest versions it finds,
    and those shadow TensorFlow's own (measured here: grpcio 1.84 over the interpreter's
    1.85, setuptools 84 over 65, 54 distributions for the bundled trainer, where pip
    installs one). uv is for environments whose dependencies the interpreter lacks."""
    choice = (os.environ.get(INSTALLER_ENV) or "pip").strip().lower()
    if choice not in ("auto", "uv", "pip"):
        raise PackageUsageError(f"{INSTALLER_ENV}={choice!r:.40} is not an installer; use "
                                "pip, uv or auto")
    if choice == "pip":
        return None
    try:
        from uv import find_uv_bin  # the `uv` distribution's binary
        found: str | None = find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
    if found is None and choice == "uv":
        raise PackageUsageError(f"{INSTALLER_ENV}=uv but uv is not installed; pip install "
                                f"uv, or unset {INSTALLER_ENV}")
    return found


def _create_venv(folder: str, uv: str | None = None) -> None:
    """A venv that sees this interpreter's packages (TensorFlow, mljob): its system
    site-packages, plus, when this interpreter is itself a venv's, that venv's."""
    if uv is not None:
        command = [uv, "venv", "--quiet", "--allow-existing", "--system-site-packages",
                   "--python", sys.executable, folder]  # the folder holds the archives
        proc = subprocess.run(command, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=PIP_TIMEOUT_S)
        if proc.returncode != 0:
            said = (proc.stderr or proc.stdout or "no output").strip().splitlines()
            raise PackageError(f"uv venv failed: {said[-1][:300] if said else 'no output'}")
    else:
        venv.EnvBuilder(system_site_packages=True, symlinks=True,
                        with_pip=importlib.util.find_spec("pip") is None).create(folder)
    if sys.prefix != sys.base_prefix:
        site_dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
        lib = os.path.join(folder, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}",
                           "site-packages")
        with open(os.path.join(lib, "mljob-base-environment.pth"), "w") as f:
            f.writelines(f"import site; site.addsitedir({d!r})\n" for d in site_dirs)


def _pip_install(folder: str, files: list[str], log_file: str,
                 cancelled: Callable[[], bool] | None, uv: str | None = None) -> None:
    """Install the archives with their dependencies, with pip's own configuration
    (index, find-links, constraints, proxies, certificates; handed to uv as its flags
    when uv installs); a failure names the requirement and the installer's reason."""
    python = os.path.join(folder, "bin", "python")
    env = None
    if uv is not None:
        flags, env = uv_settings(pip_settings())
        command = [uv, "pip", "install", "--python", python, *flags, *files]
    else:
        command = [python, "-m", "pip", "install", "--no-input",
                   "--disable-pip-version-check", "--progress-bar", "off", *files]
    own_log = os.path.join(folder, ".pip.log")  # concurrent builders never share one
    with open(own_log, "w") as out:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, env=env,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + PIP_TIMEOUT_S
            while proc.poll() is None:
                if cancelled is not None and cancelled():
                    raise PackageError("cancelled while installing the job's packages")
                if time.monotonic() > deadline:
                    raise PackageError(f"installing the job's packages took over "
                                       f"{PIP_TIMEOUT_S} s; see {log_file}")
                time.sleep(0.2)
        finally:
            stop_process(proc)
    if proc.returncode != 0:
        shutil.copyfile(own_log, log_file)
        with open(log_file, encoding="utf-8", errors="replace") as f:
            requirement, reason = pip_failure(f.read())
        raise PackageError(f"cannot install {requirement}: {'uv' if uv else 'pip'} says "
                           f"{reason!r}; fix the requirement (install_requires) or pip's "
                           f"configuration (pip config list); the installer's output is "
                           f"in {log_file}")
    os.remove(own_log)


def pip_failure(output: str) -> tuple[str, str]:
    """The requirement pip (or uv) could not install and its reason, from its output."""
    errors = [line.strip()[len("ERROR:"):].strip() for line in output.splitlines()
              if line.strip().startswith("ERROR:")]
    uv_errors: list[str] = []  # uv's `error:`/`cause:` lines, wrapped lines joined back
    continued = False
    for line in output.splitlines():
        if line.strip().startswith(("error:", "cause:")):
            uv_errors.append(" ".join(line.split()[1:]))
            continued = True
        elif continued and line[:1].isspace() and line.strip() \
                and not re.match(r"\s*(hint|help|warning):", line):
            uv_errors[-1] += " " + " ".join(line.split())
        else:
            continued = False
    patterns = (r"No matching distribution found for (\S+)",
                r"Could not find a version that satisfies the requirement (\S+)",
                r"Failed building wheel for (\S+)", r"Cannot install (.+?) because",
                r"Could not install packages due to an \w+: (.+)",
                r"depends on (\S+?),? we can conclude", r"you require (\S+?),? we can")
    errors += uv_errors
    requirement = None
    for pattern in patterns:
        requirement = next((m.group(1) for e in errors if (m := re.search(pattern, e))),
                           None)
        if requirement:
            break
    reason = next((e for e in errors if e.startswith("Could not find a version")),
                  next((e for e in uv_errors if "not found" in e), None)
                  or (errors[0] if errors else None))
    if reason is None:
        lines = [line.strip() for line in output.splitlines() if line.strip()]
        reason = lines[-1] if lines else "no output"
    return (repr(requirement) if requirement else "the job's packages"), reason[:300]
