"""`python -m training.evaluation`: zero-shot evaluation with the stock clip-benchmark (`training.evaluation.zero_shot`)."""
from .zero_shot import cli

if __name__ == "__main__":
    cli()
