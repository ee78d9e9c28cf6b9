"""The scene generator: determinism, true captions, clone captions, and the on-disk layouts."""
import hashlib
import json
import re
from dataclasses import replace

import numpy as np
import pytest
import webdataset as wds
from clip_benchmark.datasets.builder import build_dataset
from open_clip.tokenizer import SimpleTokenizer
from torchvision.transforms import ToTensor

from training.scenes import (BENCHMARK_DATASETS, COLORS, EDIT_TYPES, OPPOSITE_RELATION, SHAPES, SIZES, Description, ObjectSpec,
                             PlacedObject, SceneConfig, caption, could_hold, edit_caption, edit_description,
                             holds, paraphrases, render, sample_family, sample_scene, write_demo_dataset)

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
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file()}


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
    green_star = ObjectSpec("small", "green", "star")
    assert holds(_hand_scene((RED_CIRCLE, 6, 16, 4), (BLUE_SQUARE, 26, 16, 3), (green_star, 20, 4, 2)),
                 Description((RED_CIRCLE, BLUE_SQUARE, green_star), "to the left of"))
    behind = _hand_scene((RED_CIRCLE, 12, 16, 4), (BLUE_SQUARE, 26, 16, 3), (green_star, 3, 4, 2))
    assert not could_hold(behind, Description((RED_CIRCLE, BLUE_SQUARE, green_star), "to the left of"))
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
                assert clone in (Description(description.objects, OPPOSITE_RELATION[description.relation]),
                                 Description((second, first, *rest), description.relation))
                continue
            assert clone.relation == description.relation
            changed = [(old, new) for old, new in zip(description.objects, clone.objects) if old != new]
            assert len(changed) == 1
            (old, new), = changed
            assert [f for f in ("size", "color", "shape") if getattr(old, f) != getattr(new, f)] == [edit_type]


def test_edit_caption_is_deterministic_by_rng():
    scene = _scenes(1, seed=5)[0]
    assert ([edit_caption(scene, t, np.random.default_rng(9)) for t in EDIT_TYPES]
            == [edit_caption(scene, t, np.random.default_rng(9)) for t in EDIT_TYPES])
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


def test_clone_selection_set_has_one_false_clone_per_edit_type(demo_shards):
    words = {"color": set(COLORS), "shape": set(SHAPES), "size": set(SIZES)}
    samples = list(wds.WebDataset(str(demo_shards / "clone_selection" / "shard-000000.tar"), shardshuffle=False))
    assert len(samples) == 128
    for sample in samples:
        meta = json.loads(sample["json"])
        assert set(meta["clones"]) == set(EDIT_TYPES)
        true_words = meta["caption"].split()
        for edit_type, clone in meta["clones"].items():
            if edit_type == "relation":
                assert clone in _relation_clones(meta["caption"])
                continue
            diff = [(a, b) for a, b in zip(true_words, clone.split()) if a != b]
            assert len(clone.split()) == len(true_words) and len(diff) == 1
            assert {diff[0][0], diff[0][1]} <= words[edit_type]


def _relation_clones(text):
    """The caption with its relation reversed, and with its two related objects swapped."""
    relations = "|".join(OPPOSITE_RELATION)
    first, relation, second, tail = re.fullmatch(rf"(a \w+ \w+ \w+) ({relations}) (a \w+ \w+ \w+)(.*)", text).groups()
    return {f"{first} {OPPOSITE_RELATION[relation]} {second}{tail}", f"{second} {relation} {first}{tail}"}


# clip-benchmark's wds builder constructs WebDataset without shardshuffle; webdataset warns about it.
@pytest.mark.filterwarnings("ignore:WebDataset\\(shardshuffle")
def test_clip_benchmark_reads_the_classification_sets(demo_shards):
    for name, classes in (("scenes_shape", SHAPES), ("scenes_color", tuple(COLORS))):
        dataset = build_dataset(f"wds/{name}", root=str(demo_shards / "benchmark" / name), transform=ToTensor(),
                                task="zeroshot_classification")
        assert dataset.classes == list(classes)
        assert all("{c}" in template for template in dataset.templates) and len(dataset.templates) > 1
        samples = list(dataset)
        assert len(samples) == 128
        image, label = samples[0]
        assert image.shape == (3, 32, 32)
        assert sorted({label for _, label in samples}) == list(range(len(classes)))


@pytest.mark.filterwarnings("ignore:WebDataset\\(shardshuffle")
def test_clip_benchmark_reads_the_retrieval_set(demo_shards):
    dataset = build_dataset("wds/scenes_retrieval", root=str(demo_shards / "benchmark" / "scenes_retrieval"),
                            transform=ToTensor(), task="zeroshot_retrieval")
    samples = list(dataset)
    assert len(samples) == 128
    test_captions = [json.loads(s["json"])["caption"]
                     for s in wds.WebDataset(str(demo_shards / "test" / "shard-000000.tar"), shardshuffle=False)]
    for (image, texts), true_caption in zip(samples, test_captions):
        assert image.shape == (3, 32, 32)
        assert len(texts) == 3 and texts[0] == true_caption and len(set(texts)) == 3
