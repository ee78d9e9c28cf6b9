"""The scene generator: determinism, true captions, clone captions, and the on-disk layouts."""

import hashlib
import json
from dataclasses import replace

import numpy as np
import pytest
import webdataset as wds
from open_clip.tokenizer import SimpleTokenizer

from training.synthetic_scenes.captions import (
    caption,
    facts,
    family_duplicate_rate,
    paraphrases,
    pseudo_caption,
    word_edit_distance,
)
from training.synthetic_scenes.cli import main
from training.synthetic_scenes.edits import EDIT_TYPES, edit_caption, edit_description, family_edit, sample_family
from training.synthetic_scenes.rendering import render
from training.synthetic_scenes.scenes import (
    COLORS,
    OPPOSITE_RELATION,
    RELATIONS,
    SHAPES,
    SIZES,
    Description,
    ObjectSpec,
    PlacedObject,
    SceneConfig,
    combination_allowed,
    could_hold,
    holds,
    sample_scene,
)
from training.synthetic_scenes.writers import BENCHMARK_DATASETS, write_demo_dataset

CONFIG = SceneConfig()
RED_CIRCLE = ObjectSpec("large", "red", "circle")
BLUE_SQUARE = ObjectSpec("small", "blue", "square")


def _scenes(count, seed=0):
    rng = np.random.default_rng(seed)
    return [sample_scene(rng, CONFIG) for _ in range(count)]


def _hand_scene(*placed, relation="to the left of"):
    """A scene built by hand from (spec, x, y, radius) tuples; the description relates the first two."""
    base = _scenes(1)[0]
    objects = tuple(PlacedObject(spec, x, y, r, COLORS[spec.color]) for spec, x, y, r in placed)
    description = Description(tuple(p.spec for p in objects), relation)
    return replace(base, objects=objects, description=description)


def _file_digests(root):
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_same_seed_gives_byte_identical_files_and_another_seed_does_not(tmp_path):
    sizes = dict(num_train=48, num_val=8, num_test=8, shard_size=16)
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        write_demo_dataset(tmp_path / name, seed=seed, **sizes)
    first = _file_digests(tmp_path / "a")
    assert first == _file_digests(tmp_path / "b")
    other = _file_digests(tmp_path / "c")
    assert first.keys() == other.keys()
    assert first["train/shard-000000.tar"] != other["train/shard-000000.tar"]


def test_hand_built_geometry_decides_holds_and_could_hold():
    scene = _hand_scene((RED_CIRCLE, 6, 16, 4), (BLUE_SQUARE, 26, 16, 3))
    assert holds(scene, scene.description)
    assert not could_hold(scene, Description((RED_CIRCLE, BLUE_SQUARE), "to the right of"))
    assert not could_hold(scene, Description((BLUE_SQUARE, RED_CIRCLE), "to the left of"))
    assert not could_hold(scene, Description((RED_CIRCLE, BLUE_SQUARE), "above"))  # same height: not above
    assert not could_hold(scene, Description((ObjectSpec("large", "green", "circle"), BLUE_SQUARE), "to the left of"))
    # With a third object the first must lie clear of both ("A left of B and C").
    green_triangle = ObjectSpec("small", "green", "triangle")
    assert holds(
        _hand_scene((RED_CIRCLE, 6, 16, 4), (BLUE_SQUARE, 26, 16, 3), (green_triangle, 20, 4, 2)),
        Description((RED_CIRCLE, BLUE_SQUARE, green_triangle), "to the left of"),
    )
    behind = _hand_scene((RED_CIRCLE, 12, 16, 4), (BLUE_SQUARE, 26, 16, 3), (green_triangle, 3, 4, 2))
    assert not could_hold(behind, Description((RED_CIRCLE, BLUE_SQUARE, green_triangle), "to the left of"))
    # Extents that overlap along the axis: not clearly true, but not clearly false either.
    close = _hand_scene((RED_CIRCLE, 14, 8, 4), (BLUE_SQUARE, 17, 24, 3))
    assert not holds(close, close.description) and could_hold(close, close.description)


def test_could_hold_matches_any_object_but_each_object_once():
    red_triangle = ObjectSpec("large", "red", "triangle")
    scene = _hand_scene((RED_CIRCLE, 5, 8, 4), (BLUE_SQUARE, 29, 8, 2), (red_triangle, 18, 24, 4))
    assert holds(scene, scene.description)
    # The third object satisfies a description that names it instead of the circle...
    assert holds(scene, Description((red_triangle, BLUE_SQUARE), "to the left of"))
    # ...but a one-shape clone naming the triangle twice claims two triangles: false.
    assert not could_hold(scene, Description((red_triangle, BLUE_SQUARE, red_triangle), "to the left of"))


