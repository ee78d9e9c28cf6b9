"""The scene model of the demo data: what a scene holds, when a description is true of it, sampling.

A scene holds 2 objects (3 with `SceneConfig.three_object_prob`), each a (size, colour, shape) drawn
anywhere in the frame on a noisy, tinted, shaded background. Its `Description` names the objects and
how the first one lies relative to all the others (captioned "a large red circle to the left of a
small blue square[ and a small green triangle]" by `training.synthetic_scenes.captions`): the first object's
extent is clear of each other object's along that axis, so both readings of the "and" are true
(`holds`). A clone of the description (`training.synthetic_scenes.edits`) is checked never to describe the
image (`could_hold`).

Sampling draws only from the `numpy.random.Generator` it is given, so the same seed gives the same
scenes (`training.synthetic_scenes.writers` gives each family and scene its own generator).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterator

import numpy as np

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
        transfer setting: no evaluation image holds a pair seen in pretraining.
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
    return any(
        all(_axis_gap(first, other, description.relation)[1] > 0 for other in others)
        for first, *others in _assignments(scene, description)
    )


def could_hold(scene: Scene, description: Description) -> bool:
    """True unless the description is clearly false: no objects match, or for every match some
    other object's centre lies on the wrong side of the first one's. Clones must make this False."""
    return any(
        all(_axis_gap(first, other, description.relation)[0] > 0 for other in others)
        for first, *others in _assignments(scene, description)
    )


# ---------------------------------------------------------------------------------------------
# Sampling


def sample_description(rng: np.random.Generator, config: SceneConfig) -> Description:
    """Random objects (distinct shapes, so a caption names each object unambiguously) and relation."""
    num_objects = 3 if rng.random() < config.three_object_prob else 2
    shapes = rng.choice(SHAPES, size=num_objects, replace=False)
    objects = tuple(
        ObjectSpec(
            size=str(rng.choice(SIZES)),
            shape=str(shape),
            color=str(
                rng.choice([color for color in COLORS if combination_allowed(color, str(shape), config.combinations)])
            ),
        )
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
    bounds = (
        np.array([config.small_radius if spec.size == "small" else config.large_radius for spec in description.objects])
        * size
    )
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


def _scene_from_layout(
    description: Description, centre: np.ndarray, radius: np.ndarray, rng: np.random.Generator, config: SceneConfig
) -> Scene:
    """Add jittered colours and a random background to a valid layout."""
    jitter = rng.integers(-18, 19, size=(len(radius), 3))
    placed = tuple(
        PlacedObject(
            spec,
            float(x),
            float(y),
            float(r),
            tuple(int(c) for c in np.clip(np.array(COLORS[spec.color]) + shift, 0, 255)),
        )
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
