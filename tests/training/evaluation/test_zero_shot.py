"""training.evaluation.zero_shot on a briefly trained adacl-tiny: the stock clip-benchmark CLI on its export gives
above-chance accuracy and recall, the in-process path gives the same numbers, and the table lists them."""

import contextlib
import csv
import errno
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import open_clip
import pytest
from safetensors.torch import save_file

import open_clip_adacl  # noqa: F401  (registers adacl-tiny)
from helpers import REPO
from helpers.cli_errors import one_line_error
from training.evaluation import stock_cli, zero_shot
from training.evaluation.zero_shot import (
    cli,
    closest_dataset,
    format_markdown,
    infer_task,
    known_datasets,
    main,
    table_rows,
    worker_count,
)
from training.main import main as train_main

NUM_TEST = 128  # the demo fixture's test scenes (conftest.DEMO_SIZES)
NUM_CLASSES = {"wds/scenes_color": 7, "wds/scenes_shape": 4}


@pytest.fixture(scope="module")
def trained_checkpoint(demo_shards, module_tmp):
    """adacl-tiny after 96 CLIP steps on the demo's 512 training scenes (about 20 s on 2 CPU cores)."""
    logs = module_tmp("logs")
    summary = train_main(
        [
            "--train-data",
            str(demo_shards / "train" / "shard-{000000..000003}.tar"),
            "--model",
            "adacl-tiny",
            "--loss",
            "clip",
            "--batch-size",
            "64",
            "--epochs",
            "12",
            "--lr",
            "3e-3",
            "--warmup",
            "10",
            "--workers",
            "0",
            "--device",
            "cpu",
            "--precision",
            "fp32",
            "--seed",
            "0",
            "--logs",
            str(logs),
            "--name",
            "evaluate-test",
            "--save-frequency",
            "12",
        ]
    )
    return summary.checkpoint


@pytest.fixture(scope="module")
def stock_cli_output(trained_checkpoint, demo_shards, module_tmp):
    """The README command: export the checkpoint, run the stock `clip_benchmark eval` (a subprocess per task)."""
    output_dir = module_tmp("stock")
    main(
        [
            "--checkpoint",
            trained_checkpoint,
            "--demo-root",
            str(demo_shards),
            "--output-dir",
            str(output_dir),
            "--num-workers",
            "2",
        ]
    )
    return output_dir


def read_table(output_dir):
    with (output_dir / "results.csv").open() as f:
        return {(row["dataset"], row["task"], row["metric"]): float(row["value"]) for row in csv.DictReader(f)}


@pytest.mark.slow
def test_stock_cli_table_lists_every_metric_in_unit_range(stock_cli_output):
    table = read_table(stock_cli_output)
    # clip-benchmark reports top-5 accuracy only for sets of at least 5 classes
    classification = {
        (name, "zeroshot_classification", metric)
        for name, classes in NUM_CLASSES.items()
        for metric in ("acc1", "acc5", "mean_per_class_recall")
        if metric != "acc5" or classes >= 5
    }
    retrieval = {
        ("wds/scenes_retrieval", "zeroshot_retrieval", f"{direction}_retrieval_recall@{k}")
        for direction in ("image", "text")
        for k in (1, 5, 10)
    }
    clone_selection = {
        ("clone_selection", "clone_selection", f"{edit}_acc")
        for edit in ("color", "shape", "size", "relation", "overall")
    }
    assert set(table) == classification | retrieval | clone_selection
    assert all(0.0 <= value <= 1.0 for value in table.values())
    markdown = (stock_cli_output / "results.md").read_text()
    assert markdown.startswith("| dataset | task | metric | value |\n|---|---|---|---|\n")
    assert len(markdown.splitlines()) == 2 + len(table)
    raw = json.loads((stock_cli_output / "clip_benchmark" / "scenes_color_zeroshot_classification.json").read_text())
    assert raw["model"] == f"local-dir:{stock_cli_output / 'export'}"  # the stock CLI ran on the export


@pytest.mark.slow
def test_trained_model_is_far_above_chance_through_the_stock_cli(stock_cli_output):
    table = read_table(stock_cli_output)
    # 96 steps learn colour (acc1 ~0.5 against 1/7) but not yet shape, which stays near chance.
    assert table[("wds/scenes_color", "zeroshot_classification", "acc1")] > 2 / NUM_CLASSES["wds/scenes_color"]
    for direction in ("image", "text"):  # chance R@5 is about 5/128 either way
        assert (
            table[("wds/scenes_retrieval", "zeroshot_retrieval", f"{direction}_retrieval_recall@5")] > 4 * 5 / NUM_TEST
        )
    assert table[("clone_selection", "clone_selection", "color_acc")] > 0.75


