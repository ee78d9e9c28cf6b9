"""Zero-shot evaluation of a trained model with the stock clip-benchmark, collected into one table.

Runs `clip_benchmark eval` (zero-shot classification and retrieval) on any clip-benchmark dataset
found locally (`imagenet1k`, `cifar10`, `mscoco_captions`, `flickr30k`, `wds/<name>`, ...), plus
our clone-negative selection when the demo data has its set, and writes one table of
(dataset, task, metric, value) rows as CSV and Markdown. Everything runs offline.

    # a training checkpoint: exported first to OUTPUT/export (loadable as local-dir:OUTPUT/export)
    python -m training.evaluation --checkpoint logs/RUN/checkpoints/epoch_5.pt --demo-root demo --output-dir eval
    # an export, on the demo's clip-benchmark sets (demo/benchmark/*) and clone-selection set
    python -m training.evaluation --model local-dir:export --demo-root demo --output-dir eval
    # datasets the user has: --dataset-root-dir is clip-benchmark's template ({dataset} = name without "wds/")
    python -m training.evaluation --model local-dir:export --datasets imagenet1k,mscoco_captions \
        --dataset-root-dir '/data/{dataset}' --output-dir eval

By default each task runs as a subprocess of the stock CLI, exactly what a user would type (run by
`training.evaluation.stock_cli`, which says a result it cannot write in one line instead of a traceback):

    clip_benchmark eval --model local-dir:export --pretrained none --dataset wds/scenes_shape \
        --dataset_root demo/benchmark/scenes_shape --task zeroshot_classification \
        --no_amp --num_workers 1 --recall_k 1 5 10 --output scenes_shape.json

`--in-process` calls clip-benchmark's own dataset builders and metrics on a model loaded once in
this process instead (the same numbers, without a fresh interpreter per task). Every file is written whole or
not at all (`atomic_file`, the stock CLI's results through a staged folder); a write that fails (a full disk, a
read-only folder) ends the command in one line naming the file or folder and the cause, with exit status 1.
"""

from __future__ import annotations

import argparse
import csv
import difflib
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

import open_clip
import torch
from clip_benchmark.datasets.builder import (
    build_dataset,
    dataset_collection,
    get_dataset_collate_fn,
    get_dataset_default_task,
)
from clip_benchmark.metrics import image_caption_selection, zeroshot_classification, zeroshot_retrieval

from open_clip_adacl import MODEL_CONFIG_DIR  # importing registers our configs (e.g. adacl-tiny) for --in-process
from training.export import CONFIG_NAME, export, markdown_table
from training.trainer.engine.model import check_pretrained, load_problem
from training.trainer.launch.tool_flags import OneLineErrorParser, add_trainer_flags
from training.trainer.run_folder.checkpoint_files import atomic_file, staged_folder
from training.trainer.run_folder.safe_write import WRITE_FAILED_STATUS, WriteFailed, tool_writes

from .clone_selection import evaluate_clone_selection
from .stock_cli import STOCK_WRITE_FAILED, WRITE_FIX

CLASSIFICATION = "zeroshot_classification"
RETRIEVAL = "zeroshot_retrieval"
CAPTION_SELECTION = "image_caption_selection"
CLONE_SELECTION = "clone_selection"
WDS_PREFIX = "wds/"
LOCAL_DIR = "local-dir:"
SPLIT = "test"
TABLE_FIELDS = ("dataset", "task", "metric", "value")
# clip-benchmark 1.6.2's dataset names (its builder's branches; its collections add the vtab/ ones), most used
# first, so that the closest name to a mistyped one is the common one (imagenet -> imagenet1k, not imagenetv2).
BENCHMARK_DATASETS = (
    "imagenet1k",
    "cifar10",
    "cifar100",
    "mscoco_captions",
    "flickr30k",
    "flickr8k",
    "imagenetv2",
    "imagenet_sketch",
    "imagenet-a",
    "imagenet-r",
    "objectnet",
    "babel_imagenet",
    "caltech101",
    "cars",
    "country211",
    "cub",
    "dtd",
    "eurosat",
    "fer2013",
    "fgvc_aircraft",
    "flowers",
    "food101",
    "gtsrb",
    "inaturalist",
    "mnist",
    "pcam",
    "pets",
    "renderedsst2",
    "resisc45",
    "stl10",
    "sun397",
    "svhn",
    "voc2007",
    "voc2007_multilabel",
    "winoground",
    "multilingual_mscoco_captions",
    "flickr30k-200",
    "crossmodal3600",
    "xtd10",
    "xtd200",
    "dummy",
)
# Families of names clip-benchmark builds from a prefix: a local webdataset set, tfds and vtab tasks, SugarCrepe.
DATASET_PREFIXES = (WDS_PREFIX, "tfds/", "vtab/", "sugar_crepe", "clevr_", "dsprites_", "kitti_", "smallnorb_")


