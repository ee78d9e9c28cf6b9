"""Mistakes fail in the first minute: `--dry-run` and a run's startup check --pretrained, --imagenet-val,
the run directory and the warmup before any training step."""

import huggingface_hub
import pytest
import torch
from PIL import Image

from helpers.run_utils import tiny_argv
from training import ConfigError, RunDir
from training.main import main
from training.trainer.engine.model import ModelConfig, build_model
from training.trainer.run_folder.checkpoint_digest import with_digest
from training.trainer.run_folder.checkpoint_files import load_checkpoint


def train_argv(demo_shards, logs, name, *extra):
    return tiny_argv(
        logs, name, "--lr", "2e-3", *extra, data=demo_shards / "train" / "shard-{000000..000003}.tar", samples=64
    )


def dry_run_error(argv) -> str:
    with pytest.raises(ConfigError) as error:
        main([*argv, "--dry-run"])
    return str(error.value)


def write_image_folder(root, num_classes):
    """root/n<k>/0.png, one 8 px image per class (ImageNet's synset-folder layout)."""
    for k in range(num_classes):
        (root / f"n{k:08d}").mkdir(parents=True)
        Image.new("RGB", (8, 8), (k % 256, 0, 0)).save(root / f"n{k:08d}" / "0.png")
    return root


@pytest.fixture(scope="module")
def imagenet_like(module_tmp):
    return write_image_folder(module_tmp("imagenet") / "val", 1000)


def test_dry_run_names_a_missing_or_unreadable_pretrained_file(demo_shards, tmp_path):
    message = dry_run_error(train_argv(demo_shards, tmp_path, "r", "--pretrained", str(tmp_path / "missing.pt")))
    assert message.startswith(f"--pretrained {tmp_path / 'missing.pt'}: no such file, and not a pretrained tag")
    garbage = tmp_path / "garbage.pt"
    garbage.write_text("not a checkpoint")
    message = dry_run_error(train_argv(demo_shards, tmp_path, "r", "--pretrained", str(garbage)))
    assert f"--pretrained {garbage}: cannot be read as a checkpoint" in message


def test_dry_run_refuses_a_pretrained_checkpoint_whose_contents_do_not_match_its_digest(demo_shards, tmp_path):
    payload = with_digest(
        {"state_dict": build_model(ModelConfig("adacl-tiny"), torch.device("cpu")).model.state_dict()}
    )
    payload["state_dict"]["logit_scale"] += 1  # changed after the digest was taken, as a bad copy would
    damaged = tmp_path / "damaged.pt"
    torch.save(payload, damaged)
    message = dry_run_error(train_argv(demo_shards, tmp_path, "r", "--pretrained", str(damaged)))
    assert message.startswith(f"--pretrained {damaged}: its contents do not match the digest written with it")
    assert message.endswith("copy it again from where it was written, or pass another checkpoint")


def test_dry_run_accepts_a_state_dict_file(demo_shards, tmp_path, capsys):
    weights = tmp_path / "weights.pt"
    torch.save(build_model(ModelConfig("adacl-tiny"), torch.device("cpu")).model.state_dict(), weights)
    assert main([*train_argv(demo_shards, tmp_path, "r", "--pretrained", str(weights)), "--dry-run"]) is None
    assert "dry run OK" in capsys.readouterr().out


