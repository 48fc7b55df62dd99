"""The launcher's readers of user files are bounded: `--config` on an endless device or
a named pipe, and staged packages that are too large or expand too far."""
from __future__ import annotations

import io
import os
import tarfile

import pytest

from submit.packaging import archives, package
from submit.__main__ import main
from submit.errors import PackageUsageError
from tests.support.submit_cli import files_under, write_package


def _submit(capsys, *argv) -> tuple[int, str]:
    status = main(list(argv), standalone_mode=False)
    return status, capsys.readouterr().err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["/dev/zero", "/dev/urandom", "named pipe", "link loop"])
def test_config_from_an_endless_or_blocking_file_is_one_line(capsys, tmp_path, kind):
    """Before: /dev/zero and /dev/urandom were read until memory ran out (their size is
    0), and a named pipe blocked for ever waiting for a writer."""
    if kind == "named pipe":
        config = str(tmp_path / "config.yaml")
        os.mkfifo(config)
        words = "is a named pipe, not a regular file"
    elif kind == "link loop":
        config = str(tmp_path / "config.yaml")
        os.symlink(config, config)
        words = "a symbolic link loop"
    else:
        config, words = kind, "is a device or socket, not a regular file"
    pkg = write_package(tmp_path / "pkg")
    status, err = _submit(capsys, "job01", "--job-dir", str(tmp_path / "job"),
                          "--package-path", pkg, "--config", config)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"error: cannot read --config {config}: ") and words in err
    assert files_under(tmp_path / "job") == []
    assert not os.path.exists(os.path.join(os.environ["MLJOB_HOME"], "jobs"))


def _tar(path, members: list[tuple[str, int]]) -> str:
    """A gzipped tar of (name, size) files of zeros: small on disk whatever the sizes."""
    with tarfile.open(path, "w:gz") as tar:
        for name, size in members:
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BytesIO(bytes(size)))
    return str(path)


def test_a_package_that_expands_too_far_is_refused_before_it_is_extracted(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setattr(archives, "MAX_EXTRACTED_BYTES", 4 * 1024 * 1024)
    bomb = _tar(tmp_path / "pkg-1.0.tar.gz", [("pkg-1.0/setup.py", 10),
                                              ("pkg-1.0/zeros.bin", 8 * 1024 * 1024)])
    assert os.path.getsize(bomb) < 64 * 1024
    for action in (lambda: package.content_hash(bomb),
                   lambda: package.safe_extract(bomb, str(tmp_path / "out"))):
        with pytest.raises(PackageUsageError, match="expands to more than .* 4194304 bytes"):
            action()
    assert not (tmp_path / "out" / "pkg-1.0" / "zeros.bin").exists()


def test_a_package_of_too_many_members_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(archives, "MAX_MEMBERS", 50)
    many = _tar(tmp_path / "pkg-1.0.tar.gz", [(f"pkg-1.0/m{i}.py", 1) for i in range(51)])
    with pytest.raises(PackageUsageError, match="more than 50 members"):
        package.content_hash(many)


def test_a_staged_package_too_large_to_download_is_refused(tmp_path, monkeypatch):
    archive = _tar(tmp_path / "pkg-1.0.tar.gz", [("pkg-1.0/setup.py", 10)])
    monkeypatch.setattr(archives, "MAX_PACKAGE_BYTES", os.path.getsize(archive) - 1)
    with pytest.raises(PackageUsageError, match="is larger than"):
        package.fetch(archive, str(tmp_path / "dl"))
    staged = package.Package("pkg-1.0.tar.gz", "0" * 64, "pkg-1.0", url=archive)
    root = tmp_path / "envs"
    with pytest.raises(Exception, match="is larger than"):
        package.ensure_environment([staged], "1" * 64, root=str(root))
    assert os.listdir(root) == []  # no environment, not even a half-built one


@pytest.mark.parametrize("name, text", [
    ("config.yaml", "trainingInput:\n  workerCount: HUGE\n"),
    ("config.json", '{"trainingInput": {"workerCount": HUGE}}')], ids=["yaml", "json"])
def test_config_integer_beyond_the_conversion_limit_is_one_line(capsys, tmp_path, name,
                                                               text):
    """Before (YAML): int() raised ValueError through the loader, a traceback."""
    import sys
    config = tmp_path / name
    config.write_text(text.replace("HUGE", "9" * (sys.get_int_max_str_digits() + 700)))
    pkg = write_package(tmp_path / "pkg")
    status, err = _submit(capsys, "job01", "--job-dir", str(tmp_path / "job"),
                          "--package-path", pkg, "--config", str(config))
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert f"an integer of more than {sys.get_int_max_str_digits()} digits" in lines[0]
    assert files_under(tmp_path / "job") == []


def test_download_errors_name_the_url_once(tmp_path):
    """Before: `cannot download the staged package X: cannot read X: ...`."""
    from submit.errors import PackageError
    loop = str(tmp_path / "pkg-1.0.tar.gz")
    os.symlink(loop, loop)
    staged = package.Package("pkg-1.0.tar.gz", "0" * 64, "pkg-1.0", url=loop)
    with pytest.raises(PackageError) as info:
        package.ensure_environment([staged], "1" * 64, root=str(tmp_path / "envs"))
    message = str(info.value)
    assert message.count(loop) == 1 and "symbolic link loop" in message, message
    with pytest.raises(PackageError) as info:
        package.fetch(loop, str(tmp_path))
    assert str(info.value).count(loop) == 1, str(info.value)
