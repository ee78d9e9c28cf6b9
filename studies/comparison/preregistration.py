"""The pre-registration: the primary endpoint, the equivalence margin and the reference variant,
fixed before the runs, from the command line or from a committed file.

    --primary-endpoint clone_learnable=clone/color+clone/shape+clone/size --equivalence-margin 0.02 --reference clip
    --preregistration docs/preregistration.md#scratch

The endpoint is the per-run mean of the listed metrics (names as in the report, e.g. `clone/shape`).
A file is JSON (`.json`) or Markdown (anything else) whose ```json fenced blocks each hold one
registration; `FILE#NAME` picks the one whose `"name"` is NAME (needed when the file holds several):

    {"name": "scratch", "primary_endpoint": "clone_learnable=clone/color+clone/shape+clone/size",
     "equivalence_margin": 0.02, "reference": "clip"}

`reference` is optional (default `clip`); a JSON file holds one such object or a list of them.
Two optional keys say what a registration's prose fixed beyond that: `"helps_beyond_margin": true` (helps
and hurts need the 95% interval outside ±margin, not only outside 0; `stats.primary_verdict`) and
`"secondary_family"`, the metrics of the Holm family as names or shell patterns (`clone/*_cos_margin`;
default: the scenes' family, `findings.SECONDARY_FAMILY`). The report cites the file by path and uses its values.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

DEFAULT_REFERENCE = "clip"
DEFAULT_MARGIN = 0.02
ENDPOINT_PREFIX = "primary/"  # the endpoint's per-run value is the outcome metric `primary/<name>`
FIELDS = ("name", "primary_endpoint", "equivalence_margin", "reference", "helps_beyond_margin", "secondary_family")


@dataclass(frozen=True)
class Preregistration:
    """What the verdict is computed on, fixed before the runs."""

    endpoint: Optional[str] = None  # its name, e.g. clone_learnable; None: no primary endpoint (no verdict)
    metrics: Tuple[str, ...] = ()  # the per-run endpoint is the mean of these
    margin: float = DEFAULT_MARGIN  # equivalence margin: |difference| below it is no effect
    reference: Optional[str] = None  # None: `clip`, else the first variant
    source: Optional[str] = None  # the file it was read from (FILE or FILE#NAME); None: the command line
    helps_beyond_margin: bool = False  # helps/hurts: the 95% interval outside ±margin (else: outside 0)
    secondary_family: Optional[Tuple[str, ...]] = None  # metric names or patterns; None: the scenes' family

    @property
    def key(self) -> str:
        """The outcome metric holding the endpoint's per-run value (with an endpoint)."""
        return ENDPOINT_PREFIX + self.endpoint

    @property
    def definition(self) -> str:
        return f"{self.endpoint}={'+'.join(self.metrics)}"


def parse_endpoint(text: str) -> Tuple[str, Tuple[str, ...]]:
    """`NAME=metric1+metric2+...` -> (NAME, metrics)."""
    name, has_equals, rest = (part.strip() for part in str(text).partition("="))
    metrics = tuple(metric.strip() for metric in rest.split("+") if metric.strip())
    if not has_equals or not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or not metrics:
        raise ValueError(
            f"--primary-endpoint {text!r}: write NAME=metric1+metric2+..., e.g. "
            "clone_learnable=clone/color+clone/shape+clone/size"
        )
    if len(set(metrics)) != len(metrics):
        raise ValueError(f"--primary-endpoint {text!r} lists a metric twice")
    return name, metrics


def check_margin(margin: Any, where: str) -> float:
    try:
        value = float(margin)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: the equivalence margin {margin!r} is not a number") from None
    if not value > 0:
        raise ValueError(f"{where}: the equivalence margin must be > 0, got {margin!r}")
    return value


def from_arguments(endpoint: Optional[str], margin: Optional[float], reference: Optional[str]) -> Preregistration:
    """The registration the flags give; without --primary-endpoint, only the reference (no verdict, every
    paired metric is secondary)."""
    if endpoint is None:
        if margin is not None:
            raise ValueError("--equivalence-margin needs --primary-endpoint (the metric it is a margin on)")
        return Preregistration(reference=reference)
    name, metrics = parse_endpoint(endpoint)
    return Preregistration(
        name,
        metrics,
        check_margin(DEFAULT_MARGIN if margin is None else margin, "--equivalence-margin"),
        reference or DEFAULT_REFERENCE,
    )


def registrations_in(path: Path) -> List[Dict[str, Any]]:
    """Every registration object in a JSON file, or in a Markdown file's ```json blocks."""
    if not path.is_file():
        raise ValueError(f"--preregistration {path}: no such file")
    text = path.read_text()
    try:
        if path.suffix == ".json":
            loaded = json.loads(text)
            return loaded if isinstance(loaded, list) else [loaded]
        return [json.loads(block) for block in re.findall(r"^```json\s*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)]
    except json.JSONDecodeError as error:
        raise ValueError(f"--preregistration {path}: not valid JSON ({error})") from None


def from_file(spec: str) -> Preregistration:
    """The registration in `FILE` or `FILE#NAME` (see the module docstring)."""
    path_text, _, wanted = spec.partition("#")
    found = registrations_in(Path(path_text))
    if wanted:
        found = [entry for entry in found if isinstance(entry, dict) and entry.get("name") == wanted]
    if len(found) != 1:
        what = f"registration named {wanted!r}" if wanted else "registration"
        raise ValueError(
            f"--preregistration {spec}: found {len(found)} {what}s where one is needed"
            + ("" if wanted else "; pick one with FILE#NAME")
        )
    entry = found[0]
    unknown = sorted(set(entry) - set(FIELDS)) if isinstance(entry, dict) else []
    if not isinstance(entry, dict) or unknown or "primary_endpoint" not in entry:
        raise ValueError(
            f"--preregistration {spec}: each registration is an object with primary_endpoint, "
            f"equivalence_margin and optionally name, reference"
            + (f" (unknown: {', '.join(unknown)})" if unknown else "")
        )
    name, metrics = parse_endpoint(entry["primary_endpoint"])
    margin = check_margin(entry.get("equivalence_margin", DEFAULT_MARGIN), f"--preregistration {spec}")
    beyond_margin = entry.get("helps_beyond_margin", False)
    family = entry.get("secondary_family")
    if not isinstance(beyond_margin, bool) or not (
        family is None
        or isinstance(family, list)
        and family
        and all(isinstance(pattern, str) and pattern for pattern in family)
    ):
        raise ValueError(
            f"--preregistration {spec}: helps_beyond_margin is true or false and secondary_family a "
            "non-empty list of metric names or patterns"
        )
    return Preregistration(
        name,
        metrics,
        margin,
        entry.get("reference", DEFAULT_REFERENCE),
        spec,
        beyond_margin,
        None if family is None else tuple(family),
    )


def resolve(
    file_spec: Optional[str], endpoint: Optional[str], margin: Optional[float], reference: Optional[str]
) -> Preregistration:
    """From --preregistration, or from --primary-endpoint / --equivalence-margin / --reference; not both."""
    if file_spec:
        given = [
            flag
            for flag, value in (
                ("--primary-endpoint", endpoint),
                ("--equivalence-margin", margin),
                ("--reference", reference),
            )
            if value is not None
        ]
        if given:
            raise ValueError(
                f"--preregistration {file_spec} fixes the endpoint, margin and reference; drop "
                f"{', '.join(given)} (or the file)"
            )
        return from_file(file_spec)
    return from_arguments(endpoint, margin, reference)
