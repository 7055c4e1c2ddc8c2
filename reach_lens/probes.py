"""Task-level probes: deploy (greedy, one answer), sample (K answers at a temperature), route (greedy under
layer routes), recognize (multiple-choice likelihood). Every probe runs on one generation engine
(``reach_lens.generate``), under any sequence of interventions (``reach_lens.interventions``) for the call: the
engine builds their hooks, so what a protocol records of them (``to_dict()``) is what ran. ``model`` is a
``HookedTransformer`` (its engine is made once and kept) or an ``Engine``.

    rows = deploy(model, task, questions, "native", interventions=[Silence(12, "hook_mlp_out")])
    cands = sample(model, task, questions, "native", K=16, temperature=0.8, seed=0)
    routed = route(model, task, questions, "native", [[(0, 1, 1, 2, ...), ...], ...])   # routes per question
    recog = recognize(model, task, questions)          # one dict per question

Every probe returns plain dicts, one per question (``deploy``, ``recognize``) or K per question (``sample``,
``route``: a list of K per question), so any of them is a table in one line (``pd.DataFrame(recog)``,
``records.candidate_frame(questions, cands)``, ``records.record_table``). Generation probes return candidate
dicts (``records.candidate``): ``text``, ``answer``, ``correct``, ``mean_logprob``, ``length``, ``entropy``,
``finish_reason``, ``route``, ``hidden``.

Seeds: sample k of question q draws with ``row_seed(question_seed(seed, q.id), k)``, so the samples of a
question depend on (model, prompt, T, seed) only: not on the other questions of the call, their order, the
batch size, or the study asking.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from transformer_lens import HookedTransformer

from reach_lens.generate import Engine, LoglikRequest, NonFiniteLogits, Request, engine_for, row_seed
from reach_lens.interventions import Intervention
from reach_lens.records import candidate
from reach_lens.tasks import Question, Task

NORMS = ("tokens", "chars")
Model = HookedTransformer | Engine


def _engine(model: Model) -> Engine:
    engine = engine_for(model)
    if engine.tokenizer is None:
        raise ValueError("probes need a model with a tokenizer (prompts and completions are text)")
    return engine


def _naming_questions(run, owners: Sequence[Question]):
    """``run()``; a ``NonFiniteLogits`` it raises is raised again naming the question of the request concerned
    (``owners[request]``)."""
    try:
        return run()
    except NonFiniteLogits as error:
        if error.request is None:
            raise
        raise NonFiniteLogits(f"question {owners[error.request].id!r}: {error}", request=error.request) from None


def prompt_ids(model: Model, task: Task, questions: Sequence[Question], fmt: str) -> list[tuple[int, ...]]:
    """Token ids of each question's prompt in format ``fmt`` (what the generation probes feed the model)."""
    tokenizer = engine_for(model).tokenizer
    return [tuple(engine_for(model).encode(task.prompt(q, fmt, tokenizer))) for q in questions]


