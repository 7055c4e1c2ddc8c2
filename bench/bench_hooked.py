"""The hooked studies' work against what a researcher would otherwise write: TransformerLens ``generate`` inside
``model.hooks(...)`` and nnsight's ``generate`` with the same intervention on the Hugging Face weights.

Methods, each in its own subprocess, each in float32 and bfloat16 (``--dtypes``):

- ``reach_lens``: the TransformerLens engine, one ``Engine.generate`` over every request with a ``Silence`` or
  ``Steer`` intervention (or the routes in the requests);
- ``tl-generate``: TransformerLens's own ``model.generate`` (its KV cache on) inside
  ``with model.hooks(fwd_hooks=[("blocks.24.hook_mlp_out", hook)])``, one call per prompt (its K rows as one batch);
  routes as a per-route forward a user writes (embed, the route's blocks in order, ``ln_final``, unembed; one
  forward of the whole sequence per new token, TransformerLens's cache not knowing routes);
- ``nnsight``: nnsight's ``TransformersModel(..., task="text-generation").generate`` on the same checkpoint's
  Hugging Face weights, the intervention written at ``model.layers[24].mlp.output`` for every generated step
  (``tracer.iter[0:N]``), one call per prompt (its K rows as one batch). No routes row: a skip/repeat route runs a
  layer twice, which nnsight's edits of one forward do not express.

Work (``--works``), the same for every method:

- ``silence``, ``steer``: for each of ``--n`` ARC-Easy and ``--n`` SQuAD passage prompts (the chat format),
  K=16 samples of exactly 32 new tokens at T=0.8 (no top-k/top-p, EOS does not stop a row), with MLP 24's output
  zeroed (``silence``) or shifted by ``alpha * v`` (``steer``: v a fixed seeded unit vector, alpha 8);
- ``sweep``: the MLP sweep's greedy answers of ``--sweep-n`` ARC-Easy prompts under MLP-24 silencing, 16 new
  tokens each (a fixed budget: no stop, so every method does the same work);
- ``routes``: 16 distinct geometric skip/repeat routes of one SQuAD passage question (the routing study's random
  search), 16 greedy tokens each.

Greedy works report how many answers equal reach_lens float32's tokens before its first EOS (Hugging Face's
``min_new_tokens``, which nnsight's row needs for a fixed budget, masks EOS: the tokens after it differ by design). One prompt (one route) runs first as a
warm-up. Peak memory is each process's resident-set high-water mark during the timed work.

``--profile N`` runs the timed work under ``torch.profiler`` and prints, per method, the share of its operators'
self CPU time by kind (matrix products, softmax, sampling, copies and casts, the rest; in brackets that share of
the profiled wall time, in seconds, comparable across methods) and the N largest operators (the profiler's
overhead slows every method, the Python-heavy ones most; read shares, not speeds, from such a run).

    python bench/bench_hooked.py [--works silence steer sweep routes] [--methods ...] [--n 20] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sample import RESULT, peak_rss_mb, prompt_set, reset_peak_rss  # noqa: E402

from reach_lens.models import EMBEDDED_NAME  # noqa: E402

K, NEW_TOKENS, TEMPERATURE, GREEDY_TOKENS = 16, 32, 0.8, 16
LAYER, ALPHA, ROUTES = 24, 8.0, 16
METHODS = ("reach_lens", "tl-generate", "nnsight")
WORKS = ("silence", "steer", "sweep", "routes")
DTYPES = ("float32", "bfloat16")
OPERATOR_KINDS = {  # a profiled operator's kind, by the first of these its name contains
    "matrix products": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                        "aten::einsum", "scaled_dot_product"),
    "softmax (attention and the vocabulary's)": ("softmax",),
    "sampling": ("aten::multinomial", "aten::topk", "aten::sort", "aten::argmax", "aten::exponential"),
    "copies, casts, indexing": ("aten::copy_", "aten::to", "aten::_to_copy", "aten::cat", "aten::index", "aten::clone",
                                "aten::contiguous", "aten::stack", "aten::gather", "aten::scatter", "aten::fill_",
                                "aten::zero_", "aten::where"),
}


def work_prompts(work: str, n: int, sweep_n: int, tokenizer) -> list[str]:
    if work == "sweep":
        return prompt_set("arc", sweep_n, tokenizer)[0]
    if work == "routes":
        return prompt_set("passage", 1, tokenizer)[0]
    return prompt_set("arc", n, tokenizer)[0] + prompt_set("passage", n, tokenizer)[0]


def steering_vector(d_model: int):
    import torch

    v = torch.randn(d_model, generator=torch.Generator().manual_seed(0))
    return v / v.norm()


def routes_of(prompt: list[int], n_layers: int) -> list[tuple[int, ...]]:
    from reach_lens.probes import question_seed
    from reach_lens.routing import RandomSearch, SkipRepeat

    search = RandomSearch(SkipRepeat(n_layers), ROUTES, question_seed(0, "bench_hooked|skip_repeat|random"),
                          law="geometric")
    routes = search.run(lambda ps: [0.0] * len(ps)).routes
    assert len(set(routes)) == ROUTES
    return list(routes)


def reach_lens_runner(dtype, work: str):
    import torch

    from reach_lens.generate import Request, TransformerLensEngine, row_seed
    from reach_lens.interventions import Silence, Steer
    from reach_lens.models import encode, load_model

    model = load_model(EMBEDDED_NAME, dtype=dtype)
    if work == "steer":
        interventions = [Steer(LAYER, steering_vector(model.cfg.d_model), ALPHA, site="hook_mlp_out")]
    elif work in ("silence", "sweep"):
        interventions = [Silence(LAYER, "hook_mlp_out")]
    else:
        interventions = []

    def run(prompts: list[list[int]], routes=None) -> list[list[int]]:
        engine = TransformerLensEngine(model)  # a fresh one: no prompt prefix kept from the warm-up
        if work == "routes":
            requests = [Request(prompts[0], GREEDY_TOKENS, route=r, stop_token_ids=()) for r in routes]
        elif work == "sweep":
            requests = [Request(p, GREEDY_TOKENS, stop_token_ids=()) for p in prompts]
        else:
            requests = [Request(p, NEW_TOKENS, temperature=TEMPERATURE, seed=row_seed(i, k), stop_token_ids=())
                        for i, p in enumerate(prompts) for k in range(K)]
        with torch.no_grad():
            return [g.tokens for g in engine.generate(requests, interventions, batch_size=16)]

    return model, model.tokenizer, (lambda text: encode(model, text)), run


def tl_route_greedy(model, prompt: list[int], route: tuple[int, ...], new_tokens: int) -> list[int]:
    """Greedy tokens of ``prompt`` under ``route``, as a TransformerLens user writes a route: embed, the route's
    blocks in order, ``ln_final``, unembed, one forward of the whole sequence per token."""
    import torch

    tokens = torch.tensor([prompt])
    for _ in range(new_tokens):
        resid = model(tokens, stop_at_layer=0)  # the embedding (and positional embedding, if any)
        for layer in route:
            resid = model.blocks[layer](resid)
        logits = model.unembed(model.ln_final(resid[:, -1:]))
        tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tokens[0, len(prompt):].tolist()


def tl_generate_runner(dtype, work: str):
    import torch

    from reach_lens.models import encode, load_model

    model = load_model(EMBEDDED_NAME, dtype=dtype)
    name = f"blocks.{LAYER}.hook_mlp_out"
    delta = ALPHA * steering_vector(model.cfg.d_model).to(dtype)
    hook = (lambda act, hook: act + delta) if work == "steer" else (lambda act, hook: torch.zeros_like(act))

    def run(prompts: list[list[int]], routes=None) -> list[list[int]]:
        out = []
        with torch.no_grad():
            if work == "routes":
                return [tl_route_greedy(model, prompts[0], r, GREEDY_TOKENS) for r in routes]
            with model.hooks(fwd_hooks=[(name, hook)]):
                for ids in prompts:
                    x = torch.tensor([ids] * (1 if work == "sweep" else K))
                    y = model.generate(x, max_new_tokens=GREEDY_TOKENS if work == "sweep" else NEW_TOKENS,
                                       do_sample=work != "sweep", temperature=TEMPERATURE, stop_at_eos=False,
                                       use_past_kv_cache=True, verbose=False, return_type="tokens")
                    out += y[:, len(ids):].tolist()
        return out

    return model, model.tokenizer, (lambda text: encode(model, text)), run


def nnsight_runner(dtype, work: str):
    import warnings

    import torch
    from nnsight import TransformersModel

    from reach_lens.models import embedded_checkpoint_dir

    warnings.filterwarnings("ignore", module="nnsight")
    lm = TransformersModel(str(embedded_checkpoint_dir(EMBEDDED_NAME)), task="text-generation", dispatch=True,
                           dtype=dtype)
    tokenizer = lm.tokenizer
    delta = ALPHA * steering_vector(lm.config.hidden_size).to(dtype)

    def run(prompts: list[list[int]], routes=None) -> list[list[int]]:
        out, steps = [], GREEDY_TOKENS if work == "sweep" else NEW_TOKENS
        for ids in prompts:
            x = torch.tensor([ids] * (1 if work == "sweep" else K))
            sampling = {} if work == "sweep" else {"do_sample": True, "temperature": TEMPERATURE, "top_k": 0,
                                                   "top_p": 1.0}
            with lm.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=steps, min_new_tokens=steps,
                             pad_token_id=tokenizer.eos_token_id, **sampling) as tracer:
                for _ in tracer.iter[0:steps]:  # every forward of the generation: the prefill, then each token
                    if work == "steer":
                        lm.model.layers[LAYER].mlp.output[:] += delta
                    else:
                        lm.model.layers[LAYER].mlp.output[:] = 0
                tokens = tracer.result.save()
            out += tokens[:, len(ids):].tolist()
        return out

    return lm, tokenizer, (lambda text: tokenizer(text)["input_ids"]), run


def operator_kind(name: str) -> str:
    return next((kind for kind, parts in OPERATOR_KINDS.items() if any(p in name for p in parts)), "other")


def profile_shares(profiler, top: int) -> dict:
    """Self CPU time of a ``torch.profiler`` run: its share by `operator_kind` and the ``top`` operators' shares."""
    events = [(e.key, e.self_cpu_time_total, e.count) for e in profiler.key_averages()]
    total = sum(t for _, t, _ in events) or 1.0
    kinds: dict[str, float] = {}
    for name, t, _ in events:
        kinds[operator_kind(name)] = kinds.get(operator_kind(name), 0.0) + t / total
    largest = sorted(events, key=lambda e: -e[1])[:top]
    return {"kinds": kinds, "top": [(name, t / total, count) for name, t, count in largest]}


