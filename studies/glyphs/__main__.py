"""`python -m studies.glyphs --output DIR [...]`: write the glyph benchmark (`studies.glyphs.cli`)."""

from .cli import main

if __name__ == "__main__":
    main()