def test_true_captions_hold_and_clones_change_exactly_one_detail():
    rng = np.random.default_rng(1)
    for scene in _scenes(200, seed=1):
        description = scene.description
        assert holds(scene, description)
        assert len({spec.shape for spec in description.objects}) == len(description.objects)
        for edit_type in EDIT_TYPES:
            clone = edit_description(scene, edit_type, rng)
            assert not could_hold(scene, clone), (edit_type, caption(clone))
            assert caption(clone) != caption(description)
            if edit_type == "relation":
                first, second, *rest = description.objects
                assert clone in (
                    Description(description.objects, OPPOSITE_RELATION[description.relation]),
                    Description((second, first, *rest), description.relation),
                )
                continue
            assert clone.relation == description.relation
            changed = [(old, new) for old, new in zip(description.objects, clone.objects) if old != new]
            assert len(changed) == 1
            ((old, new),) = changed
            assert [f for f in ("size", "color", "shape") if getattr(old, f) != getattr(new, f)] == [edit_type]


def test_edit_caption_is_deterministic_by_rng():
    scene = _scenes(1, seed=5)[0]
    assert [edit_caption(scene, t, np.random.default_rng(9)) for t in EDIT_TYPES] == [
        edit_caption(scene, t, np.random.default_rng(9)) for t in EDIT_TYPES
    ]
    with pytest.raises(ValueError, match="unknown edit type"):
        edit_caption(scene, "texture", np.random.default_rng(0))


def test_family_siblings_are_one_edit_clones_of_the_base():
    rng = np.random.default_rng(2)
    for _ in range(30):
        base, *siblings = sample_family(rng, CONFIG)
        assert len(siblings) == CONFIG.family_size - 1
        same_objects = [set(s.description.objects) == set(base.description.objects) for s in siblings]
        assert sum(same_objects) <= 1  # at most one relation sibling
        assert len({caption(s.description) for s in (base, *siblings)}) == CONFIG.family_size
        for sibling in siblings:
            assert holds(sibling, sibling.description)
            assert not could_hold(base, sibling.description)  # a clone negative of the base
    with pytest.raises(ValueError, match="family_size"):
        SceneConfig(family_size=40)


def test_family_edit_names_the_edit_between_a_scene_and_its_clone():
    rng = np.random.default_rng(6)
    for scene in _scenes(100, seed=6):
        assert family_edit(scene.description, scene.description) is None
        for edit_type in EDIT_TYPES:
            assert family_edit(scene.description, edit_description(scene, edit_type, rng)) == edit_type


def test_pseudo_captions_are_true_generic_and_one_rule_for_every_image():
    tokenizer = SimpleTokenizer()
    rng = np.random.default_rng(8)
    for scene in _scenes(200, seed=7):
        text = pseudo_caption(scene.description)
        phrases = text.split(" and ")
        assert [phrase.split()[1:] for phrase in phrases] == [[s.color, s.shape] for s in scene.description.objects]
        assert len(tokenizer.encode(text)) <= 24 - 2  # adacl-tiny's context, as the gold ones
        assert not set(text.split()) & set(SIZES) and not any(relation in text for relation in RELATIONS)
    # Siblings that differ only in a size share it, and those whose relation is reversed (not swapped
    # objects); a colour or shape edit never does.
    shared = {edit: [] for edit in EDIT_TYPES}
    for _ in range(40):
        base, *siblings = sample_family(rng, CONFIG)
        for sibling in siblings:
            edit = family_edit(base.description, sibling.description)
            shared[edit].append(pseudo_caption(sibling.description) == pseudo_caption(base.description))
    assert all(shared["size"]) and not any(shared["shape"]) and not any(shared["color"])
    assert 0 < np.mean(shared["relation"]) < 1