def benchmark_name(dataset: str) -> str:
    """The name clip-benchmark formats `--dataset_root` and `--output` with: `wds/` stripped."""
    return dataset.removeprefix(WDS_PREFIX)


def dataset_root(root_template: str, dataset: str) -> Path:
    """The dataset's folder, from clip-benchmark's `--dataset_root` template (`{dataset}`, `{dataset_cleaned}`)."""
    name = benchmark_name(dataset)
    return Path(root_template.format(dataset=name, dataset_cleaned=name.replace("/", "-")))


def infer_task(dataset: str, root: Path) -> str:
    """The task to run: a `wds/` set says so in `dataset_type.txt`, other names by clip-benchmark's default.

    clip-benchmark's `--task auto` treats every `wds/` set as classification, so a retrieval
    set (`dataset_type.txt` = `retrieval`) would fail without this.
    """
    if dataset.startswith(WDS_PREFIX):
        type_file = root / "dataset_type.txt"
        dataset_type = type_file.read_text().strip().lower() if type_file.is_file() else "classification"
        return RETRIEVAL if dataset_type == "retrieval" else CLASSIFICATION
    return get_dataset_default_task(dataset)


def known_datasets() -> list[str]:
    """The names clip-benchmark's `--dataset` takes, BENCHMARK_DATASETS first, then its collections' names and
    members (`vtab+`, `retrieval`, ...)."""
    collected = [name for members in dataset_collection.values() for name in members]
    return list(dict.fromkeys([*BENCHMARK_DATASETS, *dataset_collection, *collected]))


def closest_dataset(name: str, known: Sequence[str]) -> str | None:
    """The known name a mistyped `name` most likely means: the first that extends it (imagenet -> imagenet1k),
    else difflib's closest."""
    extending = [candidate for candidate in known if candidate.startswith(name)]
    close = extending or difflib.get_close_matches(name, known, n=1)
    return close[0] if close else None


def check_dataset_names(datasets: Sequence[str]) -> None:
    """Every name is one clip-benchmark knows, before any folder is looked at: an unknown name would be
    reported as a dataset without data, hiding the typo."""
    known = known_datasets()
    for name in datasets:
        if name in known or name.startswith(DATASET_PREFIXES):
            continue
        close = closest_dataset(name, known)
        hint = f", did you mean {close}?" if close else ""
        raise ValueError(
            f"--datasets {name}: unknown dataset{hint} (clip-benchmark's names; wds/NAME for a local webdataset set)"
        )


def check_export(folder: Path) -> None:
    """The export loads in open_clip the way clip-benchmark will load it: a truncated weights file, or weights of
    another architecture than its config, is one line naming the folder instead of the stock CLI's traceback."""
    try:
        open_clip.create_model(f"{LOCAL_DIR}{folder}")
    except Exception as error:  # noqa: BLE001 - safetensors' and torch's errors, each its own type
        raise ValueError(
            f"--model {LOCAL_DIR}{folder}: the export does not load ({load_problem(error)}); export it "
            "again with python -m training.export"
        ) from None


def check_distinct_roots(roots: dict[str, Path], root_template: str) -> None:
    """Each dataset reads a folder of its own: a `--dataset-root-dir` without `{dataset}` sends every dataset to
    the same folder, and clip-benchmark would evaluate that one set under each name and exit 0."""
    by_folder: dict[Path, list[str]] = {}
    for dataset, root in roots.items():
        by_folder.setdefault(root, []).append(dataset)
    shared = next((names for names in by_folder.values() if len(names) > 1), None)
    if shared:
        raise ValueError(
            f"--dataset-root-dir {root_template}: {len(shared)} datasets ({', '.join(shared)}) would "
            f"all read {dataset_root(root_template, shared[0])}; put {{dataset}} in it (e.g. "
            "'/data/{dataset}') so that each reads its own folder, or evaluate them one at a time"
        )


def check_dataset_roots(roots: dict[str, Path]) -> None:
    """Every dataset's folder holds data before clip-benchmark runs: offline, it would try to download a missing
    one and fail with a long traceback."""
    missing = [f"{dataset} ({root})" for dataset, root in roots.items() if not _holds_data(dataset, root)]
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} of the {len(roots)} datasets have no data in their folder: "
            f"{', '.join(missing)}; put them there first (clip-benchmark's layout; evaluation "
            f"runs offline) or point --dataset-root-dir at them"
        )


