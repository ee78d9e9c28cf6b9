"""CITATION.cff credits people and says what to cite: the project's holders by name, its version as setup.py
states it with a release date, the AdaCL paper's full title and authors, and OpenCLIP upstream."""

import ast
import datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PAPER_TITLE = "Discovering Clone Negatives via Adaptive Contrastive Learning for Image-Text Matching"
PAPER_AUTHORS = [("Pan", "Renjie"), ("Dong", "Jihao"), ("Yang", "Hua")]


def citation() -> dict:
    return yaml.safe_load((ROOT / "CITATION.cff").read_text())


def setup_version() -> str:
    """The version= keyword of setup.py's setup() call, read without running it."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    [version] = [
        keyword.value.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for keyword in node.keywords
        if keyword.arg == "version"
    ]
    return version


def paper_authors(entry: dict) -> list:
    return [(author["family-names"], author["given-names"]) for author in entry["authors"]]


def test_the_software_names_its_holders_version_and_release_date():
    cff = citation()
    # The fork's own contributors; OpenCLIP's authors are credited in the references, not as co-authors of the fork.
    assert [author["name"] for author in cff["authors"]] == ["The open_clip_adacl contributors"]
    assert str(cff["version"]) == setup_version()
    assert datetime.date.fromisoformat(str(cff["date-released"])) <= datetime.date.today()
    assert cff["license"] == "MIT"


def test_the_paper_is_cited_with_its_full_title_and_authors():
    cff = citation()
    paper = cff["preferred-citation"]
    assert paper["title"] == PAPER_TITLE and paper_authors(paper) == PAPER_AUTHORS and paper["year"] == 2025
    [reference] = [entry for entry in cff["references"] if entry["title"] == PAPER_TITLE]
    assert paper_authors(reference) == PAPER_AUTHORS
    [openclip] = [entry for entry in cff["references"] if entry["title"] == "OpenCLIP"]
    assert openclip["url"] == "https://github.com/mlfoundations/open_clip" and len(openclip["authors"]) == 13


def test_the_readme_cites_the_paper_by_its_full_title():
    readme = " ".join((ROOT / "README.md").read_text().split())  # lines joined
    short = PAPER_TITLE.removesuffix(" for Image-Text Matching")
    assert readme.count(f'"{PAPER_TITLE}"') == readme.count(f'"{short}') >= 1  # every quotation of it is whole