@pytest.mark.slow
def test_in_process_path_agrees_with_stock_cli(stock_cli_output, demo_shards, tmp_path):
    rows = main(
        [
            "--model",
            f"local-dir:{stock_cli_output / 'export'}",
            "--demo-root",
            str(demo_shards),
            "--output-dir",
            str(tmp_path),
            "--num-workers",
            "0",
            "--in-process",
        ]
    )
    in_process = {(row["dataset"], row["task"], row["metric"]): row["value"] for row in rows}
    stock = read_table(stock_cli_output)
    assert in_process.keys() == stock.keys()
    for key, value in stock.items():
        assert in_process[key] == pytest.approx(value, abs=1e-6), key


def test_library_model_names_need_an_export_for_the_stock_cli(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(
            [
                "--model",
                "adacl-tiny",
                "--pretrained",
                "epoch_1.pt",
                "--datasets",
                "wds/x",
                "--output-dir",
                str(tmp_path),
            ]
        )
    assert "pass --checkpoint CKPT" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_reports_missing_datasets_in_one_line_before_running_clip_benchmark(
    stock_cli_output, tmp_path, monkeypatch, capsys
):
    (tmp_path / "cifar10").mkdir()  # an empty folder holds no data either
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "adacl-evaluate",
            "--model",
            f"local-dir:{stock_cli_output / 'export'}",
            "--datasets",
            "wds/absent,cifar10",
            "--dataset-root-dir",
            str(tmp_path / "{dataset}"),
            "--output-dir",
            str(tmp_path / "eval"),
        ],
    )
    with pytest.raises(SystemExit) as exit_info:
        cli()
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(
        f"error: 2 of the 2 datasets have no data in their folder: wds/absent "
        f"({tmp_path / 'absent'}), cifar10 ({tmp_path / 'cifar10'}); put them there first"
    )
    assert not (tmp_path / "eval").exists()


def test_task_comes_from_dataset_type(tmp_path):
    (tmp_path / "dataset_type.txt").write_text("retrieval\n")
    assert infer_task("wds/anything", tmp_path) == "zeroshot_retrieval"
    assert infer_task("wds/anything", tmp_path / "no_type_file") == "zeroshot_classification"
    assert infer_task("mscoco_captions", tmp_path) == "zeroshot_retrieval"
    assert infer_task("imagenet1k", tmp_path) == "zeroshot_classification"


def test_wds_workers_capped_at_shard_count(tmp_path):
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "nshards.txt").write_text("2\n")
    assert worker_count("wds/x", tmp_path, 4) == 2
    assert worker_count("wds/x", tmp_path, 1) == 1
    assert worker_count("cifar10", tmp_path, 4) == 4


def test_table_rows_skip_nan_and_format(tmp_path):
    result = tmp_path / "r.json"
    result.write_text(
        json.dumps(
            {"dataset": "wds/x", "task": "zeroshot_classification", "metrics": {"acc1": 0.25, "acc5": float("nan")}}
        )
    )
    rows = table_rows([result])
    assert rows == [{"dataset": "wds/x", "task": "zeroshot_classification", "metric": "acc1", "value": 0.25}]
    assert format_markdown(rows).splitlines()[-1] == "| wds/x | zeroshot_classification | acc1 | 0.2500 |"


def evaluation_cli_error(argv, monkeypatch, capsys) -> str:
    """What `python -m training.evaluation ARGV` prints when it refuses: exit status 2, one line, nothing else."""
    return one_line_error(cli, "adacl-evaluate", argv, monkeypatch, capsys)


def test_an_unknown_dataset_name_is_one_line_with_the_closest_known_one(tmp_path, monkeypatch, capsys):
    error = evaluation_cli_error(
        ["--model", "ViT-B-32", "--datasets", "imagenet1k,imagenet", "--output-dir", tmp_path / "eval"],
        monkeypatch,
        capsys,
    )
    assert error == (
        "error: --datasets imagenet: unknown dataset, did you mean imagenet1k? (clip-benchmark's "
        "names; wds/NAME for a local webdataset set)"
    )
    assert closest_dataset("mscoco", known_datasets()) == "mscoco_captions"
    assert closest_dataset("cifar-10", known_datasets()) == "cifar10"
    assert not (tmp_path / "eval").exists()


def test_a_missing_export_is_one_line_without_the_usage_screen(tmp_path, monkeypatch, capsys):
    error = evaluation_cli_error(
        ["--model", f"local-dir:{tmp_path / 'export'}", "--datasets", "imagenet1k", "--output-dir", tmp_path / "eval"],
        monkeypatch,
        capsys,
    )
    assert error == (
        f"error: --model local-dir:{tmp_path / 'export'}: no open_clip_config.json there (write one "
        "with python -m training.export)"
    )


