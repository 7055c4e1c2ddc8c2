"""lm-evaluation-harness tasks (reach_lens.tasks.lm_eval): loading through lm-eval's TaskManager, prompts, stops,
budgets, grading by lm-eval's own filters and metrics, recognition items, spec, errors; and per-document agreement
with lm-eval's ``simple_evaluate`` on a tiny random Hugging Face Llama that both lm-eval's HFLM and reach_lens load."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only
os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("lm_eval")

import lm_eval.tasks
from lm_eval.api.instance import Instance

from reach_lens import probes
from reach_lens.tasks.lm_eval import (
    ADAPTER_VERSION,
    INSTALL,
    LMEvalError,
    LMEvalUnavailable,
    doc_hash,
    lm_eval_task,
)

DATA = Path(__file__).parent / "data" / "lm_eval"
BUILTIN = Path(lm_eval.tasks.__file__).parent
GEN_DOCS = [json.loads(line) for line in (DATA / "gen.jsonl").read_text().splitlines()]
MC_DOCS = [json.loads(line) for line in (DATA / "mc.jsonl").read_text().splitlines()]

GEN_YAML = """task: tiny_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: generate_until
test_split: test
fewshot_split: test
num_fewshot: 2
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["Question:", "\\n\\n"]
  max_gen_toks: 8
  do_sample: false
filter_list:
  - name: strict
    filter:
      - function: regex
        regex_pattern: "#### (\\\\-?[0-9\\\\.\\\\,]+)"
      - function: take_first
  - name: flexible
    filter:
      - function: regex
        group_select: -1
        regex_pattern: "(-?[$0-9.,]{{2,}})|(-?[0-9]+)"
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    regexes_to_ignore: [",", "\\\\$", "(?s).*#### ", "\\\\.$"]
metadata:
  version: {version}
