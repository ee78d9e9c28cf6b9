"""The demo data: procedural scenes whose captions have clone negatives by construction.

- `scenes`: the scene model (`SceneConfig`, objects, when a description holds) and sampling;
- `captions`: the gold caption, its paraphrases, the generic pseudo caption, and how alike a
  split's captions are;
- `edits`: one-edit clone captions and the training families of one-edit siblings;
- `rendering`: a scene to pixels;
- `writers`: `write_demo_dataset` (training shards in families, clip-benchmark `wds/` sets, the
  clone-selection set; the layout is in its docstring);
- `families`: how many of a training batch's negatives are siblings, measured on the trainer's
  real batch stream (`training.trainer.data`);
- `cli`: `python -m training.synthetic_scenes --output DIR` writes the demo data.

The names below are the public API. Depends on the trainer (`families` reads its loader) and
never the other way round.
"""

from .captions import caption, paraphrases, pseudo_caption
from .edits import EDIT_TYPES, edit_caption, sample_family
from .rendering import render
from .scenes import Description, ObjectSpec, Scene, SceneConfig, sample_scene
from .writers import DemoDataset, write_demo_dataset

__all__ = [
    "EDIT_TYPES",
    "DemoDataset",
    "Description",
    "ObjectSpec",
    "Scene",
    "SceneConfig",
    "caption",
    "edit_caption",
    "paraphrases",
    "pseudo_caption",
    "render",
    "sample_family",
    "sample_scene",
    "write_demo_dataset",
]
