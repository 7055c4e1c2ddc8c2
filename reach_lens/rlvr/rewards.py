"""The verifiable reward: the task's own grader on the completion, cut where the audit's generation stops.

    reward = task_reward(task, questions, fmt="native")      # a TRL reward function
    reward(prompts=[...], completions=["B", "C. a rock"], question_id=["q1", "q1"])   # -> [1.0, 0.0]
    reward_density(model, task, questions, "native", K=8, temperature=0.8, seed=0)   # how much signal GRPO gets
    sample_hits(model, task, questions, "native", K=8, temperature=1.0)              # correct samples per question

TRL samples up to ``max_completion_length`` tokens and does not stop at the task's stop strings, so the
reward first cuts each completion before its first stop string (as ``reach_lens.generate`` does for the
audit), then grades it with ``task.grade``: 1.0 when correct, 0.0 when wrong, unparseable or empty. The
reward a completion gets in training is therefore the grade the same text gets in the audit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def cut_at_stops(text: str, stop_strings: Sequence[str]) -> str:
    """``text`` cut before the earliest of ``stop_strings`` (unchanged when none occurs)."""
    cuts = [text.find(s) for s in stop_strings if s and s in text]
    return text[: min(cuts)] if cuts else text


def completion_text(completion: Any) -> str:
    """A TRL completion as text: a str, or a conversational list of messages (their contents joined)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    raise TypeError(f"completion {completion!r:.100} is neither text nor a list of messages")


def task_reward(task: Any, questions: Sequence[Any], fmt: str = "native") -> Callable[..., list[float]]:
    """A TRL reward function grading completions of ``questions`` (looked up by the ``question_id`` column)."""
    by_id = {str(q.id): q for q in questions}
    stops = tuple(task.stop_strings(fmt))

    def task_grader(prompts: Sequence[Any], completions: Sequence[Any], question_id: Sequence[str],
                    **_trl_extras: Any) -> list[float]:
        # **_trl_extras: TRL passes every dataset column and its own hooks (trainer_state, log_metric, ...)
        if len(completions) != len(question_id):
            raise ValueError(f"{len(completions)} completions for {len(question_id)} question ids")
        rewards = []
        for qid, completion in zip(question_id, completions):
            q = by_id.get(str(qid))
            if q is None:
                raise KeyError(f"question_id {qid!r} is not one of the {len(by_id)} training questions")
            text = cut_at_stops(completion_text(completion), stops)
            rewards.append(1.0 if text.strip() and task.grade(q, text).correct else 0.0)
        return rewards

    task_grader.__name__ = f"{task.name}_grader"
    return task_grader


def sample_hits(model: Any, task: Any, questions: Sequence[Any], fmt: str, K: int, temperature: float,
                seed: int = 0, batch_size: int = 16) -> list[int]:
    """How many of K samples of each question are graded correct (``probes.sample``, as the audit draws them)."""
    from reach_lens import probes

    cands = probes.sample(model, task, questions, fmt, K=K, temperature=temperature, seed=seed, batch_size=batch_size)
    return [sum(bool(c["correct"]) for c in cs) for cs in cands]


def reward_density(model: Any, task: Any, questions: Sequence[Any], fmt: str, K: int, temperature: float,
                   seed: int = 0, batch_size: int = 16) -> dict:
    """How much reward a model's own samples carry on ``questions``: ``density`` (share of the n*K samples
    graded correct, the mean reward), ``any_correct`` (share of questions with a correct sample) and
    ``informative`` (share of questions whose K samples are neither all right nor all wrong: the only groups
    whose GRPO advantages are not all zero), each with n and K."""
    hits = sample_hits(model, task, questions, fmt, K, temperature, seed, batch_size)
    n = len(hits)
    return {"task": task.name, "n": n, "K": K, "T": temperature, "density": sum(hits) / (n * K),
            "any_correct": sum(h > 0 for h in hits) / n, "informative": sum(0 < h < K for h in hits) / n}
