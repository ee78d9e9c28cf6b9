"""The training and validation data: webdataset shards, OpenCLIP's csv files, synthetic data, or any
registered data source, read into `Batch`es: OpenCLIP-style tuples `(images, texts, ...)` whose fields are named
(`images`, `texts`, `sample_index`, `skipped`, and each sample's `family` id when `DataConfig.family_field` asks
for it).

`build_train_data` / `build_val_data` build the loaders; `DataConfig` is what they take. A data
source is one module: a `DataSource` registered with `@register_data_source("name")` (the built-in
ones are in `sources/`); `DataPosition` is the checkpointed position in the data. docs/data.md
describes the batches, the sample ids, the seeding behind exact mid-epoch resume, and what is skipped
and counted instead of stopping the run.
"""

from open_clip_adacl.losses.base import FAMILY_FIELD  # the json field data written in families holds its ids in

from . import sources  # noqa: F401 - registers the built-in data sources
from .batch import Batch
from .config import SKIP_REASONS, DataConfig, DataError, data_error_reason, global_batch, samples_per_step
from .loader import build_train_data, build_val_data, check_data_fields
from .position import DataPosition
from .registry import dataset_type_help, registered_dataset_types, resolve_dataset_type
from .samples import MAX_NAMED_SHARDS, NO_FAMILY, SkipCounter, Skipped, merged_shard_visits
from .shards import IMAGE_EXTENSIONS, read_shard, sample_index_of
from .source import DataSource, LoaderInfo, get_data_source, register_data_source
from .sources.csv_file import CsvRow, CsvStream, read_csv_rows
from .stream import ShardStream

__all__ = [
    "FAMILY_FIELD",
    "IMAGE_EXTENSIONS",
    "MAX_NAMED_SHARDS",
    "NO_FAMILY",
    "SKIP_REASONS",
    "Batch",
    "CsvRow",
    "CsvStream",
    "DataConfig",
    "DataError",
    "DataPosition",
    "DataSource",
    "LoaderInfo",
    "ShardStream",
    "SkipCounter",
    "Skipped",
    "build_train_data",
    "build_val_data",
    "check_data_fields",
    "data_error_reason",
    "dataset_type_help",
    "get_data_source",
    "global_batch",
    "merged_shard_visits",
    "read_csv_rows",
    "read_shard",
    "register_data_source",
    "registered_dataset_types",
    "resolve_dataset_type",
    "sample_index_of",
    "samples_per_step",
]
