"""The result tables docs/results.md cites are committed under docs/tables/<study>/<run>/, and the numbers of the
docs' tables equal them: each run's evaluation table is rendered here from its CSVs, row by row, and must appear in
docs/results.md as it is."""
from pathlib import Path

import pandas as pd
import pytest

from reach_lens.stats import p_text

ROOT = Path(__file__).resolve().parents[1]
TABLES = ROOT / "docs" / "tables"
RESULTS = (ROOT / "docs" / "results.md").read_text()
MLP_RUNS = sorted(p for p in (TABLES / "mlp_localize").iterdir() if p.is_dir()) if (TABLES / "mlp_localize").is_dir() else []


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _signed(x: float) -> str:
    return f"{100 * x:+.1f}".replace("-", "−")


def evaluation_rows(run: Path) -> list[str]:
    """The run's evaluation table as docs/results.md prints it: per silenced component its role, repair and
    breakage with their Wilson intervals, and the identified block's paired margin over it."""
    evaluation = pd.read_csv(run / "evaluation.csv")
    margins = pd.read_csv(run / "margins.csv").set_index("name")
    rows = []
    for r in evaluation.itertuples():
        margin = ""
        if r.name in margins.index:
            m = margins.loc[r.name]
            margin = (f"{_signed(m['diff'])} pp [{_signed(m['lo'])}, {_signed(m['hi'])}], {p_text(m['p'])} "
                      f"({int(m['a_only'])} vs {int(m['b_only'])})")
        rows.append(f"| {r.name} | {r.label} | {_pct(r.repair)}% [{_pct(r.repair_lo)}, {_pct(r.repair_hi)}] | "
                    f"{_pct(r.breakage)}% [{_pct(r.breakage_lo)}, {_pct(r.breakage_hi)}] | {margin} |".replace("|  |", "| |"))
    return rows


def test_every_cited_mlp_run_has_its_tables():
    assert MLP_RUNS, "docs/tables/mlp_localize holds no run"
    for run in MLP_RUNS:
        assert f"docs/tables/mlp_localize/{run.name}/" in RESULTS, f"{run.name}: committed but not cited"
        for name in ("evaluation", "margins", "layer_sweep", "steering", "units", "panels", "questions"):
            assert (run / f"{name}.csv").is_file(), f"{run.name}: {name}.csv missing"
    assert sum(f.stat().st_size for f in TABLES.rglob("*") if f.is_file()) < 2_000_000  # a few hundred kB


@pytest.mark.parametrize("run", MLP_RUNS, ids=[r.name for r in MLP_RUNS])
def test_the_docs_evaluation_table_equals_the_committed_csvs(run):
    missing = [row for row in evaluation_rows(run) if row not in RESULTS]
    assert not missing, f"{run.name}: rows of docs/results.md differ from its CSVs:\n" + "\n".join(missing)


@pytest.mark.parametrize("run", MLP_RUNS, ids=[r.name for r in MLP_RUNS])
def test_the_per_question_table_reproduces_the_evaluation_rates(run):
    """Each evaluation rate recounted from questions.csv: repair on the evaluation failures, breakage on the
    evaluation healthy questions, of the condition that silenced that component."""
    questions = pd.read_csv(run / "questions.csv")
    evaluation = pd.read_csv(run / "evaluation.csv")
    names = {"mlp": "silence-mlp-{}", "attn": "silence-attn-{}", "layer": "silence-layer-{}"}
    for r in evaluation.itertuples():
        column = names[r.component].format(r.layer)
        for panel, k, n in (("failure", r.repair_k, r.repair_n), ("healthy", r.breakage_k, r.breakage_n)):
            rows = questions[(questions.panel == panel) & (questions.role == "evaluation")]
            outcome = rows[column].astype("boolean")
            changed = outcome.sum() if panel == "failure" else (~outcome).sum()
            assert (int(changed), int(outcome.notna().sum())) == (k, n), (run.name, r.name, panel)
