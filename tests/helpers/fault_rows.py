"""The fault table's rows of a new user's mistakes and odd inputs (docs/cluster.md), declared once: each row is a real
command line (a tool's flags and environment), the exit status the user sees and the line that tells them what
happened. `tests/fault_table.py --cases new_user_faults` runs each as a process of its own and prints the row;
`tests/training/test_fault_rows.py` runs the same command through the tool's console entry point and checks the
status and the line, so that a row of the table is a test of the command it names.

`write_fault_inputs(work, demo)` writes what the rows read (bad shards, csv files, broken model folders, a finished
run); `FaultInputs` holds their paths."""

from __future__ import annotations

import io
import json
import pickle
import re
import shutil
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np
from PIL import Image

from helpers.run_utils import tiny_argv

# The sample keys `--loss glofnd` cannot index, in the order the first shard's samples get them (--data-size 1000).
BAD_SAMPLE_KEYS = (-3, "abc", 1.5, 2**70, 10**6)
GLOFND_DATA_SIZE = 1000
CSV_DATA_SIZE = 100  # --data-size of the glofnd run on rows.tsv, whose 128 rows are samples 0..127
NUL_ROW = 3  # the csv row whose image path holds a NUL byte
QUOTE_ROW = 3  # the tsv row whose caption opens a quote it never closes


@dataclass(frozen=True)
class FaultInputs:
    """Where the rows' inputs are (`write_fault_inputs`)."""

    work: Path
    demo: Path

    @property
    def shards(self) -> str:
        return str(self.demo / "train" / "shard-{000000..000003}.tar")

    @property
    def logs(self) -> Path:
        return self.work / "logs"

    def path(self, name: str) -> str:
        return str(self.work / name)


@dataclass(frozen=True)
class FaultRow:
    """One row: `argv(inputs)` given to `tool` (`python -m TOOL`) with `env` set (and the launcher's variables of
    the caller's environment unset), its exit `status`, and the outcome: the first output line holding `marker`
    (the message after the log prefix), which must match `expect`; `absent` must be in no output line, and no
    traceback either. `outcome_file`, when given, holds the outcome line instead of the output."""

    name: str
    fault: str
    argv: Callable[[FaultInputs], List[str]]
    status: int
    marker: str
    expect: str
    lost: str = "nothing"
    env: Mapping[str, str] = field(default_factory=dict)
    tool: str = "training.main"
    absent: Optional[str] = None
    outcome_file: Optional[Callable[[FaultInputs], Path]] = None
    file_size_limit: Optional[int] = None  # RLIMIT_FSIZE of the process: a disk that fills at this many bytes

    def outcome(self, inputs: FaultInputs, output: str) -> str:
        lines = self.outcome_file(inputs).read_text().splitlines() if self.outcome_file else output.splitlines()
        return next((line.split(" | ")[-1] for line in lines if self.marker in line), "")

    def problems(self, inputs: FaultInputs, status: int, output: str) -> List[str]:
        """What the command did that this row does not promise (empty: the row holds)."""
        found = []
        if status != self.status:
            found.append(f"exit status {status}, not {self.status}")
        if not re.search(self.expect, self.outcome(inputs, output)):
            found.append(f"no line with {self.marker!r} matching {self.expect!r}")
        if "Traceback" in output:
            found.append("a traceback")
        if self.absent and self.absent in output:
            found.append(f"{self.absent!r} said")
        return found


def run_flags(inputs: FaultInputs, name: str, *extra: str, data: Optional[str] = None, samples: int = 64) -> List[str]:
    """A tiny clip run of 1 epoch on the demo shards (or `data`), named `name`."""
    return tiny_argv(inputs.logs, name, *extra, data=data or inputs.shards, samples=samples)


def _bad_number(name: str, fault: str, flags: Sequence[str], expect: str, **kwargs) -> FaultRow:
    return FaultRow(name, fault, lambda i: run_flags(i, name, *flags, "--dry-run"), 2, "error:", expect, **kwargs)


def _environment(name: str, env: Dict[str, str], expect: str) -> FaultRow:
    fault = " ".join(f"`{key}={value}`" for key, value in env.items())
    return FaultRow(name, fault, lambda i: run_flags(i, name, "--dry-run"), 2, "error:", expect, env=env)


