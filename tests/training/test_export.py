"""Export: stock open_clip loads `local-dir:DIR` in a fresh process (no open_clip_adacl) with identical embeddings."""
import json
import os
import subprocess
import sys
import textwrap

import open_clip
import pytest
import torch

from open_clip_adacl import create_loss
from training import params
from training.checkpoint import Checkpointer, TrainState, run_components
from training.data import DataPosition
from training.distributed import DistributedEnv
from training.export import CONFIG_NAME, WEIGHTS_NAME, export
from training.model import build_model, open_clip_model_config, preprocess_config
from training.optimizer import build_optimizer

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
    components = run_components(model=bundle.model, optimizer=build_optimizer(bundle.model, cfg.optimizer),
                                scaler=None, loss=loss, state=state)
    checkpointer = Checkpointer(
        cfg.checkpoints, checkpoint_dir=str(tmp_path / "checkpoints"), components=components,
        env=DistributedEnv(), name="export-test", args=dict(cfg.recorded_args),
        model_cfg=open_clip_model_config(cfg.model), preprocess_cfg=preprocess_config(bundle.model))
    state.start_epoch(num_skip_reasons=2)
    [path] = checkpointer.save(["epoch_1.pt"])
    return path, bundle, args


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
    subprocess.run([sys.executable, "-c", STOCK_OPEN_CLIP, str(export_dir), str(tmp_path / "inputs.pt"),
                    str(tmp_path / "outputs.pt")], check=True, env=env, cwd=tmp_path, timeout=300)
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
    assert {path.name: path.stat().st_mode & 0o777 for path in export_dir.iterdir()} == \
        {CONFIG_NAME: mode, WEIGHTS_NAME: mode}


def test_export_cli_reports_a_checkpoint_without_config(tmp_path):
    torch.save({"state_dict": {}}, tmp_path / "bare.pt")
    result = subprocess.run([sys.executable, "-m", "training.export", "--checkpoint", str(tmp_path / "bare.pt"),
                             "--output", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "pass --model NAME" in result.stderr
