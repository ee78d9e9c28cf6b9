"""Procedural scenes whose captions have clone negatives by construction: the project's demo data.

A scene holds 2 objects (3 with `SceneConfig.three_object_prob`), each a (size, colour, shape) drawn
anywhere in the frame on a noisy, tinted, shaded background. Its caption names the objects and how the first one lies
relative to all the others: "a large red circle to the left of a small blue square[ and a small
green triangle]" (the first object's extent is clear of each other object's along that axis, so
both readings of the "and" are true). A *clone* caption changes exactly one detail (one object's
colour, shape or size, or the relation: reversed, or the first two objects swapped) and is
checked never to describe the image (`could_hold`). Training scenes come in *families*: a
base scene plus `family_size - 1` (default 7) siblings re-drawn from one-edit clones of its
description, written next to each other; `--train-group-size` keeps them together through the
shuffle, so a training batch holds whole families of captions one attribute apart (docs/data.md).
Each sample also carries a *pseudo* caption from a generic captioner (`pseudo_caption`), for the
paper's pseudo-caption regime: siblings that differ in a size or the relation share it exactly.

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
                                  families are single scenes), "scene": {"relation", "objects":
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

import io
import itertools
import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import webdataset as wds
from PIL import Image, ImageDraw

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (225, 35, 35),
    "orange": (250, 140, 20),
    "yellow": (240, 225, 40),
    "green": (40, 185, 60),
    "cyan": (40, 215, 225),
    "blue": (45, 80, 235),
    "purple": (155, 60, 215),
}
# Four shapes that stay distinct at a few pixels (docs/data.md: which clone edits the tiny model can learn).
SHAPES = ("circle", "square", "triangle", "cross")
SIZES = ("small", "large")
RELATIONS = ("to the left of", "to the right of", "above", "below")
OPPOSITE_RELATION = {
    "to the left of": "to the right of",
    "to the right of": "to the left of",
    "above": "below",
    "below": "above",
}
EDIT_TYPES = ("color", "shape", "size", "relation")
PSEUDO_CAPTION_KEY = "txt_pseudo"  # tar member / --caption-key field of the pseudo caption
CAPTION_KEYS = ("txt", "txt_alt", PSEUDO_CAPTION_KEY)
BENCHMARK_DATASETS = ("scenes_shape", "scenes_color", "scenes_retrieval")

# Independent random streams per split / clip-benchmark set (first word of each rng's seed).
_STREAMS = {"train": 0, "val": 1, "test": 2, "scenes_shape": 3, "scenes_color": 4}
_PLACEMENT_BATCH = 64
_MAX_FAMILY_SIZE = 12
_PLACEMENT_ROUNDS = 8
# (coordinate index, sign): `a relation b` holds when sign * (b - a) along that coordinate is large.
_RELATION_AXIS = {"to the left of": (0, 1), "to the right of": (0, -1), "above": (1, 1), "below": (1, -1)}


COMBINATIONS = ("all", "even", "odd")


def combination_allowed(color: str, shape: str, combinations: str) -> bool:
    """Whether an object may be `color` `shape` under SceneConfig.combinations ("all", "even", "odd")."""
    if combinations == "all":
        return True
    parity = (list(COLORS).index(color) + SHAPES.index(shape)) % 2
    return parity == (0 if combinations == "even" else 1)


def description_allowed(description: "Description", combinations: str) -> bool:
    return all(combination_allowed(spec.color, spec.shape, combinations) for spec in description.objects)


@dataclass(frozen=True)
class SceneConfig:
    """Generator settings. The defaults are the ones at which the tiny model learns the colour, size and
    shape clones within the study's budget (two objects, four shapes, clearly different sizes, little
    noise; docs/results/learnability.md); a third object or more noise makes them harder.

    image_size: output side in pixels (32 for adacl-tiny).
    three_object_prob: chance a scene has a third (unrelated) object.
    family_size: scenes per training family (base + one-edit siblings), 1..12; 1 = independent scenes.
    small_radius / large_radius: object radius range as a fraction of image_size.
    noise_std: Gaussian pixel noise (0-255 scale) added after rendering.
    supersample: render at this multiple of image_size, then box-downsample (anti-aliasing).
    combinations: which (colour, shape) pairs objects may have: "all", or one half of them, "even" or
        "odd" (`combination_allowed`: a checkerboard over COLORS x SHAPES, so each half has every colour
        and every shape). Pretraining on one half and fine-tuning and evaluating on the other is the
        transfer regime: no evaluation image holds a pair seen in pretraining.
    """

    image_size: int = 32
    three_object_prob: float = 0.0
    family_size: int = 8
    small_radius: tuple[float, float] = (0.10, 0.13)
    large_radius: tuple[float, float] = (0.20, 0.25)
    noise_std: float = 3.0
    supersample: int = 4
    combinations: str = "all"

    def __post_init__(self) -> None:
        # A 2-object scene has about 20 distinct one-edit clones: larger families cannot be filled.
        if not 1 <= self.family_size <= _MAX_FAMILY_SIZE:
            raise ValueError(f"family_size must be in 1..{_MAX_FAMILY_SIZE}, got {self.family_size}")
        if self.combinations not in COMBINATIONS:
            raise ValueError(f"combinations must be one of {COMBINATIONS}, got {self.combinations!r}")


@dataclass(frozen=True)
class ObjectSpec:
    """What a caption says about one object."""

    size: str
    color: str
    shape: str

    def phrase(self) -> str:
        return f"a {self.size} {self.color} {self.shape}"


@dataclass(frozen=True)
class Description:
    """A caption's content: objects[0] lies `relation` each of objects[1:]."""

    objects: tuple[ObjectSpec, ...]
    relation: str