def worker(method: str, dtype_name: str, work: str, n: int, sweep_n: int, threads: int | None,
           profile: int = 0) -> dict:
    import gc

    import torch

    if threads:
        torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    runner = {"reach_lens": reach_lens_runner, "tl-generate": tl_generate_runner, "nnsight": nnsight_runner}[method]
    model, tokenizer, encode, run = runner(dtype, work)
    prompts = [encode(t) for t in work_prompts(work, n, sweep_n, tokenizer)]
    routes = routes_of(prompts[0], 30 if method == "nnsight" else model.cfg.n_layers) if work == "routes" else None
    run(prompts[:1], routes[:1] if routes else None)  # warm-up
    gc.collect()
    reset = reset_peak_rss()
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profile else None
    start = time.perf_counter()
    if profiler is None:
        tokens = run(prompts, routes)
    else:
        with profiler:
            tokens = run(prompts, routes)
    seconds = time.perf_counter() - start
    return {"profile": profile_shares(profiler, profile) if profiler else None, "method": method, "dtype": dtype_name, "work": work, "prompts": len(prompts),
            "prompt_tokens": sum(map(len, prompts)) / len(prompts), "tokens": sum(map(len, tokens)),
            "seconds": seconds, "peak_rss_mb": peak_rss_mb(), "peak_reset": reset, "threads": torch.get_num_threads(),
            "answers": tokens if work in ("sweep", "routes") else None, "eos": sorted(stop_ids(tokenizer))}


