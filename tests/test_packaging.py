"""What `pip install .` puts into site-packages: only the project's own top-level names, so that
installing beside a cluster's stack never shadows another `evaluation` or `synthetic_scenes`, and none of the
laboratory (studies/ stays in the repository); the library's requirements are the few it imports, the trainer's
behind [training]; and `pip install -r requirements.txt` keeps the torch that stack has and a webdataset stock
open_clip_train runs with."""

import ast
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import List, Sequence

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def fresh_copy(target: Path) -> Path:
    """The repository's files as a fresh clone of this work tree holds them (tracked and new, not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in (name.decode() for name in listed if name):
        if (ROOT / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)
    return target


@pytest.mark.slow
def test_the_wheel_installs_only_open_clip_adacl_and_training_and_none_of_the_lab(tmp_path):
    # Build from a fresh copy of the whole repository (the lab beside src/ included), so that the build's own
    # directories stay out of the work tree and a lab a build could pick up is there to be picked up.
    source = fresh_copy(tmp_path / "source")
    assert (source / "studies" / "comparison" / "__init__.py").is_file()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--wheel-dir",
            str(tmp_path / "wheel"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
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
    assert "training/discover/page.html" in names  # the discovery page's template
    for tool in ("evaluation", "synthetic_scenes", "discover"):
        assert f"training/{tool}/__main__.py" in names
    # No study, no glyph generator, no loss comparison, no study recipe: the lab is not shipped.
    lab = [name for name in names if any(word in name for word in ("studies", "glyph", "comparison", "study"))]
    assert lab == []
    shipped_text = "".join(archive_text(wheel, name) for name in names if name.endswith((".py", ".txt")))
    assert "clone-scratch" not in shipped_text and "glyphs-pretrain" not in shipped_text
    assert "adacl-compare" not in shipped_text and "adacl-glyphs" not in shipped_text  # the lab's old console scripts


def archive_text(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(name).decode()


def installed_metadata(site: Path, name: str, version: str, requires=()) -> None:
    """A distribution's metadata as pip sees an installed one (name-version.dist-info/METADATA)."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        *(f"Requires-Dist: {r}" for r in requires),
    ]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    (info / "RECORD").write_text("")


def resolve_offline(
    requirements: Sequence[str], shadowing_site: Path, source: Path, find_links: str = ""
) -> subprocess.CompletedProcess:
    """pip's resolver, dry run and offline, for `pip install REQUIREMENTS` from `source` into this environment
    with `shadowing_site`'s distributions installed ahead of its own (as another stack's torch would be); the
    only index is the folder `find_links` (none by default)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(shadowing_site),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": find_links,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-build-isolation",
            "--report",
            str(source / "report.json"),
            *requirements,
        ],
        cwd=source,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.slow
def test_requirements_txt_keeps_the_torch_the_environment_has(tmp_path):
    # The environment holds another torch and its torchvision than constraints.txt pins (a cluster's stack).
    other_stack = tmp_path / "site"
    installed_metadata(other_stack, "torch", "2.5.1")
    installed_metadata(other_stack, "torchvision", "0.20.1", ["torch==2.5.1"])
    source = tmp_path / "source"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("setup.py", "requirements.txt", "constraints.txt"):
        shutil.copy(ROOT / name, source / name)

    result = resolve_offline(["-r", "requirements.txt"], other_stack, source)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((source / "report.json").read_text())
    assert [item["metadata"]["name"] for item in report["install"]] == ["open_clip_adacl"]

    # The tested pins, by contrast, would replace that torch: with constraints.txt the resolution fails offline
    # (pip would have to fetch torch 2.14.1), and it succeeds once the torch and torchvision pins are dropped.
    pinned = resolve_offline(["-r", "requirements.txt", "-c", "constraints.txt"], other_stack, source)
    assert pinned.returncode != 0 and "ResolutionImpossible" in pinned.stderr, pinned.stderr[-2000:]
    pins = (source / "constraints.txt").read_text().splitlines()
    (source / "other.txt").write_text("\n".join(line for line in pins if not line.startswith("torch")) + "\n")
    assert resolve_offline(["-r", "requirements.txt", "-c", "other.txt"], other_stack, source).returncode == 0


def setup_value(name: str):
    """A literal of setup.py (INSTALL_REQUIRES, EXTRAS_REQUIRE), read without running setup()."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    [value] = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name
    ]
    return ast.literal_eval(value)


def install_requires() -> List[Requirement]:
    return [Requirement(text) for text in setup_value("INSTALL_REQUIRES")]


def training_extra() -> List[Requirement]:
    return [Requirement(text) for text in setup_value("EXTRAS_REQUIRE")["training"]]


