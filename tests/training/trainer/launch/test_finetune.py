"""Fine-tuning from our checkpoint or export (--pretrained, with --lock-image / --lock-text), and the hub-folder
export loaded through open_clip's local-dir path (the layout its hf-hub loader reads)."""

import json
from pathlib import Path

import open_clip
import pytest
import torch
from huggingface_hub import ModelCard
from safetensors.torch import load_file

from helpers.run_utils import tiny_argv
from open_clip_adacl import fused
from training.evaluation.zero_shot import write_table
from training.export import README_NAME, WEIGHTS_NAME, export_for_hub
from training.export import main as export_main
from training.main import main
from training.trainer.launch.params import command_line
from training.trainer.run_folder.checkpoint_files import load_checkpoint


def run_argv(demo_shards, logs, name, *extra):
    return tiny_argv(
        logs,
        name,
        *("--val-data", str(demo_shards / "val" / "shard-000000.tar"), "--lr", "1e-3", *extra),
        data=demo_shards / "train" / "shard-{000000..000003}.tar",
        samples=64,
    )


@pytest.fixture(scope="module")
def pretrained(demo_shards, module_tmp):
    """A short adacl run's epoch_1.pt and its hub-folder export."""
    logs = module_tmp("pretrain")
    fused._decisions.clear()  # as in a fresh process: the run makes, logs and records its own choices
    summary = main(run_argv(demo_shards, logs, "base", "--loss", "adacl"))
    hub = export_for_hub(summary.checkpoint, logs / "hub", repo_id="someone/adacl-tiny-demo")
    return Path(summary.checkpoint), hub


def test_the_run_logs_and_records_adacl_choice_of_selection_passes(pretrained, monkeypatch):
    run = pretrained[0].parent.parent
    assert (
        "AdaCL: median anchor selection passes for 32 x 32 float32 on cpu: fused not compiled (below 2048 squared entries"
    ) in (run / "out.log").read_text()
    choices = json.loads((run / "adacl_selection.json").read_text())
    assert choices[0]["rows"] == 32 and choices[0]["choice"] == "eager" and choices[0]["eager_ms"] > 0
    # Once the run has ended, a choice made later in the same process (the next in-process run's) is not its.
    monkeypatch.setenv(fused.ENV_VARIABLE, "auto")
    assert not fused.wanted(torch.empty(16, 16), "median anchor", lambda: None, lambda: None)
    assert json.loads((run / "adacl_selection.json").read_text()) == choices


def tower(state_dict, prefix):
    return {key: value for key, value in state_dict.items() if key.startswith(prefix)}


def test_hub_folder_loads_through_open_clip_local_dir(pretrained):
    checkpoint, hub = pretrained
    assert {path.name for path in hub.iterdir()} >= {"open_clip_config.json", WEIGHTS_NAME, README_NAME}
    model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{hub}")
    trained = load_checkpoint(checkpoint)["state_dict"]
    assert all(torch.equal(value, trained[key]) for key, value in model.state_dict().items())
    texts = ["a red cube", "two blue balls left of a star"]
    assert torch.equal(open_clip.get_tokenizer(f"local-dir:{hub}")(texts), open_clip.get_tokenizer("adacl-tiny")(texts))
    assert preprocess.transforms[0].size == 32


def test_model_card_has_the_training_command_and_results(pretrained, demo_shards):
    checkpoint, hub = pretrained
    card = (hub / README_NAME).read_text()
    data = ModelCard.load(hub / README_NAME).data  # the metadata as the hub parses it
    assert (data.library_name, data.license, data.pipeline_tag) == (
        "open_clip",
        "other",
        "zero-shot-image-classification",
    )
    assert data.tags == ["clip", "open_clip", "open_clip_adacl"]
    assert data.eval_results is None and "model-index" not in card and "model_name" not in card  # no --eval-dir
    args = load_checkpoint(checkpoint)["args"]
    public = {
        **args,
        "train_data": ".../shard-{000000..000003}.tar",
        "val_data": ".../shard-000000.tar",
        "logs": f".../{Path(args['logs']).name}",
    }
    assert f"`{command_line(public)}`" in card
    assert str(demo_shards) not in card and str(checkpoint.parents[2]) not in card  # no local path
    assert "--model adacl-tiny" in card and "--loss adacl" in card and "1 epochs, 2 steps" in card
    assert "open_clip.create_model_and_transforms('hf-hub:someone/adacl-tiny-demo')" in card
    [results] = [json.loads(line) for line in (checkpoint.parent / "results.jsonl").read_text().splitlines()]
    assert f"| clip_val_loss | {results['clip_val_loss']:.4f} |" in card


