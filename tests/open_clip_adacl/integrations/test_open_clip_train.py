"""The plug-in for stock open_clip_train (`open_clip_adacl.integrations.open_clip_train`), end to end with the
installed open_clip_torch 3.3.0 trainer on the demo's webdataset shards (adacl-tiny, CPU): every registered loss
trains on 1 and 2 gloo ranks or is refused in one line before any work, AdaCL's state moves once per optimizer step
(`--accum-freq` included), the loss state rides in stock's checkpoints and continues on `--resume`."""

import dataclasses
import subprocess
import sys
import warnings

import open_clip_train.main as stock_main
import pytest
import torch

from helpers.distributed_utils import run_on_ranks
from helpers.run_utils import stock_argv
from open_clip_adacl import create_loss, get_loss_class, list_losses
from open_clip_adacl.integrations.open_clip_train import (
    CHECKPOINT_KEY,
    LossPlugin,
    PluginError,
    main,
    patched_open_clip_train,
    split_argv,
)
from open_clip_adacl.losses.base import UncommittedStateWarning
from open_clip_adacl.losses.flags import loss_option_flag
from open_clip_adacl.losses.options import EpochGatedOptions

STEPS_PER_EPOCH = 4  # --train-num-samples 128 at --batch-size 32


def saved_loss(checkpoint_path):
    """The loss state the plug-in put in a stock checkpoint."""
    checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
    return checkpoint["optimizer"][CHECKPOINT_KEY]


def committed_steps(state_dict):
    """AdaCL's steps per direction as its counters hold them: every committed step either modulated or fell back."""
    return (state_dict["modulated_steps"] + state_dict["fallback_counts"].sum(dim=1)).tolist()


# ---------------------------------------------------------------------------------------------
# Which losses stock can feed: by their capabilities, and as their forward says
# ---------------------------------------------------------------------------------------------


def own_options(name):
    """What a run of one epoch needs of a loss's options: a loss keeping per-sample state, the data's size; one that
    waits for a warm-up (`EpochGatedOptions`), none."""
    options = get_loss_class(name).Options
    return {
        **({"data_size": 512} if get_loss_class(name).needs_sample_index else {}),
        **({"start_epoch": 0} if issubclass(options, EpochGatedOptions) else {}),
    }


def loss_configurations():
    """Every registered loss with its defaults, and every choice of an option that changes what the forward reads
    (adaclw's discoveries, AdaCL's memory bank): (name, options)."""
    configurations = [(name, own_options(name)) for name in list_losses()]
    discovery = next(spec for spec in get_loss_class("adaclw").Options.specs() if spec.name == "discovery")
    configurations += [("adaclw", {"discovery": choice}) for choice in discovery.choices if choice != discovery.default]
    configurations.append(("adacl", {"bank_size": 64, "data_size": 512}))
    return configurations


def runs_on_stock_inputs(name, options):
    """Whether the loss's forward runs on what stock's step has: features, logit scale (and bias), token ids; no
    sample ids or family ids. Decided by running it, not by the capabilities the plug-in reads."""
    loss = create_loss(name, **options)
    loss.wants_stats = False
    generator = torch.Generator().manual_seed(0)
    features = torch.nn.functional.normalize(torch.randn(2, 8, 16, generator=generator), dim=-1)
    inputs = {"text_tokens": torch.randint(1, 50, (8, 12), generator=generator)} if loss.takes_text_tokens else {}
    bias = torch.tensor(-10.0) if loss.needs_logit_bias else None
    try:
        loss(features[0], features[1], torch.tensor(10.0), bias, **inputs)
    except (ValueError, TypeError):
        return False
    return True


def config_id(configuration):
    name, options = configuration
    return name + "".join(f"-{key}={value}" for key, value in options.items())


@pytest.mark.parametrize("configuration", loss_configurations(), ids=config_id)
def test_a_loss_is_refused_before_any_work_exactly_when_stock_cannot_feed_it(configuration, tmp_path):
    name, options = configuration
    feedable = runs_on_stock_inputs(name, options)
    if feedable:
        plugin = LossPlugin.build(name, options)
        assert plugin.name == name
    else:
        with pytest.raises(PluginError) as refused:
            LossPlugin.build(name, options)
        message = str(refused.value)
        assert "\n" not in message and "stock open_clip_train's batches (images, texts) do not carry" in message
        assert "python -m training.main" in message
        assert not (tmp_path / "logs").exists()


