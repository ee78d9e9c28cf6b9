"""The trainer end to end on the demo shards (`main(argv)`), and the loop's step rules on small inputs."""

import dataclasses
import logging
import math
import re
import time
from types import SimpleNamespace

import pytest
import torch

from helpers.run_utils import tiny_argv
from open_clip_adacl import create_loss
from open_clip_adacl.losses.base import Loss
from training import RunDir
from training.main import main
from training.trainer.data import Batch
from training.trainer.data.samples import MAX_NAMED_SHARDS, Skipped
from training.trainer.distributed import DistributedEnv
from training.trainer.engine.checkpoint import CheckpointConfig, Checkpointer, TrainState, run_components
from training.trainer.engine.loop import EpochLoop, NonFiniteLossError, TrainConfig, console_stats_text, train_one_epoch
from training.trainer.engine.model import ModelConfig, build_model
from training.trainer.engine.optimizer import OptimizerConfig, build_optimizer
from training.trainer.engine.precision import build_precision
from training.trainer.launch.resume import resume
from training.trainer.run_folder.checkpoint_files import load_checkpoint
from training.trainer.run_folder.logger import MetricsWriter


def train_argv(demo_shards, logs, name, *extra):
    return tiny_argv(
        logs,
        name,
        "--lr",
        "2e-3",
        "--wd",
        "0.1",
        "--log-every-n-steps",
        "1",
        *extra,
        data=demo_shards / "train" / "shard-{000000..000003}.tar",
        epochs=None,
        warmup=4,
    )


# A parser written for OpenCLIP's console lines (open_clip_train/train.py 3.3.0, train_one_epoch's logging.info):
# epoch, [samples/samples per epoch (percent)], data and batch time, throughput, LR, logit scale, then each loss
# term as "Name: value (running mean)" (`loss_name.capitalize()`, ClipLoss's one term "Contrastive_loss"), of which
# "Loss:" is the total and the line's end.
OPENCLIP_LINE = re.compile(
    r"Train Epoch: (?P<epoch>\d+) \[\s*(?P<samples>\d+)/(?P<samples_per_epoch>\d+) \((?P<percent>\d+)%\)\] "
    r"Data \(t\): (?P<data_time>[\d.]+) Batch \(t\): (?P<batch_time>[\d.]+), (?P<throughput>[\d.e+]+)/s, "
    r"(?P<throughput_per_gpu>[\d.e+]+)/s/gpu LR: (?P<lr>[\d.]+) Logit Scale: (?P<logit_scale>[\d.]+) "
    r"Contrastive_loss: (?P<term>[\d.]+) \((?P<term_mean>[\d.]+)\) Loss: (?P<loss>[\d.]+) \((?P<loss_mean>[\d.]+)\)$"
)
# What OpenCLIP 3.3.0 prints for a CLIP loss, as its f-string formats it.
OPENCLIP_EXAMPLE = (
    "Train Epoch: 0 [ 4096/10000 (41%)] Data (t): 0.123 Batch (t): 0.456, 8982.46/s, 1122.81/s/gpu "
    "LR: 0.000500 Logit Scale: 14.286 Contrastive_loss: 5.1234 (5.3456) Loss: 5.1234 (5.3456)"
)
# Ours, the line after each step line.
PROGRESS = re.compile(
    r"^Step (?P<step>\d+): samples seen (?P<seen>\d+), time left: (?:epoch (?P<epoch_left>[^,]+), "
    r"run (?P<run_left>\d+ s|\d+ min|\d+ h \d\d min)|from the next logged step .*)"
)