"""
GSM8K_YAML = """include: {builtin}/gsm8k/gsm8k.yaml
task: tiny_gsm8k
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    test: {data}
training_split: null
fewshot_split: test
"""
MC_YAML = """include: {builtin}/arc/arc_easy.yaml
task: tiny_mc
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    validation: {data}
training_split: null
test_split: null
"""


def write_task(directory: Path, template: str, data: Path, name: str, version: str = "1.0") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(template.format(data=data, builtin=BUILTIN, version=version))
    return path


@pytest.fixture
def gen_yaml(tmp_path) -> Path:
    return write_task(tmp_path / "tasks", GEN_YAML, DATA / "gen.jsonl", "tiny_gen")


@pytest.fixture
def mc_yaml(tmp_path) -> Path:
    return write_task(tmp_path / "tasks", MC_YAML, DATA / "mc.jsonl", "tiny_mc")


# ---- loading, questions, prompts, stops, budgets -------------------------------------------------


def test_generation_task_reads_what_the_yaml_says(gen_yaml):
    task = lm_eval_task(gen_yaml)
    qs = task.load()
    assert task.name == "lm-eval-tiny_gen" and task.kind == "short_answer"
    assert [q.question for q in qs] == [f"Question: {d['question']}\nAnswer:" for d in GEN_DOCS]
    assert [q.gold for q in qs] == [d["answer"] for d in GEN_DOCS]
    assert [q.id for q in qs] == [doc_hash(d) for d in GEN_DOCS]
    assert [q.id for q in lm_eval_task(gen_yaml).load()] == [q.id for q in qs]  # stable across loads
    assert task.formats == ("native", "shared", "fewshot") and task.default_format == "fewshot"
    assert task.stop_strings("fewshot") == ("Question:", "\n\n") and task.max_new_tokens("shared") == 8
    assert task.grader == f"lm-eval/tiny_gen/strict/exact_match/{ADAPTER_VERSION}"
    shared = task.prompt(qs[3], "shared", None)
    assert shared == qs[3].question
    fewshot = task.prompt(qs[3], "fewshot", None)
    blocks = fewshot.split("\n\n")
    assert len(blocks) == 3 and blocks[-1] == shared  # two shots, then the question
    shots = blocks[:2]
    assert all(s.startswith("Question: ") and "\nAnswer: " in s for s in shots)
    assert GEN_DOCS[3]["question"] not in "".join(shots)  # the document is never its own shot
    assert task.prompt_spec("fewshot") == f"lm-eval/{ADAPTER_VERSION}:tiny_gen:fewshot:num_fewshot=2:seed=1234"


def test_shots_follow_the_split_order_not_the_question_order(gen_yaml):
    task = lm_eval_task(gen_yaml)
    qs = task.load()
    forward = [task.prompt(q, "fewshot", None) for q in qs]
    again = lm_eval_task(gen_yaml)
    backward = [again.prompt(q, "fewshot", None) for q in reversed(again.load())]
    assert backward[::-1] == forward
    assert len(set(forward)) == len(forward)
    other_seed = lm_eval_task(gen_yaml, fewshot_seed=7)
    assert [other_seed.prompt(q, "fewshot", None) for q in other_seed.load()] != forward


def test_num_fewshot_overrides_the_yaml_as_simple_evaluate_does(gen_yaml):
    task = lm_eval_task(gen_yaml, num_fewshot=0)
    q = task.load()[0]
    assert task.formats == ("native", "shared") and task.default_format == "shared"
    assert task.prompt(q, "shared", None) == q.question
    assert task.spec()["num_fewshot"] == 0
    with pytest.raises(ValueError, match="unknown prompt format 'fewshot'"):
        task.prompt(q, "fewshot", None)


def test_a_yaml_including_a_builtin_task_over_a_local_file(tmp_path):
    path = write_task(tmp_path, GSM8K_YAML, DATA / "gen.jsonl", "tiny_gsm8k")
    task = lm_eval_task(path)
    assert task.filter_name == "strict-match" and task.metric == "exact_match" and task.num_fewshot == 5
    assert task.stop_strings("fewshot") == ("Question:", "</s>", "<|im_end|>") and task.max_new_tokens("fewshot") == 256
    qs = task.load()
    assert len(qs) == len(GEN_DOCS) and task.prompt(qs[0], "fewshot", None).count("Question: ") == 6
    assert lm_eval_task("tiny_gsm8k", include_path=tmp_path).load() == qs  # by name in an include path


def test_multiple_choice_task_questions_and_recognition_items(mc_yaml):
    task = lm_eval_task(mc_yaml)
    qs = task.load()
    assert task.kind == "mc" and task.default_split == "validation" and task.metric == "acc"
    assert task.prediction_key == "pred_sum" and task.recognition_norm == "chars"
    assert [q.gold for q in qs] == ["A", "B", "C", "C", "D", "B"]  # Q3's answerKey "3" is its third option
    assert qs[2].options == ("dog", "cow", "chicken") and qs[2].labels == ("A", "B", "C")
    context, continuations = task.recognition_items(qs[0])
    assert context == f"Question: {MC_DOCS[0]['question']}\nAnswer:"
    assert continuations == [" water", " iron", " salt", " glass"]
    shared = task.prompt(qs[0], "shared", None)
    assert shared == f"Question: {MC_DOCS[0]['question']}\nA. water\nB. iron\nC. salt\nD. glass\nAnswer:"
    assert task.grade(qs[0], " A. water").correct and not task.grade(qs[0], "B").correct
    assert task.grader == f"lm-eval/tiny_mc/mc_letter/2/{ADAPTER_VERSION}"
    assert lm_eval_task(mc_yaml, metric="acc_norm").prediction_key == "pred_norm"


def test_acc_norm_is_refused_where_its_divisor_would_differ(tmp_path):
    path = write_task(tmp_path, MC_YAML + 'target_delimiter: "\\n"\n', DATA / "mc.jsonl", "tiny_mc")
    q = lm_eval_task(path).load()[0]
    assert lm_eval_task(path).recognition_items(q)[1][0] == "\nwater"  # acc: the likelihood is lm-eval's
    task = lm_eval_task(path, metric="acc_norm")
    with pytest.raises(LMEvalError, match="acc_norm is not reproduced for this task"):
        task.recognition_items(task.load()[0])


def test_letter_choices_keep_the_text_that_lists_them(tmp_path):
    template = MC_YAML + 'doc_to_text: "{{{{question}}}}\\nA. x\\nB. y\\nAnswer:"\ndoc_to_choice: ["A", "B"]\n' \
                         'doc_to_target: 1\n'
    task = lm_eval_task(write_task(tmp_path, template, DATA / "mc.jsonl", "tiny_mc"))
    q = task.load()[0]
    assert q.options == q.labels == ("A", "B") and q.gold == "B"
    assert task.prompt(q, "shared", None) == q.question


def test_repeated_documents_get_distinct_stable_ids(tmp_path):
    data = tmp_path / "dup.jsonl"
    data.write_text((DATA / "gen.jsonl").read_text() + (DATA / "gen.jsonl").read_text().splitlines()[0] + "\n")
    qs = lm_eval_task(write_task(tmp_path, GEN_YAML, data, "tiny_gen")).load()
    assert qs[-1].id == f"{qs[0].id}-2" and len({q.id for q in qs}) == len(qs)


# ---- grading --------------------------------------------------------------------------------


def lm_eval_verdict(task, q, completion: str, filter_name: str) -> tuple[object, float]:
    """lm-eval's own path (evaluate): the named FilterEnsemble over an Instance, then process_results."""
    lm_task, doc = task.lm_task, task.doc(q)
    inst = Instance("generate_until", doc, ("ctx", {}), idx=0, metadata=("t", 0, 1))
    inst.resps.append(completion)
    (ensemble,) = [f for f in lm_task._filters if f.name == filter_name]
    ensemble.apply([inst])
    filtered = inst.filtered_resps[filter_name]
    return filtered, lm_task.process_results(doc, [filtered])["exact_match"]


