"""HuggingFace decoder-only causal LMs split into pipeline stages, in two lines::

    stages = split_causal_lm(model, sched.num_stages)
    runner = PipelineRunner(stages, causal_lm_loss, sched)

Needs the optional ``transformers`` package (``pip install 'pipeoffload[hf]'``) with its
mask functions (``transformers.masking_utils``, 4.53+); written and tested against 5.x.

What a stage is. :func:`split_causal_lm` cuts a ``...ForCausalLM`` into
:class:`CausalLMStage` modules that *share* the model's submodules (no copy) and keep
its structure, so parameter names stay the model's own (``model.layers.3.mlp.up_proj.weight``,
``transformer.h.0.attn.c_attn.weight``, ``lm_head.weight``): a checkpoint of the pipeline
loads into the whole model, at any pipeline size. The first stage holds the embedding
(GPT-2: token and position embeddings and their dropout), every stage a contiguous run of
decoder layers, the last the final norm and the head. Each stage computes exactly what the
model's own forward computes for its part:

- the attention masks come from transformers' own mask functions
  (``create_causal_mask``, ``create_sliding_window_causal_mask``), one per layer type the
  stage holds (``config.layer_types``; a model without them uses the sliding-window mask
  when ``config.sliding_window`` is set, as Mistral, Phi-3, Mixtral and Qwen3-MoE do), for
  the model's own attention implementation (``sdpa``, ``eager`` with its additive mask,
  ``flex_attention``); rotary embeddings per layer type where the model has them (Gemma3);
- Gemma's embedding scale lives in its embedding module; Gemma2/3's final-logit
  soft-capping is applied after the head, as their ``ForCausalLM.forward`` does; so are
  the multipliers other families apply in their top-level forwards (Granite's MuP
  ``embedding_multiplier`` and ``logits_scaling``, Cohere's ``logit_scale``, StarCoder2's
  embedding dropout: :class:`Recipe`);
- MoE models (Qwen2-MoE, Qwen3-MoE, Mixtral) with ``config.output_router_logits`` (as HF
  decides whether to add the load-balancing loss): every stage adds its layers' routing
  statistics to running sums that cross the boundaries (the sum of the routing
  probabilities with its gradient), and the last stage outputs
  ``{"logits": ..., "aux_loss": router_aux_loss_coef * load_balancing_loss}``, the term
  HF adds to its ``loss``, computed by the same formula in the same order.

What crosses each boundary (``runtime/boundary.py``):

- into the first stage: ``{"input_ids": (b, s), "attention_mask": (b, s) 0/1,
  "position_ids": (b, s)}`` (the mask and the positions optional; a tensor of ids alone
  works too). Packed sequences: leave out the mask and give position ids that restart at
  each sequence: transformers' mask functions then keep each token inside its sequence;
- between stages: ``{"hidden_states", "position_ids", "attention_mask" (when given),
  "router" (MoE)}``; everything but the hidden states and the routing probabilities
  travels without gradients, and each stage rebuilds its masks from the 2D mask;
- out of the last stage: the logits ``(b, s, vocab)`` (a dict with the auxiliary term for
  MoE). :func:`causal_lm_loss` takes next-token targets, already shifted.

Ties come from the model's own tied-weight list (``_tied_weights_keys``), declared on every
stage (``stage.tied_parameters``) for the runner when the model really ties them (same
tensor): stages built on each rank apart stay tied without ``tie=``.

A model this module has no recipe for, or one with a feature the recipes do not reproduce
(cross-attention, bidirectional attention, a layer type other than full or sliding
attention, a module the recipe does not know), is refused with a ``ParameterError`` naming
what is missing; it is never split into something else.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ParameterError
from .config import balanced_ranges

FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass(frozen=True)
class Recipe:
    """How a model family's base model runs, by its children's names."""

    embed: tuple[str, ...]  #: base-model children the first stage applies, in order
    layers: str  #: the decoder layers (an ``nn.ModuleList``)
    norm: str  #: the final norm
    rotary: str | None  #: the rotary embedding (no parameters: every stage holds it)
    masks: str  #: "layer_types" (config.layer_types), "window" (sliding when config.sliding_window), "full"
    embed_kind: str = "tokens"  #: "tokens", "gpt2" (+ positions, dropout), "neox" (+ dropout)
    #: config attributes the model's own forwards apply around the stages' modules:
    embed_mult: str | None = None  #: multiplies the token embeddings (Granite's MuP embedding_multiplier)
    embed_dropout: str | None = None  #: dropout probability on the embeddings (StarCoder2)
    logits_mul: str | None = None  #: multiplies the logits (Cohere's logit_scale, HyperCLOVA X)
    logits_div: str | None = None  #: divides the logits (Granite's logits_scaling)
    #: whether HF's load_balancing_loss_func is the family's router loss (False: refused when asked for)
    router_loss: bool = True


def _llama(masks: str, **extra: Any) -> Recipe:
    return Recipe(("embed_tokens",), "layers", "norm", "rotary_emb", masks, **extra)


_GRANITE = dict(embed_mult="embedding_multiplier", logits_div="logits_scaling")


#: ``config.model_type`` -> recipe; each checked against the model's own forward.
RECIPES: dict[str, Recipe] = {
    "llama": _llama("full"), "olmo": _llama("full"), "olmo2": _llama("full"), "gemma": _llama("full"),
    "mistral": _llama("window"), "phi3": _llama("window"), "mixtral": _llama("window"),
    "qwen3_moe": _llama("window"),
    "qwen2": _llama("layer_types"), "qwen3": _llama("layer_types"), "qwen2_moe": _llama("layer_types"),
    "gemma2": _llama("layer_types"), "gemma3_text": _llama("layer_types"),
    # Llama-shaped families checked bit for bit against their own forward (tests/test_hf_models.py)
    **{kind: _llama("full") for kind in ("stablelm", "glm", "glm4", "helium", "internlm3", "nemotron", "exaone",
                                          "ernie4_5", "seed_oss", "arcee", "apertus", "bitnet", "olmoe",
                                          "flex_olmo")},
    "jetmoe": _llama("full", router_loss=False),
    **{kind: _llama("layer_types") for kind in ("olmo3", "exaone4", "smollm3")},
    "ministral3": _llama("window"),
    "starcoder2": _llama("window", embed_dropout="embedding_dropout"),
    "granite": _llama("full", **_GRANITE), "granitemoe": _llama("full", **_GRANITE),
    "granitemoeshared": _llama("full", **_GRANITE),
    "hyperclovax": _llama("full", embed_mult="embedding_multiplier", logits_mul="logits_scaling"),
    "cohere": _llama("full", logits_mul="logit_scale"), "cohere2": _llama("layer_types", logits_mul="logit_scale"),
    "gpt2": Recipe(("wte", "wpe", "drop"), "h", "ln_f", None, "full", "gpt2"),
    "gpt_neox": Recipe(("embed_in", "emb_dropout"), "layers", "final_layer_norm", "rotary_emb", "full", "neox"),
}


@dataclass(frozen=True)
class _Router:
    """The load-balancing loss as HF's ``load_balancing_loss_func`` computes it."""

    router_class: type
    index: int  #: which output of the router module is its logits
    num_experts: int
    top_k: int
    coef: float