def check_openclip_log_lines(out_log, steps, *, steps_per_epoch, batch_size):
    """Every step's console line parses with OPENCLIP_LINE (as OpenCLIP's own does), its numbers are the step's,
    and the next line holds the step, the samples seen and the time left in the epoch and the run (from the second
    step of an epoch on: the first is not timed)."""
    assert OPENCLIP_LINE.match(OPENCLIP_EXAMPLE)
    messages = [line.split(" | INFO | ")[-1] for line in out_log.splitlines()]
    indices = [index for index, message in enumerate(messages) if message.startswith("Train Epoch: ")]
    assert len(indices) == len(steps)
    epoch_losses = []
    for index, record in zip(indices, steps):
        line = messages[index]
        parsed, progress = OPENCLIP_LINE.match(line), PROGRESS.match(messages[index + 1])
        assert parsed and progress, (line, messages[index + 1])
        step_in_epoch = (record["step"] - 1) % steps_per_epoch + 1
        epoch_losses = epoch_losses[: step_in_epoch - 1] + [record["loss"]]
        assert int(parsed["epoch"]) == record["epoch"]
        assert (int(parsed["samples"]), int(parsed["samples_per_epoch"])) == (
            step_in_epoch * batch_size,
            steps_per_epoch * batch_size,
        )
        assert float(parsed["loss"]) == pytest.approx(record["loss"], rel=1e-4) == float(parsed["term"])
        assert float(parsed["loss_mean"]) == pytest.approx(sum(epoch_losses) / len(epoch_losses), rel=1e-4)
        assert float(parsed["throughput"]) == pytest.approx(record["samples_per_second"], rel=1e-4)
        assert (int(progress["step"]), int(progress["seen"])) == (record["step"], record["step"] * batch_size)
        assert (progress["epoch_left"] is None) == (step_in_epoch == 1)  # the epoch's first step is not timed
        assert progress["epoch_left"] in (None, "0 s") or step_in_epoch < steps_per_epoch
    last, second = PROGRESS.match(messages[indices[-1] + 1]), PROGRESS.match(messages[indices[1] + 1])
    assert last["run_left"] == "0 s" and second["run_left"] != "0 s"


@pytest.mark.slow
def test_training_on_demo_shards_lowers_the_loss(demo_shards, tmp_path):
    summary = main(
        train_argv(
            demo_shards,
            tmp_path,
            "smoke",
            "--epochs",
            "3",
            "--val-data",
            str(demo_shards / "val" / "shard-000000.tar"),
            "--report-to",
            "tensorboard",
        )
    )
    run = tmp_path / "smoke"
    steps = RunDir(run).metrics("train")
    assert [r["step"] for r in steps] == list(range(1, 49)) and summary.step == 48 and summary.epoch == 3
    losses = [r["loss"] for r in steps]
    first, last = sum(losses[:8]) / 8, sum(losses[-8:]) / 8
    assert last < first - 0.4, (first, last)  # ln(32) = 3.47 is chance level
    assert all(0 < r["logit_scale"] <= 100 and r["lr"] > 0 and r["samples_per_second"] > 0 for r in steps)

    epochs = RunDir(run).metrics("epoch")
    assert [r["epoch"] for r in epochs] == [0, 1, 2] and all(r["num_steps"] == 16 for r in epochs)
    assert all(r["skipped/bad_image"] == 0 for r in epochs)
    val = RunDir(run).metrics("val")
    assert len(val) == 3 and val[-1]["val/image_to_text_R@1"] > 1 / 128  # above chance
    assert (run / "checkpoints" / "results.jsonl").is_file()
    assert list((run / "tensorboard").iterdir())

    params_txt = (run / "params.txt").read_text()
    assert (
        "loss: clip" in params_txt
        and "loss_options: {'shared_matmul': False}" in params_txt
        and "precision: fp32" in params_txt
    )
    out_log = (run / "out.log").read_text()
    assert "Train Epoch: 2 [512/512 (100%)]" in out_log and "Done: 3 epochs, 48 steps" in out_log
    check_openclip_log_lines(out_log, steps, steps_per_epoch=16, batch_size=32)
    assert summary.checkpoint == str(run / "checkpoints" / "epoch_3.pt")
    checkpoint = load_checkpoint(summary.checkpoint)
    assert (checkpoint["epoch"], checkpoint["step"]) == (3, 48)
    assert summary.final_loss == pytest.approx(epochs[-1]["loss"])


