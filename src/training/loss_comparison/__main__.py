"""`python -m training.loss_comparison`: every loss trained and evaluated over seeds, one report (`training.loss_comparison.cli`)."""

from .cli import cli

if __name__ == "__main__":
    cli()
