"""The packages under src/ depend on each other one way, and each command-line package runs as `python -m`.

open_clip_adacl (the library) <- the trainer (`training`, but its tools) <- training.evaluation,
training.synthetic_scenes, training.glyphs, training.discover <- training.loss_comparison.
"""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
TRAINER = "training"
TOOLS = ("training.evaluation", "training.synthetic_scenes", "training.glyphs", "training.discover",
         "training.loss_comparison")
# What each part may import of the others (lazy imports inside functions count too).
ALLOWED = {
    "open_clip_adacl": set(),
    TRAINER: {"open_clip_adacl"},
    "training.evaluation": {"open_clip_adacl", TRAINER},
    "training.synthetic_scenes": {"open_clip_adacl", TRAINER},
    "training.glyphs": {"open_clip_adacl", TRAINER},
    "training.discover": {"open_clip_adacl", TRAINER},
    "training.loss_comparison": {"open_clip_adacl", TRAINER, "training.evaluation", "training.synthetic_scenes"},
}


def part_of(module: str) -> str:
    """The part of the house a dotted module name belongs to ("training.data.loader" -> "training")."""
    for tool in TOOLS:
        if module == tool or module.startswith(tool + "."):
            return tool
    return module.split(".")[0]


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_parts(path: Path) -> set:
    """The parts `path` imports, absolutely or relatively."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module
            else:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from training import evaluation`
    return {part_of(name) for name in names}


def test_only_two_top_level_packages_under_src():
    assert {path.parent.name for path in SRC.glob("*/__init__.py")} == {"open_clip_adacl", "training"}


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_dependencies_point_one_way(part):
    forbidden = set(ALLOWED) - ALLOWED[part] - {part}
    files = [path for path in sorted(SRC.rglob("*.py")) if part_of(module_name(path)) == part]
    assert files
    wrong = {str(path.relative_to(SRC)): sorted(imported_parts(path) & forbidden) for path in files}
    assert {path: names for path, names in wrong.items() if names} == {}


# (`python -m training.loss_comparison` runs in the loss comparison's job tests, every job being such a
# process, and `python -m training.discover` in its own tests.)
@pytest.mark.parametrize("package", ["training.synthetic_scenes", "training.glyphs", "training.evaluation"])
def test_each_command_line_package_runs_as_a_module(package):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", package, "--help"], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith(f"usage: python -m {package}")


def test_no_tool_declares_a_flag_of_the_trainer_again():
    """A tool takes the trainer's flags with `training.tool_flags.add_trainer_flags` (their names, help, types and
    choices as the trainer declares them) and never types one in an `add_argument` of its own."""
    import re

    from training.params import build_parser

    trainer_flags = {option for action in build_parser()._actions for option in action.option_strings}
    trainer_flags -= {"-h", "--help"}
    repeated = []
    for path in [*SRC.rglob("*.py"), *(SRC.parent / "scripts").rglob("*.py")]:
        if path.parent.name == "training" and path.name in ("params.py", "flags.py", "tool_flags.py"):
            continue  # the trainer's own declarations, and how a tool mounts them
        for match in re.finditer(r'add_argument\(\s*f?["\'](--[A-Za-z0-9-]+)["\']', path.read_text()):
            if match.group(1) in trainer_flags:
                repeated.append(f"{path.relative_to(SRC.parent)}: {match.group(1)}")
    assert repeated == []


def test_training_run_is_the_trainers_run_and_import_training_stays_light():
    """`from training import run` is `training.main.run`; `import training` alone (which every `python -m
    training.<module>` does first) does not import the trainer's entry point, torch or open_clip."""
    from training import run
    from training.main import run as main_run

    assert run is main_run
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    loaded = subprocess.run([sys.executable, "-c", "import sys, training; print(sorted({'training.main', 'torch', "
                             "'open_clip'} & set(sys.modules)))"], capture_output=True, text=True, env=env, timeout=60)
    assert loaded.stdout.strip() == "[]", loaded.stderr[-2000:]