@pytest.mark.slow
def test_the_library_requires_only_what_it_imports_and_the_trainer_its_extra():
    """`pip install open_clip_adacl` brings the loss library (torch and the open_clip it extends); the trainer's
    own dependencies are its [training] extra, as OpenCLIP keeps open_clip_train's, and `import open_clip_adacl`
    with `create_loss` loads none of them."""
    assert sorted(requirement.name for requirement in install_requires()) == ["open_clip_torch", "torch"]
    extra = {requirement.name for requirement in training_extra()}
    assert {"webdataset", "pandas", "tensorboard", "braceexpand", "pillow"} <= extra
    check = (
        "import sys; from open_clip_adacl import create_loss; create_loss('adacl'); "
        "print(sorted({'webdataset', 'pandas', 'tensorboard', 'braceexpand', 'open_clip_train'} & set(sys.modules)))"
    )
    loaded = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300)
    assert loaded.stdout.strip() == "[]", loaded.stderr[-2000:]


def requirement_of(requirements: Sequence[Requirement], name: str) -> Requirement:
    [requirement] = [requirement for requirement in requirements if requirement.name == name]
    return requirement


# webdataset releases around the ones that matter: 0.2.86 (the newest open_clip_torch[training] accepts), 0.2.96
# and 1.0.x (stock open_clip_train's tar pipeline dies there with KeyError: 'fname').
WEBDATASET_RELEASES = ("0.2.5", "0.2.79", "0.2.86", "0.2.88", "0.2.90", "0.2.96", "0.2.100", "1.0.0", "1.0.2")


def test_the_webdataset_range_is_one_stock_open_clip_train_runs_with():
    ours = requirement_of(training_extra(), "webdataset")
    open_clip_training = [
        Requirement(text)
        for text in importlib.metadata.requires("open_clip_torch")
        if "training" in text.split(";", 1)[-1]
    ]
    theirs = requirement_of(open_clip_training, "webdataset")
    allowed = [version for version in WEBDATASET_RELEASES if ours.specifier.contains(version)]
    assert allowed == ["0.2.86"]
    assert all(theirs.specifier.contains(version) for version in allowed), (str(ours), str(theirs))
    assert ours.specifier.contains(importlib.metadata.version("webdataset"))
    # The README states the range setup.py holds.
    readme = (ROOT / "README.md").read_text()
    assert f"`{ours}`" in readme and "`webdataset>=0.2.86`" not in readme


def metadata_wheel(folder: Path, name: str, version: str) -> Path:
    """A wheel holding only `name` `version`'s metadata: what pip's resolver reads from an index."""
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr(f"{info}/RECORD", "")
    return wheel


@pytest.mark.slow
def test_requirements_txt_replaces_a_webdataset_1_by_the_one_open_clip_train_runs_with(tmp_path):
    # The environment holds webdataset 1.0.2 (what pip picks for an open range); the index offers 0.2.86 and 1.0.2.
    other_stack = tmp_path / "site"
    installed_metadata(other_stack, "webdataset", "1.0.2")
    index = tmp_path / "index"
    index.mkdir()
    for version in ("0.2.86", "1.0.2"):
        metadata_wheel(index, "webdataset", version)
    source = tmp_path / "source"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("setup.py", "requirements.txt"):
        shutil.copy(ROOT / name, source / name)

    result = resolve_offline(["-r", "requirements.txt"], other_stack, source, find_links=str(index))
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((source / "report.json").read_text())
    installed = {item["metadata"]["name"]: item["metadata"]["version"] for item in report["install"]}
    assert installed == {"open_clip_adacl": "0.1.0", "webdataset": "0.2.86"}


# `python -m TOOL --help` in an environment without PACKAGE (`pip install -e .`, the extras left out): an import of
# it fails as it would there.
WITHOUT_PACKAGE = (
    "import runpy, sys; sys.modules[sys.argv[2]] = None; sys.argv = [sys.argv[1], '--help']; "
    "runpy.run_module(sys.argv[0], run_name='__main__')"
)


def run_without(tool, package):
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_PACKAGE, tool, package], capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_evaluation_without_its_extra_is_one_line_naming_the_extra():
    result = run_without("training.evaluation", "clip_benchmark")
    assert (result.returncode, result.stdout) == (2, ""), result.stderr[-2000:]
    assert result.stderr == (
        "error: python -m training.evaluation needs clip_benchmark, part of the [eval] extra: pip "
        "install 'open_clip_adacl[eval]' (from the repository: pip install -r requirements.txt)\n"
    )
    # the console script starts where the command does
    assert '"adacl-evaluate=training.evaluation.__main__:cli"' in (ROOT / "setup.py").read_text()


@pytest.mark.slow
def test_the_trainer_without_its_extra_is_one_line_naming_the_extra():
    package = "webdataset"
    result = run_without("training.main", package)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr[-2000:]
    assert result.stderr == (
        f"error: python -m training.main needs {package}, part of the [training] extra: pip "
        "install 'open_clip_adacl[training]' (from the repository: pip install -r requirements.txt)\n"
    )