@dataclass(frozen=True)
class PlacedObject:
    """An object in the image: its spec, centre (x, y) and radius in pixels, and jittered colour."""

    spec: ObjectSpec
    x: float
    y: float
    radius: float
    rgb: tuple[int, int, int]


@dataclass(frozen=True)
class Scene:
    """Everything `render` needs; `description` is true of the image by construction."""

    description: Description
    objects: tuple[PlacedObject, ...]
    image_size: int
    background: tuple[int, int, int]
    gradient: tuple[float, float]  # (angle in radians, peak-to-peak amplitude on the 0-255 scale)
    noise_std: float
    supersample: int
    noise_seed: int


# ---------------------------------------------------------------------------------------------
# Captions


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


def pseudo_caption(description: Description) -> str:
    """A generic captioner's caption, one rule for every image: each object by its colour and its
    shape, joined by "and": "a red circle and an orange square".

    True of the image but generic, like the pseudo captions of the paper's weakly supervised regime:
    it never names a size or the relation, so one-edit siblings that differ only in those share their
    caption exactly (clone negatives that are also false negatives). Its words are the gold
    captions' own, so a model trained on it can be evaluated on gold captions. The manifest measures
    how alike it makes a family's captions (`caption_likeness`; docs/data.md).
    """
    return " and ".join(f"{'an' if spec.color[0] in 'aeiou' else 'a'} {spec.color} {spec.shape}"
                        for spec in description.objects)


def family_edit(base: Description, sibling: Description) -> str | None:
    """The edit type that turns `base` into its one-edit `sibling` (None when they are equal)."""
    if base == sibling:
        return None
    if base.relation != sibling.relation or set(base.objects) == set(sibling.objects):
        return "relation"  # reversed, or the first two objects swapped
    (old, new), = [(a, b) for a, b in zip(base.objects, sibling.objects) if a != b]
    (edit,) = [name for name in ("size", "color", "shape") if getattr(old, name) != getattr(new, name)]
    return edit


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


# ---------------------------------------------------------------------------------------------
# Geometry: when a caption is (or could be) true of a scene


