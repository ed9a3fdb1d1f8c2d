"""Rounds that continue a rejected GRPO candidate (`trainer.methods.continued`) against the real
stack: Valkey, the gateway, vLLM with runtime LoRA, TRL on CPU and the real gate. A module of its
own, so that its rounds start from the base model (the `loop` fixture rolls back what the modules
before it promoted) and the gate answers both versions fresh, in one burst."""
from __future__ import annotations

import asyncio

from common.datasets import load_split
from common.rounds import Outcome
from common.store import ANSWERS
from tests.integration.conftest import fleet_for, loop_settings
from tests.integration.test_learning_loop import _send
from trainer.methods import found_worse
from trainer.round import run_round


def test_a_grpo_round_continues_the_candidate_its_gate_rejected_without_finding_it_worse(built, redis_url, gateway, loop):
    """Real rounds of GRPO on extraction's served groups (of 4, none labelled), judged by the real
    gate, read back from Redis. Round 1's candidate learns at a rate of 1e-9, so it answers the
    gate's rows as the incumbent does up to the engine's batch numerics (a difference of 0 alone,
    -0.0012 and -0.0024 with a LoRA incumbent whose answers were read back), and a promote margin of 0.99 rejects it. Round 2,
    on new traffic, continues it from its files exactly when its recorded decision allows
    (`methods.continued`: a difference at or above 0, no component worse), else starts where round 1
    did and says why; a continued line is dropped again at TUCANO_GRPO_CONTINUE_REJECTED=1."""
    settings, store = loop
    for key in store.redis.scan_iter(ANSWERS.format(scope="*")):  # answered in one burst with the candidate, not read back
        store.redis.delete(key)
    rows = load_split(settings.datasets_dir, "extraction", "train")[-48:]

    def traffic(part: list[dict]) -> None:
        asyncio.run(_send(gateway.url, store, "extraction", [{"input": row["input"], "options": {"samples": 4}} for row in part]))

    def rounds(**overrides):
        # GRPO alone, as a round from traffic plans it: earlier tests here left extraction labels, which auto would train with SFT
        chosen = loop_settings(built, redis_url, promote_margin=0.99, train_time_budget_s=10, grpo_learning_rate=1e-9, grpo_min_groups=8,
                               train_method="grpo", **overrides)
        return run_round(chosen, store, fleet_for(chosen, store, gateway), ("extraction",), say=print).tasks["extraction"]
    traffic(rows[:16])
    first = rounds()
    assert [step.method for step in first.plan] == ["grpo"] and first.outcome == Outcome.REJECTED, first
    assert first.start.weights in ("active", "base"), first.start  # nothing to continue yet
    decision = store.adapter(first.version).gate.decision
    assert decision.n >= settings.gate_min_rows and abs(decision.difference) < 0.05, decision
    traffic(rows[16:32])
    second = rounds()
    if found_worse(decision) is None:
        assert second.start.weights == first.version and "1 of at most 2" in second.start.why, second.start
        assert store.adapter(second.version).parent == first.version and second.outcome == Outcome.REJECTED
        traffic(rows[32:])
        third = rounds(grpo_continue_rejected=1)  # the line of two rejected candidates is one too many
        why = "more than 1 rejected" if found_worse(store.adapter(second.version).gate.decision) is None else f"{second.version}'s gate found it worse"
        assert third.start.weights in ("active", "base") and why in third.start.why, third.start
        assert store.adapter(third.version).parent == store.route("extraction").active
    else:
        assert second.start.weights == first.start.weights and f"{first.version}'s gate found it worse" in second.start.why, second.start
        assert store.adapter(second.version).parent == store.route("extraction").active
