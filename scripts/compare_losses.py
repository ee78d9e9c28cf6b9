"""Train every loss on the demo data under one budget and seeds, evaluate, write one report.

A thin wrapper over `python -m training.loss_comparison` (same flags; the report goes to
OUTPUT_DIR/results.md unless --results-md names another file), e.g.

    python scripts/compare_losses.py --quick --losses clip,siglip,adacl:mode=literal,adacl:mode=calibrated,glofnd,fne
"""

from training.loss_comparison.cli import cli

if __name__ == "__main__":
    cli()
