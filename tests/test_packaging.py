"""The wheel holds gnndist and its three mapped sub-packages, and nothing else at top level."""
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def test_wheel_packages(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info",
                                                             "__pycache__", "runs", ".pytest_cache"))
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "wheel"), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    (whl,) = (tmp_path / "wheel").glob("gnndist-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"gnndist"}
    packages = {str(Path(n).parent).replace("/", ".") for n in names if n.endswith("__init__.py")}
    assert {"gnndist", "gnndist.partition", "gnndist.samplers", "gnndist.datasets"} <= packages
    assert all(p.startswith("gnndist") for p in packages)
    for must in ("gnndist/graph.py", "gnndist/partition/__init__.py", "gnndist/samplers/__init__.py",
                 "gnndist/datasets/registry.py"):
        assert must in names
    entry = [n for n in names if n.endswith("entry_points.txt")]
    assert "gnndist = gnndist.cli:main" in zipfile.ZipFile(whl).read(entry[0]).decode()