class CausalLMStage(nn.Module):
    """Decoder layers ``layer_ids`` of a HF causal LM (+ the embedding in the first
    stage, + the final norm and the head in the last), sharing the model's submodules
    and keeping its parameter names (module docstring). Built by :func:`split_causal_lm`."""

    def __init__(self, model: nn.Module, recipe: Recipe, layer_ids: Sequence[int], first: bool, last: bool,
                 head: str, router: _Router | None, ties: list[tuple[str, str]]) -> None:
        super().__init__()
        self.first, self.last, self.recipe, self._router = first, last, recipe, router
        self.config = model.config
        #: ties the runner reads (the same on every stage, so every rank declares them)
        self.tied_parameters = list(ties)
        self._prefix, self._head = model.base_model_prefix, head
        base = model.base_model
        holder = nn.Module()
        setattr(self, self._prefix, holder)
        if first:
            for n in recipe.embed:
                setattr(holder, n, getattr(base, n))
        setattr(holder, recipe.layers, nn.ModuleDict({str(i): getattr(base, recipe.layers)[i] for i in layer_ids}))
        if recipe.rotary:
            setattr(holder, recipe.rotary, getattr(base, recipe.rotary))
        if last:
            setattr(holder, recipe.norm, getattr(base, recipe.norm))
            setattr(self, head, getattr(model, head))
        types = _layer_types(model.config, recipe)
        self._types = {str(i): types[i] for i in layer_ids}
        rot = getattr(base, recipe.rotary) if recipe.rotary else None
        self._rope_per_type = rot is not None and "layer_type" in inspect.signature(rot.forward).parameters

    def forward(self, x: Any) -> Any:
        base = getattr(self, self._prefix)
        if self.first:
            if isinstance(x, torch.Tensor):
                x = {"input_ids": x}
            hidden = self._embed(base, x["input_ids"], x.get("position_ids"))
            pos = x.get("position_ids")
            if pos is None:  # as the model's forward: (1, s), not expanded
                pos = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
            mask2d = x.get("attention_mask")
            _check_mask(mask2d, self.config)
            router = self._router_start(hidden.device) if self._router else None
        else:
            hidden, pos, mask2d = x["hidden_states"], x["position_ids"], x.get("attention_mask")
            router = x.get("router")
        masks = {t: _mask(self.config, t, hidden, mask2d, pos) for t in set(self._types.values())}
        rope: Any = None
        if self.recipe.rotary:
            rot = getattr(base, self.recipe.rotary)
            rope = {t: rot(hidden, pos, t) for t in masks} if self._rope_per_type else rot(hidden, pos)
        logits_seen: list[torch.Tensor] = []
        hooks = self._router_hooks(logits_seen) if router is not None else []
        try:
            for i, layer in getattr(base, self.recipe.layers).items():
                t = self._types[i]
                kw: dict[str, Any] = {"attention_mask": masks[t], "position_ids": pos}
                if rope is not None:
                    kw["position_embeddings"] = rope[t] if self._rope_per_type else rope
                out = layer(hidden, **kw)
                hidden = out[0] if isinstance(out, tuple) else out
        finally:
            for h in hooks:
                h.remove()
        if router is not None:
            router = self._router_add(router, logits_seen, mask2d)
        if not self.last:
            out = {"hidden_states": hidden, "position_ids": pos}
            if mask2d is not None:
                out["attention_mask"] = mask2d
            if router is not None:
                out["router"] = router
            return out
        logits = getattr(self, self._head)(getattr(base, self.recipe.norm)(hidden))
        if self.recipe.logits_mul:
            logits = logits * getattr(self.config, self.recipe.logits_mul)
        if self.recipe.logits_div:
            logits = logits / getattr(self.config, self.recipe.logits_div)
        cap = getattr(self.config, "final_logit_softcapping", None)
        if cap is not None:  # Gemma2/3: in the model's top-level forward
            logits = torch.tanh(logits / cap) * cap
        if router is None:
            return logits
        return {"logits": logits, "aux_loss": self._router.coef * _balance_loss(router, self._router.num_experts)}

    # ------------------------------------------------------------------ parts
    def _embed(self, base: nn.Module, ids: torch.Tensor, pos: torch.Tensor | None) -> torch.Tensor:
        kind = self.recipe.embed_kind
        if kind == "gpt2":
            if pos is None:
                pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
            emb = base.wte(ids)
            return base.drop(emb + base.wpe(pos).to(emb.device))
        if kind == "neox":
            return base.emb_dropout(base.embed_in(ids))
        hidden = base.embed_tokens(ids)
        if self.recipe.embed_mult:
            hidden = hidden * getattr(self.config, self.recipe.embed_mult)
        if self.recipe.embed_dropout:
            hidden = F.dropout(hidden, p=getattr(self.config, self.recipe.embed_dropout), training=self.training)
        return hidden

    def _router_start(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        e = self._router.num_experts
        z = torch.zeros(e, dtype=torch.float32, device=device)
        return z, z.clone(), torch.zeros((), dtype=torch.float32, device=device)

    def _router_hooks(self, seen: list[torch.Tensor]) -> list[Any]:
        idx = self._router.index

        def grab(_mod: nn.Module, _args: Any, out: Any) -> None:
            seen.append(out[idx] if isinstance(out, (tuple, list)) else out)

        return [m.register_forward_hook(grab) for m in self.modules() if isinstance(m, self._router.router_class)]

    def _router_add(self, router: Any, seen: list[torch.Tensor], mask2d: torch.Tensor | None) -> tuple:
        """HF's ``load_balancing_loss_func`` accumulation, for this stage's layers."""
        tokens, probs, rows = router
        e, k = self._router.num_experts, self._router.top_k
        dev = tokens.device
        hist = torch.float32 if dev.type in ("cpu", "mps") else torch.int32
        flat = mask2d.reshape(-1).to(device=dev, dtype=torch.float32) if mask2d is not None else None
        for gate in seen:
            weights = F.softmax(gate.to(dev), dim=-1)
            _, chosen = torch.topk(weights, k, dim=-1)
            if flat is None:
                tokens = tokens + torch.histc(chosen.reshape(-1).to(hist), bins=e, min=0, max=e)
                probs = probs + weights.float().sum(dim=0)
                rows = rows + weights.shape[0]
            else:
                tokens = tokens + torch.zeros(e, dtype=torch.float32, device=dev).scatter_add_(
                    0, chosen.reshape(-1), flat.repeat_interleave(k))
                probs = probs + (weights.float() * flat.unsqueeze(-1)).sum(dim=0)
                rows = rows + flat.sum()
        return tokens, probs, rows


def _check_mask(mask: torch.Tensor | None, config: Any) -> None:
    """A boolean 4D mask given to eager attention would be *added* to the scores as 0/1."""
    if (mask is not None and mask.dim() == 4 and mask.dtype == torch.bool
            and getattr(config, "_attn_implementation", None) == "eager"):
        raise ParameterError("inputs", "attention_mask is a boolean (b, 1, s, s) mask but the model uses eager "
                             "attention, which adds the mask to its scores (0/1, not -inf): give the (b, s) 0/1 "
                             "padding mask (the stages build the model's own mask from it) or an additive float "
                             "mask")


def _balance_loss(router: tuple, num_experts: int) -> torch.Tensor:
    tokens, probs, rows = router
    return torch.sum((tokens / rows) * (probs / rows).unsqueeze(0)) * num_experts


_MASK_KW: dict[str, str] = {}


def _mask(config: Any, layer_type: str, hidden: torch.Tensor, mask2d: torch.Tensor | None,
          pos: torch.Tensor) -> Any:
    """The mask transformers' own function gives layers of ``layer_type``."""
    from transformers import masking_utils as mu

    fn = mu.create_causal_mask if layer_type == FULL else mu.create_sliding_window_causal_mask
    if not _MASK_KW:
        names = inspect.signature(mu.create_causal_mask).parameters
        _MASK_KW["embeds"] = "inputs_embeds" if "inputs_embeds" in names else "input_embeds"
        _MASK_KW["cache"] = "cache" if "cache" in names else "past_key_values"
    return fn(config=config, attention_mask=mask2d, position_ids=pos,
              **{_MASK_KW["embeds"]: hidden, _MASK_KW["cache"]: None})


def _layer_types(config: Any, recipe: Recipe) -> list[str]:
    n = config.num_hidden_layers
    if recipe.masks == "layer_types":
        types = list(config.layer_types)
    elif recipe.masks == "window" and getattr(config, "sliding_window", None) is not None:
        types = [SLIDING] * n
    else:
        types = [FULL] * n
    return types


def _check(model: nn.Module) -> tuple[Recipe, str]:
    """The model's recipe and its head's attribute name; ParameterError naming what is
    missing or unknown."""
    try:
        from transformers import masking_utils  # noqa: F401  (transformers >= 4.53)
    except ImportError as e:
        raise ParameterError("model", "split_causal_lm needs transformers' mask functions "
                             "(transformers.masking_utils, transformers >= 4.53; tested with 5.x): "
                             f"{e}") from None
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind not in RECIPES:
        raise ParameterError("model", f"no splitting recipe for model_type {kind!r} ({type(model).__name__}); "
                             f"known: {', '.join(sorted(RECIPES))}. Split it by name with "
                             "pipeoffload.models.split.split_by_name, or write the stages by hand "
                             "(docs/runtime.md, \"Your own model\")")
    recipe = RECIPES[kind]
    base = getattr(model, "base_model", None)
    if base is None or base is model:
        raise ParameterError("model", f"{type(model).__name__} has no base model under a prefix: give the "
                             f"...ForCausalLM (a model with a head), not the bare {type(model).__name__}")
    head_mod = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    top = dict(model.named_children())
    head = next((n for n, m in top.items() if m is head_mod), None)
    if head is None:
        raise ParameterError("model", f"{type(model).__name__} has no output head (get_output_embeddings)")
    extra = sorted(set(top) - {model.base_model_prefix, head})
    if extra:
        raise ParameterError("model", f"{type(model).__name__} has submodules the {kind} recipe does not know: "
                             f"{', '.join(extra)}")
    want = set(recipe.embed) | {recipe.layers, recipe.norm} | ({recipe.rotary} if recipe.rotary else set())
    have = {n for n, _ in base.named_children()}
    if want - have:
        raise ParameterError("model", f"the {kind} base model lacks {', '.join(sorted(want - have))} "
                             f"(has {', '.join(sorted(have))})")
    if have - want:
        raise ParameterError("model", f"the {kind} base model has submodules the recipe does not know: "
                             f"{', '.join(sorted(have - want))}")
    layers = getattr(base, recipe.layers)
    if len(layers) != cfg.num_hidden_layers:
        raise ParameterError("model", f"{len(layers)} decoder layers but config.num_hidden_layers = "
                             f"{cfg.num_hidden_layers}; the model's forward runs only the first "
                             f"{cfg.num_hidden_layers}")
    unsupported = [f for f in ("add_cross_attention", "use_bidirectional_attention") if getattr(cfg, f, False)]
    if not getattr(cfg, "is_causal", True):
        unsupported.append("is_causal=False")
    if unsupported:
        raise ParameterError("model", f"config has {', '.join(unsupported)}: not a decoder-only causal LM "
                             "this splitter reproduces")
    if kind.startswith("gemma") and not hasattr(base.embed_tokens, "embed_scale"):
        # older transformers scale Gemma's embedding in the model's forward, which the stages do not run
        raise ParameterError("model", f"{kind}: the embedding module has no embed_scale (a transformers "
                             "version that scales it in the model's forward); use transformers 5.x")
    other = sorted(set(_layer_types(cfg, recipe)) - {FULL, SLIDING})
    if other:
        raise ParameterError("model", f"config.layer_types has {', '.join(other)}; the splitter knows "
                             f"{FULL} and {SLIDING}")
    return recipe, head


def _router(model: nn.Module, recipe: Recipe) -> _Router | None:
    """The load-balancing loss HF adds to this model's ``loss``, if any."""
    cfg = model.config
    if not getattr(cfg, "output_router_logits", False):
        return None
    if not recipe.router_loss:
        raise ParameterError("model", f"config.output_router_logits is set, but {cfg.model_type}'s router loss is "
                             "its own (not transformers' load_balancing_loss_func, which the stages reproduce): "
                             "set output_router_logits=False and add the loss with "
                             "pipeoffload.models.aux_loss.add_aux_loss")
    rec = (getattr(model.base_model, "_can_record_outputs", None) or {}).get("router_logits")
    if rec is None or not all(hasattr(model, a) for a in ("num_experts", "num_experts_per_tok",
                                                           "router_aux_loss_coef")):
        raise ParameterError("model", f"config.output_router_logits is set but {type(model).__name__} has no "
                             "router to record (base model _can_record_outputs[\"router_logits\"]) or lacks "
                             "num_experts / num_experts_per_tok / router_aux_loss_coef")
    return _Router(rec.target_class, rec.index or 0, int(model.num_experts), int(model.num_experts_per_tok),
                   float(model.router_aux_loss_coef))


def tied_parameters(model: nn.Module) -> list[tuple[str, str]]:
    """``(source, target)`` name pairs from the model's tied-weight list
    (``_tied_weights_keys``) that the model really ties (one tensor under both names)."""
    keys = getattr(model, "_tied_weights_keys", None) or {}
    if isinstance(keys, dict):
        pairs = [(src, tgt) for tgt, src in keys.items()]
    else:  # transformers 4.x: a list of targets tied to the input embedding
        emb = model.get_input_embeddings()
        src = next((f"{n}.weight" for n, m in model.named_modules() if m is emb), None)
        pairs = [(src, t) for t in keys if src is not None]
    named = dict(model.named_parameters(remove_duplicate=False))
    return [(a, b) for a, b in pairs if a in named and b in named and named[a] is named[b]]


def _numel(mod: nn.Module) -> int:
    return sum(p.numel() for p in mod.parameters())


def layer_costs(model: nn.Module) -> tuple[list[float], float, float]:
    """``(per-layer costs, first-stage extra, last-stage extra)`` in parameters: a layer
    counts its parameters (an MoE layer's experts by the share a token uses:
    ``top_k / num_experts``), the first stage its embedding, the last its final norm and
    head (a tied head counts there too: its matmul runs there)."""
    recipe, head = _check(model)
    base = model.base_model
    share = None
    if getattr(model.config, "num_experts_per_tok", None) and hasattr(model, "num_experts"):
        share = model.num_experts_per_tok / model.num_experts
    costs = []
    for layer in getattr(base, recipe.layers):
        c = 0.0
        for name, p in layer.named_parameters():
            c += p.numel() * (share if share is not None and ".experts." in f".{name}" else 1.0)
        costs.append(c)
    first = float(sum(_numel(getattr(base, n)) for n in recipe.embed))
    last = float(_numel(getattr(base, recipe.norm)) + getattr(model, head).weight.numel())
    return costs, first, last


def stage_costs(model: nn.Module) -> tuple[list[float], float, float]:
    """Deprecated name of :func:`layer_costs` (warns; ``stage_costs`` elsewhere meant per-rank
    costs, now ``rank_costs``)."""
    import warnings

    warnings.warn("pipeoffload.models.hf.stage_costs is deprecated; use layer_costs", DeprecationWarning,
                  stacklevel=2)
    return layer_costs(model)


def split_causal_lm(model: nn.Module, num_stages: int, *,
                    layers_per_stage: Sequence[int] | None = None) -> list[CausalLMStage]:
    """Cut a HuggingFace decoder-only causal LM into ``num_stages`` pipeline stages.

    Args:
        model: a ``...ForCausalLM`` / ``GPT2LMHeadModel`` of a known family
            (:data:`RECIPES`: Llama, Mistral, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE, Mixtral,
            Gemma, Gemma2, Gemma3 (text), Phi-3, GPT-2, GPT-NeoX, OLMo, OLMo2 and 26
            Llama-shaped families: docs/runtime.md).
        num_stages: the schedule's number of layer groups (``sched.num_stages``, p·v).
        layers_per_stage: decoder layers per stage, in order (summing to the model's);
            default: balanced by :func:`layer_costs` (embedding and head counted) with
            :func:`~pipeoffload.models.config.balanced_ranges`.

    Returns:
        ``num_stages`` :class:`CausalLMStage` modules sharing the model's submodules.

    Raises:
        ParameterError: an unknown model or a feature the splitter does not reproduce
            (naming it), too few layers, or a bad ``layers_per_stage``.

    Guarantees: each stage computes what the model's own forward computes for its part
    (masks by transformers' own functions, soft-capping, the MoE load-balancing term
    HF adds to its loss); with :func:`causal_lm_loss` the pipeline's loss is the model's
    ``loss`` (next-token cross-entropy + auxiliary terms) and its gradients those of
    single-process training (tested per family, loop and V placements, with offload).
    """
    recipe, head = _check(model)
    n = len(getattr(model.base_model, recipe.layers))
    if not isinstance(num_stages, int) or num_stages < 1:
        raise ParameterError("num_stages", f"expected a positive int (sched.num_stages), got {num_stages!r}")
    if layers_per_stage is not None:
        sizes = list(layers_per_stage)
        if len(sizes) != num_stages or any(not isinstance(k, int) or k < 0 for k in sizes) or sum(sizes) != n:
            raise ParameterError("layers_per_stage", f"expected {num_stages} non-negative ints summing to the "
                                 f"model's {n} decoder layers, got {sizes}")
        ranges, start = [], 0
        for k in sizes:
            ranges.append(range(start, start + k))
            start += k
    else:
        if n < num_stages:
            raise ParameterError("num_stages", f"{n} decoder layers cannot fill {num_stages} stages (p·v); "
                                 "give `layers_per_stage` to allow stages without layers")
        costs, first, last = layer_costs(model)
        ranges = balanced_ranges(costs, num_stages, first, last)
    router, ties = _router(model, recipe), tied_parameters(model)
    return [CausalLMStage(model, recipe, ranges[s], s == 0, s == num_stages - 1, head, router, ties)
            for s in range(num_stages)]


def causal_lm_loss(output: Any, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of next-token ``targets`` (already shifted), ``-100`` ignored,
    plus the stage's auxiliary term when ``output`` is a dict with ``"aux_loss"`` (the
    MoE load-balancing term, already multiplied by its coefficient).

    Args:
        output: the last stage's logits ``(b, s, vocab)``, or ``{"logits": ..., "aux_loss": ...}``.
        targets: ``(b, s)`` token ids; ``-100`` where no loss is taken.

    Returns:
        A scalar: what the HF model returns as ``loss`` for the same tokens.
    """
    logits, aux = (output["logits"], output.get("aux_loss")) if isinstance(output, dict) else (output, None)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=-100)
    return loss if aux is None else loss + aux.to(loss.device)
