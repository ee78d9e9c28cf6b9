"""An icon as pixels: its outline drawn by FreeType (through PIL), black on white, filling the frame.

The font's em square is the icon's 24-unit design grid (units per em 512, ascent 448, descent 64, every advance
512), so the font size is the image side and the baseline sits at ascent / em of it: every icon lands where its
designers placed it on the grid. Deterministic: no randomness, no noise.
"""

from __future__ import annotations

import functools

from PIL import Image, ImageDraw, ImageFont

from .catalogue import FONT_FILE, Icon, distribution_file

BASELINE = 448 / 512  # the font's ascent over its units per em


@functools.lru_cache(maxsize=8)
def _font(pixels: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(distribution_file(FONT_FILE)), size=pixels)


def render_icon(icon: Icon, image_size: int) -> Image.Image:
    """The icon as an RGB image of `image_size` pixels."""
    image = Image.new("L", (image_size, image_size), 255)
    ImageDraw.Draw(image).text((0, BASELINE * image_size), icon.character, font=_font(image_size), fill=0, anchor="ls")
    return image.convert("RGB")
