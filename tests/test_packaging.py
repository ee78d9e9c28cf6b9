"""What `pip install .` puts into site-packages: only the project's own top-level names, so that
installing beside a cluster's stack never shadows another `evaluation` or `synthetic_scenes`."""
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_installs_only_open_clip_adacl_and_training(tmp_path):
    # Build from a copy, so that the build's own directories stay out of the work tree.
    source = tmp_path / "source"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(ROOT / "setup.py", source / "setup.py")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                             "--wheel-dir", str(tmp_path / "wheel"), str(source)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    [wheel] = (tmp_path / "wheel").glob("open_clip_adacl-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        [top_level] = [name for name in names if name.endswith(".dist-info/top_level.txt")]
        declared = set(archive.read(top_level).decode().split())
    shipped = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert declared == shipped == {"open_clip_adacl", "training"}
    # The model configs travel with the library, and the tools with the trainer.
    assert "open_clip_adacl/model_configs/adacl-tiny.json" in names
    for tool in ("evaluation", "synthetic_scenes", "loss_comparison", "discover"):
        assert f"training/{tool}/__main__.py" in names
