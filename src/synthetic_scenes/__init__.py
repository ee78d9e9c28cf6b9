"""The demo data: procedural scenes whose captions have clone negatives by construction.

- `scenes`: the scene generator and `write_demo_dataset` (training shards in families of one-edit
  siblings, clip-benchmark `wds/` sets, the clone-selection set; the layout is in its docstring);
- `families`: how many of a training batch's negatives are siblings, measured on the trainer's
  real batch stream (`training.data`);
- `cli`: `python -m synthetic_scenes --output DIR` writes the demo data.

Depends on the trainer (`families` reads its loader) and never the other way round.
"""
