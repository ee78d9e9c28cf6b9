"""The discovery page as a tool: its filters, search and per-query / per-batch limits change the rows a browser
shows (headless Chromium, the page's own script, the state in the URL's hash); each pair's label says how many
facts its captions differ in and the legend defines it; the table names the family precision a proxy; the words
that say what the other caption does not are marked, a reversed relation too; summary.json counts the kept pairs
per label; the header names the weights a local-dir: or hf-hub: model carries."""

import html
import json
import re
import shutil
import subprocess
import tempfile

import pytest

from training.discover import report
from training.discover.model import weights_description
from training.discover.store import PAIRS_FILE

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def pair(
    batch,
    direction,
    query_index,
    posterior,
    query_caption,
    negative_caption,
    *,
    same_family,
    facts_apart,
    edits=(None, None),
):
    """A pairs.jsonl line as training.discover writes it on data with families and facts."""
    return {
        "batch": batch,
        "direction": direction,
        "query_index": query_index,
        "negative_index": query_index + 1,
        "posterior": posterior,
        "gap": 1 - posterior,
        "similarity": 0.5,
        "query_key": f"q{batch}-{query_index}",
        "query_caption": query_caption,
        "query_source": "a.tar",
        "negative_key": f"n{batch}-{query_index}-{posterior}",
        "negative_caption": negative_caption,
        "negative_source": "a.tar",
        "query_family": 1,
        "query_family_edit": edits[0],
        "negative_family": 1 if same_family else 2,
        "negative_family_edit": edits[1],
        "same_family": same_family,
        "same_facts": facts_apart == 0,
        "facts_apart": facts_apart,
    }


PAIRS = [  # most probable first; the page lists them by label, then batch (report.reading_order)
    pair(
        0,
        "i2t",
        0,
        0.99,
        "a large red circle above a small blue square",
        "a small blue square above a large red circle",
        same_family=True,
        facts_apart=1,
        edits=(None, "relation"),
    ),
    pair(
        0,
        "i2t",
        0,
        0.95,
        "a large red circle above a small blue square",
        "a large red cross above a small blue square",
        same_family=False,
        facts_apart=1,
    ),  # the same query again: beyond the default view's one per query
    pair(
        0,
        "t2i",
        1,
        0.90,
        "a large purple square above a small cyan circle",
        "a small cyan circle below a large purple square",
        same_family=False,
        facts_apart=0,
    ),
    pair(
        1,
        "t2i",
        2,
        0.80,
        "a small green cross to the left of a large red circle",
        "a small green cross to the right of a large red circle",
        same_family=False,
        facts_apart=1,
    ),
    pair(
        1,
        "i2t",
        3,
        0.70,
        "a small red circle below a small blue square",
        "a large orange circle below a small blue square",
        same_family=True,
        facts_apart=2,
        edits=("size", "color"),
    ),
    pair(
        2,
        "i2t",
        4,
        0.60,
        "a large red circle above a small blue square",
        "a small blue square above a large orange circle",
        same_family=False,
        facts_apart=2,
    ),  # the objects exchanged, and a colour
]
SUMMARY = {
    "samples": 64,
    "batches": 3,
    "skipped": {},
    "directions": {
        "both": {
            "flagged_fraction": 0.3,
            "candidates_per_row": 9.6,
            "family_precision": 0.2,
            "family_recall": 0.7,
            "sibling_fraction": 0.1,
            "kept_family_precision": 0.4,
            "family_precision_with_paraphrases": 0.21,
            "kept_family_precision_with_paraphrases": 0.45,
            "kept_within_one_fact": 0.6,
            "kept_pairs": 40,
            "kept_labels": {"sibling-1": 10, "sibling-2": 6, "paraphrase": 2, "other-1": 8, "other-2": 14},
        }
    },
}


@pytest.fixture(scope="module")
def page(module_tmp):
    output = module_tmp("page")
    settings = {
        "model": "local-dir:export (the export's weights)",
        "data": "train.tar",
        "global_batch_size": 32,
        "salient": "max",
        "candidate_region": "upper",
    }
    report.write_page(output, SUMMARY, settings, PAIRS, [], report.console_table(SUMMARY))
    return output / report.PAGE_FILE


@pytest.fixture(scope="module")
def profiles(module_tmp):
    """A folder of fresh Chromium profiles, one per start."""
    return module_tmp("chromium-profiles")


