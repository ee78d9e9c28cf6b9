"""`python -m studies.icons`: write the icon data set (Material Design Icons in families of named variants).

    python -m studies.icons --output data/icons [--data-seed 0 --num-train 6144 --image-size 32 --family-size 4]

The train split is written in families of --family-size icons of one family (train with --train-group-size to
keep them together in a batch). The layout is in `studies.icons.writers`; see docs/icons.md.
"""

import argparse
import sys
from pathlib import Path

from .writers import write_icon_dataset


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m studies.icons", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output", required=True, help="directory to write (created if missing; must be empty)")
    parser.add_argument("--data-seed", type=int, default=0, help="seed of the split and the drawn families")
    parser.add_argument("--num-train", type=int, default=6144, help="training samples (families x --family-size)")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument(
        "--family-size",
        type=int,
        default=4,
        help="icons per training family (and at most one fewer siblings per test icon); keep --shard-size a "
        "multiple of it",
    )
    parser.add_argument("--shard-size", type=int, default=512, help="samples per tar shard")
    args = parser.parse_args(argv)
    try:
        if Path(args.output).exists() and any(Path(args.output).iterdir()):
            raise ValueError(f"{args.output} is not empty: pass a new or empty folder")
        manifest = write_icon_dataset(
            args.output,
            seed=args.data_seed,
            num_train=args.num_train,
            image_size=args.image_size,
            family_size=args.family_size,
            shard_size=args.shard_size,
        )
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    root, splits = Path(args.output), manifest["splits"]
    print(f"wrote the icon data set to {root} (manifest.json lists everything; ORIGIN.md its licence)")
    print(
        f"  {manifest['charmap_icons']} icons in the charmap; {sum(manifest['icons'].values())} in "
        f"{manifest['families']} families, split {manifest['icons']}"
    )
    print(
        f"  train: {splits['train']['num_samples']} samples in families of {args.family_size}, "
        f"{manifest['train_distinct_icons']} distinct icons of {manifest['train_families']} families  "
        f"{root / splits['train']['data']}"
    )
    print(f"  val:   {splits['val']['num_samples']} held-out icons  {root / splits['val']['data']}")
    print(
        f"  test:  {splits['test']['num_samples']} held-out icons (sibling kinds "
        f"{manifest['clone_selection_sibling_kinds']}): clone selection {root / manifest['clone_selection']}, "
        f"clip-benchmark --dataset wds/icon_retrieval --dataset_root {root / manifest['benchmark']['icon_retrieval']}"
    )