def test_combination_halves_are_disjoint_and_every_split_and_set_keeps_to_its_half(tmp_path):
    pairs = {
        half: {(c, s) for c in COLORS for s in SHAPES if combination_allowed(c, s, half)} for half in ("even", "odd")
    }
    assert not pairs["even"] & pairs["odd"] and len(pairs["even"] | pairs["odd"]) == len(COLORS) * len(SHAPES)
    assert all({c for c, _ in half} == set(COLORS) and {s for _, s in half} == set(SHAPES) for half in pairs.values())
    write_demo_dataset(
        tmp_path,
        seed=2,
        num_train=64,
        num_val=8,
        num_test=16,
        shard_size=32,
        config=replace(CONFIG, combinations="odd"),
    )
    seen = set()
    for tar in sorted(tmp_path.rglob("*.tar")):
        for sample in wds.WebDataset(str(tar), shardshuffle=False):
            if "json" in sample:
                seen |= {(o["color"], o["shape"]) for o in json.loads(sample["json"])["scene"]["objects"]}
    assert seen and seen <= pairs["odd"]
    with pytest.raises(ValueError, match="combinations must be one of"):
        SceneConfig(combinations="half")


def test_word_edit_distance_counts_words():
    assert word_edit_distance("a red circle", "a red circle") == 0
    assert word_edit_distance("a red circle", "a blue circle") == 1
    assert word_edit_distance("a large red circle", "a red circle") == 1
    assert word_edit_distance("a b c", "c b a") == 2


def test_family_duplicate_rate_counts_equal_pairs_within_families():
    assert family_duplicate_rate([["a", "a", "b"], ["c"], ["d", "d"]]) == pytest.approx(2 / 4)  # 3 + 0 + 1 pairs
    assert family_duplicate_rate([["a"], ["b"]]) == 0.0


def test_render_draws_each_object_in_its_colour_where_the_scene_puts_it():
    for scene in _scenes(40, seed=3):
        image = np.asarray(render(scene), dtype=float)
        assert image.shape == (CONFIG.image_size, CONFIG.image_size, 3)
        for placed in scene.objects:
            if placed.spec.size == "large":  # small objects are a few pixels: noise dominates one pixel
                centre = image[int(placed.y), int(placed.x)]
                assert np.abs(centre - np.array(placed.rgb)).max() < 40, (placed, centre)


def test_every_caption_fits_the_tiny_models_context_without_truncation():
    tokenizer = SimpleTokenizer()
    rng = np.random.default_rng(4)
    texts = []
    for scene in _scenes(200, seed=4):
        texts += [caption(scene.description), *paraphrases(scene.description)]
        texts += [edit_caption(scene, t, rng) for t in EDIT_TYPES]
    longest = max(len(tokenizer.encode(text)) for text in texts)
    assert longest <= 24 - 2  # adacl-tiny: context 24 including start and end tokens


def test_split_shards_follow_the_img2dataset_layout(demo_shards):
    manifest = json.loads((demo_shards / "manifest.json").read_text())
    assert tuple(sorted(manifest["benchmark"])) == tuple(sorted(BENCHMARK_DATASETS))
    keys = []
    for split in ("train", "val", "test"):
        sizes = json.loads((demo_shards / split / "sizes.json").read_text())
        assert sum(sizes.values()) == manifest["splits"][split]["num_samples"]
        for shard, count in sizes.items():
            samples = list(wds.WebDataset(str(demo_shards / split / shard), shardshuffle=False))
            assert len(samples) == count
            for sample in samples:
                meta = json.loads(sample["json"])
                assert meta["key"] == sample["__key__"] and sample["txt"].decode() == meta["caption"]
                assert sample["txt_alt"].decode() == meta["caption_alt"] != meta["caption"]
                assert sample["png"].startswith(b"\x89PNG")
                keys.append(int(meta["key"]))
    assert sorted(keys) == list(range(len(keys)))  # integer keys, unique across splits


