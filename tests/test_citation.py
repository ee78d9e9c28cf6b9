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
    [version] = [keyword.value.value for node in ast.walk(tree) if isinstance(node, ast.Call)
                 for keyword in node.keywords if keyword.arg == "version"]
    return version


def paper_authors(entry: dict) -> list:
    return [(author["family-names"], author["given-names"]) for author in entry["authors"]]


def test_the_software_names_its_holders_version_and_release_date():
    cff = citation()
    names = [author["name"] for author in cff["authors"]]
    assert names[0] == "The open_clip_adacl contributors" and any("OpenCLIP authors" in name for name in names)
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