def test_the_console_line_says_the_directions_once_and_only_the_losss_console_stats():
    stats = {"i2t/m2": 0.0312, "i2t/anchor": 0.41, "i2t/p_u": 0.5, "t2i/m2": 0.0287, "t2i/anchor": 0.39, "t2i/p_u": 0.4}
    assert console_stats_text(stats, ("m2", "anchor")) == "i2t/t2i m2: 0.0312/0.0287 anchor: 0.41/0.39"
    assert console_stats_text({"i2t/m2": 1.0, "scale": 2.0}, None) == "i2t/m2: 1 scale: 2"  # directions differ
    assert console_stats_text({}, None) == ""


@pytest.mark.slow
def test_an_existing_run_is_not_overwritten(demo_shards, tmp_path):
    main(train_argv(demo_shards, tmp_path, "once", "--epochs", "1", "--train-num-samples", "64"))
    from training import ConfigError

    with pytest.raises(ConfigError, match="already holds a run; continue it with --resume latest"):
        main(train_argv(demo_shards, tmp_path, "once", "--epochs", "1", "--train-num-samples", "64"))


def test_missing_shards_are_a_clear_error_before_training(tmp_path):
    from training import ConfigError

    with pytest.raises(ConfigError, match="do not exist"):
        main(
            [
                "--train-data",
                str(tmp_path / "nowhere-{000..003}.tar"),
                "--model",
                "adacl-tiny",
                "--device",
                "cpu",
                "--workers",
                "0",
                "--logs",
                str(tmp_path),
                "--name",
                "missing",
            ]
        )
    assert not (tmp_path / "missing").exists()


def test_a_rejected_loss_option_stops_before_any_file_is_written(demo_shards, tmp_path):
    from training import ConfigError

    with pytest.raises(ConfigError, match="--loss glofnd: .*data_size"):
        main(train_argv(demo_shards, tmp_path, "no-data-size", "--loss", "glofnd"))
    assert not (tmp_path / "no-data-size").exists()


def test_locked_towers_and_weight_decay_groups_follow_openclip():
    model = build_model(ModelConfig("adacl-tiny", lock_image=True), torch.device("cpu")).model
    assert not any(p.requires_grad for p in model.visual.parameters())
    optimizer = build_optimizer(model, OptimizerConfig(lr=1e-3, wd=0.2, beta1=0.9, beta2=0.98, eps=1e-6))
    no_decay, decay = optimizer.param_groups
    assert (no_decay["weight_decay"], decay["weight_decay"]) == (0.0, 0.2)
    named = {id(p): name for name, p in model.named_parameters()}
    assert "logit_scale" in {named[id(p)] for p in no_decay["params"]}
    assert all(p.ndim >= 2 and "bias" not in named[id(p)] for p in decay["params"])
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert {id(p) for group in optimizer.param_groups for p in group["params"]} == trainable


def test_dry_run_checks_the_shards_without_training(demo_shards, tmp_path, capsys):
    assert main(train_argv(demo_shards, tmp_path, "dry", "--epochs", "2", "--dry-run")) is None
    out = capsys.readouterr().out
    assert "dry run OK" in out and "16 steps per epoch, 32 steps in 2 epochs" in out
    assert not (tmp_path / "dry").exists()


# ---------------------------------------------------------------------------------------------
# The loop's rules on hand-made batches
# ---------------------------------------------------------------------------------------------

NUM_REASONS = 2


class PoisonableClip(Loss):
    """The clip loss, made NaN for batches whose first sample_index is negative; its staged state
    update records the batch's first sample_index into `committed`."""

    def __init__(self):
        super().__init__()
        self.clip = create_loss("clip")
        self.epochs_started = []
        self.committed = []
        self.stats_asked = []  # per forward, whether the trainer will read its stats

    def on_epoch_start(self, epoch):
        self.epochs_started.append(epoch)

    def forward(self, image_features, text_features, logit_scale, logit_bias=None, *, sample_index=None):
        loss = self.clip(image_features, text_features, logit_scale)
        self.stats_asked.append(self.wants_stats)
        self.stats = {"positives": torch.tensor(float(len(sample_index)))}
        self.stage_update(lambda: self.committed.append(int(sample_index[0])))
        return loss * float("nan") if sample_index[0] < 0 else loss


