"""The built wheel (a non-editable `pip install .`) holds every module of the source tree."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# source folder -> where it installs (pyproject's package-dir)
INSTALLED_AS = {"roll_lite": "roll_lite", "pipelines": "roll_lite/pipelines", "workers": "roll_lite/workers"}


def test_the_wheel_holds_every_module_under_roll_lite(tmp_path):
    source = tmp_path / "src"  # a copy, so that the build leaves no build/ or egg-info in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for folder in INSTALLED_AS:
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    [wheel] = (tmp_path / "dist").glob("roll_lite-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    expected = {
        f"{INSTALLED_AS[folder]}/{path.relative_to(REPO / folder).as_posix()}"
        for folder in INSTALLED_AS
        for path in (REPO / folder).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert "roll_lite/strategy/fsdp2.py" in expected
    missing = sorted(expected - names)
    assert not missing, f"not in the wheel (add their packages to [tool.setuptools] packages): {missing}"
    page = {f"roll_lite/viewer/static/{name}" for name in ("index.html", "viewer.js", "viewer.css")}
    assert page <= names, f"roll-view's page is not in the wheel ([tool.setuptools.package-data]): {page - names}"
    top_level = {name.split("/")[0] for name in names if not name.startswith("roll_lite-")}
    assert top_level == {"roll_lite"}, top_level
