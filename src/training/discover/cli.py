"""`python -m training.discover` (`adacl-discover`): the command line and the run."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import resource
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tqdm import tqdm

from open_clip_adacl.clone_signals import SIGNALS, STANDARD_THRESHOLD
from open_clip_adacl.losses.adacl import AdaCLLoss

from ..trainer.data import DataConfig, DataError, get_data_source, global_batch, resolve_dataset_type
from ..trainer.data.registry import makes_its_own_samples
from ..trainer.distributed import DistributedEnv, barrier, broadcast_object, init_distributed, shutdown
from ..trainer.engine.precision import build_precision
from ..trainer.flags import config_from_args
from ..trainer.launch.config import run_flags, source_option_flags
from ..trainer.launch.tool_flags import add_trainer_flags
from ..trainer.progress import eta_text
from ..trainer.run_folder.checkpoint_files import load_checkpoint
from ..trainer.run_folder.logger import setup_logging
from ..trainer.run_folder.safe_write import WRITE_FAILED_STATUS, WriteFailed, tool_writes
from . import report
from .batch import BatchResult, DiscoveryOptions, Encoder, batch_thumbnails, discover_batch
from .data import discovery_loader
from .model import load_discovery_model, quiet_logging
from .store import RunStore, read_batch_lines, remove_thumbnails_except, thumbnail_name

# The loss options that decide what is flagged; the rest of AdaCL's options shape the margins only.
DISCOVERY_OPTIONS = ("salient", "candidate_region", "prior_ratio", "std_floor")
# The trainer's flags the discovery takes (training.trainer.launch.tool_flags.add_trainer_flags), with this tool's defaults.
MODEL_DEFAULTS = {"model": None, "pretrained": None, "precision": "fp32", "device": "cuda"}
MODEL_NOTES = {
    "model": "Here also local-dir:EXPORT (python -m training.export) or hf-hub:ORG/NAME.",
    "precision": "Here it is the encoding precision.",
}
DATA_FLAGS = ("dataset_type", "caption_key", "batch_size", "workers", "train_num_samples")  # and every source's own
DATA_DEFAULTS = {"batch_size": 256, "workers": 1}
DATA_NOTES = {
    "train_num_samples": "Here: how many samples a source that makes its own (synthetic) makes, or the "
    "shards' size for the progress bar when they have no sizes.json."
}
LOG_INTERVAL_SECONDS = 30  # progress lines when stderr is not a terminal

logger = logging.getLogger(__name__)


class _OneLineErrors(argparse.ArgumentParser):
    def error(self, message: str):
        raise ValueError(f"{message} (python -m training.discover --help lists the flags)")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrors(
        prog="python -m training.discover",
        description="Find the pairs AdaCL's discovery flags as clone negatives in a dataset, "
        "batch by batch as training would, and write a report (docs/discover.md).",
    )
    model = parser.add_argument_group("model")
    model.add_argument(
        "--checkpoint", default=None, help="a trainer checkpoint (epoch_N.pt), loaded as the architecture it records"
    )
    add_trainer_flags(model, ("model", "pretrained", "precision", "device"), defaults=MODEL_DEFAULTS, notes=MODEL_NOTES)
    data = parser.add_argument_group("data")
    data.add_argument(
        "--data",
        default=None,
        help="webdataset shards ('dir/{00000..00099}.tar', '::' between sources), a csv/tsv file, or "
        "the data of any --dataset-type that reads data",
    )
    data.add_argument("--max-batches", type=int, default=None, help="stop after this many global batches")
    add_trainer_flags(
        parser.add_argument_group(
            "data: the trainer's flags (--batch-size per rank, as in training: the "
            "discovery runs over global batches of batch size x ranks)"
        ),
        (*DATA_FLAGS, *source_option_flags()),
        defaults=DATA_DEFAULTS,
        notes=DATA_NOTES,
    )
    add_trainer_flags(
        parser.add_argument_group(
            "the loss's discovery (default: the checkpoint's --adacl-* options if "
            "it trained with AdaCL, else AdaCL's defaults)"
        ),
        [f"adacl_{name}" for name in DISCOVERY_OPTIONS],
    )
    signals = parser.add_argument_group(
        "other clone signals, counted beside the loss's discovery (docs/clone_signals.md)"
    )
    signals.add_argument(
        "--clone-signals",
        default="",
        help=f"comma-separated, of {', '.join(SIGNALS)}: each one's flagged pairs and, with "
        "ground-truth families, its family precision and recall in the summary",
    )
    signals.add_argument(
        "--clone-signal-threshold",
        type=float,
        default=STANDARD_THRESHOLD,
        help="a score signal flags a negative this many standard deviations above its row's negatives",
    )
    output = parser.add_argument_group("output")
    output.add_argument("--output", required=True, type=Path, help="folder for pairs.jsonl, index.html, summary.json")
    output.add_argument(
        "--continue",
        dest="continue_run",
        action="store_true",
        help="continue the run in --output after its last complete batch",
    )
    output.add_argument(
        "--pairs-per-row",
        type=int,
        default=3,
        help="pairs.jsonl keeps each query's N most probable flagged negatives; 0 keeps every one "
        "(the discovery typically flags a third of a batch's negatives)",
    )
    output.add_argument(
        "--page-pairs",
        type=int,
        default=100,
        help="the page shows the N highest-posterior and the N smallest-gap pairs",
    )
    output.add_argument("--thumbnail-size", type=int, default=128, help="thumbnails fit in N x N pixels")
    return parser


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    for flag, value, least in (
        ("--batch-size", args.batch_size, 1),
        ("--workers", args.workers, 0),
        ("--pairs-per-row", args.pairs_per_row, 0),
        ("--page-pairs", args.page_pairs, 1),
        ("--thumbnail-size", args.thumbnail_size, 8),
        ("--max-batches", args.max_batches, 1),
    ):
        if value is not None and value < least:
            raise ValueError(f"{flag} must be >= {least}, got {value}")
    if args.checkpoint and args.pretrained:
        raise ValueError("--pretrained loads weights into --model; --checkpoint brings its own: pass one of them")
    if args.data is None and not makes_its_own_samples(args.dataset_type):
        raise ValueError("--data is required: webdataset shards, a csv/tsv file, or the data of --dataset-type")
    unknown = [name for name in signal_names(args) if name not in SIGNALS]
    if unknown:
        raise ValueError(f"--clone-signals: unknown {', '.join(unknown)}; choose from {', '.join(SIGNALS)}")
    if "," in args.caption_key:
        raise ValueError(f"--caption-key {args.caption_key}: discovery reads one caption field; pass one of them")
    return args


def signal_names(args: argparse.Namespace) -> Tuple[str, ...]:
    return tuple(name.strip() for name in args.clone_signals.split(",") if name.strip())


def discovery_options(args: argparse.Namespace) -> DiscoveryOptions:
    """The flags given, else the options the checkpoint trained with (AdaCL runs), else AdaCL's defaults;
    validated by AdaCLLoss.Options itself."""
    recorded = {}
    if args.checkpoint:
        checkpoint_args = load_checkpoint(args.checkpoint, mmap=True).get("args", {})  # load_discovery_model read it
        if checkpoint_args.get("loss") == "adacl":
            recorded = {
                name: checkpoint_args[f"adacl_{name}"]
                for name in DISCOVERY_OPTIONS
                if checkpoint_args.get(f"adacl_{name}") is not None
            }
    given = {
        name: getattr(args, f"adacl_{name}") for name in DISCOVERY_OPTIONS if getattr(args, f"adacl_{name}") is not None
    }
    options = AdaCLLoss.Options(**{**recorded, **given})
    return DiscoveryOptions(
        **{name: getattr(options, name) for name in DISCOVERY_OPTIONS},
        pairs_per_row=args.pairs_per_row,
        clone_signals=signal_names(args),
        signal_threshold=args.clone_signal_threshold,
    )


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Run the discovery; returns the summary (rank 0; {} on the other ranks)."""
    args = parse_args(argv)
    env = init_distributed(args.device)
    try:
        with tool_writes(args.output, "free space or choose another --output, then --continue the run"):
            return _run(args, env)
    finally:
        shutdown(env)


