"""The studies: each pre-registered question the project answers with loss comparisons, as data.

A study (`Study`) names its data set, its common pretraining (if any), its recipe, its variants, seeds and
endpoints, its pre-registration and its report; `STUDIES` registers them (one `Registry`, as losses and recipes
are), and `run_study(study, seeds=...)` runs one through the loss comparison's Python face. A new benchmark is one
module here that registers its studies, plus its entry in `STUDY_MODULES` below.

Modules: `study` (Study, STUDIES, run_study), `data` (the glyphs, the scenes), `pretraining` (one common `clip`
run, reused only under the same identity), `glyph_benchmark` and `clone_study` (the registered studies and their
summaries), `headroom` and `loss_table` (the glyphs' headroom calibration and the loss table in its frozen cell), `reassessment` (the clone study judged again from its per-run CSVs), `reports` (every committed
report written again from committed files), and the measurements beside them: `clone_signals`, `persistence` (the
clone signals' memory over steps), `learnability`, `traces`, `peers`, `siblings`. `python -m training.studies` is their command line (`cli`).

The top of the house: it imports the trainer (`training`) and the loss comparison (only through its face),
and nothing imports it.
"""

from importlib import import_module

from .study import STUDIES, Study, register_study, report_study, run_study

# The modules that register studies: importing them fills STUDIES.
STUDY_MODULES = ("glyph_benchmark", "headroom", "loss_table", "clone_study")


def load_studies() -> None:
    """Register every study of STUDY_MODULES (each module registers its own when first imported)."""
    for name in STUDY_MODULES:
        import_module(f"{__name__}.{name}")


__all__ = ["STUDIES", "STUDY_MODULES", "Study", "load_studies", "register_study", "report_study", "run_study"]
