"""`python -m training.synthetic_scenes`: write the built-in demo data (procedural scenes with clone captions).

    python -m training.synthetic_scenes --output DIR [--data-seed 0 --num-train 4096 --family-size 8 ...]

The train split is written in families of --family-size one-edit siblings (train with
--train-group-size to keep them together in a batch); every sample carries its gold caption
(txt), a paraphrase (txt_alt) and a generic pseudo caption (txt_pseudo).
The layout is in `training.synthetic_scenes.writers`; see docs/data.md.
"""

import argparse
import json

from .writers import write_demo_dataset


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m training.synthetic_scenes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--output", required=True, help="directory to write (created if missing)")
    parser.add_argument(
        "--data-seed", type=int, default=0, help="seed of the scenes (the loss comparison's --data-seed)"
    )
    parser.add_argument("--num-train", type=int, default=4096)
    parser.add_argument("--num-val", type=int, default=512)
    parser.add_argument("--num-test", type=int, default=512, help="test split; also each classification set")
    parser.add_argument("--shard-size", type=int, default=512, help="samples per tar shard")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument(
        "--family-size",
        type=int,
        default=8,
        help="train scenes per family of one-edit siblings (1..12; 1: independent scenes); "
        "keep --shard-size a multiple of it",
    )
    args = parser.parse_args(argv)
    demo = write_demo_dataset(
        args.output,
        seed=args.data_seed,
        num_train=args.num_train,
        num_val=args.num_val,
        num_test=args.num_test,
        shard_size=args.shard_size,
        image_size=args.image_size,
        family_size=args.family_size,
    )
    manifest = json.loads((demo.root / "manifest.json").read_text())
    print(f"wrote demo data to {demo.root} (manifest.json lists everything)")
    print(f"  train families of {args.family_size}; caption fields {', '.join(manifest['caption_keys'])}")
    for key, likeness in manifest["train_caption_likeness"].items():
        print(
            f"  {key}: {likeness['shared_in_split']:.1%} of train images share their exact caption with another "
            f"image ({likeness['shared_in_family']:.1%} within their family); siblings' captions are "
            f"{likeness['sibling_word_distance']:.2f} words from their base's on average"
        )
    for split in ("train", "val", "test"):
        print(f"  {split:5s} {demo.num_samples[split]:6d} samples  {getattr(demo, split + '_data')}")
    for name, path in demo.benchmark.items():
        print(f"  clip-benchmark --dataset wds/{name} --dataset_root {path}")
    print(f"  clone selection  {demo.clone_selection}")


if __name__ == "__main__":
    main()
