"""Print how many of a training batch's negatives are siblings (same family id in the json), as the
real loader delivers them, for each --train-group-size given. See docs/data.md.

    python scripts/sibling_fraction.py --train-data 'demo/data/train/shard-{000000..000015}.tar' \\
        --batch-size 128 --train-group-size 1,8
"""
import argparse

from training.data import DataConfig
from training.synthetic_scenes.families import measure_siblings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-data", required=True, help="training shards, as for --train-data")
    parser.add_argument("--train-num-samples", type=int, default=None, help="default: the shards' sizes.json")
    parser.add_argument("--batch-size", type=int, default=128, help="per-rank batch size")
    parser.add_argument("--world-size", type=int, default=1, help="ranks the shards are split over (rank 0 is measured)")
    parser.add_argument("--workers", type=int, default=0, help="loader workers per rank (they split the shards)")
    parser.add_argument("--train-group-size", default="1,8", help="comma list of group sizes to measure")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=1, help="epochs of batches to average over")
    args = parser.parse_args(argv)
    for group_size in (int(size) for size in args.train_group_size.split(",")):
        cfg = DataConfig(train_data=args.train_data, train_num_samples=args.train_num_samples,
                         batch_size=args.batch_size, world_size=args.world_size, workers=args.workers,
                         seed=args.seed, group_size=group_size, dataset_type="webdataset")
        stats = measure_siblings(cfg, epochs=args.epochs)
        print(f"--train-group-size {group_size:3d}: {stats.siblings_per_row:.2f} siblings per row at batch "
              f"{stats.batch_size} ({stats.sibling_fraction:.2%} of in-batch negatives), {stats.num_batches} batches")


if __name__ == "__main__":
    main()
