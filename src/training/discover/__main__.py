"""`python -m training.discover`: the clone negatives AdaCL's discovery flags in a dataset (`training.discover.cli`)."""

from .cli import cli

if __name__ == "__main__":
    cli()
