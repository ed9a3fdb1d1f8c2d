"""A store written by the code before the task registry (commit 0f61eca, by
`data/previous_store/write.py`: records with and without a served group, a correction and
ratings, adapter versions through their statuses and routes) loads as it did: each record, label,
adapter and route reads back as that code read it, each answer scores what that code's reward
gave it, the labels still pass their task's reference check and become the same training data,
and reading changes nothing stored."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from common.records import BASE_VERSION, RewardContext
from common.store import Store
from deploy.embedded_redis import EmbeddedRedis
from rewards.scoring import REWARD_VERSION
from tasks import TASK_ENGINE, TASKS, check_reference, score, typed_input
from trainer import data

PREVIOUS = Path(__file__).parent / "data" / "previous_store"
# The tasks whose reference-free score each reward version changed (rewards.scoring.REWARD_VERSION):
# their stored totals read back as served, and a rescoring gives the new version's.
REWARD_CHANGES = {"8": {"extraction"}, "9": {"sql"}, "10": {"extraction"}, "11": {"sql"}, "12": {"push"}, "13": {"push"}}


def stored_bytes(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((directory / "appendonlydir").iterdir())}


def test_a_store_written_before_the_registry_loads_as_it_did(tmp_path):
    written = json.loads((PREVIOUS / "written.json").read_text())
    # the reward code it was written under, or one whose changes since are listed: the other tasks' totals must come out again
    since = [v for v in REWARD_CHANGES if int(v) > int(written["reward_version"])]
    assert int(REWARD_VERSION) == max(map(int, [written["reward_version"], *since]))  # every version since is listed
    rescored = set(TASKS) - set().union(*(REWARD_CHANGES[v] for v in since))
    directory = tmp_path / "redis"
    shutil.copytree(PREVIOUS / "redis", directory)
    before = stored_bytes(directory)
    with EmbeddedRedis(directory) as url:
        store = Store(url)
        records = {}
        for record_id, was in written["records"].items():
            record = store.get_record(record_id).record
            records[record_id] = record
            assert (record.task, record.raw) == (was["task"], was["raw"])
            assert record.reward.total == was["total"] and record.reward_version == written["reward_version"]  # stored as served
            if record.task == "sql" or record.task not in rescored:
                continue  # SQL's was not scored (it needs the commerce DB); a changed reward scores anew
            assert score(record.task, record.raw, None, RewardContext(typed_input(record.task, record.input))).total == was["total"]
        push = records["prev-push"]
        assert push.group.rewards == written["records"]["prev-push"]["group"] and push.version == BASE_VERSION
        rescored_group = [score("push", s.text, None, RewardContext(typed_input("push", push.input))).total for s in push.group.samples]
        if "push" in rescored:  # a changed push reward may score its group anew, every sample of it
            assert rescored_group == push.group.rewards
        assert len(rescored_group) == len(push.group.rewards) and all(0.0 <= total <= 1.0 for total in rescored_group)

        labels = {label.id: label for task in TASKS for label in store.labels(task)}
        assert {i: {"task": label.task, "rating": label.rating, "answer": label.answer} for i, label in labels.items()} == written["labels"]
        correction = labels["prev-extraction"].answer
        assert check_reference("extraction", correction) == correction  # still a valid answer of its task

        adapters = {m.version: {"task": m.task, "status": m.status, "path": m.path} for m in store.adapters(*TASKS)}
        assert adapters == written["adapters"] and {m.version for m in store.adapters("push")} == {"push-v1", "push-v2"}
        routes = store.routes()[1]
        assert {task: route.active for task, route in routes.items()} == written["routes"] == {"push": "push-v2"}
        assert store.routed_adapters(routes, TASK_ENGINE) == {"base": {"push-v2": "/adapters/push-v2"}}

        # the labels and the served group become the round's data as before: a supervised example
        # from the correction, a rating each, and the push group as a rollout of the base lineage
        extraction = data.build("extraction", store.labels("extraction"), [], lambda messages: json.dumps(messages), RewardContext,
                                frozenset(), seed=0, unlabelled_limit=0, liked_as_supervised=False)
        assert len(extraction.sft) + len(extraction.validation) == 1 and len(extraction.kto) == 1
        served = data.build("push", store.labels("push"), [("1-0", push)], lambda messages: json.dumps(messages), RewardContext,
                            frozenset(), seed=0, unlabelled_limit=0, liked_as_supervised=False, groups_limit=8)
        assert [g.source for g in served.groups] == ["prev-push"] and served.groups[0].completion_ids == [[11, 12, 2], [12, 12, 2]]
    assert stored_bytes(directory) == before  # nothing was rewritten
