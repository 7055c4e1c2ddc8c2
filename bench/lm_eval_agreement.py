"""Per-document agreement of reach_lens's lm-eval tasks with lm-evaluation-harness itself, on the embedded model.

The same float32 weights on the CPU: lm-eval's ``HFLM`` over ``embedded_checkpoint_dir()`` (batch size 1, no padding;
``--lm-batch-size``), reach_lens's ``load_model()``. Two lm-eval tasks read from local files by YAMLs that ``include:`` the built-in ones:

- generation: ``gsm8k`` (5-shot, lm-eval's default format ``fewshot``) over GSM8K's ``test.jsonl`` (its shots come from
  the same file, the document itself excluded, as lm-eval does when the few-shot split is the test split). lm-eval's
  ``simple_evaluate(..., log_samples=True, limit=n)`` against ``probes.deploy`` (greedy) + the task's ``grade``,
  compared per document: the prompt, the completion, and under each of gsm8k's two filters (strict-match,
  flexible-extract) the filtered answer and the exact_match verdict. Where the completions differ, both models are
  run teacher-forced along lm-eval's tokens to the first step where their argmax differs, and the top-2 logit margins
  there are printed (a near tie is generation numerics, not the adapter).
- multiple choice: ``arc_easy`` (0-shot) over ARC-Easy's validation file. ``simple_evaluate`` against
  ``probes.recognize(norm="chars")``, compared per document: the option chosen under acc and under acc_norm, the
  largest per-option log-likelihood difference, and the token ids of every (context, continuation) pair (reach_lens:
  context and continuation encoded separately; HFLM's ``_encode_pair``: the whole encoded, split after the context).

Prints the counts and every disagreement (``--json FILE`` also writes them); ``--skip gen|mc`` runs one half.
On a busy machine ``--threads 1`` is faster: two threads on two shared cores stall (measured 10x).

    python bench/lm_eval_agreement.py [--gsm8k PATH] [--arc PATH] [--n-gen 100] [--n-mc 570] [--threads 2]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only: lm-eval must never reach the hub
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
import tempfile
import time
from pathlib import Path

GSM8K = "/work/shared/data/gsm8k/test.jsonl"
ARC = "/work/shared/data/arc/ARC-Easy-validation.jsonl"


def write_yamls(directory: Path, gsm8k: Path, arc: Path) -> None:
    """gsm8k_local and arc_easy_local: lm-eval's built-in YAMLs, data pointed at the local files."""
    import lm_eval.tasks

    builtin = Path(lm_eval.tasks.__file__).parent
    (directory / "gsm8k_local.yaml").write_text(
        f"include: {builtin / 'gsm8k' / 'gsm8k.yaml'}\ntask: gsm8k_local\ndataset_path: json\ndataset_name: null\n"
        f"dataset_kwargs:\n  data_files:\n    test: {gsm8k.resolve()}\n"
        "training_split: null\nfewshot_split: test\ntest_split: test\n")
    (directory / "arc_easy_local.yaml").write_text(
        f"include: {builtin / 'arc' / 'arc_easy.yaml'}\ntask: arc_easy_local\ndataset_path: json\ndataset_name: null\n"
        f"dataset_kwargs:\n  data_files:\n    validation: {arc.resolve()}\n"
        "training_split: null\ntest_split: null\nvalidation_split: validation\n")


