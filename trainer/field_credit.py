"""GRPO's per-field credit for answers made of JSON fields (`grpo_advantage="fields"`).

GRPO gives every token of a sample the sample's advantage: its total less its group's mean. On
extraction the total is ten fields' parts added up, so the tokens of `delivery_issue` are pushed
by how the summary and the key phrases of the same sample did. In runs 46 and 49 of `bench learn
--traffic-only --task extraction` the candidates moved `delivery_issue` wrong by 0.34 at the gate
while other fields rose, though across the base model's samples the right value of each boolean
field had the higher advantage (docs/results.md).

Here each field's value tokens get the change in that field's own part of the total (its part
less its group's mean part: `TaskDefinition.field_shares`), and every other token (keys,
punctuation, whatever lies outside the values) gets the rest of the sample's advantage. The
parts add up to the sample's advantage, so nothing is paid twice; only the cross-terms, a
field's tokens paid for another field's credit, are gone. A sample whose fields cannot all be
found in its text (not a well-formed object) keeps the sample's advantage on every token, as
plain GRPO does. TRL 1.16's loss takes per-token advantages of shape (B, T) as they are.

Measured, it is not the fix: on 48 reference-free groups of extraction it gained -0.006 and
-0.010 on held-out rows in two runs, where the sum gained +0.041 and +0.046 on the same groups, at
about twice the KL to the parent (`tucano bench grpo-gain --advantage`, docs/results.md, 2026-12-06): each
field's tokens then follow its reference-free judge alone, errors included. `sum` stays the
default; this is an option and an arm of the bench.

The reward function (`trainer.grpo_reward`, aggregation `fields`) returns the totals as `sum`
does and keeps each batch's scores here; the trainer (`trainer.trl_internals`) asks for the
token advantages after TRL has computed the sample's.
"""
from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from rewards.parsing import value_spans
from rewards.scoring import Score
from tasks import definition

if TYPE_CHECKING:  # torch is imported by the trainer that calls in; the reward function's module must not pull it in
    import torch


def has_fields(task: str) -> bool:
    """Whether `task`'s answers are JSON fields the credit can be split over."""
    return definition(task).field_shares is not None


def token_ends(tokenizer, ids: list[int]) -> list[int]:
    """The end, in characters of the decoded text, of each token: the length of the text decoded
    up to it (a token that ends inside a character counts its replacement character, one long, as
    the next token's full character is; the offsets stay within one of the truth)."""
    return [len(tokenizer.decode(ids[:k + 1], skip_special_tokens=True)) for k in range(len(ids))]


def field_of(begin: int, end: int, spans: dict[str, tuple[int, int]], names) -> str | None:
    """The field whose value the token [begin, end) overlaps, or None. Overlap, not the token's
    first character: SmolLM2 writes a boolean as one token with the space before it (` true`)."""
    return next((name for name in names if begin < spans[name][1] and spans[name][0] < max(end, begin + 1)), None)


def shares(task: str, scored: Score) -> dict[str, float]:
    """Each field's part of the score's total (`TaskDefinition.field_shares`)."""
    return definition(task).field_shares(scored.components, scored.weights, scored.fields)


class FieldCredit:
    """The reward function's scores of each generation batch, turned into per-token advantages."""

    def __init__(self):
        self.pending: list[tuple[str, str, Score]] = []  # (task, text, score) of the batch scored last
        self.samples = 0  # samples whose tokens got per-field credit
        self.whole = 0  # samples that kept the sample's advantage (a field not found in the text)

    def scored(self, tasks: list[str], texts: list[str], scores: list[Score]) -> None:
        self.pending = list(zip(tasks, texts, scores, strict=True))

    def token_advantages(self, advantages: torch.Tensor, completion_ids: torch.Tensor, mask: torch.Tensor, tokenizer,
                         group_size: int) -> torch.Tensor:
        """(B,) advantages -> (B, T): each field's value tokens the change in its part, the rest of
        the tokens the remainder (module docstring). `mask`: the completion tokens (B, T)."""
        batch = self.pending
        self.pending = []
        if len(batch) != advantages.numel():
            raise ValueError(f"per-field credit: {len(batch)} scored samples for {advantages.numel()} advantages; "
                             "the reward function and the trainer disagree on the batch")
        parts = [shares(task, scored) for task, _, scored in batch]
        out = advantages.detach().float().unsqueeze(1).repeat(1, completion_ids.size(1))
        for start in range(0, len(batch), group_size):
            members = range(start, min(start + group_size, len(batch)))
            names = set().union(*(parts[i] for i in members))
            mean = {name: statistics.fmean(parts[i].get(name, 0.0) for i in members) for name in names}
            for i in members:
                text = batch[i][1]
                spans = value_spans(text)
                if not names <= set(spans):
                    self.whole += 1
                    continue
                self.samples += 1
                change = {name: parts[i].get(name, 0.0) - mean[name] for name in names}
                rest = float(advantages[i]) - sum(change.values())
                length = int(mask[i].sum())
                ends = token_ends(tokenizer, completion_ids[i, :length].tolist())
                begin = 0
                for k, end in enumerate(ends):
                    field = field_of(begin, end, spans, names)
                    out[i, k] = change[field] if field is not None else rest
                    begin = end
        return out
