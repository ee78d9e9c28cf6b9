"""A parser of OpenCLIP's output reads ours: the same run, once with stock open_clip_train and once with
`training.main`, parsed with patterns written from stock's code (open_clip_torch 3.3.0), gives the same keys.

The patterns, from open_clip_train/train.py 3.3.0:
- the step line, `train_one_epoch` lines 207-221: `f"Train Epoch: {epoch} [{num_samples:>{sample_digits}}/
  {samples_per_epoch} ({percent_complete:.0f}%)] Data (t): {data_time_m.avg:.3f} Batch (t): {batch_time_m.avg:.3f},
  {samples_per_second:#g}/s, {samples_per_second_per_gpu:#g}/s/gpu LR: {lr:5f} Logit Scale: {logit_scale_scalar:.3f} "
  + loss_log`, where loss_log joins `f"{loss_name.capitalize()}: {loss_m.val:#.5g} ({loss_m.avg:#.5g})"` over the
  loss's output dict and "loss" (line 110: `losses["loss"] = total_loss`), so the line ends at the total's mean;
- TensorBoard, lines 225-238: `log_data = {"train/" + name: val ...}`, `tb_writer.add_scalar(name, val, step)` with
  `step = num_batches_per_epoch * epoch + i_accum` (line 87: the first step is 0);
- `evaluate`, lines 323-346: `metrics` (zero-shot, `get_clip_metrics`'s `{name}_mean_rank|_median_rank|_R@k`,
  `clip_val_loss`, `epoch`, `num_samples`) logged as `f"Eval Epoch: {epoch} " + "\\t".join(f"{k}: {round(v, 4):.4f}")`
  (besides a progress line `Eval Epoch: {epoch} [{num_samples} / {samples_per_val}]\\tClip Loss: ...`), written as
  `json.dumps(metrics)` to `checkpoint_path/results.jsonl`, and to TensorBoard as `"val/" + name` at the epoch.
"""

import json
import logging
import re

import open_clip_train.main as stock_main
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from helpers.run_utils import stock_argv
from training.main import main

STEP_LINE = re.compile(
    r"Train Epoch: \d+ \[\s*\d+/\d+ \(\d+%\)\] Data \(t\): [\d.]+ Batch \(t\): [\d.]+, [\d.e+]+/s, [\d.e+]+/s/gpu "
    r"LR: [\d.]+ Logit Scale: [\d.]+ (?P<losses>(?:\w+: [\d.]+ \([\d.]+\) )*Loss: [\d.]+ \([\d.]+\))$"
)
LOSS_TERM = re.compile(r"(\w+): [\d.]+ \([\d.]+\)")
EVAL_LINE = re.compile(r"Eval Epoch: (?P<epoch>\d+) (?!\[)(?P<metrics>.+)$")
EVAL_METRIC = re.compile(r"^(?P<key>[^:\t]+): (?P<value>-?[\d.]+)$")

pytestmark = pytest.mark.slow  # two trainers' runs, about 10 s


def run_flags(demo_shards, logs, name):
    val = ["--val-data", str(demo_shards / "val" / "shard-000000.tar"), "--val-num-samples", "128"]
    return stock_argv(demo_shards, logs, name, *val, "--report-to", "tensorboard", workers=1)


def parsed(run_dir):
    """What a parser of OpenCLIP's files reads: per step line the loss terms' names, the Eval line's keys, the keys
    of results.jsonl's lines, and each TensorBoard tag's steps."""
    messages = [line.split(" | INFO | ", 1)[-1] for line in (run_dir / "out.log").read_text().splitlines()]
    steps = [STEP_LINE.match(message) for message in messages if message.startswith("Train Epoch: ")]
    assert steps and all(steps), [message for message in messages if message.startswith("Train Epoch: ")]
    [eval_line] = [match for match in map(EVAL_LINE.match, messages) if match]
    eval_metrics = [EVAL_METRIC.match(item) for item in eval_line["metrics"].split("\t")]
    assert all(eval_metrics), eval_line["metrics"]
    results = [json.loads(line) for line in (run_dir / "checkpoints" / "results.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return {
        "loss_terms": {tuple(LOSS_TERM.findall(step["losses"])) for step in steps},
        "eval_keys": [match["key"] for match in eval_metrics],
        "eval_values": {match["key"]: float(match["value"]) for match in eval_metrics},
        "results": results,
        "tensorboard": {tag: [event.step for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]},
    }


@pytest.fixture(scope="module")
def both(demo_shards, module_tmp):
    logs = module_tmp("formats")
    handlers = list(logging.root.handlers)
    stock_main.main(run_flags(demo_shards, logs, "stock"))
    for handler in set(logging.root.handlers) - set(handlers):  # stock's setup_logging: its out.log is its run's
        logging.root.removeHandler(handler)
        handler.close()
    main([*run_flags(demo_shards, logs, "ours"), "--loss", "clip"])
    return parsed(logs / "stock"), parsed(logs / "ours")


def test_the_step_line_carries_the_same_loss_terms_and_ends_as_stocks(both):
    stock, ours = both
    assert stock["loss_terms"] == ours["loss_terms"] == {("Contrastive_loss", "Loss")}


def test_the_eval_line_and_results_jsonl_have_stocks_keys_in_its_order(both):
    stock, ours = both
    assert ours["eval_keys"][: len(stock["eval_keys"])] == stock["eval_keys"]
    assert ours["eval_keys"][len(stock["eval_keys"]) :] == ["clip_val_loss_chance"]  # ours, after stock's
    [stock_line], [our_line] = stock["results"], ours["results"]
    assert list(our_line)[: len(stock_line)] == list(stock_line)
    assert our_line["image_to_text_R@1"] == pytest.approx(ours["eval_values"]["image_to_text_R@1"], abs=5e-5)
    assert our_line["epoch"] == stock_line["epoch"] == 1


def test_tensorboard_has_stocks_tags_at_stocks_steps(both):
    stock, ours = both
    assert set(stock["tensorboard"]) <= set(ours["tensorboard"])
    assert ours["tensorboard"]["train/loss"] == stock["tensorboard"]["train/loss"] == [0, 1, 2, 3]
    assert ours["tensorboard"]["train/contrastive_loss"] == stock["tensorboard"]["train/contrastive_loss"]
    assert ours["tensorboard"]["val/image_to_text_R@1"] == stock["tensorboard"]["val/image_to_text_R@1"] == [1]
