"""The Trainer declares its parts: one field, its config, and the run's parts built once into a frozen `RunParts`
that holds the frozen `EpochLoop` and only what the loop does not hold (the end-to-end runs are in
tests/training/trainer/engine/test_loop.py)."""

import ast
import dataclasses
import inspect

from training import Trainer
from training.trainer.engine.loop import EpochLoop
from training.trainer.launch import trainer as trainer_module
from training.trainer.launch.trainer import RunParts


def self_assignments(cls: type) -> set:
    """(method, attribute) for every `self.<attribute> = ...` in the methods of `cls`."""
    tree = ast.parse(inspect.getsource(cls))
    found = set()
    for method in ast.walk(tree):
        if not isinstance(method, ast.FunctionDef):
            continue
        for node in ast.walk(method):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                if isinstance(target, ast.Attribute) and getattr(target.value, "id", None) == "self":
                    found.add((method.name, target.attr))
    return found


def test_the_trainer_has_one_declared_field_set_in_init():
    assert Trainer is trainer_module.Trainer
    assert set(Trainer.__annotations__) == {"cfg"}
    assert self_assignments(Trainer) == {("__init__", "cfg")}


def test_the_run_parts_are_frozen_and_do_not_repeat_the_loop():
    assert RunParts.__dataclass_params__.frozen and EpochLoop.__dataclass_params__.frozen
    parts = {field.name for field in dataclasses.fields(RunParts)}
    assert "loop" in parts
    assert parts & {field.name for field in dataclasses.fields(EpochLoop)} == set()
