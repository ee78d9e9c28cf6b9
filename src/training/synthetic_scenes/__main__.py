"""`python -m training.synthetic_scenes --output DIR [...]`: write the demo data (`training.synthetic_scenes.cli`)."""

from .cli import main

if __name__ == "__main__":
    main()
