"""Export: stock open_clip loads `local-dir:DIR` in a fresh process (no open_clip_adacl) with identical embeddings."""

import contextlib
import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import open_clip
import pytest
import torch

import training.export as export_module
from open_clip_adacl import create_loss
from training.export import CONFIG_NAME, README_NAME, WEIGHTS_NAME, export, model_card, public_value
from training.export import cli as export_cli
from training.trainer.data import DataPosition
from training.trainer.distributed import DistributedEnv
from training.trainer.engine.checkpoint import Checkpointer, TrainState, run_components
from training.trainer.engine.model import build_model, open_clip_model_config, preprocess_config
from training.trainer.engine.optimizer import build_optimizer
from training.trainer.launch import params

STOCK_OPEN_CLIP = textwrap.dedent("""
    import sys, torch, open_clip
    export_dir, inputs, outputs = sys.argv[1:4]
    model, _, preprocess = open_clip.create_model_and_transforms("local-dir:" + export_dir)
    tokenizer = open_clip.get_tokenizer("local-dir:" + export_dir)
    model.eval()
    images, captions = torch.load(inputs)
    with torch.no_grad():
        out = {"image": model.encode_image(images), "text": model.encode_text(tokenizer(captions)),
               "logit_scale": model.logit_scale, "logit_bias": model.logit_bias,
               "size": preprocess.transforms[0].size}
    assert "open_clip_adacl" not in sys.modules, "the export must load without our package"
    torch.save(out, outputs)
""")


def _write_checkpoint(tmp_path, argv):
    """A checkpoint exactly as the trainer writes it, of a model with non-initial weights."""
    args = params.parse_args(["--train-data", "x", "--model", "adacl-tiny", "--precision", "fp32", *argv])
    cfg = params.run_config(args)
    bundle = build_model(cfg.model, torch.device("cpu"))
    with torch.no_grad():
        for p in bundle.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    loss = create_loss("clip")  # the loss only contributes its (empty) state here
    state = TrainState(position=DataPosition(epoch=1), step=3)
    components = run_components(
        model=bundle.model, optimizer=build_optimizer(bundle.model, cfg.optimizer), scaler=None, loss=loss, state=state
    )
    checkpointer = Checkpointer(
        cfg.checkpoints,
        checkpoint_dir=str(tmp_path / "checkpoints"),
        components=components,
        env=DistributedEnv(),
        name="export-test",
        args=dict(cfg.recorded_args),
        model_cfg=open_clip_model_config(cfg.model),
        preprocess_cfg=preprocess_config(bundle.model),
    )
    state.start_epoch(num_skip_reasons=2)
    [path] = checkpointer.save(["epoch_1.pt"])
    return path, bundle, args


@pytest.mark.slow
@pytest.mark.parametrize("argv, image_size", [([], 32), (["--force-image-size", "40", "--siglip"], 40)])
def test_export_loads_in_stock_open_clip_with_identical_embeddings(tmp_path, argv, image_size):
    checkpoint, bundle, _ = _write_checkpoint(tmp_path, argv)
    export_dir = export(checkpoint, tmp_path / "export")
    config = json.loads((export_dir / CONFIG_NAME).read_text())
    assert set(config) == {"model_cfg", "preprocess_cfg"} and (export_dir / WEIGHTS_NAME).is_file()
    assert config["model_cfg"]["vision_cfg"]["image_size"] == image_size

    images = torch.randn(4, 3, image_size, image_size)
    captions = ["a red cube left of a blue ball", "two green cones", "a small star", "nothing"]
    torch.save((images, captions), tmp_path / "inputs.pt")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [
            sys.executable,
            "-c",
            STOCK_OPEN_CLIP,
            str(export_dir),
            str(tmp_path / "inputs.pt"),
            str(tmp_path / "outputs.pt"),
        ],
        check=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    stock = torch.load(tmp_path / "outputs.pt")

    model = bundle.model.eval()
    with torch.no_grad():
        assert torch.equal(stock["image"], model.encode_image(images))
        assert torch.equal(stock["text"], model.encode_text(bundle.tokenizer(captions)))
        assert torch.equal(stock["logit_scale"], model.logit_scale)
        if "--siglip" in argv:
            assert torch.equal(stock["logit_bias"], model.logit_bias)
    assert stock["size"] == bundle.preprocess_val.transforms[0].size


def test_epoch_checkpoint_loads_through_open_clip_pretrained_path(tmp_path):
    checkpoint, bundle, _ = _write_checkpoint(tmp_path, [])
    model, _, _ = open_clip.create_model_and_transforms("adacl-tiny", pretrained=str(checkpoint))
    for (name, ours), theirs in zip(bundle.model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(ours, theirs), name


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664)])
def test_export_files_get_the_umask_mode(tmp_path, umask, mode):
    checkpoint, _, _ = _write_checkpoint(tmp_path, [])
    previous = os.umask(umask)
    try:
        export_dir = export(checkpoint, tmp_path / "export")
    finally:
        os.umask(previous)
    assert {path.name: path.stat().st_mode & 0o777 for path in export_dir.iterdir()} == {
        CONFIG_NAME: mode,
        WEIGHTS_NAME: mode,
    }


@pytest.mark.slow
def test_export_cli_reports_a_checkpoint_without_config(tmp_path):
    torch.save({"state_dict": {}}, tmp_path / "bare.pt")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "training.export",
            "--checkpoint",
            str(tmp_path / "bare.pt"),
            "--output",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2 and "pass --model NAME" in result.stderr


