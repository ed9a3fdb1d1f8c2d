"""`tucano-auto`: which task a free-text request is, by rules (cheap, explainable, no model
call). Each task collects points from cues in the folded text; the highest wins, insights on a
tie or when nothing matches (a general analysis question is the safe default)."""
from __future__ import annotations

import re

from common.tasks import PUSH_CAMPAIGNS
from rewards.text import fold

# a campaign written as its identifier; the plain word "cupom" is a weaker cue of its own
CAMPAIGN_IDS = "|".join(c for c in PUSH_CAMPAIGNS if "_" in c)
CUES: dict[str, tuple[tuple[str, float], ...]] = {
    "push": (
        (r"\bpush\b", 3), (r"notifica", 3), (r"\bcampanha\b", 2), (r"\bcupom\b", 1.5), (CAMPAIGN_IDS, 3),
        (r"\bcliente:", 1.5), (r"\bdesconto", 1), (r"\bprazo:", 1), (r'"campaign"', 3),
    ),
    "sql": (
        (r"\bsql\b|\bselect\b|\bconsulta\b", 3), (r"^\s*(pergunta:\s*)?(quantos|quantas|qual o numero|qual a quantidade|qual o total)", 2.5),
        (r"\bliste\b|\bmostre\b", 1.5),
        (r"\bqual (o|a) (valor|media|nota|preco|peso|tempo|frete|faturamento|ticket|maior|porcentagem|percentual|cidade|nome)", 2),
        (r"\bquais (os|as) \d+\b", 2), (r"\b(em que|em quais) (estado|cidade|mes|ano)|\bqual foi o\b|\bque (nota|percentual)\b", 2),
        (r"\bquanto (custa|pesa|se paga|foi|somam|e,)", 1.5), (r"\bem media\b", 1),
        (r"\b(olist_|orders_enriched|customer_|product_|payment_|review_score)", 2),
    ),
    "extraction": (
        (r"\b(chegou|veio|recebi|comprei|pedi)\b", 2), (r"\brecomendo\b|\bindico\b", 2), (r"\bavaliacao:", 3),
        (r"\b(defeito|quebrad|atrasou|atraso|embalagem|caixa)\b", 1), (r"\b(amei|gostei|pessim|horrivel|otim)", 1.5),
        (r"\b(nao compro|aguardo retorno|minha compra|meu pedido)\b", 2),
    ),
    "insights": (
        (r"\b(analise|analisar|insight|tendencia|sugere|o que isso|por que|porque|explique|estrategia|recomendacoes)\b", 2.5),
        (r"\bdados (json|de \d{4})|\bdados:", 3), (r"\bcomo (evolu|se distribuem|esta|estao)", 2.5),
        (r"\b(pior|piores|melhores|mais comuns|mais caro|geram mais)\b", 1.5), (r'"rows"', 3),
    ),
}
COMPILED = {task: [(re.compile(p, re.M), w) for p, w in cues] for task, cues in CUES.items()}


def classify(text: str) -> str:
    folded = fold(text)
    points = {task: sum(w for pattern, w in cues if pattern.search(folded)) for task, cues in COMPILED.items()}
    best = max(points.values())
    if best == 0:
        return "insights"
    winners = [task for task, p in points.items() if p == best]
    return "insights" if len(winners) > 1 and "insights" in winners else winners[0]
