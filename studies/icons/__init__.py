"""The icon data set: real icon artwork (the Material Design Icons font that PyPI's qtawesome wheel ships) named by
its authors, in families of a base icon and its named variants, defined from the names alone (docs/icons.md).

`python -m studies.icons --output DIR` writes it; `catalogue` (the charmap, the family rule), `rendering`,
`writers` (the on-disk layout).
"""

from .catalogue import Catalogue, Icon, build_catalogue, mdi_catalogue
from .writers import write_icon_dataset

__all__ = ["Catalogue", "Icon", "build_catalogue", "mdi_catalogue", "write_icon_dataset"]
