"""The output folder while a run streams into it, and how `--continue` finds where it stopped.

    run.json        the settings (written atomically at the start); a resume must match them
    pairs.jsonl     one line per kept flagged pair, appended batch by batch
    batches.jsonl   one line per finished batch: its counts, fits and histograms, and the size
                    pairs.jsonl had after its pairs (`pairs_end`)
    thumbs/         PNG thumbnails of the samples the page shows

Per batch, its pairs are appended and flushed to disk first, then its batches.jsonl line: so the
last complete batches.jsonl line says exactly which batches are done and where pairs.jsonl ends.
A run killed at any point leaves at most a partial batch past that; `--continue` cuts both files back
to the last complete batch and continues with the next one, so no pair is lost or written twice.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List

from ..trainer.data import SKIP_REASONS
from ..trainer.data.samples import stable_hash
from ..trainer.run_folder.checkpoint_files import atomic_file
from .batch import BatchResult

RUN_FILE = "run.json"
PAIRS_FILE = "pairs.jsonl"
BATCHES_FILE = "batches.jsonl"
THUMBS_DIR = "thumbs"


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to a temporary file in the same folder, then rename it over `path`."""
    with atomic_file(path, "w") as file:
        file.write(text)


def thumbnail_name(source: str, key: str) -> str:
    """The thumbnail's path in the output folder: a hash of (source, key), unique across `::` sources."""
    return f"{THUMBS_DIR}/{stable_hash(source, key):016x}.png"


class RunStore:
    """The output folder of a run (rank 0 only)."""

    def __init__(self, output: Path, settings: Dict[str, Any], resume: bool):
        self.output = output
        self.pairs_path, self.batches_path = output / PAIRS_FILE, output / BATCHES_FILE
        run_file = output / RUN_FILE
        if resume and run_file.is_file():
            recorded = json.loads(run_file.read_text())
            changed = sorted(name for name in settings if recorded.get(name) != settings[name])
            if changed:
                raise ValueError(
                    f"--continue: {output} holds a run with other settings ({', '.join(changed)}: "
                    f"{', '.join(f'{recorded.get(name)!r}' for name in changed)}); resume with the same "
                    f"flags, or write to a new --output"
                )
            self.start_batch = self._cut_to_last_batch()
        else:
            if not resume and (self.pairs_path.exists() or self.batches_path.exists()):
                raise ValueError(f"{output} already holds a run: pass --continue to continue it, or another --output")
            output.mkdir(parents=True, exist_ok=True)
            write_atomically(run_file, json.dumps(settings, indent=2) + "\n")
            for path in (self.pairs_path, self.batches_path):
                path.write_text("")
            self.start_batch = 0
        (output / THUMBS_DIR).mkdir(exist_ok=True)
        self._pairs = open(self.pairs_path, "a")
        self._batches = open(self.batches_path, "a")

    def _cut_to_last_batch(self) -> int:
        """Truncate both files to the last complete batch; the number of the batch to do next."""
        complete, pairs_end, next_batch = 0, 0, 0
        with open(self.batches_path, "rb") as file:
            for line in file:
                try:
                    batch_line = json.loads(line) if line.endswith(b"\n") else None
                except ValueError:
                    batch_line = None
                if batch_line is None or batch_line["batch"] != next_batch:
                    break
                complete += len(line)
                pairs_end, next_batch = batch_line["pairs_end"], next_batch + 1
        os.truncate(self.batches_path, complete)
        os.truncate(self.pairs_path, pairs_end)
        return next_batch

    def append(self, result: BatchResult) -> None:
        """The batch's pairs, then its line of batches.jsonl, each flushed to disk."""
        for direction in result.directions:
            for pair in direction.pairs:
                self._pairs.write(json.dumps(pair) + "\n")
        _sync(self._pairs)
        batch_line = {
            "batch": result.index,
            "rows": result.rows,
            "skipped": {reason: count for reason, count in zip(SKIP_REASONS, result.skip_counts) if count},
            "pairs_end": self._pairs.tell(),
            "directions": [
                {
                    field.name: getattr(direction, field.name)
                    for field in dataclasses.fields(direction)
                    if field.name != "pairs"
                }
                for direction in result.directions
            ],
        }
        self._batches.write(json.dumps(batch_line) + "\n")
        _sync(self._batches)

    def write_thumbnails(self, thumbnails: Dict[str, bytes]) -> None:
        for name, png in thumbnails.items():
            (self.output / name).write_bytes(png)

    def has_thumbnail(self, name: str) -> bool:
        return (self.output / name).is_file()

    def close(self) -> None:
        self._pairs.close()
        self._batches.close()


def remove_thumbnails_except(output: Path, keep: set) -> None:
    """Deletes the thumbnails of pairs that entered the page on the way and left it again."""
    for path in (output / THUMBS_DIR).glob("*.png"):
        if f"{THUMBS_DIR}/{path.name}" not in keep:
            path.unlink()


def _sync(file) -> None:
    file.flush()
    os.fsync(file.fileno())


def read_jsonl(path: Path) -> Iterator[dict]:
    with open(path) as file:
        for line in file:
            yield json.loads(line)


def read_batch_lines(output: Path) -> List[dict]:
    return list(read_jsonl(output / BATCHES_FILE))
