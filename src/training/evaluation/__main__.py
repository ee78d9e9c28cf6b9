"""`python -m training.evaluation`: zero-shot evaluation with the stock clip-benchmark (`training.evaluation.zero_shot`)."""

from training.trainer.extras import exit_for_missing_extra


def cli() -> None:
    """The command (also the `adacl-evaluate` console script); without the [eval] extra, one line naming it."""
    try:
        from .zero_shot import cli as run
    except ModuleNotFoundError as error:
        exit_for_missing_extra(error, "python -m training.evaluation", "eval")
    run()


if __name__ == "__main__":
    cli()