ROWS = (
    _bad_number(
        "seed-2-64",
        "`--seed 2**64`",
        ["--seed", str(2**64)],
        r"^error: --seed 18446744073709551616 does not "
        r"fit a 64-bit integer",
    ),
    _bad_number("seed-2-32", "`--seed 2**32`", ["--seed", str(2**32)], r"^error: --seed must be in \[0, 4294967295\]"),
    _bad_number("lr-inf", "`--lr inf`", ["--lr", "inf"], r"^error: --lr inf is not a finite number"),
    _bad_number(
        "adaclw-weight-nan",
        "`--loss adaclw --adaclw-weight nan`",
        ["--loss", "adaclw", "--adaclw-weight", "nan"],
        r"^error: --loss adaclw: --adaclw-weight: nan is not a finite number",
    ),
    _bad_number(
        "adaclw-threshold-inf",
        "`--loss adaclw --adaclw-discovery tokens --adaclw-threshold inf` (a threshold that flags nothing)",
        ["--loss", "adaclw", "--adaclw-discovery", "tokens", "--adaclw-threshold", "inf"],
        r"^error: --loss adaclw: --adaclw-threshold: inf is not a finite number",
    ),
    _bad_number(
        "fp16-on-cpu",
        "`--precision fp16` on the CPU",
        ["--precision", "fp16"],
        r"^error: --precision fp16 on the CPU keeps the weights and AdamW's moments in float16",
    ),
    _environment("world-size-abc", {"WORLD_SIZE": "abc"}, r"^error: WORLD_SIZE='abc' is not a whole number >= 1"),
    _environment(
        "slurm-ntasks-abc",
        {"SLURM_NTASKS": "abc", "SLURM_PROCID": "0"},
        r"^error: SLURM_NTASKS='abc' is not a whole number >= 1",
    ),
    _environment(
        "master-port-abc", {"MASTER_PORT": "abc"}, r"^error: MASTER_PORT='abc' is not a whole number 1..65535"
    ),
    _environment(
        "rank-above-world",
        {"WORLD_SIZE": "2", "RANK": "5"},
        r"^error: RANK=5 is not below WORLD_SIZE=2 \(the ranks of 2 process\(es\) are 0..1\)",
    ),
    FaultRow(
        "epochs-1e12",
        "`--epochs 1000000000000 --dry-run`",
        lambda i: run_flags(i, "epochs-1e12", "--epochs", "1000000000000", "--dry-run"),
        0,
        "dry run OK",
        r"2000000000000 steps in 1000000000000 epochs",
    ),
    FaultRow(
        "samples-beyond-data",
        "`--train-num-samples 999999999999999 --dry-run` on 512 samples",
        lambda i: run_flags(i, "beyond", "--dry-run", samples=999999999999999),
        0,
        "warning: --train-num-samples",
        r"is more than the 512 samples of --train-data: an epoch shows each sample about 1\.95e\+12 times",
    ),
    FaultRow(
        "tokens-without-captions",
        "`--loss adaclw --adaclw-discovery tokens` on `--dataset-type synthetic` (one caption for all), `--dry-run`",
        lambda i: [
            *run_flags(i, "tokens", "--loss", "adaclw", "--adaclw-discovery", "tokens", "--dry-run"),
            "--dataset-type",
            "synthetic",
        ],
        0,
        "warning: --loss adaclw",
        r"gives every sample the same caption: its discovery can tell no pair apart and flags nothing",
    ),
    FaultRow(
        "adaclw-threshold-beyond-batch",
        "`--loss adaclw --adaclw-discovery image --adaclw-threshold 8` at batch 32 x `--accum-freq 2` (no score of 63 "
        "negatives stands 8 standard deviations out), `--dry-run`",
        lambda i: run_flags(
            i,
            "threshold",
            *("--loss", "adaclw", "--adaclw-discovery", "image", "--adaclw-threshold", "8", "--accum-freq", "2"),
            "--dry-run",
        ),
        0,
        "warning: --loss adaclw",
        r"^warning: --loss adaclw: --adaclw-threshold 8 flags nothing at a global batch of 64: no score of a row's 63 "
        r"negatives stands more than sqrt\(62\) = 7\.87 standard deviations above their mean, so every negative "
        r"counts once and the loss trains as clip; pass a --adaclw-threshold below 7\.87",
    ),
    *(
        FaultRow(
            f"hf-hub-offline{suffix}",
            f"`--model hf-hub:` a model not in the cache, `HF_HUB_OFFLINE=1`{label}",
            lambda i, extra=extra, suffix=suffix: run_flags(
                i, f"hub{suffix}", "--model", "hf-hub:nobody/no-such-model", *extra
            ),
            2,
            "error:",
            r"^error: --model hf-hub:nobody/no-such-model: cannot be fetched from the Hugging Face hub or its cache",
            env={"HF_HUB_OFFLINE": "1"},
        )
        for suffix, label, extra in (("", ", a real run", ()), ("-dry-run", ", `--dry-run`", ("--dry-run",)))
    ),
    FaultRow(
        "local-dir-pickle",
        "`--model local-dir:` a folder whose weights are a pickle that would call `print`",
        lambda i: run_flags(i, "pickled", "--model", f"local-dir:{i.path('pickled-export')}"),
        2,
        "error:",
        r"the folder's model does not load \(UnpicklingError: not a file of tensors and plain values",
    ),
    FaultRow(
        "local-dir-truncated",
        "`--model local-dir:` a folder whose `open_clip_model.safetensors` is cut in half",
        lambda i: run_flags(i, "truncated", "--model", f"local-dir:{i.path('truncated-export')}"),
        2,
        "error:",
        r"the folder's model does not load \(SafetensorError: .*incomplete metadata",
    ),
    FaultRow(
        "csv-nul-path",
        "a csv image path with a NUL byte among 127 good rows",
        lambda i: run_flags(i, "nul", "--csv-separator", ",", data=i.path("nul.csv"), samples=128),
        0,
        "Epoch 0 done",
        r"skipped samples: bad_path 1,",
        lost="that row",
    ),
    FaultRow(
        "tsv-open-quote",
        "a tsv whose caption on line 5 opens a quote it never closes (128 rows)",
        lambda i: run_flags(i, "quote", data=i.path("quote.tsv"), samples=128),
        2,
        "error:",
        r"the row on line 5 runs to line 129: a quote \(\"\) in it opens a field that swallows the 124 lines",
    ),
    FaultRow(
        "glofnd-bad-keys",
        f"`--loss glofnd --data-size {GLOFND_DATA_SIZE}` on a shard whose sample keys are "
        + ", ".join(map(str, BAD_SAMPLE_KEYS[:3]))
        + ", 2**70 and 10**6",
        lambda i: run_flags(
            i, "glofnd", "--loss", "glofnd", "--data-size", str(GLOFND_DATA_SIZE), data=i.path("bad-keys.tar")
        ),
        0,
        "Epoch 0 done",
        rf"skipped samples: bad_sample_key {len(BAD_SAMPLE_KEYS)},",
        lost="those samples",
    ),
    FaultRow(
        "csv-rows-beyond-data-size",
        f"`--loss glofnd --data-size {CSV_DATA_SIZE} --train-num-samples 64` on a tsv of 128 rows (row k is sample k; "
        "an epoch draws from all), `--dry-run`",
        lambda i: run_flags(
            i, "glofnd-csv", "--loss", "glofnd", "--data-size", str(CSV_DATA_SIZE), "--dry-run", data=i.path("rows.tsv")
        ),
        2,
        "error:",
        rf"^error: --data-size {CSV_DATA_SIZE} is less than the 128 rows of --train-data .*rows\.tsv \(row k "
        rf"is sample k, and --loss glofnd keeps a state per sample\): rows {CSV_DATA_SIZE}\.\.127 have none; pass --data-size 128",
    ),
    FaultRow(
        "gif-members",
        "a shard whose images are `.gif` members",
        lambda i: run_flags(i, "gif", data=i.path("gif.tar"), samples=128),
        0,
        "Epoch 0 done",
        r"skipped samples: none,",
    ),
    FaultRow(
        "finished-run",
        "`--resume latest` of a finished run, with `--dist-timeout 30` (was unset)",
        lambda i: run_flags(i, "finished", "--resume", "latest", "--dist-timeout", "30"),
        0,
        "Nothing to train",
        r"^Nothing to train: the run was already finished \(all 1 epochs, 2 steps\); its last checkpoint is "
        r".*epoch_1\.pt",
        absent="no longer matches",
    ),
    FaultRow(
        "export-step-checkpoint",
        "`training.export --hf-dir` of `step_3.pt`, 1 batch into epoch 1 (epoch 1 was validated)",
        lambda i: ["--checkpoint", str(i.logs / "validated" / "checkpoints" / "step_3.pt"), "--hf-dir", i.path("hf")],
        0,
        "validation results",
        r"^No validation results belong to these weights: they were saved 1 batch\(es\) into epoch 1",
        tool="training.export",
        outcome_file=lambda i: Path(i.path("hf")) / "README.md",
    ),
    FaultRow(
        "discover-full-disk",
        "`training.discover --model local-dir:EXPORT --output` on a disk that fills after 20 kB (`RLIMIT_FSIZE`): the "
        "report's pairs do not fit",
        lambda i: [
            "--model",
            f"local-dir:{i.path('export')}",  # not --checkpoint, whose export to a temporary folder fills it first
            "--data",
            str(i.demo / "train" / "shard-000000.tar"),
            "--output",
            i.path("discover"),
            "--max-batches",
            "2",
            "--batch-size",
            "32",
            "--workers",
            "0",
            "--device",
            "cpu",
        ],
        1,
        "error:",
        r"^error: could not write into .*discover \(file too large for the file-size limit .*\); free space",
        lost="the report (what was written stays for --continue)",
        tool="training.discover",
        file_size_limit=20_000,
    ),
    FaultRow(
        "export-full-disk",
        "`training.export --output` on a disk that fills after 20 kB (`RLIMIT_FSIZE`): the weights do not fit",
        lambda i: [
            "--checkpoint",
            str(i.logs / "finished" / "checkpoints" / "epoch_1.pt"),
            "--output",
            i.path("full-export"),
        ],
        1,
        "error:",
        r"^error: could not write .*full-export \(file too large for the file-size limit .*\); free space or choose "
        r"another --output \(none of the export is left there\)",
        lost="the export (none of its files is left)",
        tool="training.export",
        file_size_limit=20_000,
    ),
    FaultRow(
        "evaluation-full-disk",
        "`training.evaluation` (the stock clip-benchmark CLI) on a disk that fills after 100 bytes (`RLIMIT_FSIZE`): "
        "its result does not fit",
        lambda i: [
            "--model",
            f"local-dir:{i.path('export')}",
            "--datasets",
            "wds/scenes_shape",
            "--dataset-root-dir",
            str(i.demo / "benchmark" / "{dataset}"),
            "--output-dir",
            i.path("full-evaluation"),
            "--num-workers",
            "0",
        ],
        1,
        "error:",
        r"^error: could not write into .*full-evaluation/clip_benchmark \(file too large for the file-size limit "
        r".*\); free space or choose another --output-dir$",
        lost="the evaluation (no result is left half written)",
        tool="training.evaluation",
        file_size_limit=100,
    ),
)
ROW_NAMES = {row.name: row for row in ROWS}


