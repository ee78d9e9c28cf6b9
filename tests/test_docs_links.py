"""Every relative link of the README, CONTRIBUTING.md, CHANGELOG.md and the docs (docs/results and its archive
included) reaches a committed file, and a link to a Markdown heading reaches a heading of that page: moving a report
(into docs/results/archive/) or renaming a section breaks no page that cites it."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def heading_anchors(page: Path) -> set:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", page.read_text(), flags=re.S), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def test_every_relative_link_reaches_a_file_and_its_heading():
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold commands, not links
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path) if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_the_docs_index_answers_each_results_question_with_one_page():
    """docs/README.md lists the questions by use, change, method and results; each results question points to
    one page (the pre-registrations, one per study, excepted)."""
    index = (ROOT / "docs" / "README.md").read_text()
    assert [title for title in re.findall(r"^## (.+)$", index, re.MULTILINE)] == [
        "Use it",
        "Change it",
        "The method",
        "The results",
    ]
    results = index.split("## The results", 1)[1]
    questions = re.split(r"^- ", results, flags=re.MULTILINE)[1:]
    assert len(questions) >= 8
    for question in questions:
        pages = {target.split("#")[0] for target in re.findall(r"\]\(([^)\s]+)\)", question)}
        assert len(pages) == 1 or question.startswith("What was registered"), question