def test_dry_run_refuses_an_uncached_pretrained_tag_offline(demo_shards, tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    argv = train_argv(
        demo_shards, tmp_path, "r", "--model", "RN50", "--pretrained", "openai", "--cache-dir", str(tmp_path / "cache")
    )
    message = dry_run_error(argv)
    assert message.startswith("--pretrained openai: the weights of RN50 openai")
    assert "not in the download cache and HF_HUB_OFFLINE is set" in message


def test_dry_run_checks_the_imagenet_folder(demo_shards, tmp_path, imagenet_like, capsys):
    message = dry_run_error(train_argv(demo_shards, tmp_path, "r", "--imagenet-val", str(tmp_path / "nowhere")))
    assert message.startswith("--imagenet-val: ") and "is not a directory" in message
    three_classes = write_image_folder(tmp_path / "three", 3)
    message = dry_run_error(train_argv(demo_shards, tmp_path, "r", "--imagenet-val", str(three_classes)))
    assert "has 3 class folders, expected 1000" in message
    assert main([*train_argv(demo_shards, tmp_path, "r", "--imagenet-val", str(imagenet_like)), "--dry-run"]) is None
    assert "dry run OK" in capsys.readouterr().out


def test_a_bad_imagenet_folder_stops_a_run_before_training(demo_shards, tmp_path):
    three_classes = write_image_folder(tmp_path / "three", 3)
    with pytest.raises(ConfigError, match="--imagenet-val: .*has 3 class folders, expected 1000"):
        main(train_argv(demo_shards, tmp_path, "bad-imagenet", "--imagenet-val", str(three_classes)))
    assert not (tmp_path / "bad-imagenet").exists()


def test_dry_run_names_a_caption_key_the_samples_lack_and_the_fields_they_have(demo_shards, tmp_path):
    message = dry_run_error(train_argv(demo_shards, tmp_path, "r", "--caption-key", "txt,nope"))
    assert message == (
        "--caption-key nope: none of the first 64 samples of --train-data has a field 'nope' (in any of "
        "its first 4 readable shards); their fields are ['json', 'png', 'txt', 'txt_alt', 'txt_pseudo']: "
        "pass --caption-key with one of ['txt', 'txt_alt', 'txt_pseudo']"
    )
    message = dry_run_error(
        train_argv(
            demo_shards,
            tmp_path,
            "r",
            "--val-data",
            str(demo_shards / "val" / "shard-000000.tar"),
            "--val-caption-key",
            "caption",
        )
    )
    assert message.startswith("--val-caption-key caption: none of the first 64 samples of --val-data has a field")


def test_a_caption_key_the_samples_lack_stops_a_run_before_anything_is_written(demo_shards, tmp_path):
    with pytest.raises(ConfigError, match="--caption-key nope: none of the first 64 samples"):
        main(train_argv(demo_shards, tmp_path, "bad-key", "--caption-key", "nope"))
    assert not (tmp_path / "bad-key").exists()


def test_dry_run_refuses_a_run_directory_in_use_unless_resuming(demo_shards, tmp_path, capsys):
    summary = main(train_argv(demo_shards, tmp_path, "taken"))
    assert load_checkpoint(summary.checkpoint)["step"] == 2
    message = dry_run_error(train_argv(demo_shards, tmp_path, "taken"))
    assert message == (
        f"{tmp_path / 'taken'} already holds a run; continue it with --resume latest, roll it back "
        f"with --resume {tmp_path / 'taken' / 'checkpoints'}/<checkpoint>, or choose another --name"
    )
    assert main([*train_argv(demo_shards, tmp_path, "taken", "--resume", "latest"), "--dry-run"]) is None
    out = capsys.readouterr().out
    assert "dry run OK" in out and f"--resume latest: the run continues from {summary.checkpoint}" in out


def test_dry_run_of_resume_latest_without_a_run_says_it_starts_from_scratch(demo_shards, tmp_path, capsys):
    assert main([*train_argv(demo_shards, tmp_path, "new", "--resume", "latest"), "--dry-run"]) is None
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1] == (
        f"--resume latest: no checkpoint in {tmp_path / 'new' / 'checkpoints'} yet, so the run starts from scratch"
    )
    assert "warning" not in captured.err


def without_name(argv):
    index = argv.index("--name")
    return argv[:index] + argv[index + 2 :]


def test_resume_latest_without_a_name_is_warned_about(demo_shards, tmp_path, capsys):
    argv = without_name(train_argv(demo_shards, tmp_path, "unused", "--resume", "latest"))
    assert main([*argv, "--dry-run"]) is None
    captured = capsys.readouterr()
    assert captured.err == (
        "warning: --resume latest without --name: each launch gets a new name (its start time), "
        "so a relaunch starts from scratch in a new folder; add --name NAME to continue this run "
        "when it is launched again\n"
    )
    assert captured.out.splitlines()[-1] == "--resume latest: no --name, so a new run: it starts from scratch"
    # A run logs it too.
    summary = main(argv)
    assert "WARNING | --resume latest without --name" in (summary.run_folder.path / "out.log").read_text()


def test_amp_on_the_cpu_is_warned_about(demo_shards, tmp_path, capsys):
    assert main([*train_argv(demo_shards, tmp_path, "amp", "--precision", "amp"), "--dry-run"]) is None
    assert capsys.readouterr().err == (
        "warning: --precision amp on the CPU: autocast trains slower there than fp32 (3x for adacl-tiny on 2 "
        "cores); drop --precision (fp32 is the CPU's default) unless you are testing it\n"
    )
    assert main([*train_argv(demo_shards, tmp_path, "fp32"), "--dry-run"]) is None
    assert capsys.readouterr().err == ""


def test_warmup_longer_than_the_run_is_warned_about(demo_shards, tmp_path, capsys):
    argv = train_argv(demo_shards, tmp_path, "long-warmup", "--warmup", "10000")
    assert main([*argv, "--dry-run"]) is None
    err = capsys.readouterr().err
    assert "warning: --warmup 10000 >= the run's 2 steps: the learning rate never reaches --lr 0.002" in err
    main(argv)
    assert "WARNING | --warmup 10000 >= the run's 2 steps" in (tmp_path / "long-warmup" / "out.log").read_text()


