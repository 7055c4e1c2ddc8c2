"""One self-contained HTML report per run: the protocol, the study's tables with their intervals, and every question
with its greedy answer, its K candidates, pass@k and what the study adds to it; data inlined, no network.

    write_report("runs/sampling_gap/summary-table2-0123abcd4567")      # -> .../report.html
    write_report(run_dir, out="review.html")                           # any run directory, old ones included
    write_lm_eval_samples(run_dir)                                     # lm-evaluation-harness samples_*.jsonl

``python -m reach_lens.report RUN_DIR [--out FILE] [--lm-eval-samples [DIR]]`` does the same from the shell. Stores
are read as a reader (``RunStore.reader``), so a report can be made while its study still runs.

Modules: ``collect`` (what a run directory holds), ``rows`` (a question's row), ``studies`` (each study's probes),
``page`` (the page's data), ``render`` (the HTML), ``lm_eval_samples`` (the export).
"""
from __future__ import annotations

import os
from pathlib import Path

from reach_lens.report.collect import NotARunDirectory, collect
from reach_lens.report.lm_eval_samples import write_lm_eval_samples
from reach_lens.report.page import page_data
from reach_lens.report.render import render

REPORT = "report.html"


def write_report(run_dir: Path | str, out: Path | str | None = None) -> Path:
    """Write the report of ``run_dir`` (a summary-* directory, a run store or a run root) to ``out`` (default
    ``run_dir/report.html``); returns its path."""
    run = collect(run_dir)
    path = Path(out) if out is not None else run.path / REPORT
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # a reader never sees half a page
    tmp.write_text(render(page_data(run)), encoding="utf-8")
    os.replace(tmp, path)
    return path


__all__ = ["NotARunDirectory", "REPORT", "collect", "page_data", "render", "write_lm_eval_samples", "write_report"]
