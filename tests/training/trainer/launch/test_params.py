"""The command line: OpenCLIP's flags and defaults, generated loss flags, clear errors before any work,
the run's typed config."""

import dataclasses

import pytest
import torch
from open_clip_train.params import parse_args as openclip_parse_args

from open_clip_adacl import get_loss_class, list_losses
from training import ConfigError
from training.trainer.launch import params
from training.trainer.launch.params import parse_args, validate_args

# Flags whose default deliberately differs from OpenCLIP's, and why.
DIFFERENT_DEFAULTS = {
    "precision",  # None = amp on CUDA (OpenCLIP's default), fp32 on CPU
}


def _valid(*extra):
    return ["--train-data", "shards/{0..1}.tar", "--model", "adacl-tiny", *extra]


def test_defaults_match_openclip():
    ours = vars(parse_args([]))
    theirs = vars(openclip_parse_args([]))
    shared = (set(ours) & set(theirs)) - DIFFERENT_DEFAULTS
    assert len(shared) > 60
    differing = {name: (ours[name], theirs[name]) for name in shared if ours[name] != theirs[name]}
    assert differing == {}


def test_every_issue_flag_is_accepted():
    args = parse_args(
        _valid(
            "--train-data-upsampling-factors",
            "1",
            "--train-num-samples",
            "100",
            "--dataset-type",
            "webdataset",
            "--dataset-resampled",
            "--val-data",
            "v.tar",
            "--val-num-samples",
            "10",
            "--batch-size",
            "8",
            "--epochs",
            "2",
            "--lr",
            "1e-3",
            "--wd",
            "0.1",
            "--beta1",
            "0.8",
            "--beta2",
            "0.9",
            "--eps",
            "1e-7",
            "--warmup",
            "5",
            "--lr-scheduler",
            "const",
            "--precision",
            "fp32",
            "--workers",
            "0",
            "--pretrained",
            "",
            "--seed",
            "3",
            "--logs",
            "L",
            "--name",
            "N",
            "--save-frequency",
            "2",
            "--save-most-recent",
            "--report-to",
            "tensorboard",
            "--local-loss",
            "--gather-with-grad",
            "--grad-checkpointing",
            "--accum-freq",
            "2",
            "--grad-clip-norm",
            "1.0",
            "--log-every-n-steps",
            "5",
            "--device",
            "cpu",
            "--force-image-size",
            "48",
            "--lock-image",
            "--lock-text",
            "--val-frequency",
            "1",
            "--zeroshot-frequency",
            "1",
            "--imagenet-val",
            "iv",
            "--epochs-cooldown",
            "1",
            "--lr-cooldown-end",
            "0.0",
            "--lr-cooldown-power",
            "2",
            "--dist-url",
            "env://",
            "--dist-backend",
            "gloo",
            "--delete-previous-checkpoint",
            "--log-local",
            "--caption-key",
            "txt,alt",
            "--save-every-n-steps",
            "10",
            "--max-nonfinite-steps",
            "3",
        )
    )
    validate_args(args, world_size=2)
    assert (args.lr, args.beta1, args.beta2, args.eps) == (1e-3, 0.8, 0.9, 1e-7)
    assert args.force_image_size == 48 and args.accum_freq == 2 and args.caption_key == "txt,alt"


def test_optimizer_defaults_follow_the_model_name_like_openclip():
    vit = parse_args(["--model", "ViT-B-32"])
    rn = parse_args(["--model", "RN50"])
    assert (vit.lr, vit.beta1, vit.beta2, vit.eps) == (5e-4, 0.9, 0.98, 1e-6)
    assert (rn.lr, rn.beta1, rn.beta2, rn.eps) == (5e-4, 0.9, 0.999, 1e-8)


@pytest.mark.parametrize("flag", sorted(params.UNSUPPORTED_FLAGS))
def test_unsupported_openclip_flag_is_named(flag):
    with pytest.raises(ConfigError, match=f"{flag} is not supported by open_clip_adacl"):
        parse_args(_valid(flag, "x"))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--report-to", "mlflow"], "--report-to 'mlflow': choose tensorboard, wandb"),
        (["--opt", "timm/lamb"], "--opt timm/lamb is not supported by open_clip_adacl"),
    ],
)
def test_unsupported_openclip_values_are_named(argv, message):
    with pytest.raises(ConfigError, match=message):
        validate_args(parse_args(_valid(*argv)), world_size=1)