def lm_eval_samples(lm, directory: Path, task: str, n: int) -> tuple[dict[str, list[dict]], float]:
    """lm-eval's logged samples of ``task`` by filter name (each in document order), and the wall time."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    start = time.perf_counter()
    out = simple_evaluate(model=lm, tasks=[task], task_manager=TaskManager(include_defaults=False,
                          include_path=str(directory)), limit=n, log_samples=True, bootstrap_iters=0)
    seconds = time.perf_counter() - start
    by_filter: dict[str, list[dict]] = {}
    for s in out["samples"][task]:
        by_filter.setdefault(s["filter"], []).append(s)
    return {k: sorted(v, key=lambda s: s["doc_id"]) for k, v in by_filter.items()}, seconds


def divergence(hf, model, prompt_ids: list[int], tokens: list[int]) -> str:
    """Where reach_lens's model first disagrees with lm-eval's greedy tokens (teacher-forced), with both margins."""
    import torch

    ids = torch.tensor([prompt_ids + tokens])
    with torch.no_grad():
        theirs = hf(ids).logits[0, len(prompt_ids) - 1:-1].float()
        ours = model(ids)[0, len(prompt_ids) - 1:-1].float()
    for step in range(len(tokens)):
        if int(ours[step].argmax()) != tokens[step]:
            top_hf, top_tl = theirs[step].topk(2), ours[step].topk(2)
            return (f"step {step}: lm-eval's token {tokens[step]} (HF argmax {int(top_hf.indices[0])}, HF top-2 margin "
                    f"{float(top_hf.values[0] - top_hf.values[1]):.2e}); reach_lens argmax {int(top_tl.indices[0])} "
                    f"(TL top-2 margin {float(top_tl.values[0] - top_tl.values[1]):.2e}); max |HF - TL logit| there "
                    f"{float((theirs[step] - ours[step]).abs().max()):.1e}")
    return "no argmax difference along lm-eval's tokens (the difference is after them: a stop or the budget)"


def generation(lm, hf, model, directory: Path, n: int) -> dict:
    from reach_lens import probes
    from reach_lens.tasks.lm_eval import lm_eval_task

    samples, lm_seconds = lm_eval_samples(lm, directory, "gsm8k_local", n)
    tasks = {f: lm_eval_task(directory / "gsm8k_local.yaml", filter_name=f) for f in samples}
    first = next(iter(tasks.values()))
    questions = first.load()[:n]
    start = time.perf_counter()
    rows = probes.deploy(model, first, questions, first.default_format)
    ours_seconds = time.perf_counter() - start
    tokenizer = model.tokenizer
    report = {"n": len(questions), "lm_eval_s": round(lm_seconds, 1), "reach_lens_s": round(ours_seconds, 1),
              "prompts_equal": 0, "completions_equal": 0, "filters": {}, "differences": []}
    base = samples[next(iter(samples))]
    for i, (q, row) in enumerate(zip(questions, rows)):
        s = base[i]
        prompt = first.prompt(q, first.default_format, tokenizer)
        report["prompts_equal"] += prompt == s["arguments"][0][0]
        text, theirs = row["text"], s["resps"][0][0]
        if text == theirs:
            report["completions_equal"] += 1
        else:
            prompt_ids = tokenizer(prompt)["input_ids"]
            lm_tokens = tokenizer(theirs, add_special_tokens=False)["input_ids"]
            report["differences"].append({"doc": i, "id": q.id, "lm_eval": theirs, "reach_lens": text,
                                          "where": divergence(hf, model, prompt_ids, lm_tokens)})
    for name, task in tasks.items():
        tally = {"answers_equal": 0, "verdicts_equal": 0, "lm_eval_correct": 0, "reach_lens_correct": 0,
                 "grade_of_lm_eval_text_equal": 0, "disagreements": []}
        for i, (q, row) in enumerate(zip(questions, rows)):
            s = samples[name][i]
            theirs_answer, theirs_ok = s["filtered_resps"][0], bool(s["exact_match"] == 1.0)
            graded = task.grade(q, row["text"])
            ours_answer = task.filtered(q, row["text"])
            tally["answers_equal"] += ours_answer == theirs_answer
            tally["verdicts_equal"] += graded.correct == theirs_ok
            tally["lm_eval_correct"] += theirs_ok
            tally["reach_lens_correct"] += graded.correct
            tally["grade_of_lm_eval_text_equal"] += task.grade(q, s["resps"][0][0]).correct == theirs_ok
            if graded.correct != theirs_ok or ours_answer != theirs_answer:
                tally["disagreements"].append({"doc": i, "id": q.id, "lm_eval": [theirs_answer, theirs_ok],
                                               "reach_lens": [ours_answer, graded.correct]})
        report["filters"][name] = tally
    return report


def multiple_choice(lm, model, directory: Path, n: int) -> dict:
    import numpy as np

    from reach_lens import probes
    from reach_lens.models import encode
    from reach_lens.tasks.lm_eval import lm_eval_task

    samples, lm_seconds = lm_eval_samples(lm, directory, "arc_easy_local", n)
    (docs,) = samples.values()
    task = lm_eval_task(directory / "arc_easy_local.yaml")
    questions = task.load()[:n]
    start = time.perf_counter()
    rows = probes.recognize(model, task, questions, norm=task.recognition_norm)
    ours_seconds = time.perf_counter() - start
    report = {"n": len(questions), "lm_eval_s": round(lm_seconds, 1), "reach_lens_s": round(ours_seconds, 1),
              "acc_equal": 0, "acc_norm_equal": 0, "lm_eval_acc": 0, "lm_eval_acc_norm": 0,
              "reach_lens_acc": 0, "reach_lens_acc_norm": 0, "max_abs_dloglik": 0.0, "pairs": 0, "pairs_same_tokens": 0,
              "token_differences": [], "disagreements": []}
    for i, (q, row, s) in enumerate(zip(questions, rows, docs)):
        lls = np.array([r[0] for r in s["filtered_resps"]])
        lengths = np.array([float(len(c)) for c in task.choices(q)])
        pred, pred_norm = int(np.argmax(lls)), int(np.argmax(lls / lengths))
        report["acc_equal"] += pred == row["pred_sum"]
        report["acc_norm_equal"] += pred_norm == row["pred_norm"]
        report["lm_eval_acc"] += int(s["acc"] == 1.0)
        report["lm_eval_acc_norm"] += int(s["acc_norm"] == 1.0)
        report["reach_lens_acc"] += row["pred_sum"] == q.gold_index
        report["reach_lens_acc_norm"] += row["pred_norm"] == q.gold_index
        report["max_abs_dloglik"] = max(report["max_abs_dloglik"], float(np.abs(lls - np.array(row["loglik"])).max()))
        if pred != row["pred_sum"] or pred_norm != row["pred_norm"]:
            report["disagreements"].append({"doc": i, "id": q.id, "lm_eval": [pred, pred_norm],
                                            "reach_lens": [row["pred_sum"], row["pred_norm"]],
                                            "lm_eval_ll": lls.tolist(), "reach_lens_ll": row["loglik"]})
        context, continuations = task.recognition_items(q)
        for (lm_context, lm_continuation), continuation in zip(s["arguments"], continuations):
            ours = (encode(model, context), model.tokenizer(continuation, add_special_tokens=False)["input_ids"])
            theirs = lm._encode_pair(lm_context, lm_continuation)
            report["pairs"] += 1
            if (list(ours[0]), list(ours[1])) == (list(theirs[0]), list(theirs[1])):
                report["pairs_same_tokens"] += 1
            else:
                report["token_differences"].append({"doc": i, "continuation": lm_continuation,
                                                    "reach_lens": ours, "lm_eval": theirs})
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gsm8k", type=Path, default=Path(GSM8K), help="GSM8K test.jsonl")
    parser.add_argument("--arc", type=Path, default=Path(ARC), help="ARC-Easy jsonl (HF ai2_arc layout)")
    parser.add_argument("--n-gen", type=int, default=100, help="GSM8K documents (the first n)")
    parser.add_argument("--n-mc", type=int, default=570, help="ARC-Easy documents (the first n)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lm-batch-size", type=int, default=1, help="HFLM's batch size (1: no padding)")
    parser.add_argument("--skip", choices=("gen", "mc"), help="run only the other measurement")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    import torch
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM

    from reach_lens.models import embedded_checkpoint_dir, load_model

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    path = embedded_checkpoint_dir()
    lm = HFLM(pretrained=str(path), dtype="float32", device="cpu", batch_size=args.lm_batch_size)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model = load_model(dtype=torch.float32)
    report: dict = {"model": path.name, "threads": args.threads}
    with tempfile.TemporaryDirectory(prefix="lm_eval_agreement-") as tmp:
        directory = Path(tmp)
        write_yamls(directory, args.gsm8k, args.arc)
        if args.skip != "mc":
            report["multiple_choice"] = multiple_choice(lm, model, directory, args.n_mc)
        if args.skip != "gen":
            report["generation"] = generation(lm, hf, model, directory, args.n_gen)
    report["wall_s"] = round(time.perf_counter() - start, 1)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


def print_report(report: dict) -> None:
    print(f"\n== lm-eval agreement, {report['model']} float32 CPU, {report['threads']} threads, "
          f"wall {report['wall_s']} s")
    mc = report.get("multiple_choice")
    if mc:
        print(f"\narc_easy (0-shot), n={mc['n']}: lm-eval {mc['lm_eval_s']} s, reach_lens recognize {mc['reach_lens_s']} s")
        print(f"  chosen option equal: acc {mc['acc_equal']}/{mc['n']}, acc_norm {mc['acc_norm_equal']}/{mc['n']}")
        print(f"  accuracy: lm-eval acc {mc['lm_eval_acc']}/{mc['n']} acc_norm {mc['lm_eval_acc_norm']}/{mc['n']}; "
              f"reach_lens {mc['reach_lens_acc']}/{mc['n']} and {mc['reach_lens_acc_norm']}/{mc['n']}")
        print(f"  max |loglik difference| {mc['max_abs_dloglik']:.2e}; token ids equal for "
              f"{mc['pairs_same_tokens']}/{mc['pairs']} (context, continuation) pairs")
        for d in mc["disagreements"]:
            print(f"  DISAGREE doc {d['doc']}: lm-eval {d['lm_eval']} reach_lens {d['reach_lens']} "
                  f"ll {d['lm_eval_ll']} vs {d['reach_lens_ll']}")
        for d in mc["token_differences"][:10]:
            print(f"  TOKENS doc {d['doc']} {d['continuation']!r}: reach_lens {d['reach_lens']} lm-eval {d['lm_eval']}")
    gen = report.get("generation")
    if gen:
        print(f"\ngsm8k (5-shot), n={gen['n']}: lm-eval {gen['lm_eval_s']} s, reach_lens deploy {gen['reach_lens_s']} s")
        print(f"  prompts equal {gen['prompts_equal']}/{gen['n']}, completions equal {gen['completions_equal']}/{gen['n']}")
        for name, t in gen["filters"].items():
            print(f"  {name}: filtered answers equal {t['answers_equal']}/{gen['n']}, verdicts equal "
                  f"{t['verdicts_equal']}/{gen['n']} (correct: lm-eval {t['lm_eval_correct']}, reach_lens "
                  f"{t['reach_lens_correct']}); grade() of lm-eval's own completions equal "
                  f"{t['grade_of_lm_eval_text_equal']}/{gen['n']}")
            for d in t["disagreements"]:
                print(f"    DISAGREE doc {d['doc']}: lm-eval {d['lm_eval']} reach_lens {d['reach_lens']}")
        for d in gen["differences"]:
            print(f"  COMPLETION doc {d['doc']}: {d['where']}\n    lm-eval:    {d['lm_eval'][:160]!r}\n"
                  f"    reach_lens: {d['reach_lens'][:160]!r}")


if __name__ == "__main__":
    main()