def write_fault_inputs(work: Path, demo: Path, train: Callable[[List[str]], object]) -> FaultInputs:
    """The rows' inputs under `work`, from the demo set at `demo`; `train(argv)` runs `python -m training.main ARGV`
    (in this process or another) for the finished run and the validated run whose step checkpoint is exported."""
    inputs = FaultInputs(work, demo)
    work.mkdir(parents=True, exist_ok=True)
    samples = _first_shard_samples(demo)
    _write_shard(work / "bad-keys.tar", samples, keys=BAD_SAMPLE_KEYS)
    _write_gif_shard(work / "gif.tar", samples)
    images = work / "images"
    images.mkdir(exist_ok=True)
    rows = []
    for key, members in samples:
        (images / f"{key}.png").write_bytes(members["png"])
        rows.append((str(images / f"{key}.png"), members["txt"].decode()))
    (work / "nul.csv").write_text(
        "filepath,title\n"
        + "".join(
            f"{path + chr(0) if index == NUL_ROW else path},{caption}\n" for index, (path, caption) in enumerate(rows)
        )
    )
    quoted = [(path, '"' + caption if index == QUOTE_ROW else caption) for index, (path, caption) in enumerate(rows)]
    (work / "quote.tsv").write_text("filepath\ttitle\n" + "".join(f"{path}\t{caption}\n" for path, caption in quoted))
    (work / "rows.tsv").write_text("filepath\ttitle\n" + "".join(f"{path}\t{caption}\n" for path, caption in rows))
    train(run_flags(inputs, "finished"))
    train(
        run_flags(
            inputs, "validated", "--val-data", str(demo / "val" / "shard-000000.tar"), "--save-every-n-steps", "3"
        )
        + ["--epochs", "2"]
    )
    export = work / "export"
    if not export.exists():
        from training.export import main as export_main

        export_main(
            ["--checkpoint", str(inputs.logs / "finished" / "checkpoints" / "epoch_1.pt"), "--output", str(export)]
        )
    for name in ("pickled-export", "truncated-export"):
        shutil.rmtree(work / name, ignore_errors=True)
        shutil.copytree(export, work / name)
    weights = work / "truncated-export" / "open_clip_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (work / "pickled-export" / "open_clip_model.safetensors").unlink()
    (work / "pickled-export" / "open_clip_pytorch_model.bin").write_bytes(pickle.dumps({"state_dict": CallsPrint()}))
    return inputs


