"""The laboratory: every pre-registered question the project answers with loss comparisons, beside the product
and outside its wheel (as torchtitan keeps `experiments/`), run from the repository root: `python -m studies`.

It imports the product (`open_clip_adacl`, `training`) by public names only, and nothing in the product imports
it (tests/test_layout.py). Importing it registers its recipes into the trainer's recipe book (`recipes`). Its
floors, each importing only those below it and the product:

- `recipes`: the loss comparison's budgets and the studies' cells as trainer recipes; `glyphs/`: the glyph
  benchmark's data set (`python -m studies.glyphs --output DIR`);
- `comparison/`: the loss comparison, every variant trained and evaluated over seeds, one report
  (`python -m studies.comparison`); the rest of the lab uses it through its face only;
- `study` (`Study`, `STUDIES`, `run_study`), its `data` and common `pretraining`; `command` (`Command`,
  `COMMANDS`: one subcommand each, its options and the reports it writes from committed files) and `cli`
  (`python -m studies`, derived from `COMMANDS`);
- the studies, each one module declaring its `Study` values (cells, variants, seeds, endpoints, reports) and its
  `Command`: `glyph_benchmark`, `headroom`, `loss_table`, `clone_study`, `reassessment`; `reports` (every
  committed report written again from committed files, `redraw`);
- the measurements, each one module and its `Command`: `signal_precision` (how precisely each clone signal finds
  the families), `persistence`, `learnability`, `traces`, `peers`, `siblings`.

A new study or measurement is one module here: `load_lab` imports every module of this package, so its
registrations are found by the command line, the reports and the study list without a list to extend. Its
dependencies are the product's with the `[training]` and `[eval]` extras (requirements.txt).
"""

import pkgutil
from importlib import import_module

from . import recipes  # noqa: F401  (the lab's recipes, registered into the trainer's recipe book)
from .command import COMMANDS, Command, register_command
from .study import STUDIES, Study, register_study, report_study, run_study


def load_lab() -> None:
    """Import every module of the lab (not its subpackages, which register nothing), so that each registers its
    studies and its command."""
    for module in pkgutil.iter_modules(__path__):
        if not module.ispkg and module.name != "__main__":
            import_module(f"{__name__}.{module.name}")


__all__ = [
    "COMMANDS",
    "STUDIES",
    "Command",
    "Study",
    "load_lab",
    "register_command",
    "register_study",
    "report_study",
    "run_study",
]