def test_train_shards_hold_families_with_gold_and_pseudo_captions(demo_shards):
    manifest = json.loads((demo_shards / "manifest.json").read_text())
    assert manifest["scene_config"]["family_size"] == 8
    assert manifest["caption_keys"] == ["txt", "txt_alt", "txt_pseudo"]
    families = {}
    for sample in wds.WebDataset(str(demo_shards / "train" / "shard-{000000..000003}.tar"), shardshuffle=False):
        meta, key = json.loads(sample["json"]), int(sample["__key__"])
        assert meta["family"] == key // 8  # written contiguously, families of 8
        assert (meta["family_edit"] is None) == (key % 8 == 0) and meta["family_edit"] in (None, *EDIT_TYPES)
        assert sample["txt_pseudo"].decode() == meta["caption_pseudo"]
        assert meta["facts"] == sorted(meta["facts"]) and len(meta["facts"]) == len(meta["scene"]["objects"]) - 1
        families.setdefault(meta["family"], []).append(meta)
    likeness = manifest["train_caption_likeness"]
    for field, key in (("caption", "txt"), ("caption_pseudo", "txt_pseudo")):
        texts = [[m[field] for m in members] for members in families.values()]
        assert likeness[key]["family_duplicate_pairs"] == pytest.approx(family_duplicate_rate(texts))
        in_family = np.mean([family.count(text) > 1 for family in texts for text in family])
        assert likeness[key]["shared_in_family"] == pytest.approx(in_family)
        distances = [word_edit_distance(family[0], text) for family in texts for text in family[1:]]
        assert likeness[key]["sibling_word_distance"] == pytest.approx(np.mean(distances))
        for edit in {m["family_edit"] for members in families.values() for m in members} - {None}:
            per_edit = [
                word_edit_distance(members[0][field], m[field])
                for members in families.values()
                for m in members
                if m["family_edit"] == edit
            ]
            assert likeness[key][f"sibling_word_distance_{edit}"] == pytest.approx(np.mean(per_edit))
    # The pseudo-caption regime's premise, measured: many exact duplicates, and siblings closer than in gold.
    assert likeness["txt"]["shared_in_family"] == 0.0 < 0.3 <= likeness["txt_pseudo"]["shared_in_family"]
    assert likeness["txt_pseudo"]["sibling_word_distance"] < likeness["txt"]["sibling_word_distance"]
    # ... but closer only through the edits it cannot name: size siblings share a caption, while colour
    # siblings' captions are no closer than gold (docs/data.md).
    assert likeness["txt_pseudo"]["sibling_word_distance_size"] == 0.0
    assert likeness["txt_pseudo"]["sibling_word_distance_color"] >= likeness["txt"]["sibling_word_distance_color"]


def test_facts_are_equal_exactly_for_captions_that_say_the_same_thing():
    green_cross = ObjectSpec("small", "green", "cross")
    above = Description(objects=(RED_CIRCLE, BLUE_SQUARE), relation="above")
    converse = Description(objects=(BLUE_SQUARE, RED_CIRCLE), relation="below")  # "B below A" says "A above B"
    assert facts(above) == facts(converse) == ["a large red circle above a small blue square"]
    assert facts(replace(above, relation="below")) != facts(above)  # a relation edit
    assert facts(Description(objects=(BLUE_SQUARE, RED_CIRCLE), relation="above")) != facts(above)  # objects swapped
    three = Description(objects=(RED_CIRCLE, BLUE_SQUARE, green_cross), relation="to the right of")
    assert facts(three) == [
        "a small blue square to the left of a large red circle",
        "a small green cross to the left of a large red circle",
    ]
    for scene in _scenes(20):  # two objects: the converse ("B below A") states the same facts
        subject, other = scene.description.objects
        converse_description = Description(
            objects=(other, subject), relation=OPPOSITE_RELATION[scene.description.relation]
        )
        assert facts(converse_description) == facts(scene.description)


def test_family_size_is_an_option(tmp_path):
    write_demo_dataset(tmp_path, seed=1, num_train=24, num_val=4, num_test=4, shard_size=12, family_size=3)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["scene_config"]["family_size"] == 3
    samples = list(wds.WebDataset(str(tmp_path / "train" / "shard-{000000..000001}.tar"), shardshuffle=False))
    assert [json.loads(s["json"])["family"] for s in samples] == [key // 3 for key in range(24)]
    # (webdataset's own "__key__", "__url__", ... members vary by version.)
    assert all(
        {k for k in s if not k.startswith("__")} == {"png", "txt", "txt_alt", "txt_pseudo", "json"} for s in samples
    )


def test_the_command_line_writes_families_and_reports_how_alike_captions_are(tmp_path, capsys):
    main(
        [
            "--output",
            str(tmp_path),
            "--num-train",
            "16",
            "--num-val",
            "4",
            "--num-test",
            "4",
            "--shard-size",
            "8",
            "--family-size",
            "4",
        ]
    )
    out = capsys.readouterr().out
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["scene_config"]["family_size"] == 4
    assert "train families of 4; caption fields txt, txt_alt, txt_pseudo" in out
    pseudo = manifest["train_caption_likeness"]["txt_pseudo"]
    assert (
        f"txt_pseudo: {pseudo['shared_in_split']:.1%} of train images share their exact caption with another "
        f"image ({pseudo['shared_in_family']:.1%} within their family)"
    ) in out
