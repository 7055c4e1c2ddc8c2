"""TRL wiring on a tiny random Llama checkpoint: a 2-step GRPO run (LoRA, killed after step 1 and resumed) and a
2-step SFT run (full fine-tuning), each saved as a plain HF checkpoint that ``load_model`` reads."""
import json
import logging

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("peft")

from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: E402

from reach_lens.models import load_model  # noqa: E402
from reach_lens.rlvr import train as train_module  # noqa: E402
from reach_lens.rlvr.recipes import default_recipe  # noqa: E402
from reach_lens.rlvr.split import split_questions  # noqa: E402
from reach_lens.rlvr.train import read_metadata, stop_token_ids, train, training_ids  # noqa: E402
from reach_lens.tasks import get_task  # noqa: E402
from reach_lens.tasks.mc import make_mc_question  # noqa: E402

WORDS = ["<unk>", "<s>", "</s>", "A", "B", "C", "D", ".", "B.", "Answer:", "\n"] + [f"w{i}" for i in range(53)]
TEMPLATE = ("{% for message in messages %}{{ message['content'] }}{% endfor %}"
            "{% if add_generation_prompt %} Answer:{% endif %}")


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                  pad_token="</s>")
    tok.chat_template = TEMPLATE
    return tok


@pytest.fixture
def base_dir(tmp_path):
    config = AutoConfig.for_model("llama", vocab_size=len(WORDS), hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                  max_position_embeddings=256, tie_word_embeddings=True, bos_token_id=1,
                                  eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(tmp_path / "base")
    tiny_tokenizer().save_pretrained(tmp_path / "base")
    return tmp_path / "base"


QUESTIONS = [make_mc_question(f"q{i}", f"w{i} w{i + 1} w{i + 2}", ["w1", "w2", "w3", "w4"], i % 4) for i in range(16)]


def test_stop_token_ids():
    assert sorted(stop_token_ids(tiny_tokenizer(), (".", "\n"))) == [WORDS.index(w) for w in (".", "B.", "\n")]
    assert stop_token_ids(tiny_tokenizer(), ()) == []


@pytest.fixture
def said_by_training():
    """The messages training logs (``reach_lens.rlvr.train``'s logger at INFO), collected in a list."""
    said = []

    class Collect(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())

    logger, handler = logging.getLogger("reach_lens.rlvr.train"), Collect()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield said
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_grpo_two_steps_killed_resumed_and_loadable(base_dir, tmp_path, monkeypatch, said_by_training):
    recipe = default_recipe("grpo", steps=2, num_generations=2, save_steps=1, logging_steps=1, audit_share=0.5)
    out = tmp_path / "ckpt" / recipe.name
    real_callback = train_module._callback

    def killing_callback(elapsed):  # the run dies right after its step-1 TRL checkpoint is written
        cb = real_callback(elapsed)

        def on_save(args, state, control, **kwargs):
            elapsed.save()
            raise RuntimeError("killed after step 1")

        cb.on_save = on_save
        return cb

    monkeypatch.setattr(train_module, "_callback", killing_callback)
    with pytest.raises(RuntimeError, match="killed after step 1"):
        train(recipe, base_dir, out, questions=QUESTIONS)
    assert (out.with_name(out.name + ".work") / "checkpoint-1").is_dir() and not out.exists()
    monkeypatch.setattr(train_module, "_callback", real_callback)
    said = said_by_training
    assert train(recipe, base_dir, out, questions=QUESTIONS) == out
    assert any("resuming from checkpoint-1" in line for line in said)
    assert not out.with_name(out.name + ".work").exists()  # resume points are removed once the model is saved

    meta = read_metadata(out)
    _, _, split = split_questions(QUESTIONS, "arc_easy", recipe.salt, recipe.audit_share)
    assert meta["steps"] == 2 and meta["recipe"] == recipe.to_dict() and meta["split"] == split.to_dict()
    assert training_ids(out) == list(split.train_ids)
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 2  # stop tokens not saved
    assert "reward" in (out / "training_log.csv").read_text().splitlines()[0]
    model = load_model(out)  # LoRA merged: a plain Llama checkpoint
    assert model.cfg.n_layers == 2 and model.cfg.d_vocab == len(WORDS)
    assert torch.isfinite(model(torch.tensor([[1, 3, 4]]))).all()
    said.clear()
    assert train(recipe, base_dir, out, questions=QUESTIONS) == out  # finished: not retrained
    assert said and "already trained" in said[0]


def test_sft_two_steps_full_fine_tuning(base_dir, tmp_path):
    recipe = default_recipe("sft", steps=2, batch_size=4, lora_r=None, learning_rate=1e-2, audit_share=0.5)
    out = train(recipe, base_dir, tmp_path / recipe.name, questions=QUESTIONS)
    assert read_metadata(out)["steps"] == 2 and read_metadata(out)["recipe"]["lora_r"] is None
    before, after = load_model(base_dir), load_model(out)
    changed = [n for n, p in after.state_dict().items() if not torch.equal(p, before.state_dict()[n])]
    assert changed  # full fine-tuning moved the weights


def test_bfloat16_mixed_precision_is_a_recipe_of_its_own_and_trains_on_the_cpu(base_dir, tmp_path):
    recipe = default_recipe("sft", steps=2, batch_size=4, lora_r=None, learning_rate=1e-2, audit_share=0.5,
                            precision="bfloat16")
    assert recipe.name != default_recipe("sft", steps=2, batch_size=4, lora_r=None, learning_rate=1e-2,
                                         audit_share=0.5).name  # another precision, another checkpoint
    out = train(recipe, base_dir, tmp_path / recipe.name, questions=QUESTIONS, device="cpu")
    meta = read_metadata(out)
    assert meta["recipe"]["precision"] == "bfloat16" and meta["device"] == "cpu"
    trained = load_model(out)
    assert trained.cfg.dtype == torch.float32  # float32 master weights are what is saved
    assert not torch.equal(trained.blocks[0].mlp.W_in, load_model(base_dir).blocks[0].mlp.W_in)
    with pytest.raises(ValueError, match="precision 'int8' unknown"):
        default_recipe("sft", precision="int8")


def test_training_device_is_checked_before_training():
    from reach_lens.rlvr.train import training_device

    assert training_device("cpu") == "cpu"
    assert training_device(None) == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="device 'cuda:1'"):
        training_device("cuda:1")


