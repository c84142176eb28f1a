"""`onceflow spark pack`: refuses what is not a virtual environment or holds an editable
install, and packs a virtual environment into the archive asked for. (Executors running
such an archive on a standalone cluster: tests/spark/test_standalone.py.)"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

from typer.testing import CliRunner

from onceflow.cli.app import app


def make_venv(path):
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(path)],
                   check=True, timeout=60)
    return path


def test_pack_refuses_a_directory_that_is_not_a_venv(tmp_path):
    result = CliRunner().invoke(app, ["spark", "pack", "-p", str(tmp_path), "-o",
                                      str(tmp_path / "env.tar.gz")])
    assert result.exit_code == 1
    assert "not a valid virtual environment" in result.output
    assert not (tmp_path / "env.tar.gz").exists()


def test_pack_refuses_an_editable_install(tmp_path):
    venv = make_venv(tmp_path / "venv")
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "__editable__.demo-0.1.pth").write_text(str(tmp_path / "src") + "\n")
    result = CliRunner().invoke(app, ["spark", "pack", "-p", str(venv), "-o",
                                      str(tmp_path / "env.tar.gz")])
    assert result.exit_code == 1
    assert "editable" in result.output and str(tmp_path / "src") in result.output


def test_pack_writes_the_venv_to_the_path_and_says_how_to_use_it(tmp_path):
    venv = make_venv(tmp_path / "venv")
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "marker_module.py").write_text("VALUE = 1\n")
    archive = tmp_path / "out" / "env.tar.gz"
    archive.parent.mkdir()
    result = CliRunner().invoke(app, ["spark", "pack", "-p", str(venv), "-o", str(archive)])
    assert result.exit_code == 0, result.output
    with tarfile.open(archive) as packed:
        names = packed.getnames()
    assert "pyvenv.cfg" in names and "bin/python" in names
    assert f"{site.relative_to(venv)}/marker_module.py" in names
    assert f"--archives {archive}#environment" in result.output
    again = CliRunner().invoke(app, ["spark", "pack", "-p", str(venv), "-o", str(archive)])
    assert again.exit_code == 1 and "exists" in again.output   # --force to overwrite


def test_archive_setting_names_the_unpack_directory(tmp_path, monkeypatch):
    from onceflow.spark.session import archive_setting

    monkeypatch.chdir(tmp_path)
    assert archive_setting("env.tar.gz") == f"{tmp_path}/env.tar.gz#environment"
    assert archive_setting("hdfs://nn/envs/env.tar.gz") == "hdfs://nn/envs/env.tar.gz#environment"


def test_driver_environment_link_points_at_this_venv_and_keeps_an_existing_one(tmp_path):
    from onceflow.spark.session import link_driver_environment

    link_driver_environment(str(tmp_path))
    assert (tmp_path / "environment" / "bin" / "python").resolve() == \
        (Path(sys.prefix) / "bin" / "python").resolve()
    other = tmp_path / "other"
    (other / "environment").mkdir(parents=True)
    link_driver_environment(str(other))
    assert (other / "environment").is_dir() and not (other / "environment").is_symlink()
