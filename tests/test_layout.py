"""The packages under src/ (the product) depend on each other one way, each layer of the trainer imports only the
layers below it, the laboratory (studies/, beside src/) imports the product and is never imported by it, and each
command-line package runs as `python -m`.

open_clip_adacl (the library) <- training.trainer's foundations (flags, distributed, preemption, progress, timing)
<- training.trainer.data, training.trainer.run_folder <- training.trainer.engine <- training.trainer.launch
<- training.main (and `training` itself) <- the tools: training.export, training.torchrun, training.evaluation,
training.synthetic_scenes, training.discover. The lab, outside the wheel, on top of them all: studies.recipes,
studies.glyphs and studies.icons <- studies.comparison <- studies (its studies and measurements, which reach the loss comparison
only through its face). Checkpoints are read in one place; no name private to one package (`_x`) is imported into
or out of the lab, and no test loads a file by its path.
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
LAB = ROOT / "studies"
LIBRARY = "open_clip_adacl"
FOUNDATIONS = "training.trainer"  # its modules flags, distributed, preemption, progress (and the package's face)
DATA, RUN_FOLDER = "training.trainer.data", "training.trainer.run_folder"
ENGINE, LAUNCH = "training.trainer.engine", "training.trainer.launch"
ENTRY = "training"  # training.main and the package's face (`from training import run`)
TRAINER = (FOUNDATIONS, DATA, RUN_FOLDER, ENGINE, LAUNCH)
# What each part may import of the others (lazy imports inside functions count too). The trainer's layers from the
# bottom up: each may import the ones below it, never one above (data and the run folder stand side by side).
ALLOWED = {
    LIBRARY: set(),
    FOUNDATIONS: {LIBRARY},
    DATA: {LIBRARY, FOUNDATIONS},
    RUN_FOLDER: {LIBRARY, FOUNDATIONS},
    ENGINE: {LIBRARY, FOUNDATIONS, DATA, RUN_FOLDER},
    LAUNCH: {LIBRARY, FOUNDATIONS, DATA, RUN_FOLDER, ENGINE},
    ENTRY: {LIBRARY, *TRAINER},
    "training.export": {LIBRARY, *TRAINER},
    "training.torchrun": {LIBRARY, *TRAINER},
    "training.evaluation": {LIBRARY, *TRAINER, "training.export"},
    "training.synthetic_scenes": {LIBRARY, *TRAINER},
    "training.discover": {LIBRARY, *TRAINER, "training.export"},
}
PRODUCT = set(ALLOWED)
# The lab's floors, each on the whole product and the floors below it.
LAB_RECIPES, GLYPHS, ICONS = "studies.recipes", "studies.glyphs", "studies.icons"
COMPARISON, STUDIES = "studies.comparison", "studies"
ALLOWED.update(
    {
        LAB_RECIPES: PRODUCT,
        GLYPHS: PRODUCT,
        ICONS: PRODUCT,
        COMPARISON: PRODUCT | {LAB_RECIPES},
        STUDIES: PRODUCT | {LAB_RECIPES, GLYPHS, ICONS, COMPARISON},
    }
)
# src/training lists the entry point, the trainer's layers (one package) and the tools, each a command.
TOP_LEVEL = {
    "__init__.py",
    "main.py",
    "trainer",
    "export.py",
    "torchrun.py",
    "evaluation",
    "synthetic_scenes",
    "discover",
}


def part_of(module: str) -> str:
    """The part of the house a dotted module name belongs to ("training.trainer.data.loader" -> DATA), the
    longest part name that it is or that it starts with."""
    parts = [part for part in ALLOWED if module == part or module.startswith(part + ".")]
    return max(parts, key=len) if parts else module.split(".")[0]


def module_name(path: Path) -> str:
    """The dotted name of a module of the product (under src/) or of the lab (studies/, under the root)."""
    parts = path.relative_to(ROOT if LAB in path.parents else SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def house_files() -> list:
    """Every module of the product and of the lab."""
    return [*sorted(SRC.rglob("*.py")), *sorted(LAB.rglob("*.py"))]


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
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1]
                    + ([node.module] if node.module else [])
                )
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from training import evaluation`
    return {part_of(name) for name in names}


def test_only_two_top_level_packages_under_src():
    assert {path.parent.name for path in SRC.glob("*/__init__.py")} == {"open_clip_adacl", "training"}


def test_the_trainer_folder_lists_its_entry_point_its_layers_and_its_tools():
    """Eight entries in src/training, each a command, the package's face or the package of the trainer's layers; a
    new module goes into the layer it belongs to, a new study, benchmark or study data set into the lab, studies/
    (docs/architecture.md)."""
    listed = {path.name for path in (SRC / "training").iterdir() if path.name != "__pycache__"}
    assert listed == TOP_LEVEL and len(listed) <= 8


def test_the_layers_are_a_ladder():
    """No two parts may import each other, even through a third: the allowed imports form no circle."""
    reached = {part: set(allowed) for part, allowed in ALLOWED.items()}
    for _ in ALLOWED:
        reached = {part: below | {deeper for b in below for deeper in reached[b]} for part, below in reached.items()}
    assert [part for part in ALLOWED if part in reached[part]] == []
    assert [part for part in ALLOWED if part_of(part) != part] == []


def test_every_module_is_in_a_part():
    """Every module under src/ and studies/ belongs to a part that the rules above name (a new top-level module or
    layer package of the trainer needs its place in ALLOWED first)."""
    unplaced = [str(path.relative_to(ROOT)) for path in house_files() if part_of(module_name(path)) not in ALLOWED]
    assert unplaced == []


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_dependencies_point_one_way(part):
    forbidden = set(ALLOWED) - ALLOWED[part] - {part}
    files = [path for path in house_files() if part_of(module_name(path)) == part]
    assert files
    wrong = {str(path.relative_to(ROOT)): sorted(imported_parts(path) & forbidden) for path in files}
    assert {path: names for path, names in wrong.items() if names} == {}


def test_nothing_in_the_product_imports_the_lab():
    """The wall: no module under src/ imports `studies` or a module of it, even lazily inside a function, so the
    wheel, which holds no lab, runs whole."""
    reaching = {
        str(path.relative_to(ROOT)): sorted(part for part in imported_parts(path) if part.split(".")[0] == "studies")
        for path in sorted(SRC.rglob("*.py"))
    }
    assert {path: parts for path, parts in reaching.items() if parts} == {}


def torch_load_calls(path: Path) -> list:
    """The lines of `path` that call torch.load (as `torch.load(...)`, or `load` imported from torch)."""
    tree = ast.parse(path.read_text())
    loads = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in ("torch", "torch.serialization")
        for alias in node.names
        if alias.name == "load"
    }
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr == "load"
                and isinstance(func.value, ast.Name)
                and func.value.id == "torch"
            ) or (isinstance(func, ast.Name) and func.id in loads):
                lines.append(node.lineno)
    return lines


def test_every_checkpoint_read_goes_through_checkpoint_files():
    """Only training.trainer.run_folder.checkpoint_files calls torch.load: every other reader takes its
    `load_checkpoint` (weights_only, the content digest checked, an earlier layout converted)."""
    readers = {str(path.relative_to(SRC)): torch_load_calls(path) for path in sorted(SRC.rglob("*.py"))}
    assert [str(path.relative_to(ROOT)) for path in LAB.rglob("*.py") if torch_load_calls(path)] == []
    assert {path: lines for path, lines in readers.items() if lines} == {
        "training/trainer/run_folder/checkpoint_files.py": readers["training/trainer/run_folder/checkpoint_files.py"]
    }
    assert len(readers["training/trainer/run_folder/checkpoint_files.py"]) == 2  # load_checkpoint, checkpoint_step


# Words retired from src/ (docs/architecture.md, Glossary): each pattern, and what to write instead.
RETIRED_WORDS = {
    r"(?i)\bregimes?\b": "a study's *cell*; for how ranks hold the similarities, full logits / local_loss",
    r"\bopen_clip_adacl\.adacl\b|\bfrom (\.\.?|open_clip_adacl) import (\w+, )*adacl\b": "the AdaCL math module is "
    "open_clip_adacl.adacl_math",
}


def test_no_retired_word_is_left_in_src():
    """One meaning per word: a word the glossary retired appears nowhere under src/ or in the lab (code,
    docstrings, help)."""
    import re

    found = [
        f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r} ({instead})"
        for path in house_files()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        for pattern, instead in RETIRED_WORDS.items()
        for match in [re.search(pattern, line)]
        if match
    ]
    assert found == []


# "record" had five meanings; each has its own word now (docs/architecture.md, Glossary), and the verb alone
# stays ("the run records its arguments", `recorded_args`). Each retired name, and what to write instead.
RETIRED_RECORD_NAMES = {
    r"\.records\(\)|\bloss_record_path\b|\bLossRecords\b|\bkeep_loss_records\b": "a loss's JSON file is a journal: "
    "Loss.journals(), RunDir.loss_journal_path, launch.folder.LossJournals",
    r"\brun_folder\.records\b|\btrim_to_resume_point\b|\bdrop_records_after\b|\bset_aside_earlier_records\b": "the "
    "cut back at a resume is run_folder.rewind (rewind_to, set_aside_earlier_launch, logger.drop_lines_after)",
    r"\bread_records\b|\bbatch_records\b": "a JSON-lines line is a line: layout.read_json_lines",
    r"\bconfig_from_record\b|\.record\b": "RunSummary.run_folder (the RunDir), params.config_from_recorded_args",
    r"\brecords?\b\s*(?:=(?!=)|\[)|\bfor records? in\b|\w+_records?\b|\brecords?_\w+|(?<!logging\.)\b[A-Z]\w*Records?\b": "a "
    "name for what it holds: a line (JSON lines), a sample (a shard's dict), a journal (a loss's JSON)",
}


def test_no_retired_record_name_is_left_in_src():
    """One meaning per word: none of the five old uses of "record" is named so in src/ or the lab any more."""
    import re

    found = [
        f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r} ({instead})"
        for path in house_files()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        for pattern, instead in RETIRED_RECORD_NAMES.items()
        for match in [re.search(pattern, line)]
        if match
    ]
    assert found == []
    assert re.search(list(RETIRED_RECORD_NAMES)[-1], "for record in rows:")  # the patterns still match an old use


# (`python -m studies.comparison` runs in the loss comparison's job tests, every job being such a process, and
# `python -m training.discover` in its own tests.) The lab's commands run from the repository root, as its docs say.
@pytest.mark.slow
@pytest.mark.parametrize(
    "package", ["training.synthetic_scenes", "training.evaluation", "studies", "studies.glyphs", "studies.icons"]
)
def test_each_command_line_package_runs_as_a_module(package):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-m", package, "--help"], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith(f"usage: python -m {package}")


def test_no_tool_declares_a_flag_of_the_trainer_again():
    """A tool takes the trainer's flags with `training.trainer.launch.tool_flags.add_trainer_flags` (their names,
    help, types and choices as the trainer declares them) and never types one in an `add_argument` of its own."""
    import re

    from training.trainer.launch.params import build_parser

    trainer_flags = {option for action in build_parser()._actions for option in action.option_strings}
    trainer_flags -= {"-h", "--help"}
    repeated = []
    for path in [*house_files(), *(ROOT / "scripts").rglob("*.py")]:
        if path.relative_to(SRC.parent).as_posix() in (
            "src/training/trainer/launch/params.py",
            "src/training/trainer/flags.py",
            "src/training/trainer/launch/tool_flags.py",
            # The library's plug-in for stock open_clip_train cannot import the trainer (the layers above), and its
            # --loss means "stock's own loss" when not given; its loss option flags come from open_clip_adacl.losses.flags.
            "src/open_clip_adacl/integrations/open_clip_train.py",
        ):
            continue  # the trainer's own declarations, and how a tool mounts them
        for match in re.finditer(r'add_argument\(\s*f?["\'](--[A-Za-z0-9-]+)["\']', path.read_text()):
            if match.group(1) in trainer_flags:
                repeated.append(f"{path.relative_to(SRC.parent)}: {match.group(1)}")
    assert repeated == []


@pytest.mark.slow
def test_training_exports_its_public_face_from_the_layers_that_define_it():
    """`from training import Trainer, RunConfig, RunDir, ...` gives the defining layer's object, in a fresh
    process (no import circle: each name imports only its own layer and those below)."""
    import importlib

    import training

    for name, module in training.PUBLIC_FACE.items():
        assert getattr(training, name) is getattr(importlib.import_module(module, "training"), name), name
    assert set(training.__all__) >= {
        "run",
        "Trainer",
        "RunConfig",
        "RunDir",
        "ConfigError",
        "LOSSES",
        "SCHEDULES",
        "SOURCES",
        "RECIPES",
    }
    assert "adacl" in training.LOSSES and "cosine" in training.SCHEDULES and "webdataset" in training.SOURCES
    assert issubclass(training.ConfigError, ValueError) and "demo" in training.RECIPES
    with pytest.raises(AttributeError, match="has no attribute 'Trainr'"):
        training.Trainr
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    for first in ("Trainer", "RunDir, SOURCES, LOSSES", "*"):  # the deepest layer first, then the light ones alone
        fresh = subprocess.run(
            [sys.executable, "-c", f"from training import {first}"],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert fresh.returncode == 0, (first, fresh.stderr[-2000:])


def test_training_run_is_the_trainers_run_and_import_training_stays_light():
    """`from training import run` is `training.main.run`; `import training` alone (which every `python -m
    training.<module>` does first) does not import the trainer's entry point, torch or open_clip."""
    from training import run
    from training.main import run as main_run

    assert run is main_run
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, training; print(sorted({'training.main', 'torch', 'open_clip'} & set(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert loaded.stdout.strip() == "[]", loaded.stderr[-2000:]


def resolved_imports(path: Path) -> list:
    """(module, name) for each name `path` imports with `from <module> import name`, a relative module (in src/
    or the lab) resolved."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module
            if node.level and SRC not in path.parents and LAB not in path.parents:
                continue  # a test's own helpers (tests/helpers), in no package of the house
            if node.level:
                package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
                above = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(above + ([node.module] if node.module else []))
            found += [(base, alias.name) for alias in node.names]
    return found


def test_the_studies_use_the_loss_comparison_only_through_its_face():
    """The lab's studies and measurements import `from studies.comparison import <a name of its PUBLIC_FACE>` (or
    `from .comparison import ...`), never one of its modules: what a study may rely on is one list, which the
    comparison keeps working."""
    from studies.comparison import PUBLIC_FACE

    found = [
        f"{path.relative_to(ROOT)}: {module}.{name}"
        for path in sorted(LAB.rglob("*.py"))
        if part_of(module_name(path)) == STUDIES
        for module, name in resolved_imports(path)
        if part_of(module) == COMPARISON and (module != COMPARISON or name not in PUBLIC_FACE)
    ]
    assert found == []


def test_no_private_name_crosses_into_or_out_of_the_lab():
    """No module or test imports a `_name` of the lab from outside it, and the lab imports none from the product
    (it reaches the product through its public names)."""
    in_lab = {"studies", LAB_RECIPES, GLYPHS, ICONS, COMPARISON}
    crossing = [
        f"{path.relative_to(ROOT)}: {module}.{name}"
        for path in [*house_files(), *sorted((ROOT / "tests").rglob("*.py"))]
        for module, name in resolved_imports(path)
        if name.startswith("_") and (part_of(module) in in_lab) != (LAB in path.parents)
    ]
    assert crossing == []


def test_no_test_loads_a_file_by_its_path():
    """Tests import modules by name (the package's, or a benchmark script's with scripts/ on the path as when it
    runs: tests/helpers/bench_scripts.py), never load a file by path, which would skip the layout's rules."""
    loaders = ("spec_from_file_location", "run_path", "SourceFileLoader")
    found = [
        f"{path.relative_to(SRC.parent)}: {loader}"
        for path in sorted((SRC.parent / "tests").rglob("*.py"))
        if path.name != "test_layout.py"
        for loader in loaders
        if loader in path.read_text()
    ]
    assert found == []


# Folders under tests/ that hold what tests share, not the tests of one package.
TEST_SUPPORT = {"helpers", "fixtures"}


def test_the_tests_mirror_src():
    """tests/ is laid out like src/ and the lab: each folder of tests (tests/training/trainer/engine/,
    tests/studies/comparison/) tests the package of the same path under src/ (src/training/trainer/engine/) or under
    the root (studies/comparison/), so a package's tests are found where the package is."""
    tests = Path(__file__).resolve().parent
    folders = sorted({path.parent.relative_to(tests) for path in tests.rglob("test_*.py")} - {Path(".")})
    folders = [folder for folder in folders if not TEST_SUPPORT & set(folder.parts)]
    assert Path("training/trainer/engine") in folders
    assert Path("studies/comparison") in folders
    unmatched = [folder for folder in folders if not (SRC / folder / "__init__.py").is_file()]
    assert [
        str(folder)
        for folder in unmatched
        if not (folder.parts[0] == "studies" and (ROOT / folder / "__init__.py").is_file())
    ] == []


def test_scripts_holds_the_benchmarks_and_launchers_only():
    """A study's driver is a module of the lab, studies/ (docs/architecture.md); scripts/ keeps the speed and memory
    benchmarks, the demo, the glyph data's installer, the launch recipes and the test runner."""
    scripts = SRC.parent / "scripts"
    # step_costs.py: the counter of ops, host waits and N x N passes that bench_costs.py and a test share
    kept = {"demo.sh", "glyph_data.sh", "gpu_bench.sh", "launch", "setup_env.sh", "step_costs.py", "test.sh"}
    listed = {path.name for path in scripts.iterdir() if path.name != "__pycache__"}
    assert sorted(name for name in listed - kept if not (name.startswith("bench_") and name.endswith(".py"))) == []
