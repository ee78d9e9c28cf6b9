"""The built-in data sources, one module each: `webdataset_shards`, `csv_file`, `synthetic`.

A data source is a `training.trainer.data.DataSource` subclass decorated with
`@register_data_source("name")`, which makes `--dataset-type name` build its loaders (and `auto`
pick it for the file endings it declares). Every module of this package is imported below, which
registers its source; a source defined elsewhere registers when its module is imported.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
