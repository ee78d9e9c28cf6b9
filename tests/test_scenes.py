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

from synthetic_scenes.cli import main
from synthetic_scenes.scenes import (BENCHMARK_DATASETS, COARSE_COLORS, COLORS, EDIT_TYPES, OPPOSITE_RELATION,
                                     RELATIONS, SHAPES, SIZES, Description, ObjectSpec, PlacedObject, SceneConfig,
                                     caption, could_hold, edit_caption, edit_description, family_duplicate_rate,
                                     family_edit, holds, paraphrases, render, sample_family, sample_scene,
                                     weak_caption, weak_caption_fits, write_demo_dataset)

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


def test_family_edit_names_the_edit_between_a_scene_and_its_clone():
    rng = np.random.default_rng(6)
    for scene in _scenes(100, seed=6):
        assert family_edit(scene.description, scene.description) is None
        for edit_type in EDIT_TYPES:
            assert family_edit(scene.description, edit_description(scene, edit_type, rng)) == edit_type


_WEAK_PHRASE = re.compile(r"(an?) (?:(small|large) )?(\w+) (\w+)")


def _weak_caption_is_true(weak, description):
    """Whether `weak` is "<phrase> <relation or and> <phrase>[ and <phrase>]" naming the description's
    objects in order, each with its shape, its colour or that colour's coarse word, and its size or none."""
    links = "|".join(("and", *RELATIONS))
    phrase = r"an? (?:\w+ )?\w+ \w+"
    match = re.fullmatch(rf"({phrase}) ({links}) ({phrase})(?: and ({phrase}))?", weak)
    if match is None or match.group(2) not in ("and", description.relation):
        return False
    phrases = [text for text in match.group(1, 3, 4) if text is not None]
    if len(phrases) not in (2, len(description.objects)):
        return False
    for text, spec in zip(phrases, description.objects):
        article, size, color, shape = _WEAK_PHRASE.fullmatch(text).groups()
        if (shape != spec.shape or color not in (spec.color, COARSE_COLORS[spec.color])
                or size not in (None, spec.size) or article != ("an" if (size or color)[0] in "aeiou" else "a")):
            return False
    return True


def test_weak_captions_are_true_lossy_and_fit_the_context():
    tokenizer = SimpleTokenizer()
    rng = np.random.default_rng(7)
    weak = [(scene.description, weak_caption(scene.description, rng)) for scene in _scenes(200, seed=7) for _ in range(3)]
    assert all(_weak_caption_is_true(text, description) for description, text in weak)
    assert max(len(tokenizer.encode(text)) for _, text in weak) <= 24 - 2  # adacl-tiny's context, as the gold ones
    texts = [text for _, text in weak]
    # Every habit of the captioner shows up, and none always: the weak caption is often the gold one.
    assert 0.2 < np.mean([" and " in text and not any(r in text for r in RELATIONS) for text in texts]) < 0.4
    assert 0.3 < np.mean([not any(size in text.split() for size in SIZES) for text in texts]) < 0.7
    assert any(word in text.split() for text in texts for word in ("reddish", "greenish", "bluish"))
    assert 0.05 < np.mean([text == caption(description) for description, text in weak]) < 0.3


def test_weak_caption_fits_decides_whether_a_weak_caption_is_true_of_a_description():
    green_star = ObjectSpec("small", "green", "star")
    two = Description((RED_CIRCLE, BLUE_SQUARE), "to the left of")
    three = Description((RED_CIRCLE, BLUE_SQUARE, green_star), "to the left of")
    for text in ("a large red circle to the left of a small blue square", "a red circle and a bluish square",
                 "a bluish square and a reddish circle", "a large reddish circle to the left of a bluish square"):
        assert weak_caption_fits(text, two), text
    assert weak_caption_fits("a red circle to the left of a blue square", three)  # the third left out
    assert weak_caption_fits("a greenish star and a red circle", three)  # "and": any objects, any order
    for text in ("a small red circle to the left of a blue square",  # wrong size
                 "a blue square to the left of a red circle",  # the relation's objects swapped
                 "a red circle to the right of a blue square", "a greenish circle and a blue square",
                 "a red circle and a blue star", "a red circle and a red circle", "a red circle",
                 "a red circle to the left of a blue square and a green star"):  # no star in `two`
        assert not weak_caption_fits(text, two), text


