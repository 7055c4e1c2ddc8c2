"""Hook overhead: a forward with one silencing hook against the plain forward, on the same batch.

Work: the embedded SmolLM2-135M-Instruct, batch 16 x 128 random tokens, full forward to logits. The
two variants alternate (plain, hooked, plain, hooked, ...) so that drift in machine load hits both.

    python bench/bench_hooks.py [--repeats 5] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from reach_lens import load_model
from reach_lens.interventions import Silence


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model()
    tokens = torch.randint(0, model.cfg.d_vocab, (16, 128), generator=torch.Generator().manual_seed(0))
    hooks = Silence(model.cfg.n_layers // 2, "hook_mlp_out").hooks(model)
    times = {"plain": [], "hooked": []}
    with torch.no_grad():
        model(tokens[:2, :16])  # warm-up
        for _ in range(args.repeats):
            for name in ("plain", "hooked"):
                start = time.perf_counter()
                with model.hooks(fwd_hooks=hooks if name == "hooked" else []):
                    model(tokens)
                times[name].append(time.perf_counter() - start)
    plain, hooked = statistics.median(times["plain"]), statistics.median(times["hooked"])
    print(f"forward, batch 16 x 128 tokens, {torch.get_num_threads()} threads, median of {args.repeats}:")
    print(f"  plain  {plain:.3f} s\n  hooked {hooked:.3f} s (one zero-ablation hook at blocks.{model.cfg.n_layers // 2}.hook_mlp_out)")
    print(f"  ratio hooked/plain = {hooked / plain:.3f}")


if __name__ == "__main__":
    main()