def test_model_card_takes_the_license_and_the_evaluation_table(pretrained, tmp_path):
    checkpoint, _ = pretrained
    rows = [
        {"dataset": "wds/scenes_shape", "task": "zeroshot_classification", "metric": "acc1", "value": 0.625},
        {
            "dataset": "wds/scenes_retrieval",
            "task": "zeroshot_retrieval",
            "metric": "image_retrieval_recall@5",
            "value": 0.5,
        },
    ]
    write_table(rows, tmp_path / "eval")  # what python -m training.evaluation --output-dir writes
    output = export_main(
        [
            "--checkpoint",
            str(checkpoint),
            "--hf-dir",
            str(tmp_path / "hub"),
            "--license",
            "cc-by-4.0",
            "--eval-dir",
            str(tmp_path / "eval"),
        ]
    )
    card = (output / README_NAME).read_text()
    data = ModelCard.load(output / README_NAME).data
    assert (data.library_name, data.license, data.model_name) == ("open_clip", "cc-by-4.0", "NAME")
    # the model-index: one result per table row, its number as written; the hub's task id where it has one
    assert [
        (result.task_type, result.task_name, result.dataset_type, result.metric_type, result.metric_value)
        for result in data.eval_results
    ] == [
        ("zero-shot-image-classification", "zeroshot_classification", "wds/scenes_shape", "acc1", rows[0]["value"]),
        (
            "zeroshot_retrieval",
            "zeroshot_retrieval",
            "wds/scenes_retrieval",
            "image_retrieval_recall@5",
            rows[1]["value"],
        ),
    ]
    assert (
        "| dataset | task | metric | value |\n|---|---|---|---|\n"
        "| wds/scenes_shape | zeroshot_classification | acc1 | 0.6250 |\n"
        "| wds/scenes_retrieval | zeroshot_retrieval | image_retrieval_recall@5 | 0.5000 |\n" in card
    )
    with pytest.raises(FileNotFoundError, match="--eval-dir .*: no results.csv there"):
        export_main(["--checkpoint", str(checkpoint), "--hf-dir", str(tmp_path / "hub2"), "--eval-dir", str(tmp_path)])
    assert not (tmp_path / "hub2").exists()


def test_fine_tune_from_the_export_with_a_locked_image_tower(demo_shards, tmp_path, pretrained):
    _, hub = pretrained
    start = load_file(hub / WEIGHTS_NAME)
    summary = main(
        run_argv(
            demo_shards,
            tmp_path,
            "ft-image-locked",
            "--loss",
            "clip",
            "--lock-image",
            "--pretrained",
            str(hub / WEIGHTS_NAME),
        )
    )
    tuned = load_checkpoint(summary.checkpoint)["state_dict"]
    assert all(torch.equal(value, start[key]) for key, value in tower(tuned, "visual.").items())
    assert not all(torch.equal(value, start[key]) for key, value in tower(tuned, "transformer.").items())


def test_fine_tune_from_a_checkpoint_with_a_locked_text_tower(demo_shards, tmp_path, pretrained):
    checkpoint, _ = pretrained
    start = load_checkpoint(checkpoint)["state_dict"]
    summary = main(
        run_argv(
            demo_shards, tmp_path, "ft-text-locked", "--loss", "adacl", "--lock-text", "--pretrained", str(checkpoint)
        )
    )
    tuned = load_checkpoint(summary.checkpoint)["state_dict"]
    assert all(torch.equal(value, start[key]) for key, value in tower(tuned, "transformer.").items())
    assert not all(torch.equal(value, start[key]) for key, value in tower(tuned, "visual.").items())


def test_export_command_line_writes_a_hub_folder(pretrained, tmp_path, capsys):
    checkpoint, _ = pretrained
    output = export_main(["--checkpoint", str(checkpoint), "--hf-dir", str(tmp_path / "hub"), "--repo-id", "org/model"])
    assert "hf upload org/model" in capsys.readouterr().out
    assert "hf-hub:org/model" in (output / README_NAME).read_text()
