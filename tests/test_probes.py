"""deploy / sample / recognize on a tiny random model with a character tokenizer (and the embedded model)."""

import pandas as pd
import pytest
import torch
from conftest import SHARED_DATA, make_tiny_model, needs_shared_data
from transformer_lens import HookedTransformer

from reach_lens.generate import Engine, Request, engine_for
from reach_lens.interventions import Silence
from reach_lens.models import encode
from reach_lens.probes import RECOGNITION_KEYS, deploy, prompt_ids, question_seed, recognize, route, sample
from reach_lens.tasks import get_task
from reach_lens.tasks.base import Question
from reach_lens.tasks.mc import make_mc_question


class CharTokenizer:
    """Printable ASCII and newline as ids 3..98 (0 pad, 1 BOS, 2 EOS): enough of a tokenizer for the probes."""

    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2
    padding_side = "right"

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        ids = [98 if c == "\n" else 3 + ord(c) - 32 for c in text]
        if any(not 3 <= i <= 98 for i in ids):
            raise ValueError(f"character outside the test alphabet in {text!r}")
        return {"input_ids": ([self.bos_token_id] if add_special_tokens else []) + ids}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join("\n" if i == 98 else chr(i - 3 + 32) for i in ids if i >= 3)


@pytest.fixture(scope="module")
def model() -> HookedTransformer:
    m = make_tiny_model(d_vocab=100)
    m.tokenizer = CharTokenizer()
    return m


@pytest.fixture(scope="module")
def arc():
    return get_task("arc_easy")


@pytest.fixture(scope="module")
def questions() -> list[Question]:
    return [
        make_mc_question("q1", "Which is hot?", ["ice", "fire", "snow"], 1),
        make_mc_question("q2", "What do bees make?", ["honey", "milk", "silk", "wool"], 0),
        make_mc_question("q3", "Sky colour?", ["green", "blue"], 1),
    ]


def test_deploy_is_greedy_generation_graded(model, arc, questions):
    rows = deploy(model, arc, questions, "shared", batch_size=2)
    prompts = prompt_ids(model, arc, questions, "shared")
    assert prompts[0][0] == CharTokenizer.bos_token_id and len(prompts[0]) == 1 + len(arc.prompt(questions[0], "shared", None))
    gens = engine_for(model).generate([Request(p, arc.max_new_tokens("shared"), stop_strings=arc.stop_strings("shared"))
                                       for p in prompts])
    for q, row, gen in zip(questions, rows, gens):
        assert row["text"] == gen.text and row["length"] == len(gen.tokens)
        assert row["finish_reason"] == gen.finish_reason
        assert row["mean_logprob"] == pytest.approx(gen.mean_logprob)
        graded = arc.grade(q, gen.text)
        assert (row["answer"], row["correct"]) == (graded.answer, graded.correct)


def test_deploy_under_interventions_and_independent_of_batch_size_and_order(model, arc, questions):
    silenced = [Silence(2, "hook_mlp_out")]
    plain = deploy(model, arc, questions, "shared")
    hooked = deploy(model, arc, questions, "shared", interventions=silenced)
    assert [r["text"] for r in hooked] != [r["text"] for r in plain]
    with model.hooks(fwd_hooks=[("blocks.2.hook_mlp_out", lambda act, hook: torch.zeros_like(act))]):
        by_hand = deploy(model, arc, questions, "shared")  # the same zeros as a hook registered by hand
    assert [r["text"] for r in by_hand] == [r["text"] for r in hooked]
    for batch_size in (1, 2, 16):
        for order in ([0, 1, 2], [2, 0, 1]):
            rows = deploy(model, arc, [questions[i] for i in order], "shared", interventions=silenced,
                          batch_size=batch_size)
            assert [r["text"] for r in rows] == [hooked[i]["text"] for i in order]
            assert [r["mean_logprob"] for r in rows] == pytest.approx([hooked[i]["mean_logprob"] for i in order],
                                                                     abs=1e-5)


def test_route_probe(model, arc, questions):
    L = model.cfg.n_layers
    full = tuple(range(L))
    routes = [[full, (0, 2, 3)], [full], [(0, 1, 1, 2, 3), full, (1, 3)]]
    out = route(model, arc, questions, "shared", routes)
    assert [[c["route"] for c in cs] for cs in out] == [[list(r) for r in rs] for rs in routes]
    plain = deploy(model, arc, questions, "shared")
    for cs, rs, d in zip(out, routes, plain):
        assert cs[rs.index(full)]["text"] == d["text"]  # the full path is the plain model
    alone = route(model, arc, questions[2:], "shared", routes[2:], batch_size=1)
    assert [c["text"] for c in alone[0]] == [c["text"] for c in out[2]]
    with pytest.raises(ValueError, match="2 route lists for 3 questions"):
        route(model, arc, questions, "shared", routes[:2])


