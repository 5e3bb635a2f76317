"""Tiny random-weight HuggingFace causal LMs, one per family :func:`pipeoffload.models.hf.split_causal_lm`
knows (no downloads), and right-padded batches whose targets HF's own ``labels`` loss agrees with.

Every config is small (hidden 32, vocab 64) and deterministic (seeded init, dropout 0), with the
family's distinguishing features switched on: Mistral's sliding window shorter than the sequence,
Qwen2-MoE's shared expert, Gemma2/3's soft-capping and alternating sliding layers (eager attention
for Gemma2, as transformers requires), GPT-2's learned positions and tied head, MoE router
auxiliary losses (``output_router_logits``) with a coefficient large enough to matter.
"""

from __future__ import annotations

from typing import Any

VOCAB, HIDDEN = 64, 32
_COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
_MOE = dict(num_experts_per_tok=2, output_router_logits=True, router_aux_loss_coef=0.1)


def _spec() -> dict[str, tuple[str, str, dict]]:
    """family -> (config class, model class, config overrides)."""
    return {
        "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
        "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 4}),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8}),
        "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                      {**_MOE, "num_experts": 4, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 32}),
        "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                      {**_MOE, "num_experts": 4, "moe_intermediate_size": 16, "head_dim": 8}),
        "mixtral": ("MixtralConfig", "MixtralForCausalLM", {**_MOE, "num_local_experts": 4, "sliding_window": 6}),
        "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 8}),
        "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
                   {"head_dim": 8, "sliding_window": 4, "final_logit_softcapping": 3.0, "attn_logit_softcapping": 5.0,
                    "attn_implementation": "eager"}),
        "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                   {"head_dim": 8, "sliding_window": 4, "final_logit_softcapping": 3.0,
                    "layer_types": ["sliding_attention", "full_attention"] * 4}),
        "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
        "gpt2": ("GPT2Config", "GPT2LMHeadModel",
                 {"n_embd": HIDDEN, "n_head": 4, "n_positions": 64, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
                  "attn_pdrop": 0.0}),
        "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {"hidden_dropout": 0.0, "attention_dropout": 0.0}),
        "olmo": ("OlmoConfig", "OlmoForCausalLM", {}),
        "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
        **{kind: _auto(kind, extra) for kind, extra in _MORE.items()},
    }


_ALTERNATE = {"sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"] * 4}
_MUP = {"embedding_multiplier": 2.0, "logits_scaling": 3.0, "residual_multiplier": 0.5, "attention_multiplier": 0.3}
#: Llama-shaped families, each with the features its forward adds switched on.
_MORE: dict[str, dict] = {
    "stablelm": {}, "glm": {}, "glm4": {}, "helium": {"head_dim": 8}, "internlm3": {}, "nemotron": {},
    "exaone": {}, "ernie4_5": {}, "seed_oss": {"head_dim": 8, "residual_dropout": 0.0, "attention_dropout": 0.0}, "arcee": {}, "apertus": {}, "bitnet": {},
    "smollm3": {},
    "olmo3": _ALTERNATE, "exaone4": _ALTERNATE, "ministral3": {"sliding_window": 4},
    "starcoder2": {"sliding_window": 4},
    "olmoe": {**_MOE, "num_experts": 4}, "flex_olmo": {**_MOE, "num_experts": 4},
    # JetMoE's router loss is its own: the splitter refuses output_router_logits there
    "jetmoe": {"num_local_experts": 4},
    "granite": _MUP, "granitemoe": {**_MUP, **_MOE, "num_local_experts": 4},
    "granitemoeshared": {**_MUP, **_MOE, "num_local_experts": 4, "shared_intermediate_size": 32},
    "hyperclovax": {"embedding_multiplier": 2.0, "logits_scaling": 0.5},
    "cohere": {"logit_scale": 0.5}, "cohere2": {**_ALTERNATE, "logit_scale": 0.5},
}


def _auto(kind: str, extra: dict) -> tuple[str, str, dict]:
    """(config class, model class, overrides) of a family by transformers' auto mappings. A family
    the installed transformers lacks (one older than `make test` installs) keeps its place with empty
    class names, so :func:`build` fails for that family alone, by name, rather than every test
    module that imports this one failing at collection."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return CONFIG_MAPPING_NAMES.get(kind, ""), MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(kind, ""), dict(extra)


FAMILIES: tuple[str, ...] = tuple(_spec())
#: The families the multi-process runtime tests run: the first fifteen, and one of each kind of
#: feature the later ones add (MuP multipliers, a logit scale with alternating windows, an MoE
#: router loss, a sliding window on every layer). The runtime does not depend on the family once
#: the stages give the model's own loss, which every family is checked for in one process.
RUNTIME_FAMILIES: tuple[str, ...] = FAMILIES[:FAMILIES.index("olmo2") + 1] + ("granite", "cohere2", "olmoe",
                                                                              "starcoder2")


def build(family: str, layers: int = 4, tie: bool | None = None) -> Any:
    """The family's tiny model, seeded: the same weights on every rank."""
    import torch
    import transformers

    cfg_name, model_name, extra = _spec()[family]
    if not cfg_name or not model_name:
        raise RuntimeError(f"transformers {transformers.__version__} has no {family!r} causal LM; a newer one "
                           "(as `make test` installs) has every family these tests build: pip install -U transformers")
    kw = {**_COMMON, **extra, "num_hidden_layers": layers}
    if family == "gpt2":
        kw = {k: v for k, v in kw.items() if k not in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                        "num_key_value_heads", "max_position_embeddings")}
        kw["n_layer"] = kw.pop("num_hidden_layers")
    if family == "gpt_neox":
        kw.pop("num_key_value_heads")
    if "layer_types" in kw:
        kw["layer_types"] = kw["layer_types"][:layers]
    kw.setdefault("attn_implementation", "sdpa")
    if tie is not None:
        kw["tie_word_embeddings"] = tie
    cfg = getattr(transformers, cfg_name)(**kw)
    torch.manual_seed(0)
    return getattr(transformers, model_name)(cfg)


def batch(step: int, rows: int = 8, seq: int = 10, padded: bool = True) -> tuple[dict, Any, Any]:
    """``(inputs, targets, labels)``: right-padded ids and their mask; next-token targets
    (-100 at padding and at the last position) for :func:`causal_lm_loss`; and the
    unshifted ``labels`` giving HF's own loss the same tokens."""
    import torch

    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(3, VOCAB, (rows, seq), generator=g)
    lengths = torch.randint(seq // 2, seq + 1, (rows,), generator=g) if padded else torch.full((rows,), seq)
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    labels = ids.masked_fill(mask == 0, -100)
    targets = torch.cat([labels[:, 1:], torch.full((rows, 1), -100)], dim=1)
    x = {"input_ids": ids, "attention_mask": mask} if padded else {"input_ids": ids}
    return x, targets, labels


def sequential(stages: list, x: Any) -> Any:
    """The stages run one after the other in one process."""
    for s in stages:
        x = s(x)
    return x