def export_cli_error(argv, monkeypatch, capsys, status=2) -> str:
    """What `python -m training.export ARGV` prints when it refuses: exit status `status`, one line on stderr,
    nothing on stdout."""
    monkeypatch.setattr(sys, "argv", ["python -m training.export", *map(str, argv)])
    with pytest.raises(SystemExit) as exit_info:
        export_cli()
    captured = capsys.readouterr()
    assert exit_info.value.code == status and captured.out == "" and captured.err.count("\n") == 1, captured
    assert captured.err.startswith("error: ")
    return captured.err.strip()


class NotWeights:
    """An object torch.save pickles as code to run, which a weights-only load refuses."""


def test_export_mistakes_are_one_line_each_and_write_nothing(tmp_path, monkeypatch, capsys):
    checkpoint, _, _ = _write_checkpoint(tmp_path, [])
    out = tmp_path / "out"
    folder_error = export_cli_error(["--checkpoint", tmp_path, "--output", out], monkeypatch, capsys)
    assert (
        folder_error
        == f"error: --checkpoint {tmp_path} is a folder: pass a .pt inside it (the newest there: {checkpoint})"
    )
    missing_error = export_cli_error(["--checkpoint", tmp_path / "epoch_9.pt", "--output", out], monkeypatch, capsys)
    assert missing_error == (
        f"error: --checkpoint {tmp_path / 'epoch_9.pt'}: no such file; pass a checkpoint "
        "training.main wrote (<logs>/<name>/checkpoints/epoch_N.pt or step_N.pt)"
    )
    (tmp_path / "notes.pt").write_text("not a checkpoint\n")
    torch.save({"model": NotWeights()}, tmp_path / "pickled.pt")
    for name, kind in (("notes.pt", "UnpicklingError"), ("pickled.pt", "UnpicklingError")):
        error = export_cli_error(["--checkpoint", tmp_path / name, "--output", out], monkeypatch, capsys)
        assert error == (
            f"error: --checkpoint {tmp_path / name} is not a weights file torch can read ({kind}: "
            "truncated, or not a checkpoint); pass an epoch_N.pt or step_N.pt training.main wrote"
        )
        assert "weights_only" not in error
    usage_error = export_cli_error(["--checkpoint", checkpoint], monkeypatch, capsys)  # no usage screen before it
    assert usage_error == "error: one of the arguments --output --hf-dir is required"
    assert not out.exists()


@pytest.mark.parametrize("target", ["--output", "--hf-dir"])
def test_export_refuses_a_folder_that_is_not_empty_unless_overwrite(tmp_path, monkeypatch, capsys, target):
    checkpoint, _, _ = _write_checkpoint(tmp_path, [])
    out = tmp_path / "out"
    out.mkdir()
    (out / "other_model.safetensors").write_bytes(b"someone else's")
    error = export_cli_error(["--checkpoint", checkpoint, target, out], monkeypatch, capsys)
    assert error == f"error: {out}: folder not empty: pass an empty one or --overwrite"
    assert [path.name for path in out.iterdir()] == ["other_model.safetensors"]
    monkeypatch.setattr(
        sys, "argv", ["python -m training.export", "--checkpoint", str(checkpoint), target, str(out), "--overwrite"]
    )
    export_cli()
    assert {CONFIG_NAME, WEIGHTS_NAME, "other_model.safetensors"} <= {path.name for path in out.iterdir()}


@pytest.mark.parametrize(
    "target, refused, code, cause, existing",
    [
        ("--output", WEIGHTS_NAME, errno.ENOSPC, "disk full ([Errno 28] No space left on device)", False),
        ("--hf-dir", README_NAME, errno.EROFS, "read-only file system ([Errno 30] Read-only file system)", True),
        ("--hf-dir", CONFIG_NAME, errno.EACCES, "permission denied ([Errno 13] Permission denied)", False),
    ],
)
def test_a_write_the_disk_refuses_is_one_line_and_leaves_no_file_of_the_export(
    tmp_path, monkeypatch, capsys, target, refused, code, cause, existing
):
    """The file `refused` fails as a write on a full, read-only or forbidden disk does (an OSError without a file
    name, as write() raises it): status 1, one line naming the folder, the cause and the fix, and the folder as
    it was (gone when the export made it), not a config without weights or a model without its card."""
    checkpoint, _, _ = _write_checkpoint(tmp_path, [])
    out = tmp_path / "out"
    if existing:
        out.mkdir()
    real_atomic_file = export_module.atomic_file

    @contextlib.contextmanager
    def refusing(path, mode="wb"):
        with real_atomic_file(path, mode) as f:
            if Path(path).name == refused:
                raise OSError(code, os.strerror(code))
            yield f

    monkeypatch.setattr(export_module, "atomic_file", refusing)
    error = export_cli_error(["--checkpoint", checkpoint, target, out], monkeypatch, capsys, status=1)
    assert (
        error
        == f"error: could not write {out} ({cause}); free space or choose another {target} (none of the export is left there)"
    )
    assert (list(out.iterdir()) == []) if existing else not out.exists()


def test_model_card_cuts_relative_paths_too(tmp_path):
    values = {
        "logs": "demo/logs",
        "train_data": "data/train/{0..3}.tar::pipe:aws s3 cp s3://b/x.tar -",
        "val_data": "https://host/val.tar",
        "pretrained": "hf-hub:org/model",
        "model": "adacl-tiny",
    }
    assert {name: public_value(value) for name, value in values.items()} == {
        "logs": ".../logs",
        "train_data": ".../{0..3}.tar::pipe:aws s3 cp s3://b/x.tar -",
        "val_data": "https://host/val.tar",
        "pretrained": "hf-hub:org/model",
        "model": "adacl-tiny",
    }
    card = model_card({"args": {"logs": "demo/logs", "model": "adacl-tiny"}, "epoch": 1, "step": 2}, [], "org/m")
    assert "- **Training command:** `python -m training.main --model adacl-tiny --logs .../logs`" in str(card)
    assert "demo/logs" not in str(card)
