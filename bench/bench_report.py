"""The run report at the size the issue names: a synthetic sampling-gap cell of 300 questions x K = 64 written with the
real RunStore API (SQuAD-sized passages, 5-shot prompts sharing their shots, 64 sampled answers per question with
repeats, a hidden vector on every candidate as the selection study stores them), its report written, then opened
in headless Chromium (Debian's chromium through Playwright) several times.

    python bench/bench_report.py                       # 300 x 64; prints the file size and load-to-ready times
    python bench/bench_report.py --distinct 64 --words 60        # every candidate distinct and long: the worst case
    python bench/bench_report.py --n 1000 --K 128 --loads 3

Load-to-ready is the page's own ``performance.now()`` when its script has built the list (time since navigation
start: reading the file, parsing the inlined JSON, the first render), and the wall time of opening one question.
The budget: under 2 s to ready and under 20 MB.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd

from reach_lens.audit import gap_table_row, summarize
from reach_lens.protocol import Protocol, question_set_hash
from reach_lens.records import make_record
from reach_lens.report import write_report
from reach_lens.runs import QUESTIONS, question_rows, summary_dir
from reach_lens.select import majority_vote
from reach_lens.store import RunStore
from reach_lens.tasks import Question

WORDS = ("the of and to in a is was for on as with by he at from his that an were are which this be has or "
         "river city army century king church war school music water empire french british german first").split()
SHOTS = "Title: Example\nBackground: " + " ".join(WORDS * 12) + "\nQuestion: What?\nAnswer: this\n\n"


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def synthetic_cell(root: Path, n: int, K: int, hidden: int, distinct: int, length: int, seed: int = 0) -> Path:
    """A deployed store and a records store of ``n`` questions x ``K`` samples (drawn from ``distinct`` answers of up
    to ``length`` words per question) under ``root``, and their summary directory with the cell's table; returns the
    summary directory."""
    rng = random.Random(seed)
    questions = []
    for i in range(n):
        gold = words(rng, 2)
        questions.append(Question(f"q{i:04d}", words(rng, 12) + "?", gold, context=words(rng, 120),
                                  aliases=(gold, words(rng, 2))))
    deploy = Protocol(study="bench_report", model="synthetic", weights="0" * 16, task="squad", source=None,
                      split="validation", questions=question_set_hash(questions), n=n, seed=seed, fmt="fewshot",
                      grader="short_answer_em/1", probe="deploy", K=None, temperature=0.0, max_new_tokens=32,
                      stop_strings=("\n",))
    sample = deploy.replace(probe="sample", K=K, temperature=0.8)

    def cand(q: Question, right: bool) -> dict:
        text = q.gold if right else words(rng, rng.randint(1, length))
        return {"text": " " + text, "answer": None if rng.random() < 0.05 else text, "correct": right,
                "mean_logprob": -rng.random() * 3, "length": len(text.split()) + 1, "f1": None,
                "entropy": rng.random(), "finish_reason": "stop", "route": None,
                "hidden": [rng.gauss(0, 1) for _ in range(hidden)] if hidden else None}

    deployed, records = [], []
    for q in questions:
        rate = rng.choice((0.0, 0.0, 0.05, 0.3, 0.8))
        pool = [cand(q, rng.random() < rate) for _ in range(distinct)]  # sampled answers repeat, as a model's do
        cands = [dict(c) for c in pool[:K]] + [dict(rng.choice(pool)) for _ in range(K - min(K, distinct))]
        for c in cands:
            c["correct"] = c["correct"] and c["answer"] is not None
        greedy = cand(q, rng.random() < rate)
        greedy["correct"] = greedy["correct"] and greedy["answer"] is not None
        deployed.append({"question_id": q.id, **{k: v for k, v in greedy.items() if k != "hidden"}})
        records.append(make_record(q.id, q.gold, greedy, cands, majority_vote(cands)))
    with RunStore(root / "deployed", deploy) as store:
        store.append(QUESTIONS, question_rows(questions, lambda q: f"{SHOTS}Background: {q.context}\n"
                                                                   f"Question: {q.question}\nAnswer:"))
        store.append("deployed", deployed)
    with RunStore(root / "T0.8", sample) as store:
        store.append(QUESTIONS, question_rows(questions))
        for start in range(0, n, 25):  # parts as the run loop appends them
            store.append("records", records[start:start + 25])
    out = summary_dir(root, [deploy, sample], name="summary-T0.8")
    pd.DataFrame([{"model": "synthetic", "task": "squad", "T": 0.8, **gap_table_row(summarize(pd.DataFrame(records)))}]
                 ).to_csv(out / "table.csv", index=False)
    return out


def load_times(path: Path, loads: int) -> tuple[list[float], list[float]]:
    """Per load: the page's ready time (ms since navigation start) and the wall time of opening one question (ms)."""
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("REACH_LENS_CHROMIUM", "/usr/bin/chromium")
    args = ["--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
            "--disable-gpu", *(["--no-sandbox"] if os.geteuid() == 0 else [])]
    ready, opened = [], []
    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        context = p.chromium.launch_persistent_context(profile, executable_path=chromium, headless=True, args=args)
        for _ in range(loads):
            page = context.new_page()
            page.goto(path.resolve().as_uri())
            page.wait_for_selector("html[data-ready='1']", timeout=60000)
            ready.append(page.evaluate("window.reportReadyMs"))
            start = time.perf_counter()
            page.click("#rows tr.q:nth-child(1)")
            page.wait_for_selector("#candidates")
            opened.append(1000 * (time.perf_counter() - start))
            page.close()
        context.close()
    return ready, opened


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=300, help="questions (default 300)")
    p.add_argument("--K", type=int, default=64, help="samples per question (default 64)")
    p.add_argument("--hidden", type=int, default=64, help="length of each candidate's stored hidden vector (64)")
    p.add_argument("--distinct", type=int, default=8, help="distinct answers among a question's K (default 8)")
    p.add_argument("--words", type=int, default=6, help="longest candidate text, in words (default 6)")
    p.add_argument("--loads", type=int, default=5, help="page loads measured (default 5)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        summary = synthetic_cell(Path(tmp) / "cell", args.n, args.K, args.hidden, args.distinct, args.words)
        stores = sum(f.stat().st_size for f in Path(tmp).rglob("*.parquet")) / 1e6
        written = time.perf_counter()
        report = write_report(summary)
        rendered = time.perf_counter()
        size = report.stat().st_size / 1e6
        ready, opened = load_times(report, args.loads)
    print(f"{args.n} questions x K = {args.K} ({args.distinct} distinct answers of <= {args.words} words each): "
          f"stores {stores:.1f} MB written in {written - started:.1f} s; report.html {size:.2f} MB written in "
          f"{rendered - written:.1f} s")
    print(f"load to ready, {args.loads} loads: median {statistics.median(ready):.0f} ms, max {max(ready):.0f} ms; "
          f"opening a question: median {statistics.median(opened):.0f} ms")
    print(f"budget: {'within' if size < 20 and max(ready) < 2000 else 'OVER'} (< 20 MB, < 2000 ms)")


if __name__ == "__main__":
    main()