def _batches(poisoned, num=6, batch=4):
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(num):
        index = torch.arange(batch) + batch * i
        if i in poisoned:
            index = -index - 1
        out.append(
            Batch(
                torch.randn(batch, 3, 32, 32, generator=g),
                torch.randint(1, 500, (batch, 24), generator=g),
                index,
                Skipped(torch.tensor([i, 1]), {}),
            )
        )
    return out


def _run_epoch(batches, tmp_path, max_nonfinite=3, accum_freq=1, loss_fn=None, save_every=0, log_every=1):
    """One epoch over `batches`; with `save_every`, step_N.pt every `save_every` steps in tmp_path/checkpoints."""
    trainer, snapshots = _trainer(tmp_path, max_nonfinite, accum_freq, loss_fn, save_every, log_every)
    result = train_one_epoch(trainer, SimpleNamespace(dataloader=batches, num_batches=len(batches)))
    return result, trainer.state, snapshots, trainer.loss_fn


def _trainer(tmp_path, max_nonfinite=3, accum_freq=1, loss_fn=None, save_every=0, log_every=1):
    """An EpochLoop of adacl-tiny with PoisonableClip (or `loss_fn`), and the list of steps its optimizer took."""
    torch.manual_seed(0)
    model = build_model(ModelConfig("adacl-tiny"), torch.device("cpu")).model
    optimizer = build_optimizer(model, OptimizerConfig(lr=1e-3, wd=0.1, beta1=0.9, beta2=0.98, eps=1e-6))
    loss_fn = PoisonableClip() if loss_fn is None else loss_fn
    state = TrainState()
    snapshots = []
    optimizer.register_step_post_hook(lambda *_: snapshots.append(state.step))
    metrics = MetricsWriter(str(tmp_path))
    checkpointer = None
    if save_every:
        components = run_components(model=model, optimizer=optimizer, scaler=None, loss=loss_fn, state=state)
        checkpointer = Checkpointer(
            CheckpointConfig(save_every_n_steps=save_every),
            checkpoint_dir=str(tmp_path / "checkpoints"),
            components=components,
            env=DistributedEnv(),
            name="n",
            args={},
            model_cfg={},
            preprocess_cfg={},
        )
    trainer = EpochLoop(
        model,
        loss_fn,
        optimizer,
        None,
        build_precision("fp32", torch.device("cpu")),
        state,
        TrainConfig(accum_freq=accum_freq, log_every_n_steps=log_every, max_nonfinite_steps=max_nonfinite),
        DistributedEnv(),
        metrics,
        skip_reasons=("bad_image", "empty_caption"),
        checkpointer=checkpointer,
    )
    return trainer, snapshots


def test_nonfinite_steps_are_skipped_and_counted(tmp_path):
    result, state, optimizer_steps, loss_fn = _run_epoch(_batches(poisoned={1, 2}), tmp_path)
    assert optimizer_steps == [0, 3, 4, 5]  # no update at steps 1 and 2
    assert loss_fn.committed == [0, 12, 16, 20]  # nor a loss state update: batches 0, 3, 4, 5
    assert (result.num_steps, result.num_nonfinite_steps, state.step) == (6, 2, 6)
    assert state.consecutive_nonfinite_steps == 0 and loss_fn.epochs_started == [0]
    assert math.isfinite(result.loss)
    records = RunDir(tmp_path).metrics("train")
    assert [r["num_nonfinite_steps"] for r in records] == [0, 1, 2, 2, 2, 2]
    assert records[0]["stats/positives"] == 4.0  # the loss's stats are logged as floats