def _holds_data(dataset: str, root: Path) -> bool:
    if dataset.startswith(WDS_PREFIX):
        return (root / SPLIT / "nshards.txt").is_file()
    return root.is_dir() and any(root.iterdir())


def worker_count(dataset: str, root: Path, requested: int) -> int:
    """DataLoader workers for `dataset`: a `wds/` set gets no more workers than it has shards.

    A webdataset worker with no shard of its own makes the stock loader fail (docs/ecosystem.md §4).
    """
    if not dataset.startswith(WDS_PREFIX):
        return requested
    return min(requested, int((root / SPLIT / "nshards.txt").read_text()))


def result_path(results_dir: Path, dataset: str, task: str) -> Path:
    """Where a result JSON goes; the stock CLI's `--output` template expands to the same path."""
    return results_dir / f"{benchmark_name(dataset).replace('/', '_')}_{task}.json"


def run_stock_cli(
    model: str,
    pretrained: str,
    datasets: Sequence[str],
    root_template: str,
    task: str,
    results_dir: Path,
    *,
    batch_size: int,
    num_workers: int,
    amp: bool,
    recall_k: Sequence[int],
) -> list[Path]:
    """Run `python -m clip_benchmark.cli eval` for one task on `datasets` (through `stock_cli`: a failed write is
    one line), its results written into a staged folder and moved into `results_dir` once it succeeds, so that a
    result it cut short is not left there; return their result JSON paths."""
    with staged_folder(results_dir) as stage:
        command = [
            sys.executable,
            "-m",
            "training.evaluation.stock_cli",
            str(results_dir),
            "eval",
            "--model",
            model,
            "--pretrained",
            pretrained,
            "--dataset",
            *datasets,
            "--dataset_root",
            root_template,
            "--task",
            task,
            "--batch_size",
            str(batch_size),
            "--num_workers",
            str(num_workers),
            "--recall_k",
            *map(str, recall_k),
            "--output",
            str(stage / "{dataset}_{task}.json"),
            "--quiet",
        ]
        if not amp:
            command.append("--no_amp")
        subprocess.run(command, check=True)
    return [result_path(results_dir, dataset, task) for dataset in datasets]


def evaluate_dataset(
    model: torch.nn.Module,
    preprocess: Callable,
    tokenizer: Callable,
    dataset: str,
    root: Path,
    task: str,
    *,
    device: str,
    amp: bool = False,
    batch_size: int = 64,
    num_workers: int = 0,
    recall_k: Sequence[int] = (1, 5, 10),
) -> dict[str, float]:
    """One clip-benchmark task on an in-memory model, through clip-benchmark's own builders and metrics.

    Mirrors what `clip_benchmark eval` does for one dataset (same dataset, loader and metric
    calls), so it gives the stock CLI's numbers for a model that is not on disk.
    """
    data = build_dataset(
        dataset_name=dataset, root=str(root), transform=preprocess, split=SPLIT, download=False, task=task
    )
    if dataset.startswith(WDS_PREFIX):
        dataloader = torch.utils.data.DataLoader(data.batched(batch_size), batch_size=None, num_workers=num_workers)
    else:
        dataloader = torch.utils.data.DataLoader(
            data, batch_size=batch_size, num_workers=num_workers, collate_fn=get_dataset_collate_fn(dataset)
        )
    model.eval()
    if task == CLASSIFICATION:
        return zeroshot_classification.evaluate(
            model, dataloader, tokenizer, data.classes, data.templates, device=device, amp=amp
        )
    if task == RETRIEVAL:
        return zeroshot_retrieval.evaluate(
            model, dataloader, tokenizer, device=device, amp=amp, recall_k_list=list(recall_k)
        )
    if task == CAPTION_SELECTION:
        return image_caption_selection.evaluate(model, dataloader, tokenizer, device=device, amp=amp)
    raise ValueError(f"unsupported task {task!r} for {dataset}")


def write_result(path: Path, dataset: str, model: str, pretrained: str, task: str, metrics: dict) -> Path:
    """Write a result JSON in the stock CLI's layout."""
    path.parent.mkdir(parents=True, exist_ok=True)
    dump = {
        "dataset": dataset,
        "model": model,
        "pretrained": pretrained,
        "task": task,
        "metrics": metrics,
        "language": "en",
    }
    with atomic_file(path, "w") as f:
        f.write(json.dumps(dump))
    return path


