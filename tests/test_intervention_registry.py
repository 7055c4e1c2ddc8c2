"""The registry of intervention kinds: every Intervention subclass with a kind of its own reads back from its
to_dict(), through protocols and run stores too: reach_lens's own (UnitPlant, also before its module is imported)
and a user's; a kind another class holds is refused, a class defined again replaces itself."""
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from conftest import make_tiny_model

from reach_lens.generate import Request, engine_for
from reach_lens.hooks import Hooks, hook_point, positionwise
from reach_lens.interventions import (Intervention, Silence, Vector, hooks_for, intervention_from_dict,
                                      intervention_kinds)
from reach_lens.localize import UnitPlant
from reach_lens.protocol import Protocol, question_set_hash
from reach_lens.store import RunStore
from reach_lens.tasks import Question

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model():
    return make_tiny_model()


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 50, (3, 6), generator=torch.Generator().manual_seed(0))


def run(model, tokens, interventions=()):
    with torch.no_grad(), model.hooks(fwd_hooks=hooks_for(list(interventions), model)):
        return model(tokens)


def a_plant(model):
    g = torch.Generator().manual_seed(4)
    return UnitPlant(2, (5, 9, 30), torch.rand(3, generator=g), torch.randn(model.cfg.d_model, generator=g), 3.0)


def protocol_with(*interventions):
    qs = [Question("q", "x", "1")]
    return Protocol(study="t", model="m", weights="w" * 16, task="t", source=None, split=None,
                    questions=question_set_hash(qs), n=1, seed=0, fmt="native", grader="g/1", probe="deploy",
                    K=None, temperature=0.0, max_new_tokens=4, stop_strings=(), interventions=interventions)


@dataclass(frozen=True)
class ScaleHead(Intervention):
    """A user's kind: multiply one attention head's output (`attn.hook_z`, [batch, pos, head, d_head]) of `layer`."""

    layer: int
    head: int
    factor: float
    site: str = "attn.hook_z"
    kind: ClassVar[str] = "test_scale_head"

    def hooks(self, model, source=None) -> Hooks:
        head, factor = self.head, self.factor

        def scale(z, hook):
            z = z.clone()
            z[:, :, head] *= factor
            return z

        return [(hook_point(self.site, self.layer, model), positionwise(scale))]


@dataclass(frozen=True)
class Clamp(Intervention):
    """A user's kind with a vector: set the residual stream's component along `direction` to `value`."""

    layer: int
    direction: Vector
    value: float
    site: str = "hook_resid_post"
    kind: ClassVar[str] = "test_clamp"
    vector_fields: ClassVar[tuple[str, ...]] = ("direction",)

    def __post_init__(self):
        object.__setattr__(self, "direction", Vector.of(self.direction))

    def hooks(self, model, source=None) -> Hooks:
        d = self.direction.tensor(model.cfg.dtype, model.cfg.device)
        d = d / d.norm()
        value = self.value
        return [(hook_point(self.site, self.layer, model),
                 positionwise(lambda act, hook: act + (value - act @ d.to(act))[..., None] * d.to(act)))]


# ---------------------------------------------------------------- reach_lens's own kinds


def test_every_kind_of_reach_lens_is_registered():
    kinds = intervention_kinds()
    assert {"silence", "steer", "units", "latents", "route", "unit_plant"} <= set(kinds)
    assert kinds["unit_plant"] is UnitPlant and all(cls.kind == kind for kind, cls in kinds.items())


def test_unit_plant_round_trips_with_its_vectors(model, tokens):
    plant = a_plant(model)
    d = json.loads(json.dumps(plant.to_dict()))
    assert d["kind"] == "unit_plant" and d["weights"] == plant.weights.to_dict() and d["push"]["shape"] == [32]
    read = intervention_from_dict(d, plant.vectors())
    assert read == plant and type(read) is UnitPlant
    assert torch.equal(run(model, tokens, [read]), run(model, tokens, [plant]))
    assert not torch.allclose(run(model, tokens, [plant]), run(model, tokens), atol=1e-2)
    with pytest.raises(ValueError, match="unit_plant.weights is recorded by its hash .*: pass vectors="):
        intervention_from_dict(d)


def test_unit_plant_round_trips_through_a_protocol_and_its_run_store(tmp_path, model):
    plant, silence = a_plant(model), Silence(1)
    protocol = protocol_with(plant, silence)
    store = RunStore(tmp_path / "run", protocol)
    assert sorted(p.name for p in store.vectors_dir.iterdir()) == sorted(f"{h}.npy" for h in plant.vectors())
    stored = Protocol.from_dict(json.loads((tmp_path / "run" / "protocol.json").read_text())["protocol"])
    assert [intervention_from_dict(d, store.vectors_dir) for d in stored.interventions] == [plant, silence]
    assert RunStore.reader(tmp_path / "run", protocol_with(plant, silence)).fingerprint == store.fingerprint