def test_the_loss_is_asked_for_its_stats_on_the_logged_steps_only(tmp_path):
    # every 4th step from the first, and the epoch's last: steps 1, 5 and 7 of 7
    result, _, _, loss_fn = _run_epoch(_batches(poisoned=set(), num=7), tmp_path, log_every=4)
    assert loss_fn.stats_asked == [True, False, False, False, True, False, True]
    assert [r["step"] for r in RunDir(tmp_path).metrics("train")] == [1, 5, 7]


def test_skip_counts_are_summed_into_the_epoch_summary(tmp_path):
    result, *_ = _run_epoch(_batches(poisoned=set()), tmp_path)
    assert result.skipped == {"bad_image": 0 + 1 + 2 + 3 + 4 + 5, "empty_caption": 6}
    [epoch] = RunDir(tmp_path).metrics("epoch")
    assert epoch["skipped/bad_image"] == 15 and epoch["num_steps"] == 6


def test_the_epoch_summary_names_the_shards_whose_visits_were_cut_short(tmp_path, caplog):
    """Each batch's Skipped names its cut shards; the summary line and metrics.jsonl name them, the first
    MAX_NAMED_SHARDS only, with the visits of the others counted as "and K more visits"."""
    batches = _batches(poisoned=set(), num=2 + MAX_NAMED_SHARDS)
    shards = [f"/data/shard-{i}.tar" for i in range(MAX_NAMED_SHARDS + 2)]
    batches[0] = batches[0]._replace(skipped=Skipped(torch.tensor([1, 0]), {shards[0]: {"bad_tar": 1}}))
    for i, batch in enumerate(batches[1:], start=1):  # shard 0 cut again, then one more shard per batch
        visits = {shards[0]: {"bad_tar": 1}, shards[i]: {"bad_tar": 1}}
        batches[i] = batch._replace(skipped=Skipped(torch.tensor([2, 0]), visits))
    trainer, _ = _trainer(tmp_path)
    trainer = dataclasses.replace(trainer, skip_reasons=("bad_tar", "empty_caption"))
    with caplog.at_level(logging.INFO):
        result = train_one_epoch(trainer, SimpleNamespace(dataloader=batches, num_batches=len(batches)))
    named = {shards[0]: {"bad_tar": len(batches)}, **{shard: {"bad_tar": 1} for shard in shards[1:MAX_NAMED_SHARDS]}}
    assert result.skipped_shards == named
    [line] = [record.getMessage() for record in caplog.records if "Epoch 0 done" in record.getMessage()]
    listed = "; ".join(f"{shard}: bad_tar {visits['bad_tar']}" for shard, visits in named.items())
    assert f"skipped shard visits: bad_tar {2 * len(batches) - 1} ({listed}; and 2 more visits)," in line
    [epoch] = RunDir(tmp_path).metrics("epoch")
    assert epoch["skipped_shards"] == named and epoch["skipped_shard_visits"] == 2 * len(batches) - 1


def test_a_resumed_epoch_names_the_shards_cut_before_the_interruption(tmp_path):
    """The checkpointed epoch sums carry the named shards: the epoch resumed from step_3.pt ends with the
    summary of the uninterrupted epoch."""
    batches = _batches(poisoned=set())
    for i in (1, 4):
        batches[i] = batches[i]._replace(skipped=Skipped(torch.tensor([1, 0]), {f"/data/cut-{i}.tar": {"bad_tar": 1}}))
    whole, *_ = _run_epoch(batches, tmp_path / "whole", save_every=3)
    resumed, _ = _trainer(tmp_path / "resumed")
    components = run_components(
        model=resumed.model, optimizer=resumed.optimizer, scaler=None, loss=resumed.loss_fn, state=resumed.state
    )
    resume(tmp_path / "whole" / "checkpoints" / "step_3.pt", components, env=DistributedEnv())
    assert resumed.state.position.batches_in_epoch == 3
    result = train_one_epoch(resumed, SimpleNamespace(dataloader=batches[3:], num_batches=len(batches)))
    assert (
        result.skipped_shards
        == whole.skipped_shards
        == {"/data/cut-1.tar": {"bad_tar": 1}, "/data/cut-4.tar": {"bad_tar": 1}}
    )
    assert result.skipped == whole.skipped