@pytest.mark.parametrize(
    "flag, closest",
    [
        ("--no-such-flag", None),
        ("--batchsize", "--batch-size"),
        ("--lr-shceduler=cosine", "--lr-scheduler"),
        ("--wandb-projct-name", "--wandb-project-name"),
    ],
)
def test_an_unknown_flag_is_one_line_naming_the_closest_flag(flag, closest):
    with pytest.raises(ConfigError) as error:
        parse_args(_valid(flag))
    expected = f"unknown flag {flag.split('=')[0]}" + (f"; the closest supported flag is {closest}" if closest else "")
    assert str(error.value) == expected + " (python -m training.main --help lists them all)"


@pytest.mark.parametrize(
    "argv",
    [
        ["--train-data", "/data/a/0.tar", "/data/a/1.tar"],  # a glob the shell expanded
        ["--train-data", "a.tar", "b.tar", "--batch-size", "8"],
    ],
)
def test_an_unquoted_second_path_gets_a_hint_to_quote_the_list(argv):
    with pytest.raises(ConfigError) as error:
        parse_args(argv)
    message = str(error.value)
    assert (
        message.startswith(
            f"unrecognized arguments: {argv[2]}; a second path after a flag that takes one? "
            "Quote the list, with braces for a range ('dir/{00000..00099}.tar') or '::' between "
            "sources"
        )
        and "\n" not in message
    )
    with pytest.raises(ConfigError) as error:  # a stray word that is no path gets no such hint
        parse_args(["--train-data", "a.tar", "oops"])
    assert str(error.value) == "unrecognized arguments: oops (python -m training.main --help lists the flags)"


def test_a_leading_double_dash_is_ignored():
    assert parse_args(["--", *_valid("--batch-size", "8")]).batch_size == 8


@pytest.mark.parametrize(
    "argv, world_size, message",
    [
        (["--local-loss"], 2, "--local-loss without --gather-with-grad gives wrong gradients.*add --gather-with-grad"),
        (["--accum-freq", "0"], 1, "--accum-freq must be >= 1"),
        (["--batch-size", "0"], 1, "--batch-size must be >= 1"),
        (["--save-every-n-steps", "-1"], 1, "--save-every-n-steps must be >= 0"),
        (["--max-nonfinite-steps", "0"], 1, "--max-nonfinite-steps must be >= 1"),
        (["--resume", "/no/such/checkpoint.pt"], 1, "--resume /no/such/checkpoint.pt: no such file"),
        (["--lr-scheduler", "const-cooldown"], 1, "needs --epochs-cooldown"),
        (["--lr-scheduler", "linear"], 1, "--lr-scheduler 'linear' is unknown"),
        (["--model", "ViT-B-33"], 1, "--model 'ViT-B-33' is not a known model config; did you mean ViT-B-32"),
        (["--model", "coca_ViT-B-32"], 1, "CoCa"),
    ],
)
def test_invalid_combinations_are_rejected_with_a_fix(argv, world_size, message):
    args = parse_args(_valid(*argv))
    with pytest.raises(ConfigError, match=message):
        validate_args(args, world_size=world_size)


def test_local_loss_alone_is_fine_on_one_rank():
    validate_args(parse_args(_valid("--local-loss")), world_size=1)


def test_missing_train_data_is_an_error_unless_synthetic():
    with pytest.raises(ConfigError, match="--train-data is required"):
        validate_args(parse_args(["--model", "adacl-tiny"]), world_size=1)
    validate_args(parse_args(["--model", "adacl-tiny", "--dataset-type", "synthetic"]), world_size=1)


@pytest.mark.parametrize("loss_name", list_losses())
def test_every_loss_option_has_a_flag_and_reaches_the_loss(loss_name):
    flags = {f.flag: f for f in params.loss_flags().values()}
    options = get_loss_class(loss_name).Options.specs()
    for option in options:
        assert params.loss_option_flag(loss_name, option) in flags
    args = parse_args(_valid("--loss", loss_name))
    assert args.loss_options == {option.name: option.default for option in options}


