"""Reports opened in a real browser: headless Chromium (Debian's ``chromium``) driven by Playwright for Python. The page
loads from disk with no console error and no request but its own file, every filter shows (and lists) the count the
stored records give, an opened question shows its candidates with the grades the store holds, and the reports of a
routing run and of an RLVR run render their own sections. The runs are tests/test_report.py's (tiny checkpoints)."""
from __future__ import annotations

import os
import tempfile

import pandas as pd
import pytest
from conftest import CHROMIUM
from test_report import gap_run, lab, one, question_ids, rlvr_run, routing_run, stored, summary_of  # noqa: F401

from reach_lens.report import collect, page_data
from reach_lens.report.studies import route_edits

pytestmark = pytest.mark.browser
CHROMIUM_ARGS = ["--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-gpu", *(["--no-sandbox"] if os.geteuid() == 0 else [])]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        context = p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True,
                                                       args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000})
        yield context
        context.close()


@pytest.fixture
def opened(browser):
    """``open(path)``: the report at ``path`` loaded and ready; ``problems``: its console errors and warnings, page
    errors and every request other than the page itself."""
    pages, problems = [], []

    def open_(path):
        page = browser.new_page()
        url = path.resolve().as_uri()
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning")
                else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on("request", lambda r: problems.append(f"request: {r.url}") if r.url != url else None)
        page.goto(url)
        page.wait_for_selector("html[data-ready='1']", timeout=15000)
        pages.append(page)
        return page

    yield open_, problems
    for page in pages:
        page.close()


def filter_counts(page) -> dict[str, int]:
    return {b.get_attribute("data-filter"): int(b.query_selector(".n").inner_text())
            for b in page.query_selector_all("#filters button")}


def shown_rows(page) -> list[str]:
    return [tr.query_selector("td").inner_text() for tr in page.query_selector_all("#rows tr.q")]


def candidate_grades(page) -> tuple[int, int]:
    """(candidates, correct ones) of the opened question, counting each group's multiplicity."""
    rows = page.query_selector_all("#candidates tr.cand")
    counts = [(int(r.get_attribute("data-count")), r.get_attribute("data-correct") == "1") for r in rows]
    return sum(n for n, _ in counts), sum(n for n, ok in counts if ok)


def test_a_report_opens_offline_and_each_filter_shows_the_records_count(gap_run, opened):
    open_, problems = opened
    page = open_(summary_of(gap_run, "summary-table2-*") / "report.html")
    assert page.eval_on_selector("#probe", "s => s.options[s.selectedIndex].text").endswith("T=0.8, K=4")
    cell = one(p for p in gap_run.iterdir() if p.is_dir() and not p.name.startswith("summary-"))
    records = stored(cell / "T0.8" / "records").set_index("question_id")
    d, o = records.d.astype(bool), records.o.astype(bool)
    expected = {"all": len(records), "realized": int(d.sum()), "reached_not_realized": int((o & ~d).sum()),
                "never_reached": int((~o).sum()), "said_not_reached": int((d & ~o).sum()),
                "greedy_format_failure": int(records.deployed_answer.isna().sum()),
                "candidate_format_failure": int((records.format_failures > 0).sum())}
    assert filter_counts(page) == expected
    assert 0 < expected["realized"] < expected["all"] and expected["candidate_format_failure"] > 0  # not trivial
    for tag, n in expected.items():
        page.click(f"#filters button[data-filter='{tag}']")
        assert len(shown_rows(page)) == n, tag
    page.click("#filters button[data-filter='all']")
    for i, qid in enumerate(shown_rows(page)):
        page.click(f"#rows tr.q:nth-child({i + 1})")
        assert page.inner_text("#open-id") == qid
        assert page.inner_text("#open-question") == f"Which one is number {qid[1:]}?"
        assert page.inner_text("#open-hits") == f"{records.loc[qid, 'hits']} / 4"
        assert candidate_grades(page) == (4, int(records.loc[qid, "hits"]))
        texts = {r.query_selector("td.text").inner_text().strip()
                 for r in page.query_selector_all("#candidates tr.cand")}
        assert texts == {c["text"].strip() for c in records.loc[qid, "candidates"]}
    page.fill("#search", "q3")
    assert shown_rows(page) == ["q3"]
    page.fill("#search", "")
    page.select_option("#sort", "hits-desc")
    hits = [int(tr.query_selector_all("td")[4].inner_text().split(" / ")[0])
            for tr in page.query_selector_all("#rows tr.q")]
    assert hits == sorted(hits, reverse=True) and hits[0] == records.hits.max()
    table = page.query_selector("#summary-table")
    assert "deployed [95%]" in table.inner_text()  # the main table, its intervals beside each value
    assert problems == []


def test_a_routing_report_shows_each_search_with_its_routes(routing_run, opened):
    open_, problems = opened
    summary = summary_of(routing_run)
    page = open_(summary / "report.html")
    data = page_data(collect(summary))
    searches = stored(one(p for p in routing_run.iterdir() if (p / "searches").is_dir()) / "searches")
    for index, p in enumerate(data["probes"]):
        method = p["label"].split(" / ")[1].split(",")[0]
        page.select_option("#probe", str(index))
        reached = [any({tuple(c["route"]): c for c in s.candidates}[tuple(r)]["correct"]
                       for t in s.searches if t["method"] == method for r in t["routes"])
                   for s in searches.itertuples()]
        counts = filter_counts(page)
        assert counts["all"] == len(searches) and counts["never_reached"] == reached.count(False)
        page.click("#rows tr.q:nth-child(1)")
        qid = page.inner_text("#open-id")
        traces = searches.set_index("question_id").loc[qid, "searches"]
        routes = one(t["routes"] for t in traces if t["method"] == method)
        shown = [r.query_selector_all("td")[-1].inner_text() for r in page.query_selector_all("#candidates tr.cand")]
        assert shown == [route_edits(r, 2) for r in routes] and shown[0] == "full path"
        assert "learned router" in page.inner_text("#detail")
    assert problems == []


def test_an_rlvr_report_puts_the_checkpoints_side_by_side(rlvr_run, opened):
    open_, problems = opened
    summary = summary_of(rlvr_run)
    page = open_(summary / "report.html")
    questions = pd.read_csv(summary / "questions.csv").set_index("question_id")
    options = page.eval_on_selector_all("#probe option", "os => os.map(o => o.text)")
    assert any(o.startswith("base: ") for o in options) and any(o.startswith("other: ") for o in options)
    trained = next(i for i, o in enumerate(options) if o.startswith("other: ") and "T=0.8" in o)
    page.select_option("#probe", str(trained))
    counts = filter_counts(page)
    for fate, n in questions.realization.value_counts().items():
        assert counts[f"fate:{fate}"] == n
    page.click("#rows tr.q:nth-child(1)")
    qid = page.inner_text("#open-id")
    side = page.query_selector_all("#compare tr")[1:]
    assert [r.query_selector("td").inner_text() for r in side] == ["base", "other"]
    hits = [r.query_selector_all("td")[2].inner_text() for r in side]
    assert hits == [f"{questions.loc[qid, 'hits_base']} / 2", f"{questions.loc[qid, 'hits_trained']} / 2"]
    assert questions.loc[qid, "realization"].replace("_", " ") in page.inner_text("#detail")
    assert problems == []
