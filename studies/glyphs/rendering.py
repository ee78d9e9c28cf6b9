"""A glyph as pixels: its face's outline drawn by FreeType (through PIL), black on white, at a fixed baseline.

Every glyph of one image size shares the font size and the baseline, so a capital, an accent above or a
hook below lands where the face puts it (no per-glyph centring that would hide case or marks); only the
horizontal position centres the glyph's advance. Deterministic: no randomness, no noise.
"""

from __future__ import annotations

import functools

from PIL import Image, ImageDraw, ImageFont

from .catalogue import Face, Glyph, font_dir

# Fractions of the image side: the font size, and the baseline's height from the top. At 32 pixels capitals
# with a mark above (Ǻ) and small letters with a hook below (ƫ, ẓ) stay inside the frame.
FONT_SIZE = 0.62
BASELINE = 0.74


@functools.lru_cache(maxsize=64)
def _font(face: Face, pixels: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(font_dir() / face.file_name), size=pixels)


def render_glyph(glyph: Glyph, image_size: int) -> Image.Image:
    """The glyph as an RGB image of `image_size` pixels."""
    image = Image.new("L", (image_size, image_size), 255)
    font = _font(glyph.face, round(FONT_SIZE * image_size))
    ImageDraw.Draw(image).text(
        (image_size / 2, BASELINE * image_size), glyph.letter.character, font=font, fill=0, anchor="ms"
    )
    return image.convert("RGB")
