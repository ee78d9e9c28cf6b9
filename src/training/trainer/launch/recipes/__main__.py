"""`python -m training.trainer.launch.recipes NAME [--world-size N] [--check]`: the trainer flags a recipe sets, as a
command line (for launch scripts and for reading); exit 2 when the recipe cannot serve the world size."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Optional, Sequence

from . import RECIPES, RecipeError, recipe_values


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m training.trainer.launch.recipes",
        description="Print the trainer flags a recipe sets (for launch scripts).",
    )
    parser.add_argument("recipe", help=f"one of {', '.join(sorted(RECIPES))}")
    parser.add_argument("--world-size", type=int, default=1, help="ranks of the run (the global batch is split)")
    parser.add_argument("--check", action="store_true", help="only check that the recipe serves this world size")
    args = parser.parse_args(argv)
    try:
        values = recipe_values(args.recipe, args.world_size)
    except RecipeError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    if not args.check:
        # Imported here: the launch scripts run --check before every launch, and the trainer's parser
        # would cost them the import of torch and open_clip (seconds).
        from ..params import argv_from_values

        print(shlex.join(argv_from_values(values)))


if __name__ == "__main__":
    main()
