"""The exact code a run ran: the git commit of the source tree, a hash of any uncommitted change and the
changed paths with their own hashes; the identity of a checkpoint a run starts from; and the identity a
reusable run folder records (a study's common pretraining: recipe, seed, data seed, code), which it must
match to be reused; and the machine a measurement ran on (`machine_info`: CPU model and family, cores, load,
library versions, code), which every benchmark and comparison report names.

The loss comparison keeps them in each run's outcome, so results can be paired only between runs of
the same code (docs/cluster.md, "Running the loss comparison"), and "no code differs" between two runs
with uncommitted changes can be checked path by path.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional

if TYPE_CHECKING:
    from .layout import RunDir

UNKNOWN = "unknown (not a git checkout)"
IDENTITY_NAME = "identity.json"  # in a reusable run folder: what it trains (`check_or_record_identity`)


def _git(source: Path, *args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=source, capture_output=True, check=True).stdout


@lru_cache(maxsize=None)
def code_version(source: Path = Path(__file__).resolve().parent) -> str:
    """`git <commit>` of the tree holding `source`, with `+ diff <sha256[:12]>` of the uncommitted changes
    (tracked diffs and untracked files' names and contents) when there are any; `unknown ...` outside git.
    Cached: a process runs one code."""
    try:
        commit = _git(source, "rev-parse", "--short=10", "HEAD").decode().strip()
        root = Path(_git(source, "rev-parse", "--show-toplevel").decode().strip())
        digest = hashlib.sha256(_git(root, "diff", "HEAD", "--binary"))
        untracked = _git(root, "ls-files", "--others", "--exclude-standard", "-z").split(b"\0")
    except (OSError, subprocess.CalledProcessError):
        return UNKNOWN
    names = [name for name in untracked if name]
    for name in sorted(names):
        digest.update(name + b"\0" + (root / name.decode()).read_bytes())
    clean = digest.digest() == hashlib.sha256(b"").digest() and not names
    return f"git {commit}" + ("" if clean else f" + diff {digest.hexdigest()[:12]}")


@lru_cache(maxsize=None)
def dirty_files(source: Path = Path(__file__).resolve().parent) -> Dict[str, str]:
    """Each path (relative to the repository root) that differs from the commit, tracked or untracked, with
    the sha256[:12] of its content as it is now ("deleted" when gone); empty when clean or outside git."""
    try:
        root = Path(_git(source, "rev-parse", "--show-toplevel").decode().strip())
        changed = _git(root, "diff", "HEAD", "--name-only", "-z").split(b"\0")
        untracked = _git(root, "ls-files", "--others", "--exclude-standard", "-z").split(b"\0")
    except (OSError, subprocess.CalledProcessError):
        return {}
    names = sorted({name.decode() for name in changed + untracked if name})
    return {name: file_digest(root / name) if (root / name).is_file() else "deleted" for name in names}


def file_digest(path: Path) -> str:
    """sha256[:12] of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:12]


def checkpoint_identity(checkpoint: str) -> Dict[str, Optional[str]]:
    """What a fine-tuning run starts from: the checkpoint's path and digest, and the data seed of the data
    its run trained on (the `seed` of the manifest.json beside its recorded --train-data, None when the
    checkpoint has no run folder or its data no manifest). A name that is not a file (a pretrained tag)
    is recorded as it is."""
    from .layout import RunDir

    path = Path(checkpoint)
    if not path.is_file():
        return {"path": checkpoint, "sha256": None, "data_seed": None}
    return {"path": str(path), "sha256": file_digest(path), "data_seed": trained_data_seed(RunDir(path.parent.parent))}


def trained_data_seed(run: "RunDir") -> Optional[str]:
    """The data seed of the data a run trained on, from the manifest.json of the data folder holding its
    recorded --train-data (up to two folders above the shards); None when unknown."""
    train_data = run.recorded_args().get("train_data")
    if not train_data:
        return None
    folder = Path(train_data.split("::")[0]).parent
    for candidate in (folder, folder.parent, folder.parent.parent):
        manifest = candidate / "manifest.json"
        if manifest.is_file():
            seed = json.loads(manifest.read_text()).get("seed")
            return None if seed is None else str(seed)
    return None


def training_identity(recipe: str, seed: int, data_seed: Any) -> Dict[str, Any]:
    """What a run that others reuse trains: its recipe, seed, data seed, and this process's code."""
    return {"recipe": recipe, "seed": seed, "data_seed": data_seed, "code": code_version()}


def check_or_record_identity(run_path: Path, identity: Mapping[str, Any]) -> None:
    """Record `identity` in a new run folder, or check that an existing one recorded exactly it, so that its
    checkpoints (or a resume of it) are reused only for the training they came from. ValueError naming what
    differs, or that nothing was recorded, and the fix."""
    identity_file = Path(run_path) / IDENTITY_NAME
    if not Path(run_path).exists():
        Path(run_path).mkdir(parents=True)
        identity_file.write_text(json.dumps(dict(identity), sort_keys=True) + "\n")
        return
    if not identity_file.is_file():
        raise ValueError(
            f"{run_path} records no {IDENTITY_NAME} (trained before runs recorded one), so what it "
            f"trained cannot be checked; remove it to train again"
        )
    recorded = json.loads(identity_file.read_text())
    differences = [
        f"{key} {recorded.get(key)!r} there, {value!r} here"
        for key, value in identity.items()
        if recorded.get(key) != value
    ]
    if differences:
        raise ValueError(f"{run_path} was trained otherwise ({'; '.join(differences)}); remove it to train again")


def machine_info(device: str) -> Dict[str, str]:
    """CPU (with its family and model numbers, which tell apart CPUs that /proc/cpuinfo names alike), cores,
    load, library versions, code version (and the GPU when running on one)."""
    import torch

    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        fields: Dict[str, str] = {}
        for line in cpuinfo.read_text().splitlines():
            name, _, value = line.partition(":")
            fields.setdefault(name.strip(), value.strip())
        cpu = fields.get("model name", cpu)
        if "cpu family" in fields and "model" in fields:
            cpu += f" (family {fields['cpu family']}, model {fields['model']})"
    info = {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "open_clip": package_version("open_clip_torch"),
        "clip_benchmark": package_version("clip-benchmark"),
        "load": ", ".join(f"{value:.1f}" for value in os.getloadavg()) if hasattr(os, "getloadavg") else "?",
        "code": code_version(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = f", GPU {torch.cuda.get_device_name(0)}"
    return info


def package_version(name: str) -> str:
    """The installed distribution's version (clip_benchmark's own `__version__` is stale)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
