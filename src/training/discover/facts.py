"""What two captions say, compared: the facts in which they differ, and the words that say it.

The demo data's json carries each caption's "facts" (`training.synthetic_scenes.captions.facts`): one string
per related pair of objects, "<object> <relation> <object>", an object being "a <size> <colour> <shape>". The
page labels a pair by how many facts its captions differ in, so the labels say what the data says: family
membership alone does not (two siblings are often two edits apart, and another family's caption can be one
edit from the query's). The page also marks the words in which two captions differ; a relation stated the
other way round ("A below B" for "B above A") says the same thing, while the same words with the objects
exchanged ("A above B" against "B above A") do not, which a plain word diff cannot tell apart.

Both need the relation phrases and their converses, which are the demo data's own.
"""

from __future__ import annotations

import functools
import itertools
from typing import Dict, FrozenSet, List, Mapping, Optional, Sequence, Set, Tuple

# The relation phrases of the demo data's captions and facts, each with its converse: "A above B" says what "B below
# A" says. They are training.synthetic_scenes.scenes.OPPOSITE_RELATION, written out since the tools do not import
# each other (tests/test_layout.py); tests/training/discover/test_facts.py holds the two equal.
CONVERSES: Mapping[str, str] = {
    "to the left of": "to the right of",
    "to the right of": "to the left of",
    "above": "below",
    "below": "above",
}
# Descriptions with more objects than this are not compared (the object matching tries every permutation).
MAX_OBJECTS = 6


def relation_span(words: Sequence[str], converses: Mapping[str, str] = CONVERSES) -> Optional[Tuple[int, int]]:
    """The [start, end) word span of the one relation phrase in `words`, with words on both sides; None when
    there is no such phrase or more than one (a caption that could be read the other way round in two places)."""
    spans = []
    for phrase in converses:
        phrase_words = phrase.split()
        spans += [
            (start, start + len(phrase_words))
            for start in range(1, len(words) - len(phrase_words))
            if list(words[start : start + len(phrase_words)]) == phrase_words
        ]
    return spans[0] if len(spans) == 1 else None


# ---------------------------------------------------------------------------------------------
# Facts apart


# A description as the facts state it: its objects (each the words of its phrase after the article: size,
# colour, shape) and, per unordered pair of object indices, the relation as (first index, relation, second
# index) in one canonical direction of the two equivalent ones.
_Parsed = Tuple[Tuple[Tuple[str, ...], ...], Dict[FrozenSet[int], Tuple[int, str, int]]]


@functools.lru_cache(maxsize=65536)
def _parse(facts: Tuple[str, ...], converses: Tuple[Tuple[str, str], ...]) -> Optional[_Parsed]:
    """`facts` as objects and relations, or None when a fact is not "<object> <relation> <object>"."""
    converse = dict(converses)
    objects: List[Tuple[str, ...]] = []
    relations: Dict[FrozenSet[int], Tuple[int, str, int]] = {}
    for fact in facts:
        words = fact.split()
        span = relation_span(words, converse)
        if span is None:
            return None
        start, end = span
        indices = []
        for phrase in (words[:start], words[end:]):
            attributes = tuple(phrase[1:])  # after the article
            if attributes not in objects:
                objects.append(attributes)
            indices.append(objects.index(attributes))
        first, second = indices
        relation = " ".join(words[start:end])
        if converse[relation] < relation:  # "B below A" is stated "A above B": one of two equivalent forms
            first, relation, second = second, converse[relation], first
        if first == second or frozenset(indices) in relations:
            return None
        relations[frozenset(indices)] = (first, relation, second)
    return tuple(objects), relations