def _axis_gap(a: PlacedObject, b: PlacedObject, relation: str) -> tuple[float, float]:
    """(centre offset, extent gap) of `a relation b` along its axis; both > 0 when it holds."""
    axis, sign = _RELATION_AXIS[relation]
    offset = sign * ((b.x - a.x) if axis == 0 else (b.y - a.y))
    return offset, offset - a.radius - b.radius


def _assignments(scene: Scene, description: Description) -> Iterator[tuple[PlacedObject, ...]]:
    """Injective maps from the description's objects to scene objects with the same attributes."""
    for chosen in itertools.permutations(scene.objects, len(description.objects)):
        if all(placed.spec == spec for placed, spec in zip(chosen, description.objects)):
            yield chosen


def holds(scene: Scene, description: Description) -> bool:
    """True when the description clearly describes the image: matching objects exist and the first
    one's extent is clear of every other one's along the relation's axis."""
    return any(all(_axis_gap(first, other, description.relation)[1] > 0 for other in others)
               for first, *others in _assignments(scene, description))


def could_hold(scene: Scene, description: Description) -> bool:
    """True unless the description is clearly false: no objects match, or for every match some
    other object's centre lies on the wrong side of the first one's. Clones must make this False."""
    return any(all(_axis_gap(first, other, description.relation)[0] > 0 for other in others)
               for first, *others in _assignments(scene, description))


# ---------------------------------------------------------------------------------------------
# Sampling


def sample_description(rng: np.random.Generator, config: SceneConfig) -> Description:
    """Random objects (distinct shapes, so a caption names each object unambiguously) and relation."""
    num_objects = 3 if rng.random() < config.three_object_prob else 2
    shapes = rng.choice(SHAPES, size=num_objects, replace=False)
    objects = tuple(
        ObjectSpec(size=str(rng.choice(SIZES)), shape=str(shape), color=str(rng.choice(
            [color for color in COLORS if combination_allowed(color, str(shape), config.combinations)])))
        for shape in shapes
    )
    return Description(objects=objects, relation=str(rng.choice(RELATIONS)))


def place_objects(description: Description, rng: np.random.Generator, config: SceneConfig) -> Scene | None:
    """Draw sizes and positions anywhere in the frame making `description` hold; None if none found.

    Rejection sampling, vectorised over `_PLACEMENT_BATCH` candidate layouts at a time: objects
    must not touch, and the first object's extent must be clear of every other's along the
    relation's axis.
    """
    size = config.image_size
    gap = size / 32  # one pixel at 32 px
    bounds = np.array([config.small_radius if spec.size == "small" else config.large_radius
                       for spec in description.objects]) * size
    for _ in range(_PLACEMENT_ROUNDS):
        radius = rng.uniform(bounds[:, 0], bounds[:, 1], size=(_PLACEMENT_BATCH, len(bounds)))
        low = radius + gap
        centre = rng.uniform(low[..., None], (size - low)[..., None], size=radius.shape + (2,))
        distance = np.linalg.norm(centre[:, :, None, :] - centre[:, None, :, :], axis=-1)
        clearance = distance - radius[:, :, None] - radius[:, None, :]
        apart = (clearance + np.eye(len(bounds)) * size >= gap).all(axis=(1, 2))
        axis, sign = _RELATION_AXIS[description.relation]
        offset = sign * (centre[:, 1:, axis] - centre[:, :1, axis])
        related = (offset - radius[:, :1] - radius[:, 1:] >= gap).all(axis=1)
        valid = np.flatnonzero(apart & related)
        if valid.size:
            return _scene_from_layout(description, centre[valid[0]], radius[valid[0]], rng, config)
    return None


def _scene_from_layout(description: Description, centre: np.ndarray, radius: np.ndarray,
                       rng: np.random.Generator, config: SceneConfig) -> Scene:
    """Add jittered colours and a random background to a valid layout."""
    jitter = rng.integers(-18, 19, size=(len(radius), 3))
    placed = tuple(
        PlacedObject(spec, float(x), float(y), float(r),
                     tuple(int(c) for c in np.clip(np.array(COLORS[spec.color]) + shift, 0, 255)))
        for spec, (x, y), r, shift in zip(description.objects, centre, radius, jitter)
    )
    return Scene(
        description=description,
        objects=placed,
        image_size=config.image_size,
        background=tuple(int(v) for v in rng.integers(25, 115) + rng.integers(-12, 13, size=3)),
        gradient=(float(rng.uniform(0, 2 * np.pi)), float(rng.uniform(0, 40))),
        noise_std=config.noise_std,
        supersample=config.supersample,
        noise_seed=int(rng.integers(2**63)),
    )


