"""How many facts two captions differ in, and the words that say it (training.discover.facts): the counts the page's
labels rest on, checked against the demo data's own families, and the word diff the page marks."""

import itertools

import numpy as np
import pytest

from training.discover.facts import CONVERSES, differing_positions, facts_apart
from training.synthetic_scenes.captions import caption, facts
from training.synthetic_scenes.edits import sample_family
from training.synthetic_scenes.scenes import OPPOSITE_RELATION, Description, SceneConfig

A, B, C = "a large red circle", "a small blue square", "a small green cross"
A_ORANGE = "a large orange circle"


@pytest.mark.parametrize(
    "first, second, apart",
    [
        ([f"{A} above {B}"], [f"{A} above {B}"], 0),
        ([f"{A} above {B}"], [f"{B} below {A}"], 0),  # the same relation stated the other way round
        ([f"{A} above {B}"], [f"{A_ORANGE} above {B}"], 1),  # one colour
        ([f"{A} above {B}"], [f"{B} above {A}"], 1),  # the relation reversed
        ([f"{A} above {B}"], [f"{B} above {A_ORANGE}"], 2),  # reversed, and a colour
        ([f"{A} above {B}"], [f"{A} to the left of {B}"], 1),  # another relation
        ([f"{A} above {B}"], [f"{A} above {B}", f"{A} above {C}"], 4),  # a third object: its 3 attributes, its relation
        ([f"{A} above {B}", f"{A} above {C}"], [f"{B} above {A}", f"{B} above {C}"], 3),  # the first two swapped
    ],
)
def test_facts_apart_counts_attributes_and_relations(first, second, apart):
    assert facts_apart(first, second) == apart
    assert facts_apart(second, first) == apart


def test_the_relations_are_the_demo_data_s():
    assert CONVERSES == OPPOSITE_RELATION


def test_facts_not_of_the_form_are_not_counted():
    assert facts_apart(["a red circle"], [f"{A} above {B}"]) is None
    assert facts_apart([f"{A} above {B} above {C}"], [f"{A} above {B}"]) is None  # two relation phrases


def test_the_demo_families_are_what_the_legend_says():
    """On the demo data's two-object scenes, a sibling is 1 fact from its base, two siblings are 1 or 2 apart, and
    the caption stated the other way round ("B below A" for "A above B") is 0 apart: the counts agree with how
    the families are made."""
    rng = np.random.default_rng(0)
    apart_of_siblings = set()
    for _ in range(60):
        base, *siblings = [scene.description for scene in sample_family(rng, SceneConfig(family_size=8))]
        assert {facts_apart(facts(base), facts(sibling)) for sibling in siblings} == {1}
        apart_of_siblings |= {
            facts_apart(facts(one), facts(other)) for one, other in itertools.combinations(siblings, 2)
        }
        first, second = base.objects
        converse = Description(objects=(second, first), relation=OPPOSITE_RELATION[base.relation])
        assert caption(converse) != caption(base) and facts_apart(facts(base), facts(converse)) == 0
    assert apart_of_siblings == {1, 2}


def marked(caption_text, other):
    """The words of `caption_text` that differing_positions marks, in order."""
    words = caption_text.split()
    return [words[index] for index in sorted(differing_positions(words, other.split()))]


@pytest.mark.parametrize(
    "first, second, words",
    [
        (f"{A} above {B}", f"{A_ORANGE} above {B}", ["red"]),
        (f"{A} below {B}", f"{B} above {A}", []),  # a paraphrase: nothing differs in what they say
        (f"{A} above {B}", f"{B} above {A}", ["above"]),  # the objects exchanged: the relation
        (f"{A} above {B}", f"{B} above {A_ORANGE}", ["red", "above"]),  # exchanged, and another word differs too
        (f"{A} below {B}", f"{B} above {A_ORANGE}", ["red"]),  # a paraphrase but for one colour
        (f"{C} to the left of {A}", f"{A} to the left of {C}", ["left"]),  # a relation of several words
        ("a large red circle above a small red square", "a large blue circle above a small red square", ["red"]),
        ("a dog on a sofa", "a cat on a sofa", ["dog"]),  # no known relation phrase: a plain word diff
    ],
)
def test_the_marked_words_are_those_that_say_what_the_other_caption_does_not(first, second, words):
    assert marked(first, second) == words