COMPLETIONS = [
    " He has 3 + 2 = 5 apples.\n#### 5",  # right under both filters
    " He has 3 + 2 = 6 apples.\n#### 6",  # wrong
    " The answer is 5.",  # no "####": strict finds nothing, flexible takes "5." -> right
    " I do not know",  # no number at all
    "",
    " #### 1,005",  # commas are ignored by the metric, not by the filter
]


@pytest.mark.parametrize("filter_name", ["strict", "flexible"])
def test_grade_is_lm_evals_verdict(gen_yaml, filter_name):
    task = lm_eval_task(gen_yaml, filter_name=filter_name)
    q = task.load()[0]
    verdicts = []
    for completion in COMPLETIONS:
        graded = task.grade(q, completion)
        filtered, value = lm_eval_verdict(task, q, completion, filter_name)
        assert graded.correct == (value == 1.0)
        assert graded.answer == (None if filtered == "[invalid]" else filtered)
        assert task.filtered(q, completion) == filtered
        verdicts.append(graded.correct)
    assert verdicts == ([True, False, False, False, False, False] if filter_name == "strict"
                        else [True, False, True, False, False, False])
    assert task.grade(q, " The answer is 5.").answer == (None if filter_name == "strict" else "5.")


def test_a_question_of_another_task_object_is_graded(gen_yaml):
    q = lm_eval_task(gen_yaml).load()[1]
    assert lm_eval_task(gen_yaml).grade(q, " #### 12").correct
    stranger = type(q)("0" * 16, "?", "1")
    with pytest.raises(ValueError, match="not a document of lm-eval-tiny_gen"):
        lm_eval_task(gen_yaml).grade(stranger, "1")


# ---- errors ---------------------------------------------------------------------------------


def test_bad_filter_and_metric_names_list_the_valid_ones(gen_yaml, mc_yaml):
    with pytest.raises(LMEvalError, match="no filter 'strict-match'; valid: strict, flexible"):
        lm_eval_task(gen_yaml, filter_name="strict-match")
    with pytest.raises(LMEvalError, match="no metric 'acc'; valid: exact_match"):
        lm_eval_task(gen_yaml, metric="acc")
    with pytest.raises(LMEvalError, match="no metric 'exact_match'; valid: acc, acc_norm"):
        lm_eval_task(mc_yaml, metric="exact_match")
    with pytest.raises(LMEvalError, match="has no filter to choose"):
        lm_eval_task(mc_yaml, filter_name="none")


