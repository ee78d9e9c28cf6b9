"""Train every loss on the demo data under one budget and seeds, evaluate, write docs/RESULTS.md.

A thin wrapper over `python -m training.loss_comparison` (same flags), e.g.

    python scripts/compare_losses.py --quick --losses clip,siglip,adacl:mode=literal,adacl:mode=calibrated,glofnd,fne
"""
from training.loss_comparison.cli import cli

if __name__ == "__main__":
    cli()
