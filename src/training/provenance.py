"""The exact code a run ran: the git commit of the source tree and a hash of any uncommitted change.

Every run records it (params.txt's launch line, the loss comparison's run records), so results can be
paired only between runs of the same code (docs/cluster.md, "Running the loss comparison").
"""
from __future__ import annotations

import hashlib
import subprocess
from functools import lru_cache
from pathlib import Path

UNKNOWN = "unknown (not a git checkout)"


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