def test_consecutive_nonfinite_steps_stop_the_run_naming_the_causes_and_the_last_good_checkpoint(tmp_path):
    """No step checkpoint is written during the streak (steps 3 to 5, as metrics.jsonl numbers them): the stop
    names step_2.pt."""
    stop = (
        r"3 consecutive steps.*the last at step 5 .*learning rate.*precision.*; resume from the last checkpoint "
        r"written at a finite step, .*/step_2.pt, with --resume "
    )
    with pytest.raises(NonFiniteLossError, match=stop):
        _run_epoch(_batches(poisoned={2, 3, 4}), tmp_path, max_nonfinite=3, save_every=1)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*.pt")) == ["step_1.pt", "step_2.pt"]


def test_a_streak_at_the_end_of_an_epoch_writes_no_checkpoint_and_names_the_last_finite_one(tmp_path, caplog):
    """Steps 5 and 6 of 6 non-finite (metrics.jsonl's numbers, also in the warnings): the epoch's own checkpoints
    (epoch_1.pt, step_6.pt) are not written while the loss is non-finite; the warning names step_4.pt."""
    trainer, _ = _trainer(tmp_path, max_nonfinite=3, save_every=2)
    batches = _batches(poisoned={4, 5})
    with caplog.at_level(logging.WARNING):
        train_one_epoch(trainer, SimpleNamespace(dataloader=batches, num_batches=len(batches)))
        trainer.state.finish_epoch()
        assert trainer.checkpointer.save_epoch() is False
    checkpoints = tmp_path / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_2.pt", "step_4.pt"]
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert [w.split(":")[0] for w in warnings if "non-finite loss (" in w] == ["Step 5", "Step 6"]
    assert warnings[-1] == (
        "Not writing step_6.pt, epoch_1.pt: the loss of the last 2 step(s) was non-finite; the "
        f"last checkpoint written at a finite step is {checkpoints / 'step_4.pt'}"
    )
    assert [r["step"] for r in RunDir(tmp_path).metrics("train")] == [1, 2, 3, 4, 5, 6]


def test_a_state_made_nonfinite_by_the_update_of_a_finite_step_is_never_written_nor_named(tmp_path, caplog):
    """Step 2's loss is finite but its update leaves a NaN weight (as an overflowing learning rate does): step_2.pt
    is not written, and the stop after the NaN losses that follow names step_1.pt, which resumes finite."""
    trainer, _ = _trainer(tmp_path, max_nonfinite=3, save_every=1)
    weight_name, weight = next(iter(trainer.model.named_parameters()))

    def overflow_at_step_2(*_):
        if trainer.state.step == 1:  # the hook runs before the step is counted
            with torch.no_grad():
                weight[0] = float("nan")

    trainer.optimizer.register_step_post_hook(overflow_at_step_2)
    batches = _batches(poisoned=set())
    with caplog.at_level(logging.WARNING), pytest.raises(NonFiniteLossError, match=r"step_1\.pt, with --resume "):
        train_one_epoch(trainer, SimpleNamespace(dataloader=batches, num_batches=len(batches)))
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pt")) == ["step_1.pt"]
    assert (
        f"Not writing step_2.pt: the state after step 2's update holds non-finite values (1 tensors, e.g. "
        f"state_dict.{weight_name}); the last checkpoint written at a finite step is "
        f"{tmp_path / 'checkpoints' / 'step_1.pt'}"
    ) in caplog.text
    saved = load_checkpoint(tmp_path / "checkpoints" / "step_1.pt")
    assert all(torch.isfinite(value).all() for value in saved["state_dict"].values() if value.is_floating_point())


