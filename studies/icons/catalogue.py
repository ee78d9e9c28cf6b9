"""What the icon data set is made of: the Material Design Icons font that PyPI's `qtawesome` wheel ships, and
its charmap (icon name -> code point), families defined from the names alone.

The font and the charmap are read as files of the installed distribution (`importlib.metadata`), never by
importing `qtawesome` (its import needs a Qt binding). The data set is defined by that exact font version and
charmap: `FONT_FILE`, `CHARMAP_FILE` of `qtawesome==1.4.2` (pinned in setup.py and constraints.txt).

Families (docs/icons.md). Names are hyphenated words, object first (`account-plus-outline`). A **variant word**
is a word `w` such that at least `MIN_BASES` names `n` have both `n` and `n-w` in the charmap (counted over the
charmap itself, `variant_words`). An icon's **root** is the shortest leading part of its name that is itself an
icon and after which every word is a variant word (`root_of`); a **family** is a root and every icon whose root it
is, kept when it holds the root and at least `MIN_VARIANTS` variants. The rule uses suffixes only: the charmap's
leading words that recur (`file-`, `folder-`, `account-`) are objects compounded with another icon's name
(`file-music`), not variants of it.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, FrozenSet, Mapping, Optional, Tuple

DISTRIBUTION = "QtAwesome"
FONT_FILE = "qtawesome/fonts/materialdesignicons6-webfont-6.9.96.ttf"
CHARMAP_FILE = "qtawesome/fonts/materialdesignicons6-webfont-charmap-6.9.96.json"
LICENCE_FILE = "qtawesome-1.4.2.dist-info/licenses/LICENSE.txt"  # the wheel's own (MIT); its METADATA names the font's
MIN_BASES = 10  # a variant word follows at least this many names that are icons themselves
MIN_VARIANTS = 2  # a family is its root and at least this many variants


@dataclass(frozen=True, order=True)
class Icon:
    name: str  # the charmap's name: "account-plus-outline"
    codepoint: int

    @property
    def caption(self) -> str:
        """The name's words, as the font's authors named the icon: 'account plus outline'."""
        return self.name.replace("-", " ")

    @property
    def character(self) -> str:
        return chr(self.codepoint)


def distribution_file(path: str) -> Path:
    """A file of the installed QtAwesome distribution, found from its RECORD (nothing of it is imported)."""
    for file in importlib.metadata.files(DISTRIBUTION) or ():
        if file.as_posix() == path:
            return Path(file.locate())
    raise FileNotFoundError(f"{path} is not in the installed {DISTRIBUTION}: pip install qtawesome==1.4.2")


@functools.lru_cache(maxsize=1)
def charmap() -> Dict[str, int]:
    """Icon name -> code point, as the wheel's charmap lists them."""
    raw = json.loads(distribution_file(CHARMAP_FILE).read_text())
    return {name: int(code, 16) for name, code in raw.items()}


def variant_words(names: FrozenSet[str], min_bases: int = MIN_BASES) -> FrozenSet[str]:
    """The words `w` for which at least `min_bases` names `n` have `n-w` among `names` too."""
    bases = Counter()
    for name in names:
        head, _, word = name.rpartition("-")
        if head in names:
            bases[word] += 1
    return frozenset(word for word, count in bases.items() if count >= min_bases)


def root_of(name: str, names: FrozenSet[str], words: FrozenSet[str]) -> str:
    """The shortest leading part of `name` that is in `names` and followed by variant words only (`name` itself
    when none is shorter)."""
    parts = name.split("-")
    for end in range(1, len(parts)):
        if "-".join(parts[:end]) in names and all(part in words for part in parts[end:]):
            return "-".join(parts[:end])
    return name


@dataclass(frozen=True)
class Catalogue:
    """The icons of the kept families, by name; each icon's family root; the variant words."""

    icons: Tuple[Icon, ...]  # by name
    root: Mapping[str, str]  # icon name -> its family's root
    words: FrozenSet[str]
    charmap_size: int

    def families(self) -> Dict[str, Tuple[Icon, ...]]:
        """Root -> its family's icons (the root first, then by name)."""
        found: Dict[str, list] = {}
        for icon in self.icons:
            found.setdefault(self.root[icon.name], []).append(icon)
        return {root: tuple(sorted(members, key=lambda i: (i.name != root, i.name))) for root, members in found.items()}

    def variant_of(self, icon: Icon) -> Optional[str]:
        """The words after the root ('plus outline' for account-plus-outline), None for the root itself."""
        root = self.root[icon.name]
        return None if root == icon.name else icon.name[len(root) + 1 :].replace("-", " ")


def build_catalogue(names_to_codes: Mapping[str, int], min_bases: int = MIN_BASES) -> Catalogue:
    """The families of the module docstring's rule over `names_to_codes`."""
    names = frozenset(names_to_codes)
    words = variant_words(names, min_bases)
    roots = {name: root_of(name, names, words) for name in sorted(names)}
    sizes = Counter(roots.values())
    kept = sorted(name for name, root in roots.items() if sizes[root] >= 1 + MIN_VARIANTS)
    return Catalogue(
        tuple(Icon(name, names_to_codes[name]) for name in kept),
        {name: roots[name] for name in kept},
        words,
        len(names),
    )


@functools.lru_cache(maxsize=1)
def mdi_catalogue() -> Catalogue:
    """The catalogue of the wheel's Material Design Icons charmap."""
    return build_catalogue(charmap())