@pytest.mark.slow
def test_a_refused_loss_is_one_error_line_from_the_command_line(demo_shards, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "open_clip_adacl.integrations.open_clip_train", "--loss", "adaclw"]
        + ["--adaclw-discovery", "persistence", *stock_argv(demo_shards, tmp_path / "logs", "refused")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: --loss adaclw --adaclw-discovery persistence reads each sample's index (sample_index), which stock "
        "open_clip_train's batches (images, texts) do not carry; train it with python -m training.main (the same flags)"
    ]
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--adacl-mode", "literal"], "--adacl-mode is a loss option: give --loss too"),
        (["--loss", "clip", "--adacl-mode", "literal"], "--adacl-mode is an option of --loss adacl"),
        (["--loss", "adacl", "--adacl-eps", "2"], "--loss adacl: --adacl-eps must be in (0, 1), got 2.0"),
        (["--loss", "adacl", "--adacl-mode", "exact"], "argument --adacl-mode: invalid choice: 'exact'"),
    ],
)
def test_bad_loss_flags_are_one_line(argv, message, tmp_path):
    with pytest.raises(PluginError) as refused:
        main([*argv, "--logs", str(tmp_path)])
    assert message in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra, message",
    [
        (["--siglip"], "--siglip with --loss adacl: builds stock's SigLipLoss"),
        (["--local-loss"], "--local-loss without --gather-with-grad with --loss adacl: gives a wrong gradient"),
        (["--horovod"], "--horovod with --loss adacl"),
    ],
)
def test_stock_flags_the_loss_cannot_train_with_are_refused_before_any_work(demo_shards, tmp_path, extra, message):
    with pytest.raises(PluginError, match=message.replace("(", r"\(")):
        main(["--loss", "adacl", *stock_argv(demo_shards, tmp_path / "logs", "refused"), *extra])
    assert not (tmp_path / "logs" / "refused").exists()


# ---------------------------------------------------------------------------------------------
# AdaCL in stock's trainer: the state moves once per optimizer step, and continues on --resume
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_adacls_state_moves_once_per_optimizer_step_in_stock_open_clip_train(demo_shards, tmp_path):
    """Stock's trainer with --accum-freq 2 (2 steps of 2 micro-batches): AdaCL's counters hold one count per optimizer
    step, its moving average has moved where a step modulated, and epoch_1.pt and epoch_latest.pt carry that state;
    params.txt the loss."""
    logs = tmp_path / "logs"
    main(["--loss", "adacl", *stock_argv(demo_shards, logs, "accum", "--accum-freq", "2", "--save-most-recent")])
    first = saved_loss(logs / "accum" / "checkpoints" / "epoch_1.pt")
    assert first["loss"] == "adacl" and first["options"]["mode"] == "calibrated"
    assert committed_steps(first["state_dict"]) == [2, 2]  # 4 micro-batches, 2 optimizer steps
    # The moving average moves exactly in the directions where a committed step modulated (which directions fall
    # back on a random-init model depends on the CPU's bf16 arithmetic; on every machine tried, at least one modulates).
    state = first["state_dict"]
    modulated = state["modulated_steps"].gt(0)
    assert modulated.any() and torch.equal(state["ema_valid"], modulated)
    assert torch.equal(state["ema_margins"][:, 0].gt(0), modulated)
    latest = saved_loss(logs / "accum" / "checkpoints" / "epoch_latest.pt")
    assert all(torch.equal(latest["state_dict"][key], value) for key, value in first["state_dict"].items())
    params = (logs / "accum" / "params.txt").read_text()
    assert "loss: adacl" in params and "'mode': 'calibrated'" in params
    assert (logs / "accum" / "out.log").read_text().count("Contrastive_loss: ") == 2  # one line per optimizer step


@pytest.mark.slow
def test_a_resume_continues_the_loss_state(demo_shards, tmp_path):
    """--resume latest of stock's epoch_1.pt restores AdaCL's state before the first step: its counters go on from
    epoch 1's 4 steps to 8, where a loss started afresh would count 4; stock's own checkpoint reader loads the file."""
    logs = tmp_path / "logs"
    argv = ["--loss", "adacl", *stock_argv(demo_shards, logs, "resumed")]
    main(argv)
    assert committed_steps(saved_loss(logs / "resumed" / "checkpoints" / "epoch_1.pt")["state_dict"]) == [4, 4]
    main([*argv, "--epochs", "2", "--resume", "latest"])
    assert committed_steps(saved_loss(logs / "resumed" / "checkpoints" / "epoch_2.pt")["state_dict"]) == [8, 8]
    assert "the loss state of --loss adacl continues from" in (logs / "resumed" / "out.log").read_text()
    with pytest.raises(PluginError, match="was trained with --loss adacl, this run has --loss fne"):
        main(["--loss", "fne", *stock_argv(demo_shards, logs, "resumed", "--epochs", "3", "--resume", "latest")])


# ---------------------------------------------------------------------------------------------
# A loss whose state is never committed says so, whatever drives it
# ---------------------------------------------------------------------------------------------


