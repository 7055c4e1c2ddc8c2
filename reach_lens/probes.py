"""Task-level probes: deploy (greedy, one answer), sample (K answers at a temperature), recognize
(multiple-choice likelihood). Every probe runs under any list of hooks, scoped to the call.

    rows = deploy(model, task, questions, "native", hooks=Silence("mlp", 12).hooks(model))
    cands = sample(model, task, questions, "native", K=16, temperature=0.8, seed=0)
    recog = recognize(model, task, questions)          # one DataFrame row per question

A generation record is a dict: ``question_id``, ``text`` (the completion, cut before a stop string),
``answer`` and ``correct`` (``task.grade``), ``mean_logprob`` (mean untempered token log-probability),
``length`` (generated tokens) and ``finish_reason`` ("eos" | "stop" | "length").
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import pandas as pd
import torch
from transformer_lens import HookedTransformer
from transformer_lens.utilities import apply_softcap

from reach_lens.models import encode
from reach_lens.sampling import Generation, Hooks, PrefixState, generate
from reach_lens.tasks import Question, Task

NORMS = ("tokens", "chars")


def prompt_ids(model: HookedTransformer, task: Task, questions: Sequence[Question], fmt: str) -> list[list[int]]:
    """Token ids of each question's prompt in format ``fmt`` (what deploy and sample feed the model)."""
    return [encode(model, task.prompt(q, fmt, model.tokenizer)) for q in questions]