def _run(args: argparse.Namespace, env: DistributedEnv) -> Dict[str, Any]:
    setup_logging(None, rank=env.rank)
    if importlib.util.find_spec("matplotlib") is None:  # checked now, not after the whole run
        raise ValueError("the report's plots need matplotlib: pip install 'open_clip_adacl[eval]' (or matplotlib)")
    kind = resolve_dataset_type(args.dataset_type, args.data)
    source = get_data_source(kind)
    cfg = DataConfig(
        batch_size=args.batch_size,
        workers=args.workers,
        rank=env.rank,
        world_size=env.world_size,
        caption_key=args.caption_key,
        dataset_type=kind,
        train_num_samples=args.train_num_samples,
        source_options=config_from_args(source.Options, args, run_flags()),
    )
    ordered = source.ordered_pass(cfg, args.data, "--data")  # its data checked before any work
    with quiet_logging(logging.WARNING):
        loaded = load_discovery_model(args.model, args.pretrained, args.checkpoint, env.device)
    options = discovery_options(args)
    settings = {
        "model": loaded.description,
        "data": args.data,
        "dataset_type": kind,
        "caption_key": ordered.caption_field,
        "global_batch_size": global_batch(args.batch_size, env.world_size),
        **asdict(options),
        "clone_signals": list(options.clone_signals),
    }  # as run.json reads it back
    store = _open_store(args, settings, env)
    start_batch = broadcast_object(store.start_batch if store else None, env)
    page = report.page_selection_from(args.output, args.page_pairs) if store else None
    loader = discovery_loader(ordered, cfg, loaded.preprocess, loaded.tokenizer, start_batch)
    precision = build_precision(args.precision, env.device)
    encoder = Encoder(loaded.model, env.device, precision.autocast, precision.input_dtype)
    if store and start_batch:
        logger.info(f"resuming {args.output} at batch {start_batch}")

    progress = _Progress(
        env,
        planned_samples(ordered.num_samples, args.max_batches, settings["global_batch_size"]),
        start_batch * settings["global_batch_size"],
    )
    for local in loader:
        if args.max_batches is not None and local.index >= args.max_batches:
            break
        result = discover_batch(local, encoder, env, options)
        needed = broadcast_object(_missing_thumbnails(result, page, store) if store else None, env)
        thumbnails = batch_thumbnails(local, needed, env, args.thumbnail_size)
        if store:
            store.write_thumbnails(
                {
                    thumbnail_name(result.samples[position].source, result.samples[position].key): png
                    for position, png in thumbnails.items()
                }
            )
            store.append(result)
            progress.update(result)
    timing = progress.close()
    barrier(env)
    if not store:
        return {}
    store.close()
    return _report(args.output, settings, page, timing)


