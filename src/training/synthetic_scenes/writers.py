"""The demo data on disk: training shards in families, clip-benchmark sets, the clone-selection set.

Everything is deterministic by seed: every family/scene draws from its own
`numpy.random.default_rng([seed, stream, index])`, tar members carry fixed metadata, so the same
arguments give byte-identical files.

On-disk layout written by `write_demo_dataset(output_dir)`:

    manifest.json                 what was written: counts, shard patterns, generator settings,
                                  caption fields and, per field, how alike train families' captions
                                  are (exact duplicates, siblings' captions that fit the base)
    train/shard-000000.tar ...    img2dataset layout, one sample = <key>.png, <key>.txt (caption),
    val/...  test/...             <key>.txt_alt (a true paraphrase, for --caption-key txt,txt_alt),
                                  <key>.txt_pseudo (the pseudo caption),
                                  <key>.json {"key", "caption", "caption_alt", "caption_pseudo",
                                  "width", "height", "family": id, "family_edit": the sibling's edit
                                  from its family's base (null for the base and in val/test, whose
                                  families are single scenes), "facts": what the caption says, each
                                  fact stated one way (captions.facts: equal facts, same meaning),
                                  "scene": {"relation", "objects":
                                  [{size, color, shape, x, y, radius}]}}; keys are integer strings,
                                  unique across splits (train 0.., then val, then test)
    <split>/sizes.json            {shard file name: sample count}, read by get_dataset_size
    benchmark/scenes_shape/       clip-benchmark `wds/` classification: the shape of the one large
    benchmark/scenes_color/       object (its colour for scenes_color) next to a small distractor;
                                  test/nshards.txt, test/0.tar.. of <key>.png + <key>.cls,
                                  classnames.txt, zeroshot_classification_templates.txt
    benchmark/scenes_retrieval/   clip-benchmark `wds/` retrieval on the test scenes:
                                  test/0.tar.. of <key>.png + <key>.txt (3 true captions, one a
                                  line), dataset_type.txt = "retrieval"
    clone_selection/shard-000000.tar ...
                                  the test scenes: <key>.png + <key>.json {"key", "caption",
                                  "clones": {"color", "shape", "size", "relation": clone caption}}

Use: `clip_benchmark eval --dataset wds/scenes_shape --dataset_root DIR/benchmark/scenes_shape ...`.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from training.trainer.data.shard_writer import (
    encode_png,
    json_bytes,
    write_classification_set,
    write_retrieval_set,
    write_shards,
)

from .captions import CAPTION_KEYS, PSEUDO_CAPTION_KEY, caption, caption_likeness, facts, paraphrases, pseudo_caption
from .edits import EDIT_TYPES, edit_caption, family_edit, sample_family
from .rendering import render
from .scenes import (
    COLORS,
    RELATIONS,
    SHAPES,
    Description,
    ObjectSpec,
    Scene,
    SceneConfig,
    description_allowed,
    place_objects,
)

BENCHMARK_DATASETS = ("scenes_shape", "scenes_color", "scenes_retrieval")

# Independent random streams per split / clip-benchmark set (first word of each rng's seed).
_STREAMS = {"train": 0, "val": 1, "test": 2, "scenes_shape": 3, "scenes_color": 4}


@dataclass(frozen=True)
class DemoDataset:
    """Where `write_demo_dataset` put things; shard patterns are ready for --train-data/--val-data."""

    root: Path
    train_data: str
    val_data: str
    test_data: str
    num_samples: dict[str, int]
    benchmark: dict[str, Path] = field(default_factory=dict)
    clone_selection: Path | None = None


def write_demo_dataset(
    output_dir: str | Path,
    *,
    seed: int = 0,
    num_train: int = 4096,
    num_val: int = 512,
    num_test: int = 512,
    shard_size: int = 512,
    image_size: int = 32,
    config: SceneConfig | None = None,
    family_size: int | None = None,
) -> DemoDataset:
    """Write the train/val/test shards, the clip-benchmark sets and the clone-selection set.

    See the module docstring for the layout. `num_test` also sizes each classification set.
    family_size: training scenes per family (None: the config's, 8 by default); keep `shard_size`
    a multiple of it so no family straddles two shards. Same arguments -> byte-identical files. Returns
    the paths and shard patterns.
    """
    if min(num_train, num_val, num_test, shard_size) < 1:
        raise ValueError("num_train, num_val, num_test and shard_size must all be >= 1")
    config = replace(config or SceneConfig(), image_size=image_size)
    if family_size is not None:
        config = replace(config, family_size=family_size)
    root = Path(output_dir)
    split_sizes = {"train": num_train, "val": num_val, "test": num_test}
    first_key = dict(zip(split_sizes, np.cumsum([0, num_train, num_val]).tolist()))
    patterns, split_scenes = {}, {}
    for split, count in split_sizes.items():
        family_config = config if split == "train" else replace(config, family_size=1)
        split_scenes[split] = list(_split_scenes(seed, split, count, family_config))
        samples = _caption_samples(split_scenes[split], first_key[split])
        patterns[split] = write_shards(root / split, samples, shard_size, "shard-{:06d}.tar", with_sizes=True)

    test_scenes = [scene for _, _, scene in split_scenes["test"]]
    benchmark = {
        "scenes_shape": _write_classification_set(
            root / "benchmark", "scenes_shape", "shape", seed, num_test, shard_size, config
        ),
        "scenes_color": _write_classification_set(
            root / "benchmark", "scenes_color", "color", seed, num_test, shard_size, config
        ),
        "scenes_retrieval": _write_retrieval_set(root / "benchmark" / "scenes_retrieval", test_scenes, shard_size),
    }
    clone_samples = _clone_samples(test_scenes, seed, first_key["test"])
    write_shards(root / "clone_selection", clone_samples, shard_size, "shard-{:06d}.tar")

    manifest = {
        "seed": seed,
        "scene_config": asdict(config),
        "splits": {
            split: {"data": patterns[split], "num_samples": count, "keys": [first_key[split], first_key[split] + count]}
            for split, count in split_sizes.items()
        },
        "benchmark": {name: str(path.relative_to(root)) for name, path in benchmark.items()},
        "clone_selection": "clone_selection",
        "edit_types": list(EDIT_TYPES),
        "caption_keys": list(CAPTION_KEYS),
        "train_caption_likeness": caption_likeness(split_scenes["train"]),
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return DemoDataset(
        root=root,
        train_data=str(root / patterns["train"]),
        val_data=str(root / patterns["val"]),
        test_data=str(root / patterns["test"]),
        num_samples=split_sizes,
        benchmark=benchmark,
        clone_selection=root / "clone_selection",
    )


def _split_scenes(seed: int, split: str, count: int, config: SceneConfig) -> Iterator[tuple[int, str | None, Scene]]:
    """(family index, edit from the family's base or None, scene) for the first `count` scenes of a
    split, each family from its own rng."""
    scenes = (
        (family, family_edit(members[0].description, scene.description), scene)
        for family in itertools.count()
        for members in [sample_family(np.random.default_rng([seed, _STREAMS[split], family]), config)]
        for scene in members
    )
    return itertools.islice(scenes, count)


def _caption_samples(scenes: Iterable[tuple[int, str | None, Scene]], first_key: int) -> Iterator[dict]:
    """img2dataset-style samples: png, txt, txt_alt, txt_pseudo and json with the integer key."""
    for offset, (family, edit, scene) in enumerate(scenes):
        key = first_key + offset
        text = caption(scene.description)
        alternative = paraphrases(scene.description)[key % 2]
        pseudo = pseudo_caption(scene.description)
        meta = {
            "key": f"{key:09d}",
            "caption": text,
            "caption_alt": alternative,
            "caption_pseudo": pseudo,
            "width": scene.image_size,
            "height": scene.image_size,
            "family": family,
            "family_edit": edit,
            "facts": facts(scene.description),
            "scene": _scene_json(scene),
        }
        yield {
            "__key__": meta["key"],
            "png": encode_png(render(scene)),
            "txt": text.encode(),
            "txt_alt": alternative.encode(),
            PSEUDO_CAPTION_KEY: pseudo.encode(),
            "json": json_bytes(meta),
        }


def _clone_samples(scenes: list[Scene], seed: int, first_key: int) -> Iterator[dict]:
    """Clone-selection samples: the image, its caption and one clone caption per edit type."""
    for offset, scene in enumerate(scenes):
        key = f"{first_key + offset:09d}"
        rng = np.random.default_rng([seed, 100, offset])
        clones = {edit_type: edit_caption(scene, edit_type, rng) for edit_type in EDIT_TYPES}
        meta = {"key": key, "caption": caption(scene.description), "clones": clones, "scene": _scene_json(scene)}
        yield {"__key__": key, "png": encode_png(render(scene)), "json": json_bytes(meta)}


def _dominant_object_scene(rng: np.random.Generator, config: SceneConfig, attribute: str, value: str) -> Scene:
    """One large object with `attribute` = value, next to a small distractor of another shape and colour."""
    while True:
        shape, other_shape = rng.choice(SHAPES, size=2, replace=False)
        color, other_color = rng.choice(list(COLORS), size=2, replace=False)
        main = ObjectSpec(size="large", color=str(color), shape=str(shape))
        main = replace(main, **{attribute: value})
        distractor = ObjectSpec(size="small", color=str(other_color), shape=str(other_shape))
        if (
            distractor.shape == main.shape
            or distractor.color == main.color
            or not description_allowed(Description((main, distractor), RELATIONS[0]), config.combinations)
        ):
            continue
        order = (main, distractor) if rng.random() < 0.5 else (distractor, main)
        scene = place_objects(Description(order, str(rng.choice(RELATIONS))), rng, config)
        if scene is not None:
            return scene


def _write_classification_set(
    benchmark_dir: Path, name: str, attribute: str, seed: int, count: int, shard_size: int, config: SceneConfig
) -> Path:
    """clip-benchmark wds classification set: classify the large object's shape (or colour)."""
    classes = list(SHAPES) if attribute == "shape" else list(COLORS)
    if attribute == "shape":  # one template per colour, averaged by the zero-shot classifier
        templates = [f"a large {color} {{c}}" for color in COLORS]
    else:
        templates = [f"a large {{c}} {shape}" for shape in SHAPES]

    def samples() -> Iterator[tuple]:
        for index in range(count):
            label = index % len(classes)
            scene = _dominant_object_scene(
                np.random.default_rng([seed, _STREAMS[name], index]), config, attribute, classes[label]
            )
            yield render(scene), label

    return write_classification_set(benchmark_dir / name, samples(), classes, templates, shard_size)


def _write_retrieval_set(root: Path, scenes: list[Scene], shard_size: int) -> Path:
    """clip-benchmark wds retrieval set: each test image with its three true captions (one a line)."""
    samples = (
        (render(scene), "\n".join([caption(scene.description), *paraphrases(scene.description)])) for scene in scenes
    )
    return write_retrieval_set(root, samples, shard_size)


def _scene_json(scene: Scene) -> dict:
    return {
        "relation": scene.description.relation,
        "objects": [
            {**asdict(placed.spec), "x": round(placed.x, 3), "y": round(placed.y, 3), "radius": round(placed.radius, 3)}
            for placed in scene.objects
        ],
    }
