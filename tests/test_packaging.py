"""The package as a user gets it: `python -m build` makes an sdist and a wheel (the wheel built from the sdist) that
hold the whole package, its .pth hook and the LICENSE; the wheel alone, installed into a clean venv without torch,
runs `colltrace --version` and switches the tracer's start-up hook on with COLLTRACE set."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import colltrace

ROOT = Path(__file__).resolve().parent.parent
# generous: a build and a venv take seconds, but CI shares two cores with other jobs
TIMEOUT_S = 600


def _env() -> dict[str, str]:
    """This environment without what would make the subprocesses see the repo's venv or trace themselves."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("COLLTRACE")}


def _run(*cmd: str | Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env or _env(), capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert out.returncode == 0, f"{' '.join(map(str, cmd))} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    return out


def _package_files() -> set[str]:
    """Every file of the colltrace package in the source tree, Python or not (data such as a .tcss would count)."""
    found = set()
    for path in (ROOT / "colltrace").rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            found.add(path.relative_to(ROOT).as_posix())
    return found


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The sdist and the wheel, built offline with the backend the dev venv has (no isolated env to download)."""
    out = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT, cwd=out)
    sdists, wheels = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(p.name for p in out.iterdir())
    return sdists[0], wheels[0]


def test_the_wheel_holds_the_whole_package_its_pth_hook_and_the_license(dists: tuple[Path, Path]) -> None:
    _, wheel = dists
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        pth = z.read("colltrace.pth").decode() if "colltrace.pth" in names else None
        metadata = next(z.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    assert _package_files() - names == set()
    assert pth == (ROOT / "colltrace.pth").read_text()
    assert any(n.split("/")[0].endswith(".dist-info") and n.endswith("/LICENSE") for n in names)
    # nothing else lands in site-packages (a stray top-level `tests` or `bench` package)
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"colltrace", "colltrace.pth"}
    assert f"\nVersion: {colltrace.__version__}\n" in metadata
    assert "\nClassifier: License :: OSI Approved :: BSD License\n" in metadata


def test_the_sdist_holds_the_package_the_pth_hook_the_license_and_the_changelog(dists: tuple[Path, Path]) -> None:
    sdist, _ = dists
    prefix = f"colltrace-{colltrace.__version__}/"
    with tarfile.open(sdist) as t:
        names = {m.name.removeprefix(prefix) for m in t.getmembers() if m.isfile()}
    wanted = _package_files() | {"colltrace.pth", "LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml"}
    assert wanted - names == set()


def test_the_wheel_alone_in_a_clean_venv_runs_colltrace_version(dists: tuple[Path, Path], tmp_path: Path) -> None:
    """No torch, no orjson, no textual there (--no-deps): `--version` and the .pth hook must need none of them."""
    _, wheel = dists
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)  # this pip installs into it
    py, script = venv / "bin" / "python", venv / "bin" / "colltrace"
    pip = (sys.executable, "-m", "pip", "--python", py, "--disable-pip-version-check")
    _run(*pip, "install", "--no-deps", "--no-index", "-q", wheel, cwd=tmp_path)

    out = _run(script, "--version", cwd=tmp_path)
    assert out.stdout.strip() == f"colltrace {colltrace.__version__}"
    where = _run(py, "-c", "import colltrace; print(colltrace.__file__)", cwd=tmp_path).stdout.strip()
    assert Path(where).is_relative_to(venv), where  # the installed copy, not this checkout

    # the wheel's colltrace.pth starts the hook at interpreter start when COLLTRACE is set, and only then
    probe = "import sys; print('colltrace._startup' in sys.modules)"
    assert _run(py, "-c", probe, cwd=tmp_path).stdout.strip() == "False"
    traced = {**_env(), "COLLTRACE": "1", "COLLTRACE_DIR": str(tmp_path / "runs")}
    hooked = _run(py, "-c", probe, cwd=tmp_path, env=traced)
    assert hooked.stdout.strip() == "True" and hooked.stderr == ""