def sample_scene(rng: np.random.Generator, config: SceneConfig = SceneConfig()) -> Scene:
    """A random scene (re-drawing the description in the rare case it cannot be placed)."""
    while True:
        scene = place_objects(sample_description(rng, config), rng, config)
        if scene is not None:
            return scene


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
        if (not distinct_shapes or not description_allowed(clone, config.combinations)
                or any(member.description == clone for member in family)):
            continue
        sibling = place_objects(clone, rng, config)
        if sibling is not None:
            family.append(sibling)
            if edit_type == "relation":
                edit_types.remove("relation")
    return family


# ---------------------------------------------------------------------------------------------
# Rendering


def render(scene: Scene) -> Image.Image:
    """The scene as an RGB image of `scene.image_size` pixels (deterministic).

    Shapes are drawn at `supersample` times the size on a transparent layer and box-filtered
    down (anti-aliased edges), then laid over the shaded background; noise comes last.
    """
    size, scale = scene.image_size, scene.supersample
    ramp = np.linspace(-0.5, 0.5, size)
    angle, amplitude = scene.gradient
    shade = amplitude * (np.cos(angle) * ramp[None, :] + np.sin(angle) * ramp[:, None])
    background = np.array(scene.background, dtype=np.float64) + shade[:, :, None]
    layer = Image.new("RGBA", (size * scale, size * scale))
    draw = ImageDraw.Draw(layer)
    for placed in scene.objects:
        _draw_shape(draw, placed.spec.shape, placed.x * scale, placed.y * scale, placed.radius * scale,
                    (*placed.rgb, 255))
    shapes = np.asarray(layer.resize((size, size), Image.Resampling.BOX), dtype=np.float64)
    alpha = shapes[:, :, 3:] / 255
    noise = np.random.default_rng(scene.noise_seed).normal(0.0, scene.noise_std, (size, size, 3))
    pixels = background * (1 - alpha) + shapes[:, :, :3] * alpha + noise
    return Image.fromarray(np.clip(pixels, 0, 255).round().astype(np.uint8))


def _regular_polygon(x: float, y: float, radii: Iterable[float], start_deg: float) -> list[tuple[float, float]]:
    radii = list(radii)
    angles = np.deg2rad(start_deg + 360.0 * np.arange(len(radii)) / len(radii))
    return [(x + r * np.cos(a), y + r * np.sin(a)) for r, a in zip(radii, angles)]


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, x: float, y: float, r: float, rgb: tuple[int, ...]) -> None:
    """Shapes of similar area for one radius, so size words mean the same for every shape."""
    if shape == "circle":
        draw.ellipse([x - r, y - r, x + r, y + r], fill=rgb)
    elif shape == "square":
        half = 0.85 * r
        draw.rectangle([x - half, y - half, x + half, y + half], fill=rgb)
    elif shape == "triangle":
        draw.polygon(_regular_polygon(x, y + 0.2 * r, [1.2 * r] * 3, -90), fill=rgb)
    elif shape == "cross":
        arm = 0.36 * r
        draw.rectangle([x - r, y - arm, x + r, y + arm], fill=rgb)
        draw.rectangle([x - arm, y - r, x + arm, y + r], fill=rgb)
    else:
        raise ValueError(f"unknown shape {shape!r}")