def question_seed(seed: int, question_id: str) -> int:
    """The sampling seed of one question: a stable 63-bit hash of ``(seed, question_id)``."""
    digest = hashlib.sha256(f"{seed}:{question_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _budget(task: Task, fmt: str, max_new_tokens: int | None) -> int:
    """The generation budget: ``max_new_tokens`` when given (>= 1), else the task's for ``fmt``."""
    if max_new_tokens is None:
        return task.max_new_tokens(fmt)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens {max_new_tokens} out of range: expected >= 1 (None: the task's)")
    return max_new_tokens


def deploy(model: Model, task: Task, questions: Sequence[Question], fmt: str,
           interventions: Sequence[Intervention] = (), batch_size: int = 16, keep_hidden: bool = False,
           max_new_tokens: int | None = None) -> list[dict]:
    """Greedy decoding along the full path: one candidate per question (``max_new_tokens``: None is the task's)."""
    engine = _engine(model)
    budget, stops = _budget(task, fmt, max_new_tokens), task.stop_strings(fmt)
    requests = [Request(p, budget, stop_strings=stops, keep_hidden=keep_hidden)
                for p in prompt_ids(model, task, questions, fmt)]
    gens = _naming_questions(lambda: engine.generate(requests, interventions=interventions, batch_size=batch_size),
                             questions)
    return [candidate(task, q, g, keep_hidden) for q, g in zip(questions, gens)]


def sample(model: Model, task: Task, questions: Sequence[Question], fmt: str, K: int, temperature: float,
           seed: int, interventions: Sequence[Intervention] = (), batch_size: int = 16,
           keep_hidden: bool = False, top_p: float = 1.0, max_new_tokens: int | None = None) -> list[list[dict]]:
    """``K`` samples per question at ``temperature`` (> 0), from the nucleus of mass ``top_p``; ``result[i][k]`` is
    sample k of question i (``max_new_tokens``: None is the task's)."""
    if K < 1:
        raise ValueError(f"K {K} out of range: expected >= 1 samples per question")
    if not temperature > 0:
        raise ValueError(f"temperature {temperature} out of range for sampling: expected > 0 (deploy is greedy)")
    engine = _engine(model)
    prompts = prompt_ids(model, task, questions, fmt)
    budget, stops = _budget(task, fmt, max_new_tokens), task.stop_strings(fmt)
    requests = [Request(p, budget, temperature=temperature, top_p=top_p, seed=row_seed(question_seed(seed, q.id), k),
                        stop_strings=stops, keep_hidden=keep_hidden)
                for q, p in zip(questions, prompts) for k in range(K)]
    gens = _naming_questions(lambda: engine.generate(requests, interventions=interventions, batch_size=batch_size),
                             [q for q in questions for _ in range(K)])
    return [[candidate(task, q, g, keep_hidden) for g in gens[i * K:(i + 1) * K]] for i, q in enumerate(questions)]


def route(model: Model, task: Task, questions: Sequence[Question], fmt: str,
          routes: Sequence[Sequence[Sequence[int]]], interventions: Sequence[Intervention] = (),
          batch_size: int = 16, keep_hidden: bool = False) -> list[list[dict]]:
    """Greedy decoding under layer routes: ``routes[i]`` are question i's routes (layer lists; repeats and
    skips allowed), ``result[i][j]`` the candidate of question i under ``routes[i][j]`` (its ``route`` key
    says which). Rows of every question and route share decode batches and prompt prefixes."""
    if len(routes) != len(questions):
        raise ValueError(f"{len(routes)} route lists for {len(questions)} questions: expected one list per question")
    engine = _engine(model)
    prompts = prompt_ids(model, task, questions, fmt)
    budget, stops = task.max_new_tokens(fmt), task.stop_strings(fmt)
    requests = [Request(p, budget, route=tuple(r), stop_strings=stops, keep_hidden=keep_hidden)
                for p, rs in zip(prompts, routes) for r in rs]
    gens = iter(_naming_questions(
        lambda: engine.generate(requests, interventions=interventions, batch_size=batch_size),
        [q for q, rs in zip(questions, routes) for _ in rs]))
    return [[candidate(task, q, next(gens), keep_hidden) for _ in rs] for q, rs in zip(questions, routes)]


RECOGNITION_KEYS = ("question_id", "gold_index", "loglik", "norm_loglik", "pred_sum", "pred_norm", "gold_rank")


def recognize(model: Model, task: Task, questions: Sequence[Question], interventions: Sequence[Intervention] = (),
              batch_size: int = 32, norm: str | None = None) -> list[dict]:
    """Multiple-choice recognition by option log-likelihood, one dict per question (``RECOGNITION_KEYS``).

    For each option, ``task.recognition_items`` gives (context, continuation); context and continuation are
    tokenized separately and concatenated (context with BOS as ``encode`` gives it, continuation without
    special tokens), and the continuation's log-likelihood is the sum of its tokens' log-probabilities.
    Keys: ``question_id``, ``gold_index``, ``loglik`` (list over options), ``norm_loglik`` (loglik divided
    by the continuation's token count, ``norm="tokens"``, or by the option text's character count without
    the target delimiter, the leading space, ``norm="chars"``: exactly lm-evaluation-harness's acc_norm; None: the
    task's ``recognition_norm``, tokens but for lm-evaluation-harness tasks),
    ``pred_sum`` and ``pred_norm`` (argmax option index of each), ``gold_rank`` (1 + options with a higher
    loglik).
    """
    engine = _engine(model)
    norm = task.recognition_norm if norm is None else norm
    if norm not in NORMS:
        raise ValueError(f"norm {norm!r} unknown; expected one of {NORMS}")
    if task.kind != "mc":
        raise ValueError(f"task {task.name!r} is {task.kind}; recognition needs a multiple-choice task")
    requests: list[LoglikRequest] = []
    owners: list[int] = []
    divisors: list[int] = []
    for i, q in enumerate(questions):
        context, continuations = task.recognition_items(q)
        context_ids = engine_for(model).encode(context)
        if not context_ids:
            raise ValueError(f"question {q.id!r}: empty context (no token predicts the first continuation token)")
        for j, continuation in enumerate(continuations):
            cont_ids = engine.tokenizer(continuation, add_special_tokens=False)["input_ids"]
            if not cont_ids:
                raise ValueError(f"question {q.id!r}: option {j} has an empty continuation")
            requests.append(LoglikRequest(context_ids, cont_ids))
            owners.append(i)
            divisors.append(len(cont_ids) if norm == "tokens" else len(continuation.removeprefix(" ")))
    logliks = _naming_questions(lambda: engine.loglik(requests, interventions=interventions, batch_size=batch_size),
                                [questions[i] for i in owners])
    per_question: list[list[float]] = [[] for _ in questions]
    per_question_norm: list[list[float]] = [[] for _ in questions]
    for i, ll, divisor in zip(owners, logliks, divisors):
        per_question[i].append(ll)
        per_question_norm[i].append(ll / max(divisor, 1))
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
    return rows