def stop_ids(tokenizer) -> set[int]:
    """The checkpoint's end tokens: the tokenizer's EOS and its generation config's (SmolLM2's chat end)."""
    from transformers import GenerationConfig

    from reach_lens.models import embedded_checkpoint_dir

    config = GenerationConfig.from_pretrained(embedded_checkpoint_dir(EMBEDDED_NAME)).eos_token_id
    return {tokenizer.eos_token_id, *([config] if isinstance(config, int) else config or [])} - {None}


def same_to_eos(reference: list[int], other: list[int], eos: set[int]) -> bool:
    """Whether ``other`` has ``reference``'s tokens before the reference's first end token (all of them if none)."""
    ends = [i for i, t in enumerate(reference) if t in eos]
    n = ends[0] if ends else len(reference)
    return other[:n] == reference[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--works", nargs="+", default=list(WORKS), choices=WORKS)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--n", type=int, default=20, help="ARC-Easy and SQuAD prompts each (silence, steer)")
    parser.add_argument("--sweep-n", type=int, default=64, help="ARC-Easy prompts of the sweep")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile the timed work: time shares by operator kind and the N largest operators")
    parser.add_argument("--worker", nargs=3, metavar=("METHOD", "DTYPE", "WORK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(RESULT + json.dumps(worker(*args.worker, args.n, args.sweep_n, args.threads, args.profile)), flush=True)
        return
    print(f"{EMBEDDED_NAME}, MLP {LAYER}: samples K={K} x {NEW_TOKENS} tokens at T={TEMPERATURE} on {args.n} + "
          f"{args.n} prompts; sweep {args.sweep_n} greedy x {GREEDY_TOKENS}; {ROUTES} routes x {GREEDY_TOKENS}")
    for work in args.works:
        results = {}
        for dtype in args.dtypes:
            for method in args.methods:
                if method == "nnsight" and work == "routes":
                    continue
                command = [sys.executable, __file__, "--worker", method, dtype, work, "--n", str(args.n),
                           "--sweep-n", str(args.sweep_n), "--profile", str(args.profile)] + (
                           ["--threads", str(args.threads)] if args.threads else [])
                done = subprocess.run(command, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    sys.exit(f"{method} {dtype} on {work} failed:\n{done.stderr[-3000:]}")
                results[method, dtype] = json.loads(next(line for line in done.stdout.splitlines()
                                                         if line.startswith(RESULT))[len(RESULT):])
        if len({r["prompt_tokens"] for r in results.values()}) != 1:
            sys.exit(f"the methods read different prompts: {[r['prompt_tokens'] for r in results.values()]} tokens")
        first = next(iter(results.values()))
        print(f"\n[{work}] {first['prompts']} prompts, {first['prompt_tokens']:.0f} prompt tokens on average, "
              f"{first['threads']} torch threads")
        speed = {key: r["tokens"] / r["seconds"] for key, r in results.items()}
        for (method, dtype), r in results.items():
            print(f"  {method:<12} {dtype:<9} {r['tokens']:>6} tokens in {r['seconds']:7.1f} s = "
                  f"{speed[method, dtype]:6.1f} tokens/s   peak RSS {r['peak_rss_mb']:6.0f} MB"
                  + ("" if r["peak_reset"] else " (process lifetime)") + (" (profiled)" if r["profile"] else ""))
            if r["profile"]:
                print("      self CPU time: " + ", ".join(f"{kind} {share:.0%} ({share * r['seconds']:.1f} s)"
                                                         for kind, share in sorted(r["profile"]["kinds"].items(),
                                                                                   key=lambda kv: -kv[1])))
                for name, share, count in r["profile"]["top"]:
                    print(f"        {share:6.1%}  {name} ({count} calls)")
        for dtype in args.dtypes:
            for peer in ("tl-generate", "nnsight"):
                if ("reach_lens", dtype) in speed and (peer, dtype) in speed:
                    print(f"  {dtype}: reach_lens / {peer} = {speed['reach_lens', dtype] / speed[peer, dtype]:.2f}x")
        for method in args.methods:
            if (method, "bfloat16") in speed and (method, "float32") in speed:
                print(f"  {method}: bfloat16 / float32 = {speed[method, 'bfloat16'] / speed[method, 'float32']:.2f}x")
        reference = results.get(("reach_lens", "float32"), {}).get("answers")
        if reference:
            for (method, dtype), r in results.items():
                eos = set(r["eos"])
                same = sum(same_to_eos(a, b, eos) for a, b in zip(reference, r["answers"]))
                print(f"  {method} {dtype}: {same}/{len(reference)} greedy answers equal to reach_lens float32's before its EOS")


if __name__ == "__main__":
    main()