def test_a_siblings_gold_caption_never_fits_its_base_but_its_weak_caption_sometimes_does():
    rng = np.random.default_rng(8)
    fits = []
    for _ in range(40):
        base, *siblings = sample_family(rng, CONFIG)
        for sibling in siblings:
            assert weak_caption_fits(caption(sibling.description), sibling.description)
            assert not weak_caption_fits(caption(sibling.description), base.description)
            fits.append(weak_caption_fits(weak_caption(sibling.description, rng), base.description))
    assert 0.1 < np.mean(fits) < 0.4


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


def test_train_shards_hold_families_with_gold_and_weak_captions(demo_shards):
    manifest = json.loads((demo_shards / "manifest.json").read_text())
    assert manifest["scene_config"]["family_size"] == 8
    assert manifest["caption_keys"] == ["txt", "txt_alt", "txt_weak1", "txt_weak2"]
    families = {}
    for sample in wds.WebDataset(str(demo_shards / "train" / "shard-{000000..000003}.tar"), shardshuffle=False):
        meta, key = json.loads(sample["json"]), int(sample["__key__"])
        assert meta["family"] == key // 8  # written contiguously, families of 8
        assert (meta["family_edit"] is None) == (key % 8 == 0) and meta["family_edit"] in (None, *EDIT_TYPES)
        assert [sample["txt_weak1"].decode(), sample["txt_weak2"].decode()] == meta["caption_weak"]
        families.setdefault(meta["family"], []).append(meta)
    for field, key in (("caption", "txt"), (0, "txt_weak1"), (1, "txt_weak2")):
        rate = family_duplicate_rate([m["caption"] if field == "caption" else m["caption_weak"][field] for m in members]
                                     for members in families.values())
        assert rate == pytest.approx(manifest["train_family_duplicate_rate"][key])
    rates = manifest["train_family_duplicate_rate"]
    assert rates["txt"] == 0.0 and all(0 < rates[key] < 0.03 for key in ("txt_weak1", "txt_weak2"))
    fits = {"txt": [], "txt_weak1": [], "txt_weak2": []}
    for members in families.values():
        scene = members[0]["scene"]
        base = Description(tuple(ObjectSpec(o["size"], o["color"], o["shape"]) for o in scene["objects"]),
                           scene["relation"])
        for meta in members[1:]:
            for key, text in zip(fits, [meta["caption"], *meta["caption_weak"]]):
                fits[key].append(weak_caption_fits(text, base))
    for key, flags in fits.items():
        assert manifest["train_sibling_fits_base_rate"][key]["all"] == pytest.approx(np.mean(flags))
    assert manifest["train_sibling_fits_base_rate"]["txt"]["all"] == 0.0 < np.mean(fits["txt_weak1"])


def test_family_size_and_weak_captions_are_options(tmp_path):
    write_demo_dataset(tmp_path, seed=1, num_train=24, num_val=4, num_test=4, shard_size=12, family_size=3,
                       num_weak_captions=0)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["scene_config"]["family_size"] == 3 and manifest["caption_keys"] == ["txt", "txt_alt"]
    samples = list(wds.WebDataset(str(tmp_path / "train" / "shard-{000000..000001}.tar"), shardshuffle=False))
    assert [json.loads(s["json"])["family"] for s in samples] == [key // 3 for key in range(24)]
    # (webdataset's own "__key__", "__url__", ... members vary by version.)
    assert all({k for k in s if not k.startswith("__")} == {"png", "txt", "txt_alt", "json"} for s in samples)
    with pytest.raises(ValueError, match="num_weak_captions"):
        write_demo_dataset(tmp_path / "bad", num_weak_captions=-1)


def test_the_command_line_writes_families_and_reports_duplicates(tmp_path, capsys):
    main(["--output", str(tmp_path), "--num-train", "16", "--num-val", "4", "--num-test", "4",
          "--shard-size", "8", "--family-size", "4", "--num-weak-captions", "1"])
    out = capsys.readouterr().out
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["scene_config"]["family_size"] == 4 and manifest["caption_keys"][-1] == "txt_weak1"
    assert "train families of 4; caption fields txt, txt_alt, txt_weak1" in out
    rate = manifest["train_family_duplicate_rate"]["txt_weak1"]
    assert f"exact duplicates among a family's captions (pairs): txt 0.00%, txt_weak1 {rate:.2%}" in out
    fits = manifest["train_sibling_fits_base_rate"]["txt_weak1"]["all"]
    assert f"siblings whose caption is also true of their family's base: txt 0.0%, txt_weak1 {fits:.1%}" in out


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