def write_export(folder, embed_dim=None):
    """An adacl-tiny export (random weights) as training.export writes it; `embed_dim` in its config only."""
    folder.mkdir()
    model = open_clip.create_model("adacl-tiny")
    model_cfg = open_clip.get_model_config("adacl-tiny")
    config = {"model_cfg": {**model_cfg, "embed_dim": embed_dim or model_cfg["embed_dim"]}, "preprocess_cfg": {}}
    (folder / "open_clip_config.json").write_text(json.dumps(config))
    save_file(model.state_dict(), str(folder / "open_clip_model.safetensors"))
    return folder


def test_a_truncated_or_mismatched_export_is_named_in_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "x" / "test").mkdir(parents=True)
    (tmp_path / "x" / "test" / "nshards.txt").write_text("1\n")  # a wds set's folder, so the data check passes
    truncated = write_export(tmp_path / "truncated")
    weights = truncated / "open_clip_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    mismatched = write_export(
        tmp_path / "mismatched", embed_dim=2 * open_clip.get_model_config("adacl-tiny")["embed_dim"]
    )
    for export_dir, problem in ((truncated, "SafetensorError: "), (mismatched, "RuntimeError: size mismatch for ")):
        error = evaluation_cli_error(
            [
                "--model",
                f"local-dir:{export_dir}",
                "--datasets",
                "wds/x",
                "--dataset-root-dir",
                tmp_path / "{dataset}",
                "--output-dir",
                tmp_path / "eval",
            ],
            monkeypatch,
            capsys,
        )
        assert error.startswith(f"error: --model local-dir:{export_dir}: the export does not load ({problem}")
        assert error.endswith("); export it again with python -m training.export")
    assert not (tmp_path / "eval").exists()


def test_a_table_the_disk_refuses_is_one_line_and_is_not_left_half_written(tmp_path, monkeypatch, capsys):
    """results.csv fails as a write on a full disk does (an OSError without a file name): status 1, one line naming
    the folder, the cause and the fix; the result written before it stays whole, no table or temporary file does.
    The evaluation itself is not what fails here, so it is a fixed number."""
    (tmp_path / "x" / "test").mkdir(parents=True)
    (tmp_path / "x" / "test" / "nshards.txt").write_text("1\n")
    export_dir, out = write_export(tmp_path / "export"), tmp_path / "eval"
    monkeypatch.setattr(zero_shot, "evaluate_dataset", lambda *args, **kwargs: {"acc1": 0.5})
    real_atomic_file = zero_shot.atomic_file

    @contextlib.contextmanager
    def refusing(path, mode="wb"):
        with real_atomic_file(path, mode) as f:
            if Path(path).name == "results.csv":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            yield f

    monkeypatch.setattr(zero_shot, "atomic_file", refusing)
    argv = ["--model", f"local-dir:{export_dir}", "--datasets", "wds/x", "--dataset-root-dir", tmp_path / "{dataset}"]
    error = one_line_error(cli, "adacl-evaluate", [*argv, "--output-dir", out, "--in-process"], monkeypatch, capsys, 1)
    assert error == (
        f"error: could not write into {out} (disk full ([Errno 28] No space left on device)); free space or choose "
        "another --output-dir"
    )
    assert [path.relative_to(out).as_posix() for path in sorted(out.rglob("*"))] == [
        "clip_benchmark",
        "clip_benchmark/x_zeroshot_classification.json",
    ]


@pytest.mark.parametrize(
    "code, filename, cause",
    [
        (errno.ENOSPC, None, "disk full ([Errno 28] No space left on device)"),
        (errno.EROFS, "stage/x_task.json", "read-only file system ([Errno 30] Read-only file system)"),
    ],
)
def test_the_stock_clis_failed_write_is_one_line_naming_the_results_folder(
    tmp_path, monkeypatch, capsys, code, filename, cause
):
    """The stock CLI writes its result with open() and json.dump: a write fails without a file name, an open with
    the staged file's (which its caller removes); either way the line names the results' folder."""

    def refused(*args, **kwargs):
        raise OSError(code, os.strerror(code), filename)

    monkeypatch.setattr(stock_cli.runpy, "run_module", refused)
    monkeypatch.setattr(sys, "argv", ["stock_cli", str(tmp_path), "eval", "--output", "stage/{dataset}_{task}.json"])
    with pytest.raises(SystemExit) as stop:
        stock_cli.cli()
    assert stop.value.code == stock_cli.STOCK_WRITE_FAILED
    assert capsys.readouterr().err.splitlines() == [
        f"error: could not write into {tmp_path} ({cause}); free space or choose another --output-dir"
    ]