def encode_png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------
# Writing the demo dataset


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
        records = _caption_records(split_scenes[split], first_key[split])
        patterns[split] = _write_shards(root / split, records, shard_size, "shard-{:06d}.tar", with_sizes=True)

    test_scenes = [scene for _, _, scene in split_scenes["test"]]
    benchmark = {
        "scenes_shape": _write_classification_set(root / "benchmark", "scenes_shape", "shape", seed, num_test,
                                                  shard_size, config),
        "scenes_color": _write_classification_set(root / "benchmark", "scenes_color", "color", seed, num_test,
                                                  shard_size, config),
        "scenes_retrieval": _write_retrieval_set(root / "benchmark" / "scenes_retrieval", test_scenes, shard_size),
    }
    clone_records = _clone_records(test_scenes, seed, first_key["test"])
    _write_shards(root / "clone_selection", clone_records, shard_size, "shard-{:06d}.tar")

    manifest = {
        "seed": seed,
        "scene_config": asdict(config),
        "splits": {split: {"data": patterns[split], "num_samples": count,
                           "keys": [first_key[split], first_key[split] + count]}
                   for split, count in split_sizes.items()},
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


def _split_scenes(seed: int, split: str, count: int,
                  config: SceneConfig) -> Iterator[tuple[int, str | None, Scene]]:
    """(family index, edit from the family's base or None, scene) for the first `count` scenes of a
    split, each family from its own rng."""
    scenes = (
        (family, family_edit(members[0].description, scene.description), scene)
        for family in itertools.count()
        for members in [sample_family(np.random.default_rng([seed, _STREAMS[split], family]), config)]
        for scene in members
    )
    return itertools.islice(scenes, count)


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
    sibling_within_one_word: the fraction of siblings whose caption is at most one word from the base's.
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
        distances = [word_edit_distance(by_family[family][0], text)
                     for (family, edit, _), text in zip(scenes, texts) if edit is not None]
        likeness[key] = {
            "shared_in_split": float(np.mean([in_split[text] > 1 for text in texts])),
            "shared_in_family": float(np.mean([in_family[pair] > 1 for pair in zip(families, texts)])),
            "family_duplicate_pairs": family_duplicate_rate(by_family.values()),
            "sibling_word_distance": float(np.mean(distances)) if distances else 0.0,
            "sibling_within_one_word": float(np.mean([d <= 1 for d in distances])) if distances else 0.0,
        }
    return likeness


def _caption_records(scenes: Iterable[tuple[int, str | None, Scene]], first_key: int) -> Iterator[dict]:
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
            "scene": _scene_json(scene),
        }
        yield {"__key__": meta["key"], "png": encode_png(render(scene)), "txt": text.encode(),
               "txt_alt": alternative.encode(), PSEUDO_CAPTION_KEY: pseudo.encode(), "json": _json_bytes(meta)}


def _clone_records(scenes: list[Scene], seed: int, first_key: int) -> Iterator[dict]:
    """Clone-selection samples: the image, its caption and one clone caption per edit type."""
    for offset, scene in enumerate(scenes):
        key = f"{first_key + offset:09d}"
        rng = np.random.default_rng([seed, 100, offset])
        clones = {edit_type: edit_caption(scene, edit_type, rng) for edit_type in EDIT_TYPES}
        meta = {"key": key, "caption": caption(scene.description), "clones": clones, "scene": _scene_json(scene)}
        yield {"__key__": key, "png": encode_png(render(scene)), "json": _json_bytes(meta)}


def _dominant_object_scene(rng: np.random.Generator, config: SceneConfig, attribute: str, value: str) -> Scene:
    """One large object with `attribute` = value, next to a small distractor of another shape and colour."""
    while True:
        shape, other_shape = rng.choice(SHAPES, size=2, replace=False)
        color, other_color = rng.choice(list(COLORS), size=2, replace=False)
        main = ObjectSpec(size="large", color=str(color), shape=str(shape))
        main = replace(main, **{attribute: value})
        distractor = ObjectSpec(size="small", color=str(other_color), shape=str(other_shape))
        if (distractor.shape == main.shape or distractor.color == main.color
                or not description_allowed(Description((main, distractor), RELATIONS[0]), config.combinations)):
            continue
        order = (main, distractor) if rng.random() < 0.5 else (distractor, main)
        scene = place_objects(Description(order, str(rng.choice(RELATIONS))), rng, config)
        if scene is not None:
            return scene