def table_rows(result_paths: Sequence[Path]) -> list[dict]:
    """One (dataset, task, metric, value) row per metric of each result JSON.

    NaN metrics are left out: clip-benchmark reports acc5 as NaN when a set has fewer than 5 classes.
    """
    rows = []
    for path in result_paths:
        result = json.loads(Path(path).read_text())
        for metric, value in result["metrics"].items():
            if not math.isnan(value):
                rows.append(
                    {"dataset": result["dataset"], "task": result["task"], "metric": metric, "value": float(value)}
                )
    return rows


def format_markdown(rows: Sequence[dict]) -> str:
    """The table as GitHub Markdown, values to 4 decimals."""
    return markdown_table(TABLE_FIELDS, [[row[name] for name in TABLE_FIELDS] for row in rows])


def write_table(rows: Sequence[dict], output_dir: Path) -> str:
    """Write `results.csv` and `results.md` under `output_dir`; return the Markdown."""
    output_dir.mkdir(parents=True, exist_ok=True)
    with atomic_file(output_dir / "results.csv", "w") as f:
        writer = csv.DictWriter(f, fieldnames=TABLE_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    markdown = format_markdown(rows)
    with atomic_file(output_dir / "results.md", "w") as f:
        f.write(markdown)
    return markdown


def demo_datasets(demo_root: Path) -> list[str]:
    """The `wds/<name>` sets under `demo_root/benchmark/` (each with a `test/nshards.txt`)."""
    benchmark_dir = demo_root / "benchmark"
    names = sorted(path.name for path in benchmark_dir.iterdir() if (path / SPLIT / "nshards.txt").is_file())
    if not names:
        raise FileNotFoundError(f"no clip-benchmark wds sets under {benchmark_dir}")
    return [WDS_PREFIX + name for name in names]


def load_model(model: str, pretrained: str, device: str):
    """(model, preprocess, tokenizer) as clip-benchmark loads them; `pretrained` "none" means random init. A
    `pretrained` file that does not load, or records another architecture, is a one-line ValueError."""
    if pretrained.lower() != "none":
        try:
            check_pretrained(model, pretrained)
        except ValueError as error:
            raise ValueError(f"--pretrained {pretrained}: {error}") from None
    clip, _, preprocess = open_clip.create_model_and_transforms(
        model, pretrained=None if pretrained.lower() == "none" else pretrained, device=device
    )
    return clip.eval(), preprocess, open_clip.get_tokenizer(model)


def export_checkpoint(checkpoint: Path, export_dir: Path) -> str:
    """Export a training checkpoint with `training.export`; return its `local-dir:` model name."""
    export(checkpoint, export_dir, overwrite=True)  # this tool's own folder, written again on each run
    return f"{LOCAL_DIR}{export_dir}"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = OneLineErrorParser(prog="python -m training.evaluation", description=__doc__.split("\n")[0])
    model = parser.add_mutually_exclusive_group(required=True)
    add_trainer_flags(
        model,
        ("model",),
        defaults={"model": None},
        notes={"model": "Here also local-dir:EXPORT_DIR (python -m training.export)."},
    )
    model.add_argument(
        "--checkpoint", type=Path, help="training checkpoint (epoch_N.pt), exported to OUTPUT_DIR/export"
    )
    add_trainer_flags(
        parser,
        ("pretrained", "batch_size"),
        defaults={"pretrained": "none", "batch_size": 64},
        notes={"pretrained": "Here: with a built-in --model name."},
    )
    data = parser.add_mutually_exclusive_group(required=True)
    # clip-benchmark's own spellings (--dataset A B, --dataset_root) are aliases: argparse would otherwise call
    # them ambiguous abbreviations of --datasets and --dataset-root-dir.
    data.add_argument(
        "--datasets",
        "--dataset",
        nargs="+",
        help="clip-benchmark names, comma- or space-separated, e.g. imagenet1k,wds/scenes_shape",
    )
    data.add_argument(
        "--demo-root",
        type=Path,
        help="demo data folder: evaluates every DEMO_ROOT/benchmark/<name> and DEMO_ROOT/clone_selection",
    )
    parser.add_argument(
        "--dataset-root-dir",
        "--dataset_root",
        default="root",
        help="clip-benchmark --dataset_root (a template: {dataset} is the name without wds/)",
    )
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--num-workers", type=int, default=4, help="capped at the shard count of a wds set")
    parser.add_argument("--recall-k", type=int, nargs="+", default=[1, 5, 10])
    parser.add_argument(
        "--amp",
        action="store_true",
        help="clip-benchmark's default precision, autocast (bf16 on the CPU, fp16 on a GPU); fp32 by default, as "
        "the stock `clip_benchmark eval --no_amp`",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run clip-benchmark's builders and metrics here instead of the stock CLI subprocess",
    )
    args = parser.parse_args(argv)
    if args.model in {path.stem for path in MODEL_CONFIG_DIR.glob("*.json")} and not args.in_process:
        parser.error(
            f"the stock clip_benchmark CLI does not know --model {args.model} (an open_clip_adacl config): "
            "pass --checkpoint CKPT (exported for it first), an export as --model local-dir:DIR, "
            "or --in-process"
        )
    if (
        args.model
        and args.model.startswith(LOCAL_DIR)
        and not (Path(args.model.removeprefix(LOCAL_DIR)) / CONFIG_NAME).is_file()
    ):
        parser.error(f"--model {args.model}: no {CONFIG_NAME} there (write one with python -m training.export)")
    return args


def select_datasets(args: argparse.Namespace) -> tuple[list[str], str, Path | None]:
    """(clip-benchmark dataset names, `--dataset_root` template, clone-selection folder or None)."""
    if args.demo_root:
        clone_dir = args.demo_root / "clone_selection"
        return (
            demo_datasets(args.demo_root),
            str(args.demo_root / "benchmark" / "{dataset}"),
            clone_dir if clone_dir.is_dir() else None,
        )
    names = [name.strip() for names in args.datasets for name in names.split(",")]
    return [name for name in names if name], args.dataset_root_dir, None


def main(argv: Sequence[str] | None = None) -> list[dict]:
    """Evaluate, write OUTPUT_DIR/results.csv and results.md, print the table; return its rows. A write that fails
    (a full disk, a read-only folder) is a WriteFailed naming the file or folder and the cause."""
    args = parse_args(argv)
    with tool_writes(args.output_dir, WRITE_FIX):
        return _evaluate(args)


def _evaluate(args: argparse.Namespace) -> list[dict]:
    datasets, root_template, clone_dir = select_datasets(args)
    check_dataset_names(datasets)
    roots = {dataset: dataset_root(root_template, dataset) for dataset in datasets}
    check_distinct_roots(roots, root_template)
    check_dataset_roots(roots)
    if args.model and args.model.startswith(LOCAL_DIR):
        check_export(Path(args.model.removeprefix(LOCAL_DIR)))
    model_name = args.model or export_checkpoint(args.checkpoint, args.output_dir / "export")
    workers = {dataset: worker_count(dataset, roots[dataset], args.num_workers) for dataset in datasets}
    tasks: dict[str, list[str]] = {}
    for dataset in datasets:
        tasks.setdefault(infer_task(dataset, roots[dataset]), []).append(dataset)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # clip-benchmark's own choice
    if args.in_process or clone_dir:
        model, preprocess, tokenizer = load_model(model_name, args.pretrained, device)
    results_dir = args.output_dir / "clip_benchmark"

    result_paths = []
    for task, task_datasets in tasks.items():
        if not args.in_process:
            result_paths += run_stock_cli(
                model_name,
                args.pretrained,
                task_datasets,
                root_template,
                task,
                results_dir,
                batch_size=args.batch_size,
                num_workers=min(workers[name] for name in task_datasets),
                amp=args.amp,
                recall_k=args.recall_k,
            )
            continue
        for dataset in task_datasets:
            metrics = evaluate_dataset(
                model,
                preprocess,
                tokenizer,
                dataset,
                roots[dataset],
                task,
                device=device,
                amp=args.amp,
                batch_size=args.batch_size,
                num_workers=workers[dataset],
                recall_k=args.recall_k,
            )
            result_paths.append(
                write_result(
                    result_path(results_dir, dataset, task), dataset, model_name, args.pretrained, task, metrics
                )
            )
    if clone_dir:
        metrics = evaluate_clone_selection(
            model, preprocess, tokenizer, clone_dir, device=device, batch_size=args.batch_size
        )
        result_paths.append(
            write_result(
                result_path(results_dir, CLONE_SELECTION, CLONE_SELECTION),
                CLONE_SELECTION,
                model_name,
                args.pretrained,
                CLONE_SELECTION,
                metrics,
            )
        )
    rows = table_rows(result_paths)
    print(write_table(rows, args.output_dir))
    return rows


def cli() -> None:
    """Console entry point (`adacl-evaluate`): a failure prints one line and exits with status 2 (WRITE_FAILED_STATUS:
    the output took no more writes)."""
    try:
        main()
    except WriteFailed as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(WRITE_FAILED_STATUS)
    except subprocess.CalledProcessError as error:
        if error.returncode == STOCK_WRITE_FAILED:  # its one line is said
            sys.exit(WRITE_FAILED_STATUS)
        print(
            f"error: clip_benchmark eval failed with exit status {error.returncode} (its output is above)",
            file=sys.stderr,
        )
        sys.exit(2)
    except (OSError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    cli()