@pytest.mark.slow
def test_several_datasets_sharing_one_root_are_refused_and_a_root_per_dataset_is_not(
    stock_cli_output, demo_shards, tmp_path, monkeypatch, capsys
):
    """A root without {dataset} would evaluate scenes_shape's folder under both names and exit 0; with {dataset}
    (here in clip-benchmark's own spellings, --dataset A B --dataset_root) each gets its own score."""
    export_dir = stock_cli_output / "export"
    shared = demo_shards / "benchmark" / "scenes_shape"
    error = evaluation_cli_error(
        [
            "--model",
            f"local-dir:{export_dir}",
            "--datasets",
            "wds/scenes_color,wds/scenes_shape",
            "--dataset-root-dir",
            shared,
            "--output-dir",
            tmp_path / "eval",
        ],
        monkeypatch,
        capsys,
    )
    assert error == (
        f"error: --dataset-root-dir {shared}: 2 datasets (wds/scenes_color, wds/scenes_shape) would all "
        f"read {shared}; put {{dataset}} in it (e.g. '/data/{{dataset}}') so that each reads its own "
        "folder, or evaluate them one at a time"
    )
    assert not (tmp_path / "eval").exists()
    rows = main(
        [
            "--model",
            f"local-dir:{export_dir}",
            "--dataset",
            "wds/scenes_color",
            "wds/scenes_shape",
            "--dataset_root",
            str(demo_shards / "benchmark" / "{dataset}"),
            "--output-dir",
            str(tmp_path / "ok"),
            "--num-workers",
            "0",
            "--in-process",
        ]
    )
    stock = read_table(stock_cli_output)
    assert {(row["dataset"], row["metric"]): row["value"] for row in rows} == pytest.approx(
        {
            (dataset, metric): value
            for (dataset, _, metric), value in stock.items()
            if dataset in ("wds/scenes_color", "wds/scenes_shape")
        },
        abs=1e-6,
    )


def readme_stock_command():
    """The README's `clip_benchmark eval` command (its "Export and evaluation" block), as the shell splits it."""
    text = (REPO / "README.md").read_text()
    start = text.index("\nclip_benchmark eval ") + 1
    lines = []
    for line in text[start:].splitlines():
        lines.append(line.rstrip("\\").strip())
        if not line.endswith("\\"):
            break
    return shlex.split(" ".join(lines))


def with_values(argv, **values):
    """`argv` with the values of the flags `values` (by name without dashes) replaced, or added when missing."""
    argv = list(argv)
    for name, value in values.items():
        flag = f"--{name}"
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    return argv


@pytest.mark.slow
def test_the_readmes_stock_command_and_the_table_agree_exactly(stock_cli_output, demo_shards, tmp_path):
    """The README's stock command on the demo's export and sets (its dataset, root and output replaced; one worker per
    shard) gives the table's numbers to the last digit; without its --no_amp it gives `--amp`'s table's."""
    export_dir = stock_cli_output / "export"
    table = read_table(stock_cli_output)
    command = readme_stock_command()
    assert command[:2] == ["clip_benchmark", "eval"] and "--no_amp" in command
    amp_rows = main(
        [
            "--model",
            f"local-dir:{export_dir}",
            "--datasets",
            "wds/scenes_color",
            "--dataset-root-dir",
            str(demo_shards / "benchmark" / "{dataset}"),
            "--output-dir",
            str(tmp_path / "amp"),
            "--num-workers",
            "1",
            "--amp",
        ]
    )
    amp_table = {(row["dataset"], row["task"], row["metric"]): row["value"] for row in amp_rows}
    for amp, argv in ((False, command), (True, [arg for arg in command if arg != "--no_amp"])):
        output = tmp_path / f"stock_amp{amp}.json"
        argv = with_values(
            argv[2:],
            model=f"local-dir:{export_dir}",
            dataset="wds/scenes_color",
            dataset_root=str(demo_shards / "benchmark" / "scenes_color"),
            output=str(output),
            num_workers="1",
        )
        subprocess.run([sys.executable, "-m", "clip_benchmark.cli", "eval", *argv], check=True, capture_output=True)
        stock = json.loads(output.read_text())["metrics"]
        ours = amp_table if amp else table
        for metric in ("acc1", "mean_per_class_recall"):
            assert stock[metric] == ours[("wds/scenes_color", "zeroshot_classification", metric)], (amp, metric)
    fp32 = table[("wds/scenes_color", "zeroshot_classification", "acc1")]
    print(
        f"scenes_color acc1: fp32 {fp32:.4f}, clip-benchmark's default (bf16 autocast) {amp_table[('wds/scenes_color', 'zeroshot_classification', 'acc1')]:.4f}"
    )