def test_loss_flag_value_is_passed_and_choices_are_checked():
    args = parse_args(_valid("--loss", "siglip", "--loss-dist-impl", "shift"))
    assert args.loss_options == {"dist_impl": "shift"}
    with pytest.raises(ConfigError, match="argument --loss-dist-impl: invalid choice: 'sideways'"):
        parse_args(_valid("--loss", "siglip", "--loss-dist-impl", "sideways"))


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--loss", "adaclw", "--adaclw-weight", "nan"],
            "--loss adaclw: --adaclw-weight: nan is not a finite number (NaN or infinity would make the run's numbers "
            "NaN); pass a finite one",
        ),
        (
            ["--loss", "adaclw", "--adaclw-weight", "0.5"],
            "--loss adaclw: --adaclw-weight must be >= 1 (1 is clip), got 0.5",
        ),
        (
            ["--loss", "adacl", "--adacl-anchor-min", "0.5", "--adacl-anchor-max", "0.2"],
            "--loss adacl: need --adacl-anchor-min <= --adacl-anchor-max, got 0.5, 0.2",
        ),
        (
            ["--loss", "adacl", "--adacl-preset", "paper", "--adacl-mode", "calibrated"],
            "--loss adacl: --adacl-preset 'paper' sets --adacl-mode='literal'; drop --adacl-mode='calibrated' or the "
            "--adacl-preset",
        ),
        (
            ["--loss", "glofnd"],
            "--loss glofnd: data_size (--data-size) must be the number of training samples, >= 1, got None: it sizes "
            "the loss's per-sample state",
        ),
    ],
)
def test_a_loss_options_error_names_the_flags_typed_not_the_option_names(extra, message):
    """The loss says `weight`, as a Python caller passes it (`Options.build(weight=...)`); the command line's user
    typed --adaclw-weight, and reads that (a flag already named beside its option is not named twice)."""
    with pytest.raises(ConfigError) as refused:
        params.checked_config(parse_args(_valid(*extra)))
    assert str(refused.value) == message
    with pytest.raises(ValueError, match="weight must be >= 1 "):
        get_loss_class("adaclw").Options.build(weight=0.5)


def test_loss_flag_of_another_loss_is_an_error():
    with pytest.raises(ConfigError, match="--loss-dist-impl is an option of --loss siglip, but --loss is 'clip'"):
        parse_args(_valid("--loss", "clip", "--loss-dist-impl", "bidir"))


def test_siglip_flag_is_an_alias():
    assert parse_args(_valid("--siglip")).loss == "siglip"
    assert params.logit_init_for_loss("siglip")["init_logit_bias"] == -10.0
    assert params.logit_init_for_loss("clip") == {}
    with pytest.raises(ConfigError, match="--siglip means --loss siglip"):
        parse_args(_valid("--siglip", "--loss", "glofnd"))


def test_precision_defaults_to_amp_on_cuda_and_fp32_on_cpu():
    assert params.resolve_precision(None, "cuda") == "amp"
    assert params.resolve_precision(None, "cpu") == "fp32"
    assert params.resolve_precision("amp_bf16", "cpu") == "amp_bf16"


