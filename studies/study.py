"""A study as data, its registry, and how one runs: `run_study(study, seeds=...)` with Python values.

A `Study` is one comparison of a pre-registered question: the data set it trains on, the common pretraining its
runs fine-tune (if any), the recipe every run trains with, the loss variants in their registered order
(`LossVariant` values, as `loss_variants` parses them once), its seeds, its endpoints (named JSON blocks of its
pre-registration file) and the report each writes. A new benchmark is one module that builds its `Study` values
and adds them to `STUDIES` (the library's one `Registry` kind, as losses are added to theirs) and registers its
command (`studies.command`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from open_clip_adacl.registry import Registry

from .comparison import (
    QUICK,
    Budget,
    LossVariant,
    Preregistration,
    from_file,
    parse_loss_variants,
    rebuild_report,
    run_comparison,
)
from .data import DataSet
from .pretraining import Pretraining, pretrain

ROOT = (
    Path(__file__).resolve().parents[1]
)  # the repository the lab lives in: its docs/ hold the pre-registrations and reports


@dataclass(frozen=True)
class Study:
    """One comparison of a study: every variant on every seed, on one cell (data, start, recipe).

    `endpoints` name JSON blocks of `preregistration` (docs/preregistration*.md): the first is the study's
    own (its verdicts, in `report`), each other one is reported from the same runs beside it
    (`<report folder>/<endpoint>.md`). `budget` is the comparison's (its data sizes; `recipe` replaces its
    training flags)."""

    name: str
    data: DataSet
    recipe: Optional[str]
    variants: Tuple[LossVariant, ...]
    seeds: Tuple[int, ...]
    preregistration: Optional[str]
    endpoints: Tuple[str, ...]
    report: str
    pretraining: Optional[Pretraining] = None
    budget: Budget = QUICK

    def report_path(self, endpoint: Optional[str] = None) -> Path:
        """The report of `endpoint` (default: the study's own), relative to the repository or absolute."""
        path = Path(self.report)
        return path if endpoint in (None, *self.endpoints[:1]) else path.with_name(f"{endpoint}.md")

    def registration(self, endpoint: Optional[str] = None) -> Preregistration:
        """The registered endpoint, margin and reference of `endpoint` (default: the study's own), citing the
        file as the repository names it; without a pre-registration, the comparison's defaults."""
        if not self.preregistration:
            return Preregistration()
        name = endpoint or self.endpoints[0]
        found = from_file(f"{resolved(Path(self.preregistration))}#{name}")
        return replace(found, source=f"{self.preregistration}#{name}")


def _check_study(name: str, study: Study) -> None:
    if study.name != name:
        raise ValueError(f"study {study.name!r} registered as {name!r}: register it under its own name")
    if not study.variants or not all(isinstance(variant, LossVariant) for variant in study.variants):
        raise ValueError(f"study {name!r}: its variants are LossVariant values (loss_variants('clip', ...))")
    labels = labels_of(study)
    if len(set(labels)) != len(labels):
        raise ValueError(f"study {name!r} lists a variant twice: {labels}")


STUDIES: Registry[Study] = Registry("study", check=_check_study)


def register_study(study: Study) -> Study:
    return STUDIES.add(study.name, study)


def labels_of(study: Study) -> List[str]:
    """The labels of the study's variants, in the registered order (each variant's row in its report)."""
    return [variant.label for variant in study.variants]


def chosen_variants(study: Study, only: Optional[str]) -> List[LossVariant]:
    """The study's variants, or those of `only` (comma-separated; all must be among them), in the registered
    order."""
    if only is None:
        return list(study.variants)
    labels, wanted = labels_of(study), {variant.label for variant in parse_loss_variants(only)}
    if wanted - set(labels):
        raise ValueError(f"losses {sorted(wanted - set(labels))} are not variants of {study.name}: {labels}")
    return [variant for variant in study.variants if variant.label in wanted]


def study_budget(study: Study, output_root: Path, jobs: Optional[int], num_train: Optional[int]) -> Budget:
    """The study's budget under its recipe, fine-tuning its common pretraining when it has one."""
    budget = study.budget.with_recipe(study.recipe) if study.recipe else study.budget
    values: Dict[str, Any] = dict(budget.trainer_values)
    if study.pretraining is not None:
        values["pretrained"] = str(pretrain(study.pretraining, output_root))
    return replace(
        budget,
        trainer_values=values,
        **({"jobs": jobs} if jobs else {}),
        **({"num_train": num_train} if num_train else {}),
    )


def resolved(path: Path) -> Path:
    return path if path.is_absolute() else ROOT / path


def run_study(
    study: Study,
    seeds: Optional[Sequence[int]] = None,
    *,
    output_root: Path,
    results_dir: Optional[Path] = None,
    losses: Optional[str] = None,
    jobs: Optional[int] = None,
    command: str = "",
    echo=print,
) -> List[Dict[str, Any]]:
    """Run the study's comparison into <output_root>/<name> (finished runs reused), then write its reports
    (into `results_dir`, default the folder of `study.report`); returns the assessed outcomes of its runs."""
    inputs = study.data.comparison_data(output_root)
    num_train = inputs.own_data.data.num_train if inputs.own_data else None
    budget = study_budget(study, output_root, jobs, num_train)
    results_md = report_in(study, results_dir)
    outcomes = run_comparison(
        chosen_variants(study, losses),
        list(seeds if seeds is not None else study.seeds),
        budget,
        output_dir=output_root / study.name,
        results_md=results_md,
        data_dir=inputs.data_dir,
        data_seed=inputs.data_seed,
        command=command or f"run_study({study.name!r})",
        own_data=inputs.own_data,
        preregistration=study.registration(),
        echo=echo,
    )
    for endpoint in study.endpoints[1:]:
        report_study(study, output_root=output_root, results_dir=results_dir, endpoint=endpoint)
    return outcomes


def report_in(study: Study, results_dir: Optional[Path], endpoint: Optional[str] = None) -> Path:
    path = study.report_path(endpoint)
    folder = results_dir if results_dir is not None else resolved(path.parent)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / path.name


def report_study(
    study: Study,
    *,
    output_root: Path,
    results_dir: Optional[Path] = None,
    endpoint: Optional[str] = None,
    losses: Optional[str] = None,
) -> List[Dict[str, Any]]:
    """Write the report of `endpoint` (default: the study's own) again from the study's finished runs,
    training nothing; returns their outcomes."""
    outcomes, missing = rebuild_report(
        output_root / study.name,
        report_in(study, results_dir, endpoint),
        study.registration(endpoint),
        labels=losses and [variant.label for variant in parse_loss_variants(losses)],
    )
    if missing:
        print(f"{study.name}: no outcome yet of {len(missing)} run(s): {', '.join(missing)}")
    return outcomes
