"""`python -m training.torchrun`: torchrun that leaves every flag after `-m training.main` to the trainer.

    python -m training.torchrun --standalone --nproc_per_node 8 -m training.main --logs /ckpt --name run ...

torchrun (2.x) parses the whole command line and abbreviates its own options, so a trainer flag that
prefixes one of them is taken, or refused, by torchrun: `--logs` fails with "ambiguous option: --logs
could match --logs-specs, --logs_specs". Plain torchrun needs `--` after the trainer module; this
launcher inserts it when it is missing and is torchrun otherwise (same options, same environment).
"""
from __future__ import annotations

import sys
from typing import List, Optional, Sequence

TRAINER_MODULE = "training.main"


def with_separator(argv: Sequence[str]) -> List[str]:
    """`argv` with `--` right after the trainer module (`-m training.main`) unless already there."""
    argv = list(argv)
    for position in range(len(argv) - 1):
        if argv[position] in ("-m", "--module") and argv[position + 1] == TRAINER_MODULE:
            after = position + 2
            if argv[after:after + 1] != ["--"]:
                argv.insert(after, "--")
            return argv
    raise SystemExit(f"error: python -m training.torchrun launches the trainer: give -m {TRAINER_MODULE} "
                     f"after torchrun's options (e.g. --nproc_per_node 8 -m {TRAINER_MODULE} --train-data ...)")


def cli(argv: Optional[Sequence[str]] = None) -> None:
    from torch.distributed.run import main as torchrun_main

    torchrun_main(with_separator(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    cli()