def question_seed(seed: int, question_id: str) -> int:
    """The sampling seed of one question: a stable 63-bit hash of ``(seed, question_id)``."""
    digest = hashlib.sha256(f"{seed}:{question_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _record(task: Task, q: Question, gen: Generation) -> dict:
    text = gen.text if gen.text is not None else ""
    graded = task.grade(q, text)
    return {
        "question_id": q.id,
        "text": text,
        "answer": graded.answer,
        "correct": graded.correct,
        "mean_logprob": gen.mean_logprob,
        "length": len(gen.tokens),
        "finish_reason": gen.finish_reason,
    }


def _check_tokenizer(model: HookedTransformer) -> None:
    if model.tokenizer is None:
        raise ValueError("probes need a model with a tokenizer (prompts and completions are text)")


def deploy(
    model: HookedTransformer,
    task: Task,
    questions: Sequence[Question],
    fmt: str,
    hooks: Hooks = (),
    batch_size: int = 16,
    start_layer: int | None = None,
    prefix: PrefixState | None = None,
) -> list[dict]:
    """Greedy decoding, one record per question (see the module docstring).

    ``start_layer``/``prefix`` reuse clean prompt prefixes (``make_prefix(model, prompt_ids(...), layers)``)
    when every hook sits at layer ``>= start_layer``; the records are the same as without.
    """
    _check_tokenizer(model)
    gens = generate(
        model, prompt_ids(model, task, questions, fmt), max_new_tokens=task.max_new_tokens(fmt),
        stop_strings=task.stop_strings(fmt), hooks=hooks, batch_size=batch_size,
        start_layer=start_layer, prefix=prefix,
    )
    return [_record(task, q, g[0]) for q, g in zip(questions, gens)]


def sample(
    model: HookedTransformer,
    task: Task,
    questions: Sequence[Question],
    fmt: str,
    K: int,
    temperature: float,
    seed: int,
    hooks: Hooks = (),
    batch_size: int = 16,
) -> list[list[dict]]:
    """``K`` samples per question at ``temperature``; ``result[i][k]`` is a record (module docstring).

    Question ``q`` samples with ``question_seed(seed, q.id)``, so its samples do not depend on which
    other questions are in the call, their order, or ``batch_size``.
    """
    _check_tokenizer(model)
    if temperature <= 0:
        raise ValueError(f"temperature {temperature} out of range for sampling: expected > 0 (deploy is greedy)")
    gens = generate(
        model, prompt_ids(model, task, questions, fmt), n_per_prompt=K, temperature=temperature,
        seeds=[question_seed(seed, q.id) for q in questions], max_new_tokens=task.max_new_tokens(fmt),
        stop_strings=task.stop_strings(fmt), hooks=hooks, batch_size=batch_size,
    )
    return [[_record(task, q, g) for g in gs] for q, gs in zip(questions, gens)]


def recognize(
    model: HookedTransformer,
    task: Task,
    questions: Sequence[Question],
    hooks: Hooks = (),
    batch_size: int = 32,
    norm: str = "tokens",
) -> pd.DataFrame:
    """Multiple-choice recognition by option log-likelihood, one row per question.

    For each option, ``task.recognition_items`` gives (context, continuation); context and continuation
    are tokenized separately and concatenated (context with BOS as ``encode`` gives it, continuation
    without special tokens), and the continuation's log-likelihood is the sum of its tokens'
    log-probabilities. Columns: ``question_id``, ``gold_index``, ``loglik`` (list over options),
    ``norm_loglik`` (loglik divided by the continuation's token count, ``norm="tokens"``, or by its
    character count, ``norm="chars"``, as lm-evaluation-harness's acc_norm), ``pred_sum`` and
    ``pred_norm`` (argmax option index of each), ``gold_rank`` (1 + options with a higher loglik).
    Sequences run right-padded in forwards of ``batch_size`` sequences, longest first.
    """
    _check_tokenizer(model)
    if norm not in NORMS:
        raise ValueError(f"norm {norm!r} unknown; expected one of {NORMS}")
    if task.kind != "mc":
        raise ValueError(f"task {task.name!r} is {task.kind}; recognition needs a multiple-choice task")
    if batch_size < 1:
        raise ValueError(f"batch_size {batch_size} out of range: expected >= 1")
    sequences: list[tuple[list[int], int]] = []  # (context + continuation ids, continuation length)
    owners: list[tuple[int, int]] = []  # (question index, option index)
    divisors: list[int] = []
    for i, q in enumerate(questions):
        context, continuations = task.recognition_items(q)
        context_ids = encode(model, context)
        if not context_ids:
            raise ValueError(f"question {q.id!r}: empty context (no token predicts the first continuation token)")
        for j, continuation in enumerate(continuations):
            cont_ids = model.tokenizer(continuation, add_special_tokens=False)["input_ids"]
            if not cont_ids:
                raise ValueError(f"question {q.id!r}: option {j} has an empty continuation")
            sequences.append((context_ids + cont_ids, len(cont_ids)))
            owners.append((i, j))
            divisors.append(len(cont_ids) if norm == "tokens" else len(continuation))
    logliks = _continuation_logliks(model, sequences, hooks, batch_size)
    per_question: list[list[float]] = [[] for _ in questions]
    per_question_norm: list[list[float]] = [[] for _ in questions]
    for (i, _), ll, divisor in zip(owners, logliks, divisors):
        per_question[i].append(ll)
        per_question_norm[i].append(ll / divisor)
    rows = []
    for q, ll, nll in zip(questions, per_question, per_question_norm):
        gold = q.gold_index
        rows.append({
            "question_id": q.id,
            "gold_index": gold,
            "loglik": ll,
            "norm_loglik": nll,
            "pred_sum": max(range(len(ll)), key=ll.__getitem__),
            "pred_norm": max(range(len(nll)), key=nll.__getitem__),
            "gold_rank": 1 + sum(x > ll[gold] for x in ll),
        })
    return pd.DataFrame(rows, columns=["question_id", "gold_index", "loglik", "norm_loglik", "pred_sum",
                                       "pred_norm", "gold_rank"])


def _continuation_logliks(model: HookedTransformer, sequences: list[tuple[list[int], int]], hooks: Hooks,
                          batch_size: int) -> list[float]:
    """Summed log-probability of the last ``n`` tokens of each sequence, in batched right-padded forwards.

    Only the positions that predict continuation tokens go through the unembedding."""
    device = model.cfg.device
    order = sorted(range(len(sequences)), key=lambda s: -len(sequences[s][0]))
    out = [0.0] * len(sequences)
    with torch.no_grad(), model.hooks(fwd_hooks=list(hooks)):
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            width = len(sequences[chunk[0]][0])
            tokens = torch.zeros((len(chunk), width), dtype=torch.long, device=device)
            mask = torch.zeros_like(tokens)
            rows, positions, targets = [], [], []
            for r, s in enumerate(chunk):
                ids, n = sequences[s]
                tokens[r, : len(ids)] = torch.tensor(ids)
                mask[r, : len(ids)] = 1
                rows += [r] * n
                positions += range(len(ids) - n - 1, len(ids) - 1)
                targets += ids[len(ids) - n :]
            resid = model(tokens, attention_mask=mask, stop_at_layer=model.cfg.n_layers)
            if model.cfg.normalization_type is not None:
                resid = model.ln_final(resid)
            picked = resid[torch.tensor(rows), torch.tensor(positions)]
            logits = apply_softcap(model.unembed(picked[None])[0], model.cfg.output_logits_soft_cap)
            logp = torch.log_softmax(logits.float(), dim=-1)
            token_logp = logp[torch.arange(len(targets)), torch.tensor(targets, device=device)]
            sums = torch.zeros(len(chunk), dtype=torch.float64).index_add_(0, torch.tensor(rows), token_logp.double().cpu())
            for r, s in enumerate(chunk):
                out[s] = float(sums[r])
    return out
