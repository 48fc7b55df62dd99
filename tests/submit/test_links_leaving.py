"""Links that lead out of what is copied: `versions create` (and `predict publish`) of an
export, and a training package, refuse a symbolic link to a file or folder outside (or a
loop), in one line naming it, before anything is published or staged (the published
version held a copy of /etc/passwd). Links that stay inside are copied as before."""
from __future__ import annotations

import os

import pytest

from predict.models import publish
from predict.errors import UsageError as PredictUsageError
from tests.support.submit_cli import files_under, one_error_line, run, write_package


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "outside" / "passwd"
    path.parent.mkdir()
    path.write_text("root:x:0:0:SECRET\n")
    return path


def export(folder, **links) -> str:
    os.makedirs(os.path.join(folder, "variables"))
    with open(os.path.join(folder, "saved_model.pb"), "wb") as f:
        f.write(b"graph")
    for rel, target in links.items():
        path = os.path.join(folder, rel.replace("__", os.sep))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.symlink(target, path)
    return str(folder)


def _leaves(secret, tmp_path):
    return {"a file outside": {"assets__passwd": str(secret)},
            "a relative way out": {"assets__passwd": "../../outside/passwd"},
            "a folder outside": {"assets__etc": str(secret.parent)},
            "a loop": {"variables__loop": ".."},
            "a sibling of the same prefix": {"assets__k": "../../model-keys/k"}}


@pytest.mark.parametrize("case", ["a file outside", "a relative way out",
                                  "a folder outside", "a loop",
                                  "a sibling of the same prefix"])
def test_versions_create_refuses_a_link_leaving_the_export(capsys, tmp_path, secret, case):
    links = _leaves(secret, tmp_path)[case]
    (tmp_path / "job" / "model-keys").mkdir(parents=True)
    (tmp_path / "job" / "model-keys" / "k").write_text("SECRET key\n")
    origin = export(tmp_path / "job" / "model", **links)
    base = tmp_path / "served" / "m"
    assert run(capsys, "models", "create", "m", "--base-path", str(base))[0] == 0
    status, out, err = run(capsys, "versions", "create", "v1", "--model", "m", "--origin",
                           origin)
    line = one_error_line(err)
    assert status == 2 and out == "", err
    rel, target = next(iter(links.items()))
    assert f"holds the link {rel.replace('__', os.sep)} -> {target}, which leads out of " \
           "the export" in line and "nothing is published" in line
    assert not any("SECRET" in open(p, errors="replace").read()
                   for p in files_under(base) if os.path.isfile(p))
    assert not os.path.exists(base / "1")
    status, out, _ = run(capsys, "versions", "list", "--model", "m")
    assert status == 0 and "v1" not in out
    with pytest.raises(PredictUsageError, match="leads out of the export"):  # predict publish
        publish.publish(origin, str(tmp_path / "other"))


def test_links_inside_the_export_are_copied(capsys, tmp_path):
    origin = export(tmp_path / "model", assets__graph="../saved_model.pb",
                    assets__vars="../variables")
    version = publish.publish(origin, str(tmp_path / "served"))
    copied = tmp_path / "served" / str(version) / "assets" / "graph"
    assert copied.read_bytes() == b"graph"


def test_a_package_with_a_link_leaving_it_is_not_staged(capsys, tmp_path, secret):
    pkg = write_package(tmp_path / "pkg")
    os.symlink(str(secret), os.path.join(pkg, "fakejob", "passwd.txt"))
    status, out, err = run(capsys, "job01", "--package-path", pkg, "--module-name",
                           "fakejob.task", "--job-dir", str(tmp_path / "job"), "--dry-run")
    line = one_error_line(err)
    assert status == 2 and "fakejob/passwd.txt -> " in line, err
    assert "which leads out of the package" in line and "nothing is staged" in line
    assert not os.path.exists(tmp_path / "job")