def _missing_thumbnails(result: BatchResult, page: report.PageSelection, store: RunStore) -> List[int]:
    """Offers the batch's pairs to the page; the batch positions of their samples that enter it without
    a thumbnail yet."""
    entering = [pair for pair in result.pairs_of_batch() if page.offer(pair)]
    return sorted(
        {
            pair[f"{side}_index"]
            for pair in entering
            for side in ("query", "negative")
            if not store.has_thumbnail(thumbnail_name(pair[f"{side}_source"], pair[f"{side}_key"]))
        }
    )


def _open_store(args: argparse.Namespace, settings: Dict[str, Any], env: DistributedEnv) -> Optional[RunStore]:
    """Rank 0's output folder; a problem with it is raised on every rank, so that none waits for the others."""
    store, error = None, None
    if env.is_master:
        try:
            store = RunStore(args.output, settings, args.continue_run)
        except (ValueError, OSError) as failure:
            error = str(failure)
    error = broadcast_object(error, env)
    if error:
        raise ValueError(error)
    return store


def _report(
    output: Path, settings: Dict[str, Any], page: report.PageSelection, timing: Dict[str, float]
) -> Dict[str, Any]:
    batch_lines = read_batch_lines(output)
    summary = report.summarize(batch_lines)
    if not summary["samples"]:
        skipped = ", ".join(f"{reason}={count}" for reason, count in summary["skipped"].items()) or "none"
        raise DataError(f"--data yielded no usable sample (skipped: {skipped}); check the shards and --caption-key")
    report.add_kept_metrics(summary, output)
    summary = {"settings": settings, **summary, "this_run": timing}
    pairs = page.pairs()
    remove_thumbnails_except(output, report.page_thumbnails(pairs))
    plots = report.write_plots(output, batch_lines, settings)
    table = report.console_table(summary)
    report.write_summary(output, summary)
    report.write_page(output, summary, settings, pairs, plots, table)
    print(table)
    print(f"{summary['samples']} samples in {summary['batches']} batches; report: {output / report.PAGE_FILE}")
    return summary


