"""Train every loss on the demo data under one budget and seeds, evaluate, write docs/RESULTS.md.

A thin wrapper over `python -m training.benchmark` (same flags), e.g.

    python scripts/run_benchmark.py --quick --losses clip,siglip,adacl:mode=literal,adacl:mode=calibrated,glofnd,fne
"""
from loss_comparison.cli import cli

if __name__ == "__main__":
    cli()
