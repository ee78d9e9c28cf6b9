"""`python -m studies.glyphs`: write the glyph benchmark (real font glyphs in families of one-attribute siblings).

    python -m studies.glyphs --output data/glyphs [--data-seed 0 --num-train 6144 --image-size 32 ...]

The train split is written in families of --family-size siblings (train with --train-group-size to keep them
together in a batch); every training sample carries its gold caption (txt) and the generic captioner's
(txt_weak). The layout is in `studies.glyphs.writers`; see docs/glyphs.md.
"""

import argparse
import json
import sys
from pathlib import Path

from .writers import write_glyph_dataset


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m studies.glyphs", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output", required=True, help="directory to write (created if missing; must be empty)")
    parser.add_argument("--data-seed", type=int, default=0, help="seed of the split and the families")
    parser.add_argument("--num-train", type=int, default=6144, help="training samples (families x --family-size)")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument(
        "--family-size",
        type=int,
        default=8,
        help="glyphs per training family (a base and its siblings); keep --shard-size a multiple of it",
    )
    parser.add_argument("--shard-size", type=int, default=512, help="samples per tar shard")
    parser.add_argument(
        "--weak-drop",
        type=float,
        default=0.5,
        help="probability that the weak captioner drops each detail group (marks, weight, slant, typeface)",
    )
    args = parser.parse_args(argv)
    try:
        if Path(args.output).exists() and any(Path(args.output).iterdir()):
            raise ValueError(f"{args.output} is not empty: pass a new or empty folder")
        data = write_glyph_dataset(
            args.output,
            seed=args.data_seed,
            num_train=args.num_train,
            image_size=args.image_size,
            family_size=args.family_size,
            shard_size=args.shard_size,
            weak_drop=args.weak_drop,
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    manifest = json.loads((data.root / "manifest.json").read_text())
    print(f"wrote the glyph benchmark to {data.root} (manifest.json lists everything; ORIGIN.md its licence)")
    print(
        f"  {manifest['letters']} letters x {len(manifest['faces'])} faces = "
        f"{sum(manifest['glyphs'].values())} glyphs, split {manifest['glyphs']}"
    )
    print(
        f"  train: {data.num_samples['train']} samples in families of {args.family_size}, "
        f"{manifest['train_distinct_glyphs']} distinct glyphs  {data.train_data}"
    )
    for field, share in manifest["train_caption_duplicates"].items():
        print(
            f"  {field}: {share['shared_in_split']:.1%} of training samples share their caption with another glyph "
            f"({share['shared_in_family']:.1%} within their family)"
        )
    print(f"  val:   {data.num_samples['val']} held-out glyphs  {data.val_data}")
    print(
        f"  test:  {data.num_samples['test']} held-out glyphs: clone selection {data.clone_selection}, "
        f"clip-benchmark --dataset wds/glyph_retrieval --dataset_root {data.retrieval}"
    )
