"""Trained is served: the probe a candidate carries (`common.records.LogprobProbe`). When the
round saves a version, the trainer computes, in fp32 at temperature 1, the logprobs of the last
tokens of one of the texts it trained on; every engine that later loads the version is asked the
same tokens' prompt logprobs (deploy/hotswap.py), so an engine that serves something other than
what was trained (vLLM #47724, OpenPipe ART #661, TRL #5312: a stale or wrong LoRA, weights
applied differently) is caught before any route points at it."""
from __future__ import annotations

from contextlib import contextmanager

import torch

from common.records import LogprobProbe
from trainer.data import TaskData

PROBED_TOKENS = 48  # the last this many tokens of the probe text are compared


def probe_ids(tokenizer, data: TaskData) -> list[int] | None:
    """A text the round trained on, as token ids: a served group's prompt and first sample, else a
    supervised example, a preference pair's chosen side, a rated answer, or a GRPO prompt."""
    if data.groups:
        group = data.groups[0]
        return group.prompt_token_ids + group.completion_ids[0]
    for examples, answer in ((data.sft, "completion"), (data.pairs, "chosen"), (data.kto, "completion"), (data.prompts, None)):
        if examples:
            example = examples[0]
            ids = tokenizer(example.prompt, add_special_tokens=True)["input_ids"]
            return ids + (tokenizer(getattr(example, answer), add_special_tokens=False)["input_ids"] if answer else [])
    return None


@contextmanager
def _measuring(model):
    """Eval mode, no gradient, no autocast, for logprobs read in fp32; the policy's mode is put back."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.autocast(model.device.type, enabled=False):
            yield
    finally:
        model.train(was_training)


def token_logprobs(model, ids: list[int], start: int, temperature: float = 1.0) -> torch.Tensor:
    """The logprob under `model`, in fp32 at `temperature`, of each of `ids[start:]` given the
    tokens before it (`_measuring`)."""
    with _measuring(model):
        tokens = torch.tensor([ids], device=model.device)
        logits = model(input_ids=tokens).logits[0, start - 1:-1].float() / (temperature or 1.0)
    return torch.log_softmax(logits, dim=-1).gather(1, tokens[0, start:].unsqueeze(1)).squeeze(1)


def group_logprobs(model, prompt: list[int], completions: list[list[int]], temperature: float = 1.0) -> list[torch.Tensor]:
    """`token_logprobs` of each completion after `prompt`, the prompt run once for the group (its
    cache shared by every sample: GRPO's KL reads a group's samples, whose prompt is the same)."""
    if len(prompt) < 2:
        return [token_logprobs(model, prompt + completion, len(prompt), temperature) for completion in completions]
    with _measuring(model):
        cache = model(input_ids=torch.tensor([prompt[:-1]], device=model.device), use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(completions))
        width = max(len(c) for c in completions)
        rest = torch.tensor([[prompt[-1], *c, *[0] * (width - len(c))] for c in completions], device=model.device)
        mask = torch.tensor([[1] * len(prompt) + [1] * len(c) + [0] * (width - len(c)) for c in completions], device=model.device)
        logits = model(input_ids=rest, attention_mask=mask, past_key_values=cache).logits[:, :-1].float() / (temperature or 1.0)
    logprobs = torch.log_softmax(logits, dim=-1).gather(2, rest[:, 1:].unsqueeze(2)).squeeze(2)
    return [row[:len(c)] for row, c in zip(logprobs, completions)]


def make_probe(model, tokenizer, data: TaskData) -> LogprobProbe | None:
    ids = probe_ids(tokenizer, data)
    if not ids or len(ids) < 2:
        return None
    start = max(1, len(ids) - PROBED_TOKENS)
    logprobs = token_logprobs(model, ids, start)
    return LogprobProbe(token_ids=list(ids), scored_from=start, logprobs=[round(float(x), 5) for x in logprobs])
