"""Write the built-in demo data (procedural scenes with clone captions); see `training.scenes`.

    python scripts/make_synthetic_shards.py --output DIR [--seed 0 --num-train 4096 ...]
"""
import argparse

from training.scenes import write_demo_dataset


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", required=True, help="directory to write (created if missing)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-train", type=int, default=4096)
    parser.add_argument("--num-val", type=int, default=512)
    parser.add_argument("--num-test", type=int, default=512, help="test split; also each classification set")
    parser.add_argument("--shard-size", type=int, default=512, help="samples per tar shard")
    parser.add_argument("--image-size", type=int, default=32)
    args = parser.parse_args(argv)
    demo = write_demo_dataset(args.output, seed=args.seed, num_train=args.num_train, num_val=args.num_val,
                              num_test=args.num_test, shard_size=args.shard_size, image_size=args.image_size)
    print(f"wrote demo data to {demo.root} (manifest.json lists everything)")
    for split in ("train", "val", "test"):
        print(f"  {split:5s} {demo.num_samples[split]:6d} samples  {getattr(demo, split + '_data')}")
    for name, path in demo.benchmark.items():
        print(f"  clip-benchmark --dataset wds/{name} --dataset_root {path}")
    print(f"  clone selection  {demo.clone_selection}")


if __name__ == "__main__":
    main()