def test_other_errors_say_what_to_change(gen_yaml, mc_yaml, tmp_path):
    with pytest.raises(LMEvalError, match="no lm-eval task 'tiny_gem' in .*; tasks there: tiny_gen"):
        lm_eval_task("tiny_gem", include_path=gen_yaml.parent)
    with pytest.raises(LMEvalError, match="does not exist"):
        lm_eval_task(tmp_path / "missing.yaml")
    with pytest.raises(LMEvalError, match="could not load its data.*dataset_path: json"):
        lm_eval_task(write_task(tmp_path / "x", GEN_YAML, tmp_path / "absent.jsonl", "tiny_gen"))
    with pytest.raises(LMEvalError, match="has no 'train' split; it has \\['validation'\\]"):
        lm_eval_task(mc_yaml).load(split="train")
    with pytest.raises(LMEvalError, match="reads its documents from its YAML"):
        lm_eval_task(mc_yaml).load(DATA / "mc.jsonl")
    zero = write_task(tmp_path / "z", GEN_YAML.replace("num_fewshot: 2", "num_fewshot: 0"), DATA / "gen.jsonl", "g")
    with pytest.raises(LMEvalError, match="sets num_fewshot: 0 in its YAML, which lm-eval never overrides"):
        lm_eval_task(zero, num_fewshot=3)


