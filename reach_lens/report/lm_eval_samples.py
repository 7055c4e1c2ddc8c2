"""A run's records as lm-evaluation-harness sample files, so the run opens wherever lm-eval's ``--log_samples``
output does: one ``<out>/<model>/samples_<task>_<time>.jsonl`` per ``records`` table, in lm-eval 0.4's layout
(``EvaluationTracker.save_results_samples``: ``arguments`` as ``gen_args_i``/``arg_j``, responses as strings).

Per document (one question): ``doc_id`` (its position), ``doc`` (the stored question: id, text, context, options,
labels, gold, aliases), ``target`` (the gold answer), ``arguments`` (two requests on the stored prompt: the greedy
answer, then the K candidates with their decoding), ``resps`` ([[greedy text], [K candidate texts]]),
``filtered_resps`` ([greedy answer, majority-vote answer], lm-eval's "[invalid]" where none was extracted),
``filter`` (the grader), ``metrics`` and their values (``exact_match`` of the greedy answer, ``maj@K``, ``pass@1``
and ``pass@K`` (unbiased, from the hits), ``hits``), and ``doc_hash``, ``prompt_hash``, ``target_hash`` computed
as lm-eval computes them (sha256 of the doc's indented JSON, of the prompt, of the target).
"""
from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from pathlib import Path

from reach_lens.errors import UserError
from reach_lens.report.collect import collect
from reach_lens.report.page import cell_key
from reach_lens.report.rows import QUESTION_FIELDS, cell_questions, questions_frames
from reach_lens.stats import pass_at_k

INVALID = "[invalid]"  # what lm-eval's regex filters return when nothing matches
OUT = "lm_eval_samples"


def hash_string(text: str) -> str:
    """lm-eval's ``utils.hash_string``."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sanitize_model_name(name: str) -> str:
    """lm-eval's ``utils.sanitize_model_name`` (the directory of a model's files)."""
    return re.sub(r"[\"<>:/|\\?*\[\]]+", "__", name)


def sanitize_task_name(name: str) -> str:
    """lm-eval's ``utils.sanitize_task_name``."""
    return re.sub(r"\W", "_", name)


def samples(store, questions: dict[str, list]) -> list[dict]:
    """The sample rows of one ``records`` store, with ``questions`` (``QUESTION_FIELDS`` rows by id, prompts
    whole)."""
    p = store.protocol
    at = {f: i for i, f in enumerate(QUESTION_FIELDS)}
    greedy = {"until": list(p.stop_strings), "max_gen_toks": p.max_new_tokens, "do_sample": False, "temperature": 0.0}
    drawn = {"until": list(p.stop_strings), "max_gen_toks": p.max_new_tokens, "do_sample": p.probe == "sample",
             "temperature": p.temperature, "top_p": p.top_p, "repeats": p.K, "probe": p.probe}
    out = []
    for doc_id, r in enumerate(store.read("records").to_dict("records")):
        q = questions.get(r["question_id"])
        if q is None or q[at["prompt"]] is None:
            raise UserError(f"{store.root}: question {r['question_id']!r} has no stored prompt (stores written before "
                            "the questions table lack it): rerun the study into this directory, which computes "
                            "nothing again and stores the questions with their prompts")
        doc = {f: q[at[f]] for f in QUESTION_FIELDS if f != "prompt"}
        prompt, K, hits = q[at["prompt"]], int(r["K"]), int(r["hits"])
        cands = list(r["candidates"])
        metrics = {"exact_match": float(bool(r["d"])), f"maj@{K}": float(bool(r["vote_correct"])),
                   "pass@1": pass_at_k(K, hits, 1), f"pass@{K}": pass_at_k(K, hits, K), "hits": hits}
        out.append({
            "doc_id": doc_id, "doc": doc, "target": str(r["gold"]),
            "arguments": {"gen_args_0": {"arg_0": prompt, "arg_1": greedy}, "gen_args_1": {"arg_0": prompt,
                                                                                         "arg_1": drawn}},
            "resps": [[str(r["deployed_text"])], [str(c["text"]) for c in cands]],
            "filtered_resps": [r["deployed_answer"] or INVALID, r["vote_answer"] or INVALID],
            "filter": p.grader, "metrics": list(metrics),
            "doc_hash": hash_string(json.dumps(doc, indent=2, ensure_ascii=False)),
            "prompt_hash": hash_string(prompt), "target_hash": hash_string(str(r["gold"])), **metrics})
    return out


def write_lm_eval_samples(run_dir: Path | str, out: Path | str | None = None) -> list[Path]:
    """Write one lm-eval samples file per ``records`` store of ``run_dir`` (any directory ``collect`` reads) under
    ``out`` (default ``run_dir/lm_eval_samples``), ``<model>/samples_<task>_<store>_<time>.jsonl``; returns them."""
    run = collect(run_dir)
    out = Path(out) if out is not None else run.path / OUT
    cells: dict[str, list] = {}
    for store in run.stores:
        cells.setdefault(cell_key(store), []).append(store)
    date_id = datetime.now().isoformat().replace(":", "-")  # lm-eval's file time stamp
    written: list[Path] = []
    for stores in cells.values():
        frames = questions_frames(stores)
        ids = list(dict.fromkeys(i for f in frames if len(f) for i in f["question_id"]))
        rows, prefix = cell_questions(frames, ids)
        for row in rows:
            row[-1] = None if row[-1] is None else prefix + row[-1]
        questions = {row[0]: row for row in rows}
        for store in stores:
            if "records" not in store.tables:
                continue
            p = store.protocol
            directory = out / sanitize_model_name(p.model)
            directory.mkdir(parents=True, exist_ok=True)
            task = sanitize_task_name(f"{p.task}_{store.root.name}")
            path = directory / f"samples_{task}_{date_id}.jsonl"
            n = 1
            while path in written:
                n += 1
                path = directory / f"samples_{task}_{n}_{date_id}.jsonl"
            lines = [json.dumps(sample, ensure_ascii=False) + "\n" for sample in samples(store, questions)]
            path.write_text("".join(lines), encoding="utf-8")
            written.append(path)
    if not written:
        raise UserError(f"{run.path}: no records table to export (lm-eval samples need K candidates per question; "
                        "routing searches and screens have none)")
    return written