@pytest.mark.slow
def test_zero_shot_runs_on_the_folder_built_at_startup(demo_shards, tmp_path, imagenet_like):
    main(train_argv(demo_shards, tmp_path, "zs", "--imagenet-val", str(imagenet_like), "--zeroshot-frequency", "1"))
    [val] = RunDir(tmp_path / "zs").metrics("val")
    assert 0.0 <= val["val/imagenet-zeroshot-val-top1"] <= val["val/imagenet-zeroshot-val-top5"] <= 1.0


def test_weights_of_another_architecture_are_named(demo_shards, tmp_path):
    weights = tmp_path / "other.pt"
    torch.save({"visual.proj": torch.zeros(3, 3)}, weights)
    with pytest.raises(ConfigError, match=f"--pretrained {weights} does not fit --model adacl-tiny: "):
        main(train_argv(demo_shards, tmp_path, "mismatch", "--pretrained", str(weights)))


def test_a_run_from_python_takes_its_log_handlers_with_it(demo_shards, tmp_path, capsys):
    """After `training.run` returns, the process's later lines reach neither the run's out.log nor the stderr
    the run had (a closed stream in a finished test or notebook cell: logging's `--- Logging error ---`)."""
    import logging

    handlers_before = list(logging.getLogger().handlers)
    summary = main(train_argv(demo_shards, tmp_path, "ends"))
    out_log = summary.run_folder.path / "out.log"
    written = out_log.read_text()
    assert "Done:" in written
    assert logging.getLogger().handlers == handlers_before
    logging.getLogger().warning("a line after the run")
    assert out_log.read_text() == written
    assert "Logging error" not in capsys.readouterr().err


def test_dry_run_lists_the_loss_options_that_differ_from_their_defaults_one_a_line(demo_shards, tmp_path, capsys):
    from open_clip_adacl import get_loss_class

    main([*train_argv(demo_shards, tmp_path, "r", "--loss", "adacl", "--adacl-preset", "paper"), "--dry-run"])
    out = capsys.readouterr().out.splitlines()
    plan = out.index(next(line for line in out if line.startswith("dry run OK: ")))
    assert out[plan].startswith("dry run OK: --model adacl-tiny --loss adacl; 1 rank(s)") and "{" not in out[plan]
    listed = out[plan + 1 :]
    options = get_loss_class("adacl").Options
    expected = {
        spec.name: spec.default
        for spec in options.specs()
        if getattr(options.build(preset="paper"), spec.name) != spec.default
    }
    assert len(expected) >= 3 and [line.split(":")[0] for line in listed] == [
        f"  loss option {name}" for name in expected
    ]
    assert all(line.endswith(f"(default {expected[line.split(':')[0].split()[-1]]})") for line in listed)


@pytest.mark.slow
def test_a_runs_log_starts_with_its_plan_and_lists_only_the_chosen_losss_options(demo_shards, tmp_path):
    """out.log's first line is the plan (ranks x batch x accum, steps, epochs, the checkpoints' disk), the loss
    options the run changes under it; the "Params:" dump leaves out the other losses' options (all unset), which
    params.txt keeps, and the first step's time left is not an estimate from that step alone."""
    main(
        train_argv(
            demo_shards, tmp_path, "plan", "--loss", "adacl", "--adacl-queue-size", "64", "--log-every-n-steps", "1"
        )
    )
    messages = [line.split(" | ", 2)[-1] for line in (tmp_path / "plan" / "out.log").read_text().splitlines()]
    assert messages[0].startswith(
        "Plan: --model adacl-tiny --loss adacl; 1 rank(s) x batch 32 x accum 1 = 32 samples per step; 64 samples "
        "per rank and epoch, 2 steps per epoch, 2 steps in 1 epochs; checkpoints: about 0.04 GB each"
    )
    assert messages[1] == "  loss option queue_size: 64 (default 0)"
    assert messages[2].startswith("Rank 0 of 1 on cpu")
    dump = messages[messages.index("Params:") + 1 : messages.index("Params:") + 200]
    names = [line.split(":")[0].strip() for line in dump if line.startswith("  ")]
    assert "adacl_queue_size" in names and "loss" in names
    assert not [name for name in names if name.startswith(("adaclw_", "glofnd_", "fne_", "hnnce_", "oracle_"))]
    assert "glofnd_alpha: None" in (tmp_path / "plan" / "params.txt").read_text()
    [first_step] = [message for message in messages if message.startswith("Step 1: ")]
    assert "time left: from the next logged step" in first_step
