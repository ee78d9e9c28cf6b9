"""`python -m training.glyphs --output DIR [...]`: write the glyph benchmark (`training.glyphs.cli`)."""

from .cli import main

if __name__ == "__main__":
    main()