def rendered(page, profiles, state=""):
    """The page's DOM after its script ran in headless Chromium with `state` in the URL's hash."""
    if CHROMIUM is None:
        pytest.fail(
            "the page tests need Chromium: apt-get install -y chromium (Debian), then run them with "
            "bash scripts/test.sh --browser"
        )
    profile = tempfile.mkdtemp(dir=profiles)
    result = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--dump-dom",
            f"{page.as_uri()}#{state}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def shown_rows(dom):
    """The rows the browser shows, in order: rank, label badge, and the marked words of the query's and the
    negative's captions; and the page's count line."""
    rows = re.findall(r'<tr class="pair"([^>]*)>(.*?)</tr>', dom, re.S)
    assert len(rows) == len(PAIRS)
    shown = []
    for attributes, cells in rows:
        if " hidden" in attributes:
            continue
        rank = int(re.search(r'<td class="rank">(\d+)</td>', cells).group(1))
        badge = re.search(r'<span class="truth [^"]*">([^<]*)</span>', cells).group(1)
        captions = re.findall(r'<div class="caption">(.*?)</div>', cells)
        shown.append({"rank": rank, "label": badge, "marks": [re.findall(r"<mark>(.*?)</mark>", c) for c in captions]})
    count = re.search(r'<span id="count">([^<]*)</span>', dom).group(1)
    return shown, count


def visible_rows(page, profiles, state=""):
    """The ranks of the rows headless Chromium shows with `state` in the URL's hash, and the page's count line."""
    shown, count = shown_rows(rendered(page, profiles, state))
    return [row["rank"] for row in shown], count


