"""One-edit clones of a scene's description, and the training families of one-edit siblings.

A *clone* caption changes exactly one detail of a description (one object's colour, shape or size,
or the relation: reversed, or the first two objects swapped) and is checked never to describe the
image (`scenes.could_hold`). Training scenes come in *families* (`sample_family`): a base scene plus
`family_size - 1` (default 7) siblings re-drawn from one-edit clones of its description, written
next to each other; `--train-group-size` keeps them together through the shuffle, so a training
batch holds whole families of captions one attribute apart (docs/data.md; how many siblings a
batch really holds: `training.synthetic_scenes.families`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

import numpy as np

from .captions import caption
from .scenes import (
    COLORS,
    OPPOSITE_RELATION,
    SHAPES,
    SIZES,
    Description,
    Scene,
    SceneConfig,
    could_hold,
    description_allowed,
    place_objects,
    sample_scene,
)

EDIT_TYPES = ("color", "shape", "size", "relation")


def edit_description(scene: Scene, edit_type: str, rng: np.random.Generator) -> Description:
    """A one-edit clone of the scene's description that is clearly false of the image.

    color / shape / size: one object's attribute takes another value (possibly another object's,
    which tests attribute binding); relation: reversed ("left of" -> "right of") or the two
    related objects swapped. Candidates are tried in random order; the first one that
    `could_hold` rejects is returned.
    """
    description = scene.description
    candidates = list(_edit_candidates(description, edit_type))
    for index in rng.permutation(len(candidates)):
        if not could_hold(scene, candidates[index]):
            return candidates[index]
    raise ValueError(f"no {edit_type!r} clone of {caption(description)!r} is false of its image")


def edit_caption(scene: Scene, edit_type: str, rng: np.random.Generator) -> str:
    """`caption(edit_description(scene, edit_type, rng))`: a clone caption never true of the image."""
    return caption(edit_description(scene, edit_type, rng))


def _edit_candidates(description: Description, edit_type: str) -> Iterator[Description]:
    """Every description differing from `description` by exactly one edit of `edit_type`."""
    if edit_type == "relation":
        first, second, *rest = description.objects
        yield replace(description, relation=OPPOSITE_RELATION[description.relation])
        yield replace(description, objects=(second, first, *rest))
        return
    if edit_type not in ("color", "shape", "size"):
        raise ValueError(f"unknown edit type {edit_type!r}; expected one of {EDIT_TYPES}")
    values = {"color": tuple(COLORS), "shape": SHAPES, "size": SIZES}[edit_type]
    for position, spec in enumerate(description.objects):
        for value in values:
            if value != getattr(spec, edit_type):
                objects = list(description.objects)
                objects[position] = replace(spec, **{edit_type: value})
                yield replace(description, objects=tuple(objects))


def family_edit(base: Description, sibling: Description) -> str | None:
    """The edit type that turns `base` into its one-edit `sibling` (None when they are equal)."""
    if base == sibling:
        return None
    if base.relation != sibling.relation or set(base.objects) == set(sibling.objects):
        return "relation"  # reversed, or the first two objects swapped
    ((old, new),) = [(a, b) for a, b in zip(base.objects, sibling.objects) if a != b]
    (edit,) = [name for name in ("size", "color", "shape") if getattr(old, name) != getattr(new, name)]
    return edit


def sample_family(rng: np.random.Generator, config: SceneConfig) -> list[Scene]:
    """A base scene and `family_size - 1` siblings, each re-drawn from a one-edit clone of the base.

    Siblings keep the scene invariants of distinct shapes (a shape edit to another object's
    shape is re-drawn) and of the config's colour-shape combinations, and never repeat a description. At most one sibling has the relation
    edit: two would carry equivalent captions ("A right of B", "B left of A"), which would be
    false negatives of each other rather than clones.
    """
    base = sample_scene(rng, config)
    family = [base]
    edit_types = list(EDIT_TYPES)
    while len(family) < config.family_size:
        edit_type = str(rng.choice(edit_types))
        clone = edit_description(base, edit_type, rng)
        distinct_shapes = len({spec.shape for spec in clone.objects}) == len(clone.objects)
        if (
            not distinct_shapes
            or not description_allowed(clone, config.combinations)
            or any(member.description == clone for member in family)
        ):
            continue
        sibling = place_objects(clone, rng, config)
        if sibling is not None:
            family.append(sibling)
            if edit_type == "relation":
                edit_types.remove("relation")
    return family
