"""`python -m studies.comparison`: every loss trained and evaluated over seeds, one report (`studies.comparison.cli`)."""

from .cli import cli

if __name__ == "__main__":
    cli()
