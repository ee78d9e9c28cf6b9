"""The discovery page as a tool: its filters, search and per-query / per-batch limits change the rows a browser
shows (headless Chromium, the page's own script, the state in the URL's hash), the differing words of a pair are
marked, and the header names the weights a local-dir: or hf-hub: model carries."""
import re
import shutil
import subprocess

import pytest

from training.discover import report
from training.discover.model import weights_description

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def pair(batch, direction, query_index, posterior, query_caption, negative_caption, *, same_family, same_facts=False,
         edits=(None, None)):
    """A pairs.jsonl line as training.discover writes it on data with families and facts."""
    return {"batch": batch, "direction": direction, "query_index": query_index, "negative_index": query_index + 1,
            "posterior": posterior, "gap": 1 - posterior, "similarity": 0.5,
            "query_key": f"q{batch}-{query_index}", "query_caption": query_caption, "query_source": "a.tar",
            "negative_key": f"n{batch}-{query_index}-{posterior}", "negative_caption": negative_caption,
            "negative_source": "a.tar", "query_family": 1, "query_family_edit": edits[0],
            "negative_family": 1 if same_family else 2, "negative_family_edit": edits[1],
            "same_family": same_family, "same_facts": same_facts}


PAIRS = [  # most probable first, as the page lists them
    pair(0, "i2t", 0, 0.99, "a large red circle above a small blue square", "a small blue square above a large red "
         "circle", same_family=True, edits=(None, "relation")),
    pair(0, "i2t", 0, 0.95, "a large red circle above a small blue square", "a large red cross above a small blue "
         "square", same_family=False),  # the same query again: beyond the default view's one per query
    pair(0, "t2i", 1, 0.90, "a large purple square above a small cyan circle", "a small cyan circle below a large "
         "purple square", same_family=False, same_facts=True),
    pair(1, "t2i", 2, 0.80, "a small green cross to the left of a large red circle", "a small green cross to the "
         "right of a large red circle", same_family=False),
    pair(1, "i2t", 3, 0.70, "a large red circle below a small blue square", "a large orange circle below a small "
         "blue square", same_family=True, edits=("size", "color")),
]


@pytest.fixture(scope="module")
def page(module_tmp):
    output = module_tmp("page")
    summary = {"samples": 64, "batches": 2, "skipped": {}, "directions": {"both": {"kept_pairs": 40}}}
    settings = {"model": "local-dir:export (the export's weights)", "data": "train.tar", "global_batch_size": 32,
                "salient": "max", "candidate_region": "upper"}
    report.write_page(output, summary, settings, PAIRS, [], "table")
    return output / report.PAGE_FILE


def visible_rows(page, state=""):
    """The ranks of the rows headless Chromium shows with `state` in the URL's hash, and the page's count line."""
    if CHROMIUM is None:
        pytest.fail("the page tests need Chromium: apt-get install -y chromium (Debian), then run them with "
                    "bash scripts/test.sh --browser")
    result = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                             f"{page.as_uri()}#{state}"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = re.findall(r'<tr class="pair"([^>]*)>\s*<td class="rank">(\d+)</td>', result.stdout)
    assert len(rows) == len(PAIRS)
    count = re.search(r'<span id="count">([^<]*)</span>', result.stdout).group(1)
    return [int(rank) for attributes, rank in rows if " hidden" not in attributes], count


@pytest.mark.browser
def test_the_default_view_shows_one_row_per_query(page):
    assert visible_rows(page) == ([1, 2, 3, 4], "4 shown of 5 matching (5 on this page)")
    assert visible_rows(page, "perquery=0")[1] == "5 shown of 5 matching (5 on this page)"
    assert visible_rows(page, "perquery=0&perbatch=2")[1] == "4 shown of 5 matching (5 on this page)"


@pytest.mark.browser
@pytest.mark.parametrize("state, shown", [
    ("truth=sibling", "2 shown of 2 matching"),
    ("truth=paraphrase", "1 shown of 1 matching"),
    ("direction=t2i&batch=1", "1 shown of 1 matching"),
    ("edit=color", "1 shown of 1 matching"),
    ("pmin=0.85&perquery=0", "3 shown of 3 matching"),
    ("search=orange%20circle", "1 shown of 1 matching"),
])
def test_filters_and_search_change_the_visible_rows(page, state, shown):
    ranks, count = visible_rows(page, state)
    assert count.startswith(shown) and ranks == list(range(1, len(ranks) + 1))  # the ranks count the shown rows


def test_the_words_that_differ_are_marked():
    assert report.differing_words("a small cyan circle below a large purple square",
                                  "a large purple square above a small cyan circle") == \
        "a small cyan circle <mark>below</mark> a large purple square"  # a paraphrase: the relation word
    assert report.differing_words("a large red circle", "a large orange circle") == "a large <mark>red</mark> circle"
    # the same words in another order (a relation edit that swaps the objects): what the alignment leaves
    assert report.differing_words("a small blue square above a large red circle",
                                  "a large red circle above a small blue square") == \
        "a small blue square <mark>above a large red circle</mark>"


def test_the_page_marks_paraphrases_and_says_what_the_numbers_are(page):
    text = page.read_text()
    assert text.count('data-truth="paraphrase"') == 1 and "1 paraphrase (other family, same facts)" in text
    assert "it is not calibrated" in text and "this batch's own similarities" in text
    assert 'data-edits="color size"' in text


def test_the_header_names_the_weights_of_an_export_or_a_hub_model():
    assert weights_description("local-dir:/exports/demo", None) == \
        "(the export's weights, /exports/demo/open_clip_model.safetensors)"
    assert weights_description("hf-hub:org/model", None) == "(the hub repository's weights)"
    assert weights_description("ViT-B-32", "laion2b_s34b_b79k") == "--pretrained laion2b_s34b_b79k"
    assert weights_description("ViT-B-32", None) == "(random weights)"
