"""Sampling throughput: the reach_lens engine against Hugging Face ``generate`` on the same model.

Work, identical for both: for each of 20 prompts, K=16 samples of exactly 32 new tokens at T=0.8 (no
top-k/top-p; EOS does not stop a row: reach_lens requests with ``stop_token_ids=()``, HF with
``min_new_tokens=32``). The model is an embedded one (``--model``, default SmolLM2-135M-Instruct); prompts are in
its chat format ("native"), or in the plain "shared" format for a model without a chat template (Gemma 3 270M
base). Prompt sets:

- arc: the first 20 ARC-Easy test questions (about 90 prompt tokens);
- logiqa: the first 20 LogiQA test questions whose prompt has at least 280 tokens (about 320);
- squad: the first 20 embedded SQuAD questions in OLMES's 5-shot text format, for every model (about 1,250
  tokens, of which the ~1,000 of the shots are the same in every prompt: reach_lens computes them once).

HF runs one ``generate(num_return_sequences=16)`` per prompt (it expands the prompt to 16 rows before its
prefill); reach_lens runs one ``Engine.generate`` over all 16 x 20 requests (one prefill per prompt).
Each method runs in its own subprocess; peak memory is that process's resident-set high-water mark
during generation (reset after loading where Linux allows it). One prompt is run first as a warm-up.

    python bench/bench_sample.py [--model gemma3-270m] [--threads 1] [--n 20] [--sets arc logiqa squad]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from reach_lens.models import EMBEDDED_MODELS, EMBEDDED_NAME

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"  # ../shared/data beside the checkout
ARC_FILE = SHARED_DATA / "arc" / "ARC-Easy-test.jsonl"
LOGIQA_FILE = SHARED_DATA / "logiqa" / "Test.txt"
K, NEW_TOKENS, TEMPERATURE = 16, 32, 0.8
MIN_LOGIQA_TOKENS = 280


def prompt_format(tokenizer) -> str:
    return "native" if tokenizer.chat_template is not None else "shared"


def set_format(name: str, tokenizer) -> str:
    return "fewshot" if name == "squad" else prompt_format(tokenizer)


def prompt_set(name: str, n: int, tokenizer) -> list[str]:
    from reach_lens.tasks import get_task

    fmt = set_format(name, tokenizer)
    if name == "squad":
        task = get_task("squad")
        return [task.prompt(q, fmt, tokenizer) for q in task.load()[:n]]
    if name == "arc":
        task = get_task("arc_easy")
        return [task.prompt(q, fmt, tokenizer) for q in task.load(ARC_FILE)[:n]]
    task = get_task("logiqa")
    prompts = []
    for q in task.load(LOGIQA_FILE):
        text = task.prompt(q, fmt, tokenizer)
        if len(tokenizer(text, add_special_tokens=False)["input_ids"]) >= MIN_LOGIQA_TOKENS:
            prompts.append(text)
        if len(prompts) == n:
            break
    return prompts


def reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(method: str, model_name: str, set_name: str, n: int, threads: int | None) -> dict:
    import gc

    import torch

    from reach_lens.models import embedded_checkpoint_dir, encode, load_model

    if threads:
        torch.set_num_threads(threads)
    if method == "reach_lens":
        from reach_lens.generate import Request, TransformerLensEngine, row_seed

        model = load_model(model_name)
        fmt = set_format(set_name, model.tokenizer)
        prompts = [encode(model, p) for p in prompt_set(set_name, n, model.tokenizer)]

        def run(batch: list[list[int]]) -> int:
            engine = TransformerLensEngine(model)  # a fresh one: no prompt prefix kept from the warm-up
            requests = [Request(p, NEW_TOKENS, temperature=TEMPERATURE, seed=row_seed(i, k), stop_token_ids=())
                        for i, p in enumerate(batch) for k in range(K)]
            return sum(len(g.tokens) for g in engine.generate(requests))
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = embedded_checkpoint_dir(model_name)
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
        fmt = set_format(set_name, tokenizer)
        # the tokenizer's own special tokens, as reach_lens's encode adds them (Gemma's BOS; none for SmolLM2)
        prompts = [tokenizer(p)["input_ids"] for p in prompt_set(set_name, n, tokenizer)]

        def run(batch: list[list[int]]) -> int:
            total = 0
            with torch.no_grad():
                for ids in batch:
                    x = torch.tensor([ids])
                    out = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=True, temperature=TEMPERATURE,
                                      top_k=0, top_p=1.0, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                      num_return_sequences=K, pad_token_id=tokenizer.eos_token_id)
                    total += (out.shape[1] - x.shape[1]) * out.shape[0]
            return total

    run(prompts[:1])
    gc.collect()
    reset = reset_peak_rss()
    start = time.perf_counter()
    tokens = run(prompts)
    seconds = time.perf_counter() - start
    return {"method": method, "set": set_name, "format": fmt, "prompts": len(prompts),
            "prompt_tokens": sum(map(len, prompts)) / len(prompts), "tokens": tokens, "seconds": seconds,
            "peak_rss_mb": peak_rss_mb(), "peak_reset": reset, "threads": torch.get_num_threads()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=EMBEDDED_NAME, choices=list(EMBEDDED_MODELS), help="embedded model")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--n", type=int, default=20, help="prompts per set")
    parser.add_argument("--sets", nargs="+", default=["arc", "logiqa"], choices=["arc", "logiqa", "squad"])
    parser.add_argument("--worker", nargs=2, metavar=("METHOD", "SET"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.model, args.worker[1], args.n, args.threads)))
        return
    print(f"{args.model}: K={K} samples x {NEW_TOKENS} new tokens at T={TEMPERATURE}, {args.n} prompts per set")
    for set_name in args.sets:
        results = {}
        for method in ("reach_lens", "hf"):
            command = [sys.executable, __file__, "--worker", method, set_name, "--model", args.model,
                       "--n", str(args.n)]
            if args.threads:
                command += ["--threads", str(args.threads)]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                sys.exit(f"{method} on {set_name} failed:\n{done.stderr[-3000:]}")
            results[method] = json.loads(done.stdout.strip().splitlines()[-1])
        ours, hf = results["reach_lens"], results["hf"]
        if ours["prompt_tokens"] != hf["prompt_tokens"]:
            sys.exit(f"the methods read different prompts ({ours['prompt_tokens']} vs {hf['prompt_tokens']} tokens)")
        print(f"\n[{set_name}] {ours['prompts']} prompts ({ours['format']} format), {ours['prompt_tokens']:.0f} "
              f"prompt tokens on average, {ours['threads']} torch threads")
        for r in (ours, hf):
            print(f"  {r['method']:<10} {r['tokens']:>6} tokens in {r['seconds']:7.1f} s = "
                  f"{r['tokens'] / r['seconds']:6.1f} tokens/s   peak RSS {r['peak_rss_mb']:6.0f} MB"
                  + ("" if r["peak_reset"] else " (process lifetime)"))
        ratio = (ours["tokens"] / ours["seconds"]) / (hf["tokens"] / hf["seconds"])
        print(f"  throughput ratio reach_lens / HF = {ratio:.2f}x")


if __name__ == "__main__":
    main()
