"""The glyph benchmark: real glyph artwork (the DejaVu fonts matplotlib ships) named by Unicode, written in
families of one-attribute siblings for the clone-negative benchmark (docs/glyphs.md).

`python -m studies.glyphs --output DIR` writes it; `catalogue` (letters, faces, siblings), `rendering`,
`writers` (the on-disk layout).
"""

from .catalogue import ATTRIBUTE_KINDS, FACES, Face, Glyph, Letter, SiblingIndex, all_glyphs, covered_letters
from .writers import GlyphDataset, write_glyph_dataset

__all__ = [
    "ATTRIBUTE_KINDS",
    "FACES",
    "Face",
    "Glyph",
    "GlyphDataset",
    "Letter",
    "SiblingIndex",
    "all_glyphs",
    "covered_letters",
    "write_glyph_dataset",
]