def planned_samples(num_samples: Optional[int], max_batches: Optional[int], global_batch_size: int) -> Optional[int]:
    """The samples this pass reads: the data's, or fewer when --max-batches stops it first (the progress
    bar's total, so that it ends at 100% and its estimate is of this pass)."""
    if max_batches is None:
        return num_samples
    stop = max_batches * global_batch_size
    return stop if num_samples is None else min(num_samples, stop)


class _Progress:
    """Samples per second and the time left on rank 0: a tqdm bar on a terminal, a log line every 30 s
    otherwise."""

    def __init__(self, env: DistributedEnv, total: Optional[int], done: int):
        self.enabled = env.is_master
        self.total, self.done, self.read = total, done, 0  # samples of the pass, read before and in this launch
        self.samples, self.start, self.last_log = 0, time.time(), time.time()
        self.start_cpu = _cpu_seconds()
        self.bar = tqdm(
            total=total,
            initial=done,
            unit="sample",
            unit_scale=True,
            desc="discover",
            smoothing=0.1,
            disable=not (self.enabled and sys.stderr.isatty()),
        )

    def update(self, result) -> None:
        self.samples += result.rows
        self.read += result.raw_samples
        self.bar.update(result.raw_samples)
        now = time.time()
        if self.bar.disable and now - self.last_log >= LOG_INTERVAL_SECONDS:
            self.last_log = now
            logger.info(self.line(result.index, now))

    def line(self, index: int, now: float) -> str:
        """The log line after batch `index`: samples so far, their rate and, when the pass's size is known,
        the time left at the rate of the samples read in this launch (skipped ones included, as the bar)."""
        rate = self.samples / max(now - self.start, 1e-9)
        text = f"batch {index}: {self.samples} samples, {rate:.1f} samples/s"
        if self.total is None:
            return text
        return (
            f"{text}, {self.done + self.read}/{self.total} read, "
            f"{eta_text(now - self.start, self.read, self.total - self.done)}"
        )

    def close(self) -> Dict[str, float]:
        """This run's samples, seconds and samples per second, also per CPU-second of this process and
        its data workers (which a machine shared with other jobs does not move)."""
        self.bar.close()
        seconds, cpu_seconds = time.time() - self.start, _cpu_seconds() - self.start_cpu
        return {
            "samples": self.samples,
            "seconds": seconds,
            "samples_per_second": self.samples / max(seconds, 1e-9),
            "cpu_seconds": cpu_seconds,
            "samples_per_cpu_second": self.samples / max(cpu_seconds, 1e-9),
        }


def _cpu_seconds() -> float:
    """User and system time of this process and its finished children (the data workers)."""
    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )


def cli() -> None:
    """Console entry point (`adacl-discover`): a failure prints one line and exits with status 2 (1: the report's
    folder took no more writes)."""
    try:
        main()
    except (ValueError, FileNotFoundError, DataError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except WriteFailed as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(WRITE_FAILED_STATUS)