def facts_apart(facts: Sequence[str], other: Sequence[str], converses: Mapping[str, str] = CONVERSES) -> Optional[int]:
    """The number of facts in which two captions differ: the objects' sizes, colours and shapes, and the relation
    of each two objects, with the objects of one matched to the other's so that the count is smallest.

    An attribute counts once per object whose value differs (an object only one caption names counts each of its
    attributes); a relation counts once per pair of objects whose relation differs or that only one caption
    relates. "A below B" and "B above A" state the same relation, so paraphrases are 0 apart, and the one-edit
    siblings of the demo data's two-object scenes are 1 apart from their base: one attribute, or the relation
    reversed (the two objects exchanged). None when a fact is not of the form "<object> <relation> <object>" or
    a caption names more than MAX_OBJECTS objects."""
    key = tuple(sorted(converses.items()))
    parsed, parsed_other = _parse(tuple(facts), key), _parse(tuple(other), key)
    if parsed is None or parsed_other is None:
        return None
    (objects, relations), (other_objects, other_relations) = parsed, parsed_other
    if max(len(objects), len(other_objects)) > MAX_OBJECTS:
        return None
    if len(objects) > len(other_objects):  # match the fewer objects into the more
        objects, relations, other_objects, other_relations = other_objects, other_relations, objects, relations
    best = None
    for image in itertools.permutations(range(len(other_objects)), len(objects)):
        count = sum(_attributes_apart(objects[index], other_objects[target]) for index, target in enumerate(image))
        count += sum(len(other_objects[target]) for target in set(range(len(other_objects))) - set(image))
        mapped = {
            frozenset(image[i] for i in pair): (image[first], relation, image[second])
            for pair, (first, relation, second) in relations.items()
        }
        count += sum(mapped.get(pair) != other_relations.get(pair) for pair in set(mapped) | set(other_relations))
        best = count if best is None else min(best, count)
    return best


def _attributes_apart(attributes: Tuple[str, ...], other: Tuple[str, ...]) -> int:
    """Attributes (words at the same place of two object phrases) that differ, plus those only one phrase has."""
    return sum(a != b for a, b in zip(attributes, other)) + abs(len(attributes) - len(other))


# ---------------------------------------------------------------------------------------------
# The words that differ


def differing_positions(
    words: Sequence[str], other: Sequence[str], converses: Mapping[str, str] = CONVERSES
) -> Set[int]:
    """The positions of `words` that say what `other` does not.

    `words` is read as written and, when it holds one relation phrase, the other way round ("A below B" read
    as "B above A"); of the two readings, the one sharing the longest common subsequence of words with `other`
    is compared (ties: as written), and its words outside that subsequence are marked, at their places in
    `words`. So a changed word is marked ("red" against "orange"), a relation stated the other way round is not
    ("A below B" against "B above A": nothing), and the same relation with the objects exchanged is marked at
    its relation ("above" in "A above B" against "B above A"), also when other words differ too."""
    readings = [(list(words), list(range(len(words))))]
    span = relation_span(words, converses)
    if span is not None:
        start, end = span
        converse = converses[" ".join(words[start:end])].split()
        # Each word of the converse phrase stands for the word of the phrase at its place (the last one past it).
        relation_places = [min(start + index, end - 1) for index in range(len(converse))]
        readings.append(
            (
                list(words[end:]) + converse + list(words[:start]),
                list(range(end, len(words))) + relation_places + list(range(start)),
            )
        )
    best_common, best_marked = -1, set()
    for reading, places in readings:
        matched = _common_subsequence(reading, list(other))
        if len(matched) > best_common:
            best_common = len(matched)
            best_marked = {places[index] for index in range(len(reading)) if index not in matched}
    return best_marked


def _common_subsequence(words: List[str], other: List[str]) -> Set[int]:
    """The positions of `words` in a longest common subsequence with `other` (word level; the earliest
    positions of `words` where several subsequences are longest)."""
    rows, columns = len(words), len(other)
    lengths = [[0] * (columns + 1) for _ in range(rows + 1)]  # lengths[i][j]: of words[i:] and other[j:]
    for i in range(rows - 1, -1, -1):
        for j in range(columns - 1, -1, -1):
            lengths[i][j] = (
                lengths[i + 1][j + 1] + 1 if words[i] == other[j] else max(lengths[i + 1][j], lengths[i][j + 1])
            )
    matched, i, j = set(), 0, 0
    while i < rows and j < columns:
        if words[i] == other[j] and lengths[i][j] == lengths[i + 1][j + 1] + 1:
            matched.add(i)
            i, j = i + 1, j + 1
        elif lengths[i + 1][j] >= lengths[i][j + 1]:
            i += 1
        else:
            j += 1
    return matched