def test_a_kind_of_reach_lens_reads_before_its_module_is_imported():
    """A fresh process that has imported only reach_lens.interventions reads a unit plant's record (vectors as the
    plain lists older records hold)."""
    script = (
        "import sys\n"
        "from reach_lens.interventions import intervention_from_dict\n"
        "assert 'reach_lens.localize.plants' not in sys.modules\n"
        "iv = intervention_from_dict({'kind': 'unit_plant', 'layer': 1, 'units': [0, 3], 'weights': [0.5, 1.0],\n"
        "                             'push': [1.0, 0.0, -1.0], 'strength': 2.0})\n"
        "print(type(iv).__module__, type(iv).__name__, iv.units, iv.push.shape)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["reach_lens.localize.plants", "UnitPlant", "(0,", "3)", "(3,)"]


def test_an_unknown_kind_names_the_registered_ones_and_how_to_register_yours():
    with pytest.raises(ValueError, match=r"unknown intervention kind 'prune'; registered: 'silence', 'steer', .*"
                                         r"'unit_plant'.* import it before reading"):
        intervention_from_dict({"kind": "prune", "layer": 1})


# ---------------------------------------------------------------- a user's kinds


def test_a_users_kind_round_trips_and_its_hooks_run(model, tokens):
    head = ScaleHead(1, 2, 0.0)
    d = json.loads(json.dumps(head.to_dict()))
    assert d == {"kind": "test_scale_head", "layer": 1, "head": 2, "factor": 0.0, "site": "attn.hook_z"}
    assert intervention_from_dict(d) == head and intervention_kinds()["test_scale_head"] is ScaleHead
    seen = {}
    record = ("blocks.1.attn.hook_z", lambda z, hook: seen.setdefault("z", z.clone()))
    with torch.no_grad(), model.hooks(fwd_hooks=hooks_for([head], model) + [record]):
        model(tokens)
    assert not seen["z"][:, :, 2].any() and seen["z"][:, :, [0, 1, 3]].abs().sum() > 0
    assert torch.equal(run(model, tokens, [ScaleHead(1, 2, 1.0)]), run(model, tokens))
    # the engine runs it too: greedy under the engine equals the hooked model's own argmax
    prompt = tuple(tokens[0].tolist())
    gen = engine_for(model).generate([Request(prompt, 4, stop_token_ids=())], interventions=[head])[0]
    seq = tokens[:1]
    for _ in range(4):
        seq = torch.cat([seq, run(model, seq, [head])[:, -1].argmax(-1, keepdim=True)], 1)
    assert list(gen.tokens) == seq[0, len(prompt):].tolist()


def test_a_users_kind_with_a_vector_round_trips_through_a_run_store(tmp_path, model, tokens):
    clamp = Clamp(2, torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(2)), 0.0)
    store = RunStore(tmp_path / "run", protocol_with(clamp))
    (d,) = store.protocol.interventions
    read = intervention_from_dict(d, store.vectors_dir)
    assert read == clamp and torch.equal(run(model, tokens, [read]), run(model, tokens, [clamp]))
    seen = {}
    record = ("blocks.2.hook_resid_post", lambda a, hook: seen.setdefault("resid", a.clone()))
    with torch.no_grad(), model.hooks(fwd_hooks=hooks_for([clamp], model) + [record]):
        model(tokens)
    unit = clamp.direction.tensor(torch.float32, "cpu") / clamp.direction.tensor(torch.float32, "cpu").norm()
    assert (seen["resid"] @ unit).abs().max() < 1e-4


def test_a_kind_another_class_holds_is_refused_naming_both():
    taken = (r"intervention kind 'silence' of test_intervention_registry\..*Impostor is taken by "
             r"reach_lens\.interventions\.Silence; give Impostor a kind of its own")
    with pytest.raises(ValueError, match=taken):
        class Impostor(Silence):
            kind: ClassVar[str] = "silence"
    with pytest.raises(ValueError, match="'test_scale_head' of .*Other is taken by .*ScaleHead"):
        @dataclass(frozen=True)
        class Other(ScaleHead):
            kind: ClassVar[str] = "test_scale_head"
    assert intervention_kinds()["silence"] is Silence and intervention_kinds()["test_scale_head"] is ScaleHead
    with pytest.raises(TypeError, match="kind 3 must be a non-empty str"):
        class Numbered(Silence):
            kind: ClassVar = 3


def defined(name: str, offset: float):
    """A class of one module and qualified name, each call a new definition (a notebook cell run again)."""

    @dataclass(frozen=True)
    class Shift(Intervention):
        layer: int
        kind: ClassVar[str] = name

        def hooks(self, model, source=None) -> Hooks:
            return [(hook_point("hook_resid_post", self.layer, model), lambda act, hook: act + offset)]

    return Shift


def test_defining_the_same_class_again_replaces_it(model, tokens):
    first = defined("test_shift", 1.0)
    second = defined("test_shift", 2.0)
    assert first is not second and intervention_kinds()["test_shift"] is second
    read = intervention_from_dict({"kind": "test_shift", "layer": 0})
    assert type(read) is second and torch.equal(run(model, tokens, [read]), run(model, tokens, [second(0)]))
    renamed = defined("test_shift_renamed", 3.0)  # the cell run again with another kind: the old kind goes
    kinds = intervention_kinds()
    assert kinds["test_shift_renamed"] is renamed and "test_shift" not in kinds


def test_bases_without_a_kind_of_their_own_are_not_registered():
    class Base(Intervention):  # abstract: no kind, no hooks
        pass

    @dataclass(frozen=True)
    class Concrete(Base):
        layer: int
        kind: ClassVar[str] = "test_concrete"

        def hooks(self, model, source=None) -> Hooks:
            return []

    @dataclass(frozen=True)
    class LoudSilence(Silence):  # inherits "silence": stays Silence's
        pass

    kinds = intervention_kinds()
    assert kinds["test_concrete"] is Concrete and kinds["silence"] is Silence
    assert Base not in kinds.values() and LoudSilence not in kinds.values() and Intervention not in kinds.values()
    assert intervention_from_dict(Concrete(3).to_dict()) == Concrete(3)
    assert type(intervention_from_dict(LoudSilence(2).to_dict())) is Silence
