"""Writes the store that `tests/integration/test_previous_store.py` reads: records (with and
without a served group), labels (a correction, ratings), adapter versions through their statuses
and routes, as the code before the task registry wrote them. It was run once, on a checkout of
commit 0f61eca (the last before `tasks/`), with this repository's virtual environment:

    git worktree add /tmp/prev 0f61eca
    PYTHONPATH=/tmp/prev .venv/bin/python tests/integration/data/previous_store/write.py tests/integration/data/previous_store

It leaves `redis/` (the embedded Valkey's append-only files, stopped cleanly) and `written.json`
(what was written, with the scores the previous reward code gave). Not collected by pytest: it
imports names that code had (`rewards.scoring.score`) and this code does not.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from pathlib import Path

from common.lifecycle import activate, reject, retire
from common.records import AdapterMeta, Group, Record, Reward, Route, Sample, Sampling, Usage
from common.store import Store
from deploy.embedded_redis import EmbeddedRedis
from rewards.scoring import REWARD_VERSION, score  # the entry point before the registry

INPUTS = {
    "extraction": {"review": "O fone chegou com a caixa amassada e atrasou uma semana, mas o som é ótimo."},
    "push": {"campaign": "carrinho_abandonado", "customer_name": "Ana", "product": "fone bluetooth", "discount_pct": 10},
    "insights": {"question": "Quais estados vendem mais?", "columns": ["estado", "pedidos"], "rows": [["SP", 410], ["RJ", 130], ["MG", 118]]},
    "sql": {"question": "Quantos pedidos foram entregues?"},
}
RAW = {
    "extraction": json.dumps({"sentiment": "neutral", "sentiment_score": 3.0, "complaint_category": "delivery_delay",
                              "product_mentioned": "fone", "delivery_issue": True, "would_recommend": None, "urgency": "medium",
                              "key_phrases": ["caixa amassada", "atrasou uma semana"], "summary": "Atrasou, som ótimo.",
                              "requires_response": True}, ensure_ascii=False),
    "push": ['{"title": "Ana, seu fone te espera", "body": "10% off no fone bluetooth: finalize sua compra hoje."}',
             '{"title": "OFERTA!!", "body": "Compre agora!!"}'],
    "insights": "<think>\nSP lidera.\n</think>\n\nResumo: SP lidera com 410 pedidos.\n- RJ tem 130.\n- MG tem 118.\nRecomendação: investir em SP.",
    "sql": "SELECT COUNT(*) FROM olist_orders_dataset WHERE order_status = 'delivered'",
}
CORRECTION = {"sentiment": "negative", "sentiment_score": 2.0, "complaint_category": "delivery_delay", "product_mentioned": "fone",
              "delivery_issue": True, "would_recommend": None, "urgency": "medium", "key_phrases": ["atrasou uma semana"],
              "summary": "Entrega atrasada e caixa amassada.", "requires_response": True}


def record(task: str, raw: str, group: Group | None = None, n: int = 1) -> Record:
    scored = score(task, raw, None, INPUTS[task]) if task != "sql" else None
    reward = Reward(scored.total, scored.components, False, scored.details) if scored else Reward(0.5, {"executes": 1.0}, False, {})
    return Record(id=f"prev-{task}", time=time.time(), task=task, source="tasks", input=INPUTS[task], prompt="<|im_start|>...",
                  chat_template_sha256="0" * 64, raw=raw, output=scored.output if scored else {"sql": raw}, valid=True,
                  sampling=Sampling(0.7, 0.95, 160, n=n), engine="http://127.0.0.1:8000", model="base", adapter=None, arm="base",
                  usage=Usage(12, 20), finish_reason="stop", latency_ms=40.0, reward=reward, reward_version=REWARD_VERSION, group=group)


def main(out: Path) -> None:
    shutil.rmtree(out / "redis", ignore_errors=True)
    written: dict = {"reward_version": REWARD_VERSION, "records": {}, "labels": {}, "adapters": {}, "routes": {}}
    with EmbeddedRedis(out / "redis") as url:
        store = Store(url)
        samples = [Sample(text, [11 + i, 12, 2], [-0.5, -0.25, -0.125], "stop", True,
                          Reward(score("push", text, None, INPUTS["push"]).total, {}, False)) for i, text in enumerate(RAW["push"])]
        made = [record("extraction", RAW["extraction"]), record("push", RAW["push"][0], Group([1, 2, 3], samples, 0), n=2),
                record("insights", RAW["insights"]), record("sql", RAW["sql"])]
        for r in made:
            entry = asyncio.run(store.add_record(r))
            written["records"][r.id] = {"entry": entry, "task": r.task, "raw": r.raw, "total": r.reward.total,
                                        "group": [s.reward.total for s in r.group.samples] if r.group else None}
        store.add_feedback("prev-extraction", -1, correction=CORRECTION)
        store.add_feedback("prev-push", 1)
        store.add_feedback("prev-insights", -1)
        for task, label in ((t, label) for t in INPUTS for label in store.labels(t)):
            written["labels"][label.id] = {"task": task, "rating": label.rating, "answer": label.answer}
        for task, fates in (("push", ("active", "active")), ("sql", ("rejected",))):  # push-v1 is retired when v2 is promoted
            for fate in fates:
                version = store.next_adapter_version(task)
                store.put_adapter(AdapterMeta(version=version, task=task, path=f"/adapters/{version}", method="grpo",
                                              base_model="base", sha256="ab" * 32))
                if fate == "rejected":
                    reject(store, version, "gate: no better than the base model")
                    continue
                current = store.route(task).active
                store.change_route(task, lambda route, v=version: Route(active=v, previous=route.active))
                activate(store, version, "promoted by its round")
                if current:
                    retire(store, current, f"{version} was promoted")
        for meta in store.adapters():
            written["adapters"][meta.version] = {"task": meta.task, "status": meta.status, "path": meta.path}
        written["routes"] = {task: route.active for task, route in store.routes()[1].items()}
    (out / "written.json").write_text(json.dumps(written, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