def test_accumulation_takes_one_step_per_accum_freq_batches(tmp_path):
    result, state, optimizer_steps, loss_fn = _run_epoch(_batches(poisoned=set(), num=7), tmp_path, accum_freq=2)
    assert (result.num_steps, state.step, state.position.batches_in_epoch) == (3, 3, 6)
    # The loss ran twice per step (once per micro-batch) and its state moved once per step.
    assert loss_fn.committed == [0, 8, 16]


def test_a_nonfinite_batch_leaves_the_adacl_queue_unchanged(tmp_path):
    clean = _batches(poisoned=set(), num=3)
    poisoned = list(clean)
    poisoned.insert(1, clean[1]._replace(images=torch.full_like(clean[1].images, float("nan"))))  # NaN features
    for run in ("poisoned", "clean"):
        (tmp_path / run).mkdir()
    result, _, _, loss_fn = _run_epoch(poisoned, tmp_path / "poisoned", loss_fn=create_loss("adacl", queue_size=8))
    _, _, _, reference = _run_epoch(clean, tmp_path / "clean", loss_fn=create_loss("adacl", queue_size=8))
    assert result.num_nonfinite_steps == 1 and math.isfinite(result.loss)
    assert [r["loss"] for r in RunDir(tmp_path / "poisoned").metrics("train")][2:] == [
        r["loss"] for r in RunDir(tmp_path / "clean").metrics("train")
    ][1:]  # the next steps: finite, as if clean
    for key, value in reference.state_dict().items():
        assert torch.equal(loss_fn.state_dict()[key], value), key
    assert loss_fn.queue_filled == 8 and torch.isfinite(loss_fn.queue_image).all()


@pytest.mark.slow
def test_lock_logit_scale_keeps_the_temperature_while_the_towers_train(demo_shards, tmp_path):
    main(train_argv(demo_shards, tmp_path, "locked", "--epochs", "1", "--lock-logit-scale"))
    steps = RunDir(tmp_path / "locked").metrics("train")
    assert len(steps) == 16 and all(r["logit_scale"] == pytest.approx(1 / 0.07, rel=1e-6) for r in steps)
    assert steps[-1]["loss"] < steps[0]["loss"]  # the towers still learn


def test_a_run_started_from_python_is_the_command_lines_run(demo_shards, tmp_path):
    from training import config_from_values, run
    from training.trainer.launch.params import config_from_recorded_args, given_values
    from training.trainer.run_folder.checkpoint_files import load_checkpoint

    argv = train_argv(
        demo_shards,
        tmp_path,
        "from-python",
        "--epochs",
        "1",
        "--train-num-samples",
        "64",
        "--loss",
        "adacl",
        "--adacl-preset",
        "paper",
    )
    config = config_from_values(given_values(argv))
    summary = run(config)
    record = summary.run_folder
    assert record.path == tmp_path / "from-python" and len(record.metrics("train")) == summary.step == 2
    assert str(record.final_checkpoint()) == summary.checkpoint
    assert "name: from-python" in (record.path / "params.txt").read_text()
    # The run folder reads back the run's config, typed: the same RunConfig, the same args its checkpoint holds.
    recorded = record.recorded_args()
    assert (recorded["batch_size"], recorded["lr"], recorded["loss_options"]["mode"]) == (32, 2e-3, "literal")
    assert config_from_recorded_args(recorded) == config
    assert recorded == load_checkpoint(summary.checkpoint)["args"]


def test_a_wall_clock_that_jumps_back_gives_no_negative_durations(tmp_path, monkeypatch):
    readings = iter(range(10**6, 0, -1))  # the wall clock goes back a second at each reading (an NTP step)
    monkeypatch.setattr(time, "time", lambda: float(next(readings)))
    result, *_ = _run_epoch(_batches(poisoned=set()), tmp_path)
    records = RunDir(tmp_path).metrics("train")
    assert result.seconds >= 0 and all(r["batch_time"] >= 0 and r["data_time"] >= 0 for r in records)
