"""The captions of a scene: the gold caption and its paraphrases, a generic pseudo caption, and how
alike a training split's captions are.

The gold caption names every object and the relation (`caption`); `paraphrases` are two other true
captions. Each sample also carries a *pseudo* caption from a generic captioner (`pseudo_caption`),
for the paper's pseudo-caption setting: siblings that differ in a size or the relation share it
exactly. `caption_likeness` measures this for the manifest (docs/data.md).
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

import numpy as np

from .scenes import OPPOSITE_RELATION, Description, Scene

PSEUDO_CAPTION_KEY = "txt_pseudo"  # tar member / --caption-key field of the pseudo caption
CAPTION_KEYS = ("txt", "txt_alt", PSEUDO_CAPTION_KEY)


def caption(description: Description) -> str:
    """The canonical caption: "a large red circle to the left of a small blue square[ and a ...]"."""
    first, second, *rest = description.objects
    text = f"{first.phrase()} {description.relation} {second.phrase()}"
    return text + "".join(f" and {spec.phrase()}" for spec in rest)


def paraphrases(description: Description) -> tuple[str, str]:
    """Two other true captions: the converse ("B [and C] to the right of A") and "there is ..."."""
    first, *others = description.objects
    subjects = " and ".join(spec.phrase() for spec in others)
    converse = f"{subjects} {OPPOSITE_RELATION[description.relation]} {first.phrase()}"
    return converse, "there is " + caption(description)


# Of each pair of converse relations, the one a fact is stated with ("B below A" is stated "A above B").
_STATED_RELATIONS = ("to the left of", "above")


def facts(description: Description) -> list[str]:
    """What the description says, one fact per (first object, other object), each stated one way ("a large red
    circle above a small blue square", never its converse), sorted: two descriptions with the same facts say
    the same thing in other words ("A below B" and "B above A"), whatever their families."""
    first, *others = description.objects
    stated = []
    for other in others:
        if description.relation in _STATED_RELATIONS:
            stated.append(f"{first.phrase()} {description.relation} {other.phrase()}")
        else:
            stated.append(f"{other.phrase()} {OPPOSITE_RELATION[description.relation]} {first.phrase()}")
    return sorted(stated)


def pseudo_caption(description: Description) -> str:
    """A generic captioner's caption, one rule for every image: each object by its colour and its
    shape, joined by "and": "a red circle and an orange square".

    True of the image but generic, like the pseudo captions of the paper's weakly supervised setting:
    it never names a size or the relation, so one-edit siblings that differ only in those share their
    caption exactly (clone negatives that are also false negatives). Its words are the gold
    captions' own, so a model trained on it can be evaluated on gold captions. The manifest measures
    how alike it makes a family's captions (`caption_likeness`; docs/data.md).
    """
    return " and ".join(
        f"{'an' if spec.color[0] in 'aeiou' else 'a'} {spec.color} {spec.shape}" for spec in description.objects
    )


# ---------------------------------------------------------------------------------------------
# How alike the captions of a split and of its families are


def family_duplicate_rate(families: Iterable[Sequence[str]]) -> float:
    """The fraction of within-family caption pairs that are exactly equal (false negatives in a batch).

    families: each family's captions, one per member. 0.0 when no family has two members.
    """
    equal = pairs = 0
    for captions in families:
        counts = Counter(captions)
        equal += sum(n * (n - 1) // 2 for n in counts.values())
        pairs += len(captions) * (len(captions) - 1) // 2
    return equal / pairs if pairs else 0.0


def word_edit_distance(a: str, b: str) -> int:
    """Levenshtein distance between two captions counted in words (insert, delete, substitute)."""
    words_a, words_b = a.split(), b.split()
    previous = list(range(len(words_b) + 1))
    for i, word_a in enumerate(words_a, 1):
        current = [i]
        for j, word_b in enumerate(words_b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (word_a != word_b)))
        previous = current
    return previous[-1]


def caption_likeness(scenes: Sequence[tuple[int, str | None, Scene]]) -> dict[str, dict[str, float]]:
    """How alike the training captions are, per caption field (gold `txt`, `txt_pseudo`), for the manifest:

    shared_in_split: the fraction of images whose caption is exactly another image's caption;
    shared_in_family: ... another image of its own family (a duplicate inside one training batch);
    family_duplicate_pairs: `family_duplicate_rate`, the fraction of within-family pairs that are equal;
    sibling_word_distance: the mean `word_edit_distance` between each sibling's caption and its base's;
    sibling_within_one_word: the fraction of siblings whose caption is at most one word from the base's;
    sibling_word_distance_<edit>: `sibling_word_distance` over the siblings of one edit type (colour, shape,
    size, relation): which edits a captioner makes closer than the gold captions and which farther.
    """
    likeness = {}
    for key, captioner in (("txt", caption), (PSEUDO_CAPTION_KEY, pseudo_caption)):
        texts = [captioner(scene.description) for _, _, scene in scenes]
        families = [family for family, _, _ in scenes]
        in_split = Counter(texts)
        in_family = Counter(zip(families, texts))
        by_family: dict[int, list[str]] = {}
        for family, text in zip(families, texts):
            by_family.setdefault(family, []).append(text)
        edited = [
            (edit, word_edit_distance(by_family[family][0], text))
            for (family, edit, _), text in zip(scenes, texts)
            if edit is not None
        ]
        distances = [distance for _, distance in edited]
        by_edit: dict[str, list[int]] = {}
        for edit, distance in edited:
            by_edit.setdefault(edit, []).append(distance)
        likeness[key] = {
            "shared_in_split": float(np.mean([in_split[text] > 1 for text in texts])),
            "shared_in_family": float(np.mean([in_family[pair] > 1 for pair in zip(families, texts)])),
            "family_duplicate_pairs": family_duplicate_rate(by_family.values()),
            "sibling_word_distance": float(np.mean(distances)) if distances else 0.0,
            "sibling_within_one_word": float(np.mean([d <= 1 for d in distances])) if distances else 0.0,
            **{f"sibling_word_distance_{edit}": float(np.mean(values)) for edit, values in sorted(by_edit.items())},
        }
    return likeness