def test_informative_filter_trains_on_the_mixed_groups_only_and_samples_once(base_dir, tmp_path, monkeypatch):
    recipe = default_recipe("grpo", steps=1, num_generations=4, save_steps=1, logging_steps=1, audit_share=0.5,
                            prompt_filter="informative")
    train_qs, _, _ = split_questions(QUESTIONS, "arc_easy", recipe.salt, recipe.audit_share)
    hits = {q.id: i % 5 for i, q in enumerate(train_qs)}  # 0..4 correct of K = 4: only 1..3 are informative
    drawn, trained_on = [], []

    def fake_hits(model, task, questions, fmt, K, temperature, seed):
        drawn.append((K, temperature, seed, [q.id for q in questions]))
        return [hits[q.id] for q in questions]

    real_trainer = train_module._trainer

    def recording_trainer(recipe, model, tokenizer, task, qs, work, device):
        trained_on.extend(q.id for q in qs)
        return real_trainer(recipe, model, tokenizer, task, qs, work, device)

    monkeypatch.setattr(train_module, "sample_hits", fake_hits)
    monkeypatch.setattr(train_module, "_trainer", recording_trainer)
    out = train(recipe, base_dir, tmp_path / recipe.name, questions=QUESTIONS)
    informative = [q.id for q in train_qs if 0 < hits[q.id] < 4]
    assert drawn == [(4, recipe.temperature, recipe.seed, [q.id for q in train_qs])]
    assert trained_on == informative and 0 < len(informative) < len(train_qs)
    meta = read_metadata(out)["prompt_filter"]
    assert meta["kept_ids"] == informative
    assert (meta["kept"], meta["of"], meta["K"]) == (len(informative), len(train_qs), 4)
    # training_ids: the whole training side, what an audit must avoid
    assert sorted(training_ids(out)) == sorted(q.id for q in train_qs)

    work = tmp_path / "resumed.work"  # a resumed run reads the kept ids back instead of sampling again
    work.mkdir()
    kept, _ = train_module.informative_questions(recipe, base_dir, get_task("arc_easy"), train_qs, work)
    monkeypatch.setattr(train_module, "sample_hits", lambda *a: pytest.fail("sampled again"))
    assert train_module.informative_questions(recipe, base_dir, get_task("arc_easy"), train_qs, work)[0] == kept
