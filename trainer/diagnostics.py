"""The seed project's stop conditions, read from a candidate's per-step training metrics: signs
that a round's optimisation went wrong even when its loss looks fine. Each is flagged with the
figure that tripped it, and kept with the round and the version.

- length ceiling: GRPO completions hitting the completion limit (over a fifth of them);
- zero-variance groups: over half of the GRPO groups had rewards that did not vary;
- grad-norm spikes: any step's gradient norm over 2.0;
- flat reward: the GRPO reward did not move between the first and the last generation batches;
- entropy collapse: the policy's entropy fell below half of what it started at.
"""
from __future__ import annotations

import statistics

from common.rounds import StopCondition

LENGTH_CEILING_SHARE = 0.2
ZERO_VARIANCE_SHARE = 0.5
GRAD_NORM_SPIKE = 2.0
FLAT_REWARD = 0.005
ENTROPY_COLLAPSE = 0.5


def _series(steps: list[dict], key: str) -> list[float]:
    return [s[key] for s in steps if isinstance(s.get(key), (int, float))]


def stop_conditions(steps_by_method: dict[str, list[dict]]) -> dict[str, StopCondition]:
    """Each condition whose figure the steps have, flagged or not, over every method's steps."""
    steps = [s for log in steps_by_method.values() for s in log]
    grpo = steps_by_method.get("grpo", [])
    flags: dict[str, StopCondition] = {}
    clipped = _series(grpo, "completions/clipped_ratio")
    if clipped:
        share = statistics.fmean(clipped)
        flags["length_ceiling"] = StopCondition(flagged=share > LENGTH_CEILING_SHARE, value=round(share, 3))
    zero = _series(grpo, "zero_variance_share")
    if zero:
        share = statistics.fmean(zero)
        flags["zero_variance_groups"] = StopCondition(flagged=share > ZERO_VARIANCE_SHARE, value=round(share, 3))
    norms = _series(steps, "grad_norm")
    if norms:
        flags["grad_norm_spikes"] = StopCondition(flagged=max(norms) > GRAD_NORM_SPIKE, value=round(max(norms), 3),
                                                   spikes=sum(1 for n in norms if n > GRAD_NORM_SPIKE))
    rewards = _series(grpo, "reward_total")
    if len(rewards) >= 2:
        half = max(1, len(rewards) // 2)
        moved = statistics.fmean(rewards[half:]) - statistics.fmean(rewards[:half])
        flags["flat_reward"] = StopCondition(flagged=abs(moved) < FLAT_REWARD, value=round(moved, 4))
    entropy = _series(grpo, "entropy")
    if len(entropy) >= 2 and entropy[0] > 0:
        ratio = entropy[-1] / entropy[0]
        flags["entropy_collapse"] = StopCondition(flagged=ratio < ENTROPY_COLLAPSE, value=round(ratio, 3))
    return flags
