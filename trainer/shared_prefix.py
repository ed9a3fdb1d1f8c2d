"""Shared-prefix training: a batch's common prompt prefix is run once, not once per example.

Every example of a task starts with the same tokens: the system prompt (for SQL, about 450
tokens of schema before a question of 15) and the opening of the user turn. A causal LM's states
over those tokens do not depend on what follows them, so the backbone runs on the common prefix
once (batch 1), its key/value cache is repeated over the batch, and the rest of each example
runs on top of it. The gradient flows back through the repeated cache into the one prefix pass
(`repeat_interleave` sums it over the batch), so loss and gradients are those of the plain
forward (`tests/unit/test_shared_prefix.py`); only the prefix's repeated work is gone. On two
CPU cores an SQL SFT step is about three times cheaper.

The split point is the common prefix of the batch's tokens, cut before the first labelled token
of any row, so every labelled position is predicted from a state of the second pass. A batch
with no useful common prefix (a padded-left batch, a single row) takes the plain forward.
"""
from __future__ import annotations

import torch

MIN_SHARED_TOKENS = 16  # below this the second pass saves less than it costs


def split_point(input_ids: torch.Tensor, labels: torch.Tensor) -> int:
    """Tokens [0, P) are the same in every row and carry no label, nor does token P (it is
    predicted from the prefix's last state); 0 when there is nothing worth sharing."""
    if input_ids.size(0) < 2:
        return 0
    same = (input_ids == input_ids[:1]).all(dim=0)
    common = int(same.long().cumprod(0).sum())
    labelled = (labels != -100).any(dim=0).nonzero()
    first_label = int(labelled[0]) if len(labelled) else input_ids.size(1)
    point = min(common, first_label - 1)
    return point if point >= MIN_SHARED_TOKENS else 0


def backbone(model):
    """The transformer under the LM head (of a PEFT model too: its LoRA layers are inside it);
    the prefix pass needs its states, not logits over the prefix."""
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(causal_lm, causal_lm.base_model_prefix)


def with_shared_prefix(model, inputs: dict) -> dict:
    """The batch's inputs for a forward on top of its common prefix: the prefix run once (with
    gradient), its cache repeated over the rows, and every per-token tensor cut to what follows.
    The attention mask keeps its full length (prefix and rest), as a forward with a cache expects.
    Returns the inputs unchanged when the batch shares too little."""
    input_ids, labels = inputs["input_ids"], inputs.get("labels")
    if labels is None or getattr(model, "is_gradient_checkpointing", False):
        return inputs  # a checkpointed layer takes no cache (transformers drops it): the plain forward
    point = split_point(input_ids, labels)
    if not point:
        return inputs
    rows = input_ids.size(0)
    cache = backbone(model)(input_ids=input_ids[:1, :point], use_cache=True).past_key_values
    cache.batch_repeat_interleave(rows)
    out = {"past_key_values": cache}
    for key, value in inputs.items():
        if key == "attention_mask" or not isinstance(value, torch.Tensor) or value.dim() != 2 or value.shape != input_ids.shape:
            out.setdefault(key, value)
        else:
            out[key] = value[:, point:]
    return out


def with_shared_prompts(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> dict | None:
    """GRPO's forward inputs with each distinct prompt run once: a batch of groups holds every
    prompt `n` times (once per sample), and all of a row but its last `logits_to_keep` tokens is
    prompt (left-padded, as TRL builds it). The prompts but their last token run once each (with
    gradient), their cache is gathered to every row that has them, and the rows go on from the
    prompt's last token, whose state predicts the first completion token. Positions and masks are
    those of the plain forward (the attention mask keeps its full length), so log-probabilities,
    entropies and gradients are the plain forward's (`tests/unit/test_shared_prefix.py`); a push
    group of 4 (a 250-token prompt, 40-token answers) costs 410 tokens of forward, not 1,160.

    Returns the inputs for `model(**inputs, fused_lm_head=True)`, labels included, or None where
    no prompt repeats or the model checkpoints (a checkpointed layer takes no cache)."""
    prefix = input_ids.size(1) - logits_to_keep - 1
    if prefix < 1 or getattr(model, "is_gradient_checkpointing", False):
        return None
    key = torch.cat([input_ids[:, :prefix + 1], attention_mask[:, :prefix + 1]], dim=1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    distinct = int(inverse.max()) + 1
    if distinct == input_ids.size(0):
        return None
    rows = torch.arange(input_ids.size(0), device=input_ids.device)
    first = torch.full((distinct,), input_ids.size(0), device=input_ids.device).scatter_reduce(0, inverse, rows, "amin")
    cache = backbone(model)(input_ids=input_ids[first, :prefix], attention_mask=attention_mask[first, :prefix],
                            use_cache=True).past_key_values
    cache.batch_select_indices(inverse)
    rest = input_ids[:, prefix:]
    labels = rest.masked_fill(attention_mask[:, prefix:] == 0, -100)
    labels[:, 0] = -100  # the prompt's last token: its state predicts the first completion token
    return {"input_ids": rest, "attention_mask": attention_mask, "past_key_values": cache, "labels": labels}
