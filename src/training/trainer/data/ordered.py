"""One pass over a dataset in its own order, for tools that read a dataset instead of training on it
(`python -m training.discover`): what `DataSource.ordered_pass` returns.

The pass yields every sample once, in the order the data holds them (shards as given and samples in
shard order; csv rows in file order), each checked as training checks it but not decoded: a
`PassSample`, or the name of the reason training would skip it (`SKIP_REASONS`), so that a reader can
cut the pass into batches by position and count the skips of its own slice.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Iterator, Optional, Union


@dataclass(frozen=True)
class PassSample:
    """A sample of an ordered pass that training would read; its image is still encoded."""

    key: str  # where it is in its source: a tar member prefix, a csv row's image path, ...
    source: str  # the shard or file it comes from
    text: str  # the caption, as training reads it
    image_bytes: bytes  # decode with training.trainer.data.samples.decode_image, as training does
    meta: Optional[bytes] = None  # the sample's json, when it has one


PassItem = Union[PassSample, str]  # a sample, or the SKIP_REASONS name training would skip it for


class OrderedPass(abc.ABC):
    """The pass itself: built (and its data checked) in the main process, iterated in any process (it is
    pickled into DataLoader workers), as often as needed."""

    num_samples: Optional[int]  # the dataset's size when it is known without reading it
    caption_field: str  # where the captions come from (a tar field, a csv column), for reports

    @abc.abstractmethod
    def items(self, events) -> Iterator[PassItem]:
        """Every sample in order; failures of a whole file (an unreadable or truncated shard) are counted in
        `events` (a SkipCounter), as training counts them."""