def test_the_run_config_resolves_the_precision_for_the_device_the_run_falls_back_to(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = params.run_config(parse_args(_valid()))  # --device cuda by default
    assert cfg.model.precision == cfg.recorded_args["precision"] == "amp"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # init_distributed falls back to the CPU
    assert params.run_config(parse_args(_valid())).model.precision == "fp32"
    assert params.run_config(parse_args(_valid("--precision", "bf16"))).model.precision == "bf16"


@pytest.mark.slow
def test_cli_prints_config_errors_and_exits_with_status_2():
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "training.main", "--horovod"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: --horovod is not supported by open_clip_adacl")
    result = subprocess.run(
        [sys.executable, "-m", "training.main", "--batchsize", "8"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: unknown flag --batchsize; the closest supported flag is --batch-size "
        "(python -m training.main --help lists them all)"
    ]


def test_the_chosen_loss_flags_record_the_values_the_run_uses():
    args = params.parse_args(["--train-data", "x.tar", "--loss", "adacl", "--adacl-ema", "0.5"])
    assert args.adacl_ema == 0.5 and args.loss_options["ema"] == 0.5
    assert args.adacl_mode == args.loss_options["mode"] == "calibrated"  # a default, filled in for params.txt
    assert args.glofnd_alpha is None  # another loss's option: not part of this run


def test_grouping_and_validation_caption_flags_reach_the_data_config():
    args = parse_args(
        ["--train-data", "t.tar", "--train-group-size", "8", "--caption-key", "txt,txt_alt", "--val-caption-key", "txt"]
    )
    cfg = params.run_config(args).data
    assert (cfg.group_size, cfg.caption_key, cfg.val_caption_key) == (8, "txt,txt_alt", "txt")
    defaults = params.run_config(parse_args(["--train-data", "t.tar"])).data
    assert (defaults.group_size, defaults.val_caption_key) == (1, None)


def test_the_run_config_is_built_once_and_leaves_the_arguments_alone():
    args = parse_args(_valid("--device", "cpu", "--epochs", "3", "--name", "run"))
    parsed = dict(vars(args))
    cfg = params.run_config(args)
    assert vars(args) == parsed  # nothing is written back into the namespace
    assert args.precision is None and cfg.model.precision == "fp32"  # resolved for the device, in the config only
    assert cfg.recorded_args == {**params.arg_values(args), "precision": "fp32"}  # what params.txt records
    assert (cfg.epochs, cfg.schedule.epochs, cfg.checkpoints.total_epochs, cfg.validation.total_epochs) == (3, 3, 3, 3)
    assert cfg.logging.name == "run" and cfg.loss.name == "clip" and cfg.optimizer.lr == args.lr
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.model.precision = "amp"
    assert params.run_config(parse_args(_valid("--logs", "none"))).logging.logs is None


def test_a_recipes_loss_options_go_with_its_loss():
    """The demo recipe trains adaclw with text_image_tokens; `--loss clip` beside it trains clip, the recipe's adaclw
    option dropped (and recorded as overridden), while the same option given on the command line is refused."""
    recipe = parse_args(["--recipe", "demo", "--train-data", "x.tar"])
    assert (recipe.loss, recipe.loss_options["discovery"]) == ("adaclw", "text_image_tokens")
    clip = parse_args(["--recipe", "demo", "--loss", "clip", "--train-data", "x.tar"])
    assert clip.loss == "clip" and clip.adaclw_discovery is None and clip.loss_options == recipe_free_clip_options()
    assert {"loss", "adaclw_discovery"} <= set(clip.recipe_overrides)
    with pytest.raises(ConfigError, match="--adaclw-discovery is an option of --loss adaclw"):
        parse_args(["--recipe", "demo", "--loss", "clip", "--adaclw-discovery", "gda", "--train-data", "x.tar"])


def recipe_free_clip_options():
    return parse_args(["--loss", "clip", "--train-data", "x.tar"]).loss_options


def test_python_states_a_run_as_flag_values_and_gets_the_command_lines_run():
    argv = [
        "--train-data",
        "x.tar",
        "--recipe",
        "demo",
        "--loss",
        "adacl",
        "--adacl-mode",
        "literal",
        "--train-group-size",
        "8",
        "--no-adacl-modulate",
    ]
    values = params.given_values(argv)
    assert values == {
        "train_data": "x.tar",
        "recipe": "demo",
        "loss": "adacl",
        "adacl_mode": "literal",
        "train_group_size": 8,
        "adacl_modulate": False,
    }
    assert vars(params.args_from_values(values)) == vars(parse_args(argv))
    assert params.config_from_values(values) == params.checked_config(parse_args(argv))
    assert vars(parse_args(params.argv_from_values(values))) == vars(parse_args(argv))


@pytest.mark.parametrize(
    "values, message",
    [
        ({"batch_sise": 8}, r"\['batch_sise'\] are no flags of the trainer; the closest is 'batch_size'"),
        ({"train_data": "x.tar", "precision": "fp64"}, r"--precision 'fp64': choose one of"),
        ({"train_data": "x.tar", "loss": "clip", "adacl_eps": 0.1}, "is an option of --loss adacl"),
    ],
)
def test_bad_flag_values_are_named(values, message):
    with pytest.raises(ConfigError, match=message):
        params.config_from_values(values)