class CallsPrint:
    """Pickled as a call of `print`: what a malicious weights file holds in place of tensors."""

    def __reduce__(self):
        return print, ("this ran while loading",)


def _first_shard_samples(demo: Path) -> List[tuple]:
    """(key, {extension: bytes}) of the first training shard's samples, in order."""
    samples: Dict[str, Dict[str, bytes]] = {}
    with tarfile.open(demo / "train" / "shard-000000.tar") as shard:
        for member in shard.getmembers():
            key, extension = member.name.split(".", 1)
            samples.setdefault(key, {})[extension] = shard.extractfile(member).read()
    return sorted(samples.items())


def _write_shard(path: Path, samples: Sequence[tuple], keys: Sequence = ()) -> None:
    """The samples as a shard; the first ones get the json "key"s `keys` (the others keep their own)."""
    with tarfile.open(path, "w") as tar:
        for index, (key, members) in enumerate(samples):
            members = dict(members)
            if index < len(keys):
                meta = json.loads(members["json"])
                meta["key"] = keys[index]
                members["json"] = json.dumps(meta).encode()
            for extension, data in members.items():
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def _write_gif_shard(path: Path, samples: Sequence[tuple]) -> None:
    """The samples with each png re-encoded as a two-frame gif member (the first frame the image itself)."""
    converted = []
    for key, members in samples:
        image = Image.open(io.BytesIO(members["png"])).convert("RGB")
        gif = io.BytesIO()
        image.save(gif, format="GIF", save_all=True, append_images=[Image.new("RGB", image.size)])
        converted.append((key, {**{k: v for k, v in members.items() if k != "png"}, "gif": gif.getvalue()}))
    _write_shard(path, converted)


def grey16_png(size: int = 32) -> bytes:
    """A 16-bit grey PNG whose values run evenly from black (0) to white (65535): its mean is mid-grey."""
    values = np.linspace(0, 65535, size * size).reshape(size, size).astype(np.uint16)
    data = io.BytesIO()
    Image.fromarray(values).save(data, format="PNG")
    return data.getvalue()


def launcher_free(environ: Mapping[str, str]) -> Dict[str, str]:
    """`environ` without the variables a launcher sets (a row sets its own)."""
    prefixes = ("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "TORCHELASTIC", "PMI_", "OMPI_", "MPI_")
    return {key: value for key, value in environ.items() if not key.startswith(prefixes)}
