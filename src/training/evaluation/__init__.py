"""Evaluation of trained models after training (in-training validation is `training.trainer.engine.validation`).

- `zero_shot`: zero-shot classification and retrieval with the stock clip-benchmark CLI, plus
  clone selection on the demo data, in one table; `python -m training.evaluation` (`adacl-evaluate`);
- `clone_selection`: does the model prefer an image's true caption over a one-edit clone of it;
- `clone_detection`: AdaCL's clone discovery scored against known sibling families (the loss
  comparison's `detect/` metrics);
- `side_by_side`: several runs' evaluation tables as one, with their difference (the demo's two runs).
"""