def drive(loss, steps, accum_freq, commit):
    """Forwards (and backwards) of `steps` optimizer steps of `accum_freq` micro-batches each, as a trainer runs them."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        for _ in range(accum_freq):
            features = torch.nn.functional.normalize(torch.randn(2, 16, 8, generator=generator), dim=-1)
            features.requires_grad_(True)
            loss(features[0], features[1], torch.tensor(10.0)).backward()
        if commit:
            loss.commit()


def test_a_loss_never_committed_warns_once_and_a_committing_trainer_never(recwarn):
    """FNE stages an update of its running statistics at every training forward (from epoch 0 here)."""
    warnings.simplefilter("always")
    committed = create_loss("fne", start_epoch=0)
    drive(committed, steps=3, accum_freq=committed.UNCOMMITTED_WARNING_AFTER, commit=True)  # k - 1 drops per step
    assert not [w for w in recwarn if issubclass(w.category, UncommittedStateWarning)]
    assert committed.i2t_num_matched > 0

    never = create_loss("fne", start_epoch=0)
    drive(never, steps=2 * never.UNCOMMITTED_WARNING_AFTER, accum_freq=1, commit=False)
    [warning] = [w for w in recwarn if issubclass(w.category, UncommittedStateWarning)]
    assert "call loss.commit() after each optimizer step" in str(warning.message)
    assert never.i2t_num_matched == 0


@pytest.mark.slow
def test_stock_trainer_with_only_create_loss_replaced_warns_that_the_state_never_moves(demo_shards, tmp_path):
    """The obvious patch (stock's create_loss returning the project's loss, nothing else) trains, and the loss warns
    once that its state does not move, with UNCOMMITTED_WARNING_AFTER + 1 steps."""
    loss = create_loss("adacl")
    steps = loss.UNCOMMITTED_WARNING_AFTER + 1
    argv = stock_argv(demo_shards, tmp_path / "logs", "naive", samples=8 * steps, batch_size=8)
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        patch.setattr(stock_main, "create_loss", lambda args: loss)
        stock_main.main(argv)
    assert len([w for w in caught if issubclass(w.category, UncommittedStateWarning)]) == 1
    assert committed_steps(loss.state_dict()) == [0, 0]


# ---------------------------------------------------------------------------------------------
# Every registered loss, 1 and 2 gloo ranks (slow)
# ---------------------------------------------------------------------------------------------


def fresh_state(name, options):
    return create_loss(name, **options).state_dict()


def plugin_argv(name, options):
    specs = {spec.name: spec for spec in get_loss_class(name).Options.specs()}
    return ["--loss", name] + [
        item for key, value in options.items() for item in (loss_option_flag(name, specs[key]), str(value))
    ]


def check_trained(run_dir, name, options):
    """The run wrote stock's final checkpoint with the loss's state; a loss that keeps state has moved it."""
    saved = saved_loss(run_dir / "checkpoints" / "epoch_1.pt")
    assert saved["loss"] == name
    state, fresh = saved["state_dict"], fresh_state(name, options)
    if get_loss_class(name).keeps_state:
        assert any(not torch.equal(state[key], fresh[key]) for key in fresh), "the loss's state never moved"
    out_log = (run_dir / "out.log").read_text()
    assert out_log.count("Contrastive_loss: ") == STEPS_PER_EPOCH and "Traceback" not in out_log
    return state


@pytest.mark.slow
@pytest.mark.parametrize("configuration", loss_configurations(), ids=config_id)
def test_every_loss_trains_in_stock_open_clip_train_or_is_refused(configuration, demo_shards, tmp_path):
    name, options = configuration
    argv = [*plugin_argv(name, options), *stock_argv(demo_shards, tmp_path, "run")]
    if not runs_on_stock_inputs(name, options):
        with pytest.raises(PluginError, match="do not carry"):
            main(argv)
        assert not (tmp_path / "run").exists()
        return
    main(argv)
    check_trained(tmp_path / "run", name, options)


def train_on_rank(rank, world_size, argv):
    """One gloo rank of the plug-in's `main(argv)` (torchrun's variables set); returns this rank's loss state."""
    name, options, stock_args = split_argv(argv)
    with patched_open_clip_train(name, options) as plugin:
        stock_main.main(stock_args)
        return {key: value.cpu() for key, value in plugin.loss.state_dict().items()}


@pytest.mark.slow
@pytest.mark.parametrize("configuration", loss_configurations(), ids=config_id)
def test_every_loss_trains_on_two_gloo_ranks_or_is_refused(configuration, demo_shards, tmp_path):
    """Two CPU ranks with stock's DDP (its device_ids=[cpu] dropped by the plug-in): --local-loss --gather-with-grad,
    the loss's state the same on both ranks and in rank 0's checkpoint."""
    name, options = configuration
    argv = [
        *plugin_argv(name, options),
        *stock_argv(demo_shards, tmp_path, "ddp", "--local-loss", "--gather-with-grad"),
    ]
    argv[argv.index("--batch-size") + 1] = "16"  # the same global batch of 32
    if not runs_on_stock_inputs(name, options):
        with pytest.raises(PluginError, match="do not carry"):
            main(argv)
        return
    states = run_on_ranks(train_on_rank, 2, argv, init_group=False)
    saved = check_trained(tmp_path / "ddp", name, options)
    for key, value in saved.items():
        assert torch.equal(states[0][key], value) and torch.equal(states[1][key], value), key


def test_plugin_names_its_options_as_the_trainer_does():
    plugin = LossPlugin.build("adaclw", {"discovery": "text_image_tokens", "weight": 8.0})
    assert plugin.changed_flags() == " --adaclw-weight 8.0 --adaclw-discovery text_image_tokens"
    assert dataclasses.asdict(plugin.options) == plugin.option_values()