def text_of(dom, pattern):
    """The text of the first element `pattern` (a regex with one group) finds, tags dropped, spaces joined."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", re.search(pattern, dom, re.S).group(1))).split())


@pytest.mark.browser
def test_the_default_view_shows_one_row_per_query(page, profiles):
    assert visible_rows(page, profiles) == ([1, 2, 3, 4, 5], "5 shown of 6 matching (6 on this page)")
    assert visible_rows(page, profiles, "perquery=0")[1] == "6 shown of 6 matching (6 on this page)"
    assert visible_rows(page, profiles, "perquery=0&perbatch=2")[1] == "5 shown of 6 matching (6 on this page)"


@pytest.mark.browser
@pytest.mark.parametrize(
    "state, shown",
    [
        ("direction=t2i&batch=1", "1 shown of 1 matching"),
        ("edit=color", "1 shown of 1 matching"),
        ("pmin=0.85&perquery=0", "3 shown of 3 matching"),
        ("search=orange%20circle", "2 shown of 2 matching"),
    ],
)
def test_filters_and_search_change_the_visible_rows(page, profiles, state, shown):
    ranks, count = visible_rows(page, profiles, state)
    assert count.startswith(shown) and ranks == list(range(1, len(ranks) + 1))  # the ranks count the shown rows


@pytest.mark.browser
@pytest.mark.parametrize(
    "truth, labels",
    [
        ("sibling-1", ["sibling, 1 fact apart"]),
        ("sibling-2", ["sibling, 2 facts apart"]),
        ("paraphrase", ["paraphrase (other family, same facts)"]),
        ("other-1", ["other family, 1 fact apart"] * 2),
        ("other-2", ["other family, 2 or more facts apart"]),
        ("sibling", ["sibling, 1 fact apart", "sibling, 2 facts apart"]),  # a side as a whole
        (
            "other",
            [
                "paraphrase (other family, same facts)",  # LABEL_ORDER: the paraphrase first, then by batch
                "other family, 1 fact apart",
                "other family, 1 fact apart",
                "other family, 2 or more facts apart",
            ],
        ),
    ],
)
def test_the_label_filter_shows_the_pairs_of_each_label(page, profiles, truth, labels):
    """Each label's filter shows exactly the pairs carrying it (the labels follow the pairs' facts_apart), and
    the legend defines every label the page uses, in the words of its badges."""
    dom = rendered(page, profiles, f"truth={truth}&perquery=0")
    shown, count = shown_rows(dom)
    assert [row["label"] for row in shown] == labels and count.startswith(f"{len(labels)} shown of {len(labels)} ")
    legend = text_of(dom, r'<dl class="legend">(.*?)</dl>')
    options = re.findall(r'<option value="([^"]*)">', re.search(r'<select name="truth">(.*?)</select>', dom, re.S)[1])
    assert options == ["", "sibling", "other", "sibling-1", "sibling-2", "paraphrase", "other-1", "other-2"]
    for label in {report.TRUTHS[report.pair_label(pair)] for pair in PAIRS}:
        assert label in legend, label
    assert "one edit apart" not in legend
    assert (
        "one for each object whose size, colour or shape differs, per attribute, and one for each two objects "
        "whose relation differs" in legend
    )


@pytest.mark.browser
def test_the_page_names_the_family_precision_a_proxy(page, profiles):
    """The table the page shows and its legend call the precision against families by that name, and say what it
    counts wrong."""
    dom = rendered(page, profiles)
    table = text_of(dom, r"<pre>(.*?)</pre>")
    assert "family precision*" in table and "kept family precision*" in table and "kept <=1 fact apart" in table
    assert (
        "precision against the data's families, a proxy: a pair of one family counts as a clone (also siblings "
        "2 facts apart), a pair of two families as a false positive (also paraphrases and pairs 1 fact apart)" in table
    )
    assert "10 sibling, 1 fact apart" not in table and "25.0% sibling, 1 fact apart" in table
    legend = text_of(dom, r'<dl class="legend">(.*?)</dl>')
    assert (
        "family precision in the table: the precision against the data's families, a proxy of the precision" in legend
    )


@pytest.mark.browser
def test_the_page_marks_a_reversed_relation_also_when_other_words_differ(page, profiles):
    shown, _ = shown_rows(rendered(page, profiles, "perquery=0"))
    marks = {row["rank"]: row["marks"] for row in shown}
    assert marks[1] == [["above"], ["above"]]  # the objects exchanged: the relation, in both captions
    assert marks[3] == [[], []]  # a paraphrase says the same thing
    assert marks[6] == [["red", "above"], ["above", "orange"]]  # exchanged, and a colour
    assert marks[4] == [["circle"], ["cross"]]  # one word differs, nothing exchanged
    assert marks[5] == [["left"], ["right"]]


def test_the_words_that_differ_are_marked_as_html():
    assert (
        report.differing_words(
            "a small cyan circle below a large purple square", "a large purple square above a small cyan circle"
        )
        == "a small cyan circle below a large purple square"
    )  # a paraphrase: nothing
    assert (
        report.differing_words("a large red circle & more", "a large orange circle & more")
        == "a large <mark>red</mark> circle &amp; more"
    )
    assert (
        report.differing_words(
            "a large red circle above a small blue square", "a small blue square above a large orange circle"
        )
        == "a large <mark>red</mark> circle <mark>above</mark> a small blue square"
    )


def test_each_pair_is_labelled_by_its_family_and_facts():
    labels = [report.pair_label(pair) for pair in PAIRS]
    assert labels == ["sibling-1", "other-1", "paraphrase", "other-1", "sibling-2", "other-2"]
    assert report.pair_label({**PAIRS[0], "facts_apart": 4}) == "sibling-3"
    assert report.pair_label({**PAIRS[5], "facts_apart": 5}) == "other-2"
    # written without a count (facts of another form): the side, or 0 apart when the facts are the same
    unknown = {key: value for key, value in PAIRS[1].items() if key != "facts_apart"}
    assert report.pair_label(unknown) == "other" and report.pair_label({**unknown, "same_facts": True}) == "paraphrase"
    no_family = {key: value for key, value in PAIRS[1].items() if not key.endswith("family")}
    assert report.pair_label(no_family) == "none"


def test_the_summary_counts_the_kept_pairs_per_label(tmp_path):
    (tmp_path / PAIRS_FILE).write_text("".join(json.dumps(pair) + "\n" for pair in PAIRS))
    summary = {
        "directions": {
            "i2t": {"kept_siblings": 2, "kept_paraphrases": 0},  # as the batches counted them
            "t2i": {"kept_siblings": 0, "kept_paraphrases": 1},
            "both": {"kept_siblings": 2, "kept_paraphrases": 1},
        }
    }
    report.add_kept_metrics(summary, tmp_path)
    both, i2t = summary["directions"]["both"], summary["directions"]["i2t"]
    assert both["kept_labels"] == {"sibling-1": 1, "sibling-2": 1, "paraphrase": 1, "other-1": 2, "other-2": 1}
    assert i2t["kept_labels"] == {"sibling-1": 1, "sibling-2": 1, "other-1": 1, "other-2": 1}
    assert both["kept_within_one_fact"] == pytest.approx(4 / 6) and i2t["kept_within_one_fact"] == pytest.approx(2 / 4)
    assert both["kept_family_precision"] == pytest.approx(2 / 6)
    assert both["kept_family_precision_with_paraphrases"] == pytest.approx(3 / 6)
    assert summary["label_names"]["other-1"] == "other family, 1 fact apart"


def test_the_page_marks_each_label_and_says_what_the_numbers_are(page):
    text = page.read_text()
    assert text.count('data-truth="other paraphrase"') == 1 and "1 paraphrase (other family, same facts)" in text
    assert text.count('data-truth="sibling sibling-2"') == 1 and "2 other family, 1 fact apart" in text
    assert "it is not calibrated" in text and "this batch's own similarities" in text
    assert 'data-edits="color size"' in text


def test_the_header_names_the_weights_of_an_export_or_a_hub_model():
    assert (
        weights_description("local-dir:/exports/demo", None)
        == "(the export's weights, /exports/demo/open_clip_model.safetensors)"
    )
    assert weights_description("hf-hub:org/model", None) == "(the hub repository's weights)"
    assert weights_description("ViT-B-32", "laion2b_s34b_b79k") == "--pretrained laion2b_s34b_b79k"
    assert weights_description("ViT-B-32", None) == "(random weights)"


def test_the_page_opens_on_siblings_and_spans_the_batches_before_the_far_apart_pairs():
    tied = [
        pair(batch, "i2t", 10 + batch, 0.99, "a red circle", "a blue square", same_family=False, facts_apart=2)
        for batch in (0, 0, 0)
    ]  # one batch's tied pairs of two families, the least useful rows
    across = [
        pair(batch, "i2t", 20 + index, posterior, "a red circle", "a red square", same_family=True, facts_apart=1)
        for index, (batch, posterior) in enumerate(((3, 0.97), (4, 0.98), (3, 0.99)))
    ]
    ordered = report.reading_order([*tied, *PAIRS, *across])
    labels = [report.pair_label(row) for row in ordered]
    assert labels == sorted(labels, key=report.LABEL_ORDER.index) and labels[0].startswith("sibling")
    assert labels[-4:] == ["other-2"] * 4  # the tied ones and PAIRS' last
    siblings_1 = [(row["batch"], row["posterior"]) for row in ordered if report.pair_label(row) == "sibling-1"]
    # each batch's best before any batch's second, by posterior: batch 0 (0.99), 3 (0.99), 4 (0.98), then 3 again
    assert siblings_1 == [(0, 0.99), (3, 0.99), (4, 0.98), (3, 0.97)]


def test_the_console_table_fits_800_pixels_with_a_row_per_metric():
    summary = {**SUMMARY, "directions": {name: SUMMARY["directions"]["both"] for name in ("i2t", "t2i", "both")}}
    lines = report.console_table(summary).splitlines()
    assert max(map(len, lines)) <= report.TABLE_WIDTH
    assert lines[0].split() == ["i2t", "t2i", "both"]
    assert lines[3].startswith("family precision*") and lines[3].split()[-3:] == ["0.200"] * 3


def test_the_per_batch_plot_labels_the_batches_without_candidates(tmp_path, monkeypatch):
    import matplotlib.axes

    def direction(flagged):
        return {"flagged": flagged, "negatives": 100, "histogram": [0] * 8, "fits": None}

    records = [
        {"batch": batch, "directions": [direction(flagged), direction(flagged)]}
        for batch, flagged in ((0, 5), (1, 0), (2, 7), (3, 0))
    ]
    labels = []
    plot = matplotlib.axes.Axes.plot
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "plot",
        lambda axis, *args, **kwargs: (
            labels.append((kwargs.get("label"), list(args[0]))),
            plot(axis, *args, **kwargs),
        )[1],
    )
    monkeypatch.setattr(report, "_plot_fits", lambda *args: None)
    report.write_plots(tmp_path, records, {"candidate_region": "upper"})
    assert ("no candidates in the batch (2 of 4)", [1, 3]) in labels
