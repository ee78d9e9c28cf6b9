"""`python -m studies.icons --output DIR [...]`: write the icon data set (`studies.icons.cli`)."""

from .cli import main

if __name__ == "__main__":
    main()
