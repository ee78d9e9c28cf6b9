"""A study's data set: the glyphs (`studies.glyphs`), the icons (`studies.icons`) or the synthetic scenes
(`training.synthetic_scenes`), written once under the study's output root and reused while their manifest says
they are the same data.

Each data set is a value (`GlyphData`, `IconData`, `SceneData`) that knows its folder, writes itself, and says how
a comparison reads it: as its own data with its evaluation sets (`OwnData`, the glyphs and the icons) or as the
demo data of the comparison's budget (a data folder, the scenes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, ClassVar, Optional, Tuple, Union

from .comparison import QUICK, Benchmarks, ComparisonData, OwnData


@dataclass(frozen=True)
class TrainingData:
    """What a trainer run reads: its shards, their sample count (None: the shards' own sizes) and data seed."""

    train_data: str
    val_data: str
    num_samples: Optional[int]
    data_seed: int


def training_data(data_dir: Path, manifest: dict, with_num_samples: bool) -> TrainingData:
    """The training and validation shards a data set's manifest names; the sample count only where the trainer
    needs it given (the scenes' shards carry their sizes)."""
    splits = manifest["splits"]
    return TrainingData(
        str(data_dir / splits["train"]["data"]),
        str(data_dir / splits["val"]["data"]),
        splits["train"]["num_samples"] if with_num_samples else None,
        manifest["seed"],
    )


@dataclass(frozen=True)
class WrittenDataSet:
    """A data set of the lab that a writer puts in <root>/<FOLDER> once (`write`, its LAYOUT_VERSION), read as a
    comparison's own data with its clip-benchmark sets and clone selection; one per data seed."""

    seed: int = 0
    FOLDER: ClassVar[str]
    WHAT: ClassVar[str]

    def writer(self) -> Tuple[Callable[..., object], int]:
        """The writer (`write(folder, seed=...)`) and the layout version it writes."""
        raise NotImplementedError

    def folder(self, root: Path) -> Path:
        return root / self.FOLDER

    def prepare(self, root: Path) -> dict:
        """Write the data once; returns its manifest (an error if the folder holds another data seed's, or an
        earlier layout's)."""
        write, layout_version = self.writer()
        data_dir = self.folder(root)
        manifest_path = data_dir / "manifest.json"
        if not manifest_path.is_file():
            print(f"== writing the {self.WHAT} into {data_dir}", flush=True)
            write(data_dir, seed=self.seed)
        manifest = json.loads(manifest_path.read_text())
        if manifest["seed"] != self.seed:
            raise ValueError(
                f"{data_dir} holds {self.WHAT} of data seed {manifest['seed']}, not {self.seed}: remove it"
            )
        if manifest.get("layout_version") != layout_version:
            raise ValueError(
                f"{data_dir} holds {self.WHAT} of an earlier layout ({manifest.get('layout_version', 1)}, this "
                f"writer's is {layout_version}): remove it, and it is written again"
            )
        return manifest

    def training(self, root: Path) -> TrainingData:
        return training_data(self.folder(root), self.prepare(root), with_num_samples=True)

    def comparison_data(self, root: Path) -> "ComparisonInputs":
        """The data as a comparison's own data: evaluated on its clip-benchmark sets and clone selection."""
        data_dir, manifest = self.folder(root), self.prepare(root)
        training = training_data(data_dir, manifest, with_num_samples=True)
        data = ComparisonData(
            root="",
            train_data=training.train_data,
            val_data=training.val_data,
            num_train=training.num_samples,
            data_size=training.num_samples,
        )
        benchmarks = Benchmarks(
            tuple(f"wds/{name}" for name in sorted(manifest["benchmark"])),
            str(data_dir / "benchmark" / "{dataset}"),
            str(data_dir / manifest["clone_selection"]),
        )
        return ComparisonInputs(own_data=OwnData(data, benchmarks))


@dataclass(frozen=True)
class GlyphData(WrittenDataSet):
    """The glyph data of one data seed (docs/glyphs.md), in <root>/data."""

    FOLDER: ClassVar[str] = "data"
    WHAT: ClassVar[str] = "glyph data"

    def writer(self) -> Tuple[Callable[..., object], int]:
        from .glyphs import write_glyph_dataset
        from .glyphs.writers import LAYOUT_VERSION

        return write_glyph_dataset, LAYOUT_VERSION


@dataclass(frozen=True)
class IconData(WrittenDataSet):
    """The icon data of one data seed (docs/icons.md), in <root>/icon_data. No study trains on it yet
    (docs/preregistration_icons.md registers what will)."""

    FOLDER: ClassVar[str] = "icon_data"
    WHAT: ClassVar[str] = "icon data"

    def writer(self) -> Tuple[Callable[..., object], int]:
        from .icons import write_icon_dataset
        from .icons.writers import LAYOUT_VERSION

        return write_icon_dataset, LAYOUT_VERSION


@dataclass(frozen=True)
class SceneData:
    """The demo scenes of the quick budget's sizes with these colour-shape combinations and data seed, in
    <root>/data (all combinations) or <root>/data_<combinations>."""

    combinations: str = "all"
    seed: int = 0

    def folder(self, root: Path) -> Path:
        return root / ("data" if self.combinations == "all" else f"data_{self.combinations}")

    def prepare(self, root: Path) -> dict:
        """Write the scenes once; returns their manifest (an error if the folder holds other scenes)."""
        from training.synthetic_scenes.scenes import SceneConfig
        from training.synthetic_scenes.writers import write_demo_dataset

        data_dir = self.folder(root)
        manifest_path = data_dir / "manifest.json"
        if manifest_path.is_file():
            manifest = json.loads(manifest_path.read_text())
            written = (manifest["scene_config"]["combinations"], manifest["seed"])
            if written != (self.combinations, self.seed):
                raise ValueError(
                    f"{data_dir} holds scenes of combinations {written[0]!r} and data seed {written[1]}, "
                    f"not {self.combinations!r} and {self.seed}: remove it"
                )
            return manifest
        write_demo_dataset(
            data_dir,
            seed=self.seed,
            num_train=QUICK.num_train,
            num_val=QUICK.num_val,
            num_test=QUICK.num_test,
            shard_size=QUICK.shard_size,
            config=replace(SceneConfig(), combinations=self.combinations),
        )
        return json.loads(manifest_path.read_text())

    def training(self, root: Path) -> TrainingData:
        return training_data(self.folder(root), self.prepare(root), with_num_samples=False)

    def comparison_data(self, root: Path) -> "ComparisonInputs":
        """The scenes as the comparison's demo data; all combinations it writes itself at its budget's sizes."""
        if self.combinations != "all":
            self.prepare(root)
        return ComparisonInputs(data_dir=self.folder(root), data_seed=self.seed)


@dataclass(frozen=True)
class ComparisonInputs:
    """How a comparison reads a study's data: its own data and evaluation sets, or a demo-data folder."""

    own_data: Optional[OwnData] = None
    data_dir: Optional[Path] = None
    data_seed: int = 0


DataSet = Union[GlyphData, IconData, SceneData]