def _write_classification_set(benchmark_dir: Path, name: str, attribute: str, seed: int, count: int,
                              shard_size: int, config: SceneConfig) -> Path:
    """clip-benchmark wds classification set: classify the large object's shape (or colour)."""
    classes = list(SHAPES) if attribute == "shape" else list(COLORS)
    if attribute == "shape":  # one template per colour, averaged by the zero-shot classifier
        templates = [f"a large {color} {{c}}" for color in COLORS]
    else:
        templates = [f"a large {{c}} {shape}" for shape in SHAPES]

    def records() -> Iterator[dict]:
        for index in range(count):
            label = index % len(classes)
            scene = _dominant_object_scene(np.random.default_rng([seed, _STREAMS[name], index]), config,
                                           attribute, classes[label])
            yield {"__key__": f"{index:06d}", "png": encode_png(render(scene)), "cls": str(label).encode()}

    root = benchmark_dir / name
    _write_shards(root / "test", records(), shard_size, "{}.tar", with_nshards=True)
    (root / "classnames.txt").write_text("\n".join(classes) + "\n")
    (root / "zeroshot_classification_templates.txt").write_text("\n".join(templates) + "\n")
    return root


def _write_retrieval_set(root: Path, scenes: list[Scene], shard_size: int) -> Path:
    """clip-benchmark wds retrieval set: each test image with its three true captions."""
    records = (
        {"__key__": f"{index:06d}", "png": encode_png(render(scene)),
         "txt": "\n".join([caption(scene.description), *paraphrases(scene.description)]).encode()}
        for index, scene in enumerate(scenes)
    )
    _write_shards(root / "test", records, shard_size, "{}.tar", with_nshards=True)
    (root / "dataset_type.txt").write_text("retrieval\n")
    return root


def _write_shards(directory: Path, records: Iterable[dict], shard_size: int, name_format: str, *,
                  with_sizes: bool = False, with_nshards: bool = False) -> str:
    """Write records into tars of `shard_size` samples; return the brace pattern relative to the root.

    Tar members get a fixed integer mtime, owner and mode, so the same records give byte-identical
    tars with plain ustar headers (a float mtime would add a pax header to every member).
    """
    directory.mkdir(parents=True, exist_ok=True)
    sizes: dict[str, int] = {}
    records = iter(records)
    while chunk := list(itertools.islice(records, shard_size)):
        name = name_format.format(len(sizes))
        with wds.TarWriter(str(directory / name), encoder=False, mtime=0, user="demo", group="demo") as sink:
            for record in chunk:
                sink.write(record)
        sizes[name] = len(chunk)
    if with_sizes:
        (directory / "sizes.json").write_text(json.dumps(sizes, indent=1, sort_keys=True) + "\n")
    if with_nshards:
        (directory / "nshards.txt").write_text(f"{len(sizes)}\n")
    return f"{directory.name}/{_brace_pattern(name_format, len(sizes))}"


def _brace_pattern(name_format: str, count: int) -> str:
    """'shard-{:06d}.tar', 3 -> 'shard-{000000..000002}.tar' (a plain name for one shard)."""
    if count == 1:
        return name_format.format(0)
    prefix, rest = name_format.split("{", 1)
    spec, suffix = rest.split("}", 1)
    number = "{" + spec + "}"
    return f"{prefix}{{{number.format(0)}..{number.format(count - 1)}}}{suffix}"


def _scene_json(scene: Scene) -> dict:
    return {
        "relation": scene.description.relation,
        "objects": [{**asdict(placed.spec), "x": round(placed.x, 3), "y": round(placed.y, 3),
                     "radius": round(placed.radius, 3)} for placed in scene.objects],
    }


def _json_bytes(obj: dict) -> bytes:
    return json.dumps(obj, sort_keys=True).encode()