def test_sample_seeds_per_question(model, arc, questions):
    both = sample(model, arc, questions, "shared", K=3, temperature=1.0, seed=7, batch_size=4)
    last = sample(model, arc, questions[2:], "shared", K=3, temperature=1.0, seed=7)
    assert [len(s) for s in both] == [3, 3, 3]
    assert [r["text"] for r in both[2]] == [r["text"] for r in last[0]]
    assert len({r["text"] for s in both for r in s}) > 1
    other_seed = sample(model, arc, questions[2:], "shared", K=3, temperature=1.0, seed=8)
    assert [r["text"] for r in other_seed[0]] != [r["text"] for r in last[0]]
    assert question_seed(7, "q1") != question_seed(7, "q2") != question_seed(8, "q2")
    with pytest.raises(ValueError, match="temperature 0 out of range"):
        sample(model, arc, questions, "shared", K=2, temperature=0, seed=0)


def option_logliks(model, context: str, continuation: str) -> float:
    """Unbatched reference: one full forward over context + continuation."""
    ctx = encode(model, context)
    cont = model.tokenizer(continuation, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ctx + cont]))[0], -1)
    return sum(float(logp[len(ctx) - 1 + t, tok]) for t, tok in enumerate(cont))


@pytest.mark.parametrize("norm", ["tokens", "chars"])
def test_recognize_matches_unbatched_likelihoods(model, arc, questions, norm):
    frame = pd.DataFrame(recognize(model, arc, questions, batch_size=3, norm=norm))  # 9 sequences over 3 padded forwards
    assert list(frame.columns) == ["question_id", "gold_index", "loglik", "norm_loglik", "pred_sum", "pred_norm",
                                   "gold_rank"]
    for q, row in zip(questions, frame.itertuples()):
        context, continuations = arc.recognition_items(q)
        expected = [option_logliks(model, context, c) for c in continuations]
        assert row.question_id == q.id and row.gold_index == q.gold_index
        assert row.loglik == pytest.approx(expected, abs=1e-4)
        if norm == "tokens":
            sizes = [len(c) for c in continuations]  # one token per character with this tokenizer
        else:
            sizes = [len(c) - 1 for c in continuations]  # lm-eval's len(choice): without the leading space
        assert row.norm_loglik == pytest.approx([e / n for e, n in zip(expected, sizes)], abs=1e-4)
        assert row.pred_sum == max(range(len(expected)), key=expected.__getitem__)
        assert row.pred_norm == max(range(len(expected)), key=lambda j: expected[j] / sizes[j])
        assert row.gold_rank == 1 + sum(e > expected[q.gold_index] for e in expected)


def test_recognize_under_interventions_and_errors(model, arc, questions):
    plain = recognize(model, arc, questions)
    hooked = recognize(model, arc, questions, interventions=[Silence(0, "hook_attn_out")])
    assert isinstance(plain, list) and set(plain[0]) == set(RECOGNITION_KEYS)  # one dict per question
    assert [r["loglik"] for r in hooked] != [r["loglik"] for r in plain]
    assert not model.hook_dict["blocks.0.hook_attn_out"].fwd_hooks
    with pytest.raises(ValueError, match="norm 'bytes' unknown"):
        recognize(model, arc, questions, norm="bytes")
    with pytest.raises(ValueError, match="recognition needs a multiple-choice task"):
        recognize(model, get_task("gsm8k"), [Question("g1", "1+1?", "2")])


class FixedScores(Engine):
    """An engine whose log-likelihoods are given: recognition's arithmetic on known numbers."""

    name = "fixed"
    capabilities = frozenset({"loglik"})
    tokenizer = CharTokenizer()

    def __init__(self, scores):
        self.scores = scores

    def encode(self, text):
        return self.tokenizer(text)["input_ids"]

    def describe(self):
        return {"model": "fixed", "weights": "0", "device": "cpu", "dtype": "float32"}

    def generate(self, requests, interventions=(), batch_size=16):
        raise AssertionError("not used")

    def loglik(self, requests, interventions=(), batch_size=32):
        return [self.scores[self.tokenizer.decode(r.continuation)] for r in requests]