def test_missing_lm_eval_names_the_extra(gen_yaml, monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval now raises ImportError
    with pytest.raises(LMEvalUnavailable, match=r'pip install -e "\.\[lm-eval\]"'):
        lm_eval_task(gen_yaml)
    assert "lm-eval" in INSTALL


# ---- spec -----------------------------------------------------------------------------------


def test_spec_pins_versions_and_changes_with_the_yaml_or_the_data(tmp_path):
    data = tmp_path / "gen.jsonl"
    shutil.copy(DATA / "gen.jsonl", data)
    path = write_task(tmp_path, GEN_YAML, data, "tiny_gen")
    spec = lm_eval_task(path).spec()
    assert spec["lm_eval"] == lm_eval.__version__ and spec["task"] == "tiny_gen" and spec["task_version"] == 1.0
    assert (spec["filter"], spec["metric"], spec["num_fewshot"], spec["fewshot_seed"]) == ("strict", "exact_match", 2,
                                                                                            1234)
    assert set(spec["data_sha256"]) == {"test"} and set(spec["data_sha256"]["test"]) == {"gen.jsonl"}
    assert lm_eval_task(path).spec() == spec
    json.dumps(spec)  # a protocol stores it
    data.write_text(data.read_text() + json.dumps({"question": "1 + 1?", "answer": "#### 2"}) + "\n")
    changed_data = lm_eval_task(path).spec()
    assert changed_data["data_sha256"] != spec["data_sha256"] and changed_data["yaml_sha256"] == spec["yaml_sha256"]
    write_task(tmp_path, GEN_YAML, data, "tiny_gen", version="2.0")
    changed_yaml = lm_eval_task(path).spec()
    assert changed_yaml["yaml_sha256"] != changed_data["yaml_sha256"] and changed_yaml["task_version"] == 2.0
    assert lm_eval_task(path, filter_name="flexible").spec()["filter"] == "flexible"


def test_spec_covers_an_included_yaml(tmp_path):
    (tmp_path / "base").mkdir()
    base = write_task(tmp_path / "base", GEN_YAML, DATA / "gen.jsonl", "base_gen")
    child = tmp_path / "child.yaml"
    child.write_text(f"include: {base}\ntask: child_gen\n")
    before = lm_eval_task(child).spec()["yaml_sha256"]
    base.write_text(base.read_text().replace("max_gen_toks: 8", "max_gen_toks: 9"))
    task = lm_eval_task(child)
    assert task.spec()["yaml_sha256"] != before and task.max_new_tokens("shared") == 9


# ---- agreement with simple_evaluate on a tiny model ---------------------------------------------

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A tiny random Llama with a byte-level BPE tokenizer trained on the fixture texts, saved for HFLM and
    reach_lens's load_model alike."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    texts = [line for path in DATA.glob("*.jsonl") for line in path.read_text().splitlines()]
    texts += ["Question: Answer: #### \n\n", "A. B. C. D."]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=500, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                        unk_token="<|endoftext|>", pad_token="<|im_end|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    hf = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # random init is near-uniform: sharpen it so that choices and tokens are decided
        for p in hf.parameters():
            if p.dim() == 2:
                p.mul_(5.0)
    directory = tmp_path_factory.mktemp("tiny_llama")
    hf.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tiny_pair(tiny_checkpoint):
    from lm_eval.models.huggingface import HFLM

    from reach_lens.models import load_model

    return HFLM(pretrained=str(tiny_checkpoint), device="cpu", dtype="float32", batch_size=1), load_model(tiny_checkpoint)


def simple_evaluate_samples(lm, yaml_path: Path, **options) -> list[dict]:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    name = yaml_path.stem
    out = simple_evaluate(model=lm, tasks=[name], task_manager=TaskManager(include_defaults=False,
                          include_path=str(yaml_path.parent)), log_samples=True, bootstrap_iters=0, **options)
    return out["samples"][name]


def test_recognition_chooses_what_simple_evaluate_chooses(tiny_pair, mc_yaml):
    import numpy as np

    lm, model = tiny_pair
    task = lm_eval_task(mc_yaml)
    qs = task.load()
    samples = sorted(simple_evaluate_samples(lm, mc_yaml), key=lambda s: s["doc_id"])
    rows = probes.recognize(model, task, qs)  # the task's own norm, characters: lm-eval's acc_norm
    assert len(samples) == len(rows) == len(MC_DOCS)
    chosen = []
    for q, row, s in zip(qs, rows, samples):
        assert [a[0] for a in s["arguments"]] == [task.recognition_items(q)[0]] * len(q.options)
        lls = np.array([r[0] for r in s["filtered_resps"]])
        lengths = np.array([len(c) for c in task.choices(q)], dtype=float)
        assert np.abs(lls - np.array(row["loglik"])).max() < 1e-4
        assert row["pred_sum"] == int(np.argmax(lls)) and row["pred_norm"] == int(np.argmax(lls / lengths))
        assert (row["pred_sum"] == q.gold_index) == (s["acc"] == 1.0)
        assert (row["pred_norm"] == q.gold_index) == (s["acc_norm"] == 1.0)
        chosen.append(row["pred_sum"])
    assert len(set(chosen)) > 1  # the tiny model does not always pick the same position


def test_generation_prompts_completions_and_verdicts_equal_simple_evaluate(tiny_pair, gen_yaml):
    lm, model = tiny_pair
    samples = simple_evaluate_samples(lm, gen_yaml)
    for filter_name in ("strict", "flexible"):
        task = lm_eval_task(gen_yaml, filter_name=filter_name)
        qs = task.load()
        theirs = sorted((s for s in samples if s["filter"] == filter_name), key=lambda s: s["doc_id"])
        assert [task.prompt(q, "fewshot", None) for q in qs] == [s["arguments"][0][0] for s in theirs]
        rows = probes.deploy(model, task, qs, task.default_format)
        assert [r["text"] for r in rows] == [s["resps"][0][0] for s in theirs]
        for q, s in zip(qs, theirs):
            assert task.filtered(q, s["resps"][0][0]) == s["filtered_resps"][0]
            assert task.grade(q, s["resps"][0][0]).correct == (s["exact_match"] == 1.0)


def test_native_prompts_are_lm_evals_chat_path(tiny_pair, gen_yaml):
    lm, model = tiny_pair
    samples = sorted((s for s in simple_evaluate_samples(lm, gen_yaml, apply_chat_template=True)
                      if s["filter"] == "strict"), key=lambda s: s["doc_id"])
    task = lm_eval_task(gen_yaml)
    prompts = [task.prompt(q, "native", model.tokenizer) for q in task.load()]
    assert prompts == [s["arguments"][0][0] for s in samples]
    assert prompts[0].count("<|im_start|>user") == 3 and prompts[0].endswith("<|im_start|>assistant\n")
    assert task.prompt_spec("native").endswith(":chat_template:fewshot_as_multiturn")
