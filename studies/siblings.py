"""Print how many of a training batch's negatives are siblings (same family id in the json), as the
real loader delivers them, for each --train-group-size in --group-sizes. See docs/data.md.

    python -m studies siblings --train-data 'demo/data/train/shard-{000000..000015}.tar' \\
        --batch-size 128 --group-sizes 1,8
"""

import argparse

from training.synthetic_scenes.families import measure_siblings
from training.trainer.data import DataConfig
from training.trainer.launch.tool_flags import add_trainer_flags

from .command import Command, register_command


def options(parser: argparse.ArgumentParser) -> None:
    add_trainer_flags(
        parser.add_argument_group("the trainer's flags"),
        ("train_data", "train_num_samples", "batch_size", "workers", "seed", "epochs"),
        defaults={"batch_size": 128, "workers": 0, "epochs": 1},
        notes={"epochs": "Here: epochs of batches averaged."},
    )
    parser.add_argument(
        "--world-size", type=int, default=1, help="ranks the shards are split over (rank 0 is measured)"
    )
    parser.add_argument("--group-sizes", default="1,8", help="comma list of --train-group-size values to measure")


def run(args: argparse.Namespace) -> None:
    if not args.train_data:
        raise SystemExit("error: give --train-data (the training shards)")
    for group_size in (int(size) for size in args.group_sizes.split(",")):
        cfg = DataConfig(
            train_data=args.train_data,
            train_num_samples=args.train_num_samples,
            batch_size=args.batch_size,
            world_size=args.world_size,
            workers=args.workers,
            seed=args.seed,
            group_size=group_size,
            dataset_type="webdataset",
        )
        stats = measure_siblings(cfg, epochs=args.epochs)
        print(
            f"--train-group-size {group_size:3d}: {stats.siblings_per_row:.2f} siblings per row at batch "
            f"{stats.batch_size} ({stats.sibling_fraction:.2%} of in-batch negatives), {stats.num_batches} batches"
        )


register_command(Command("siblings", __doc__, run, options))