def test_char_norm_divides_by_the_option_text_as_lm_eval_does(arc):
    """Options "a" and "bb" with log-likelihoods -2 and -3.5: per character of the option text (lm-eval's
    len(choice)) "bb" wins (-1.75 > -2); per character of the continuation " a" / " bb" "a" would (-1 > -1.17)."""
    q = make_mc_question("q", "Which?", ["a", "bb"], 1)
    frame = pd.DataFrame(recognize(FixedScores({" a": -2.0, " bb": -3.5}), arc, [q], norm="chars"))
    assert frame.norm_loglik[0] == pytest.approx([-2.0, -1.75])
    assert frame.pred_norm[0] == 1 and frame.pred_sum[0] == 0


@pytest.mark.integration
@needs_shared_data("arc/ARC-Easy-test.jsonl")
def test_embedded_model_probes_on_arc():
    from reach_lens.models import load_model

    ARC_FILE = SHARED_DATA / "arc" / "ARC-Easy-test.jsonl"

    m = load_model()
    task = get_task("arc_easy")
    qs = task.load(ARC_FILE)[:4]
    rows = deploy(m, task, qs, "native")
    assert all(r["length"] <= task.max_new_tokens("native") for r in rows)
    assert sum(r["answer"] is not None for r in rows) >= 3  # the instruct model answers with a letter
    frame = pd.DataFrame(recognize(m, task, qs))
    context, continuations = task.recognition_items(qs[0])
    expected = [option_logliks(m, context, c) for c in continuations]
    assert frame.loglik[0] == pytest.approx(expected, abs=2e-3)
    assert frame.gold_rank[0] == 1 + sum(e > expected[qs[0].gold_index] + 2e-3 for e in expected)
    samples = sample(m, task, qs[:2], "native", K=4, temperature=0.8, seed=0)
    assert [len(s) for s in samples] == [4, 4]


def test_non_finite_logits_are_an_error_naming_the_question_in_every_probe(model, arc, questions):
    """A hook that writes NaN into the residual must stop a probe (NaN logits would read as an empty answer, a
    run of one token, or a recognized gold option), naming the question, the step and the likely cause."""
    from reach_lens.generate import NonFiniteLogits

    def nan_for(prompt_length: int, decode_only: bool):
        def write_nan(resid, hook):  # only the rows of one question's prompt (prefill) or every decode step
            if decode_only and resid.shape[1] == 1:
                return torch.full_like(resid, float("nan"))
            if not decode_only and resid.shape[1] == prompt_length:
                return torch.full_like(resid, float("nan"))
            return resid
        return [("blocks.1.hook_resid_post", write_nan)]

    lengths = [len(p) for p in prompt_ids(model, arc, questions, "shared")]
    second = lengths[1]
    assert len(set(lengths)) == 3
    first_decoded = questions[lengths.index(max(lengths))].id  # rows start longest prompt first
    probes = {"deploy": lambda: deploy(model, arc, questions, "shared", batch_size=1),
              "sample": lambda: sample(model, arc, questions, "shared", K=2, temperature=0.8, seed=0, batch_size=1),
              "route": lambda: route(model, arc, questions, "shared", [[(0, 1, 1)]] * 3, batch_size=1)}
    for name, run in probes.items():
        with pytest.raises(NonFiniteLogits, match=r"question 'q2': non-finite logits for request \d+ .* at generated "
                                                  r"token 0: .*a hook may have written non-finite values"), \
                model.hooks(fwd_hooks=nan_for(second, decode_only=False)):
            run()
        with pytest.raises(NonFiniteLogits, match=rf"question '{first_decoded}': .* at generated token 1\b"), \
                model.hooks(fwd_hooks=nan_for(second, decode_only=True)):
            run()
    with pytest.raises(NonFiniteLogits, match=r"question 'q\d': non-finite logits for loglik request \d+") as raised, \
            model.hooks(fwd_hooks=[("blocks.0.hook_resid_post", lambda a, hook: a * float("nan"))]):
        recognize(model, arc, questions)
    owners = [q.id for q in questions for _ in q.options]  # one loglik request per option, in question order
    assert str(raised.value).startswith(f"question {owners[raised.value.request]!r}:")
    assert not model.hook_dict["blocks.1.hook_resid_post"].fwd_hooks  # nothing left behind
