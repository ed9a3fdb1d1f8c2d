"""Synthetic PT-BR customer reviews with known ground-truth extraction labels.

Each review is composed from a scenario (what happened: a delay, a defect, praise, mixed
feelings...) and fragments that carry its key phrases verbatim, then varied by register
(slang, no accents, lower case, typos outside key phrases). The scenario fixes the labels, so
every review comes with the 10-field reference object of contract §2.
"""
from __future__ import annotations

import random
import unicodedata
from dataclasses import dataclass

# (noun, definite article): fragments say "{ap}" for "o fone de ouvido" / "a cadeira".
# GENERAL_PRODUCTS are what the demo model's bootstrap SFT reads about; TEAM_PRODUCTS are the
# demo store's own catalogue (the reviews in its commerce DB, its push campaigns), which the
# bootstrap never shows the model: what it learns of them, it learns from the team's labels.
GENERAL_PRODUCTS = (
    ("cadeira", "a"), ("jogo de lençol", "o"), ("relógio", "o"), ("perfume", "o"), ("panela", "a"),
    ("capinha de celular", "a"), ("liquidificador", "o"), ("tapete", "o"), ("kit de maquiagem", "o"),
    ("boneca", "a"), ("travesseiro", "o"), ("ventilador", "o"),
)
TEAM_PRODUCTS = (
    ("fone de ouvido bluetooth", "o"), ("tênis de corrida", "o"), ("luminária de mesa", "a"), ("mochila escolar", "a"),
    ("carregador portátil", "o"), ("furadeira de impacto", "a"), ("mouse sem fio", "o"), ("garrafa térmica", "a"),
)
PRODUCTS = GENERAL_PRODUCTS + TEAM_PRODUCTS


@dataclass(frozen=True)
class Scenario:
    name: str
    sentiment: str
    scores: tuple[float, ...]
    category: str
    delivery_issue: bool
    urgency: tuple[str, ...]
    requires_response: bool
    recommend: tuple[bool | None, ...]
    fragments: tuple[str, ...]  # each holds one key phrase in [brackets]
    summaries: tuple[str, ...]


# Scenarios only the demo store's reviews have: their complaint categories never appear in the
# bootstrap's supervised data.
TEAM_ONLY_SCENARIOS = ("price", "packaging", "other")
SCENARIOS = (
    Scenario("praise", "positive", (5.0, 5.0, 4.0, 4.5), "none", False, ("low",), False, (True, True, None),
             ("{ap} [chegou antes do prazo]", "[produto de ótima qualidade]", "[superou minhas expectativas]",
              "{ap} é [exatamente como na foto]", "[entrega super rápida]", "[muito bem embalado]",
              "[amei {ap}]", "[vale cada centavo]"),
             ("Cliente elogia {op} e a entrega.", "Cliente satisfeito com {op}.", "Avaliação positiva: {op} atendeu às expectativas.")),
    Scenario("delivery_delay", "negative", (1.0, 2.0, 1.5), "delivery_delay", True, ("medium", "high"), True, (False, None),
             ("{ap} [ainda não chegou]", "[atrasou mais de uma semana]", "[prazo de entrega estourado]",
              "[já passou da data prevista]", "[ninguém informa onde está o pedido]", "{ap} [chegou com 15 dias de atraso]"),
             ("Cliente reclama do atraso na entrega de {op}.", "Pedido de {op} atrasado; cliente pede solução.")),
    Scenario("product_defect", "negative", (1.0, 2.0), "product_defect", False, ("high",), True, (False,),
             ("{ap} [veio com defeito]", "[parou de funcionar em dois dias]", "{ap} [veio quebrado]",
              "[não liga de jeito nenhum]", "[peça com defeito de fábrica]"),
             ("Cliente recebeu {op} com defeito e quer troca.", "Produto ({op}) defeituoso; cliente insatisfeito.")),
    Scenario("wrong_item", "negative", (1.0, 2.0), "wrong_item", False, ("high",), True, (False, None),
             ("[veio o produto errado]", "pedi {ap} e [recebi outra coisa]", "[cor diferente da que pedi]",
              "[tamanho errado]", "[mandaram outro modelo]"),
             ("Cliente recebeu item errado no lugar de {op}.", "Pedido de {op} veio trocado.")),
    Scenario("missing_item", "negative", (1.0, 2.0), "missing_item", True, ("high",), True, (False, None),
             ("[faltou um item no pedido]", "[só veio metade do pedido]", "{ap} [não veio na caixa]",
              "[recebi incompleto]"),
             ("Pedido chegou incompleto: faltou {op}.", "Cliente relata item faltando ({op}).")),
    Scenario("quality", "negative", (2.0, 2.5, 3.0), "quality", False, ("low", "medium"), False, (False, None),
             ("{ap} é [de qualidade ruim]", "[material muito fino]", "[parece bem frágil]",
              "[não vale o que custa]", "{ap} [desbotou na primeira lavagem]"),
             ("Cliente achou a qualidade de {op} abaixo do esperado.", "Qualidade fraca de {op}.")),
    Scenario("customer_service", "negative", (1.0, 2.0), "customer_service", False, ("medium", "high"), True, (False,),
             ("[o atendimento não responde]", "[abri chamado e nada]", "[atendente foi grosseiro]",
              "[ninguém resolve meu problema]"),
             ("Cliente reclama do atendimento sobre {op}.", "Atendimento ruim; cliente sem resposta sobre {op}.")),
    Scenario("price", "neutral", (3.0, 3.5), "price", False, ("low",), False, (None, True),
             ("{ap} [achei um pouco caro]", "[frete muito caro]", "[preço subiu depois da compra]"),
             ("Cliente acha o preço de {op} alto, mas sem grandes problemas.",)),
    Scenario("packaging", "neutral", (3.0, 2.5), "packaging", False, ("low",), False, (None, True),
             ("[caixa chegou amassada]", "[embalagem rasgada]", "{ap} veio [sem proteção nenhuma]"),
             ("Embalagem de {op} chegou danificada, produto ok.",)),
    Scenario("mixed", "neutral", (3.0, 3.5), "delivery_delay", True, ("low",), False, (True, None),
             ("{ap} é bom mas [demorou pra chegar]", "[entrega atrasou um pouco]",
              "[gostei {dp}] mas [a entrega demorou]"),
             ("Cliente gostou de {op}, mas a entrega atrasou.",)),
    Scenario("neutral", "neutral", (3.0,), "none", False, ("low",), False, (None,),
             ("{ap} [é ok]", "[nada de especial]", "[cumpre o que promete]", "[produto razoável]"),
             ("Avaliação neutra sobre {op}.",)),
    Scenario("other", "negative", (2.0,), "other", False, ("medium",), True, (None, False),
             ("[nota fiscal não veio]", "[cobraram duas vezes no cartão]", "[não consigo rastrear]"),
             ("Cliente relata problema com o pedido de {op}.", "Problema administrativo no pedido ({op}).")),
)

OPENINGS = ("", "", "Comprei {ap} e ", "Olha, ", "Bom, ", "Gente, ", "Sinceramente, ", "Pedido feito, ")
RECOMMEND_YES = ("Recomendo!", "Super recomendo.", "Recomendo a loja.", "Indico pra todo mundo.")
RECOMMEND_NO = ("Não recomendo.", "Não indico essa loja.", "Não compro mais aqui.")
CLOSINGS = ("", "", "Obrigado.", "Aguardo retorno.", "Enfim.", "É isso.")
SLANG = {"muito": "mto", "você": "vc", "porque": "pq", "também": "tb", "beleza": "blz", "que": "q"}


def _strip_accents(text: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")


def _typo(word: str, rng: random.Random) -> str:
    if len(word) < 5 or not word.isalpha():
        return word
    i = rng.randrange(1, len(word) - 1)
    return word[:i] + word[i + 1] + word[i] + word[i + 2:]


def _vary(text: str, phrases: list[str], rng: random.Random) -> tuple[str, list[str]]:
    """Register variation applied alike to the text and its key phrases (the product name is
    the last phrase), so every phrase stays verbatim in the text."""
    if rng.random() < 0.25:
        text, phrases = text.lower(), [p.lower() for p in phrases]
    if rng.random() < 0.2:
        text, phrases = _strip_accents(text), [_strip_accents(p) for p in phrases]
    words = text.split(" ")
    protected = {w.strip(".,!").lower() for p in phrases for w in p.split(" ")}
    out = []
    for word in words:
        if word.strip(".,!").lower() in protected:
            out.append(word)
        elif word.lower() in SLANG and rng.random() < 0.5:
            out.append(SLANG[word.lower()])
        elif rng.random() < 0.03:
            out.append(_typo(word, rng))
        else:
            out.append(word)
    return " ".join(out), phrases


def general_scenarios() -> tuple[Scenario, ...]:
    return tuple(s for s in SCENARIOS if s.name not in TEAM_ONLY_SCENARIOS)


def make_review(rng: random.Random, scenario: Scenario | None = None, products: tuple[tuple[str, str], ...] = PRODUCTS,
                scenarios: tuple[Scenario, ...] = SCENARIOS) -> tuple[str, dict, int]:
    """One review text, its 10-field reference and a 1-5 review_score consistent with it."""
    scenario = scenario or rng.choice(scenarios)
    product, article = rng.choice(products)
    names = {"{ap}": f"{article} {product}", "{dp}": f"d{article} {product}", "{p}": product}
    chosen = rng.sample(scenario.fragments, k=min(len(scenario.fragments), rng.choice((1, 2, 2, 3))))
    parts, phrases = [], []
    for fragment in chosen:
        for slot, name in names.items():
            fragment = fragment.replace(slot, name)
        phrases += [seg.split("]")[0] for seg in fragment.split("[")[1:]]
        parts.append(fragment.replace("[", "").replace("]", ""))
    opening = rng.choice(OPENINGS).replace("{ap}", names["{ap}"])
    body = ", ".join(parts)
    text = (opening + body) if opening else body[0].upper() + body[1:]
    text += "."
    recommend = rng.choice(scenario.recommend)
    if recommend is True:
        text += " " + rng.choice(RECOMMEND_YES)
    elif recommend is False:
        text += " " + rng.choice(RECOMMEND_NO)
    closing = rng.choice(CLOSINGS)
    if closing:
        text += " " + closing
    text, varied = _vary(text, phrases + [product], rng)
    phrases, product = varied[:-1], varied[-1]
    phrases = [p if p in text else p[0].upper() + p[1:] for p in phrases]  # sentence-initial
    mentioned = product if product in text else None
    score = rng.choice(scenario.scores)
    summary = rng.choice(scenario.summaries).replace("{op}", f"{article} {product}" if mentioned else "o produto")
    summary = summary.replace(" de o ", " do ").replace(" de a ", " da ")
    reference = {
        "sentiment": scenario.sentiment,
        "sentiment_score": score,
        "complaint_category": scenario.category,
        "product_mentioned": mentioned,
        "delivery_issue": scenario.delivery_issue,
        "would_recommend": recommend,
        "urgency": rng.choice(scenario.urgency),
        "key_phrases": phrases[:5],
        "summary": summary[:200],
        "requires_response": scenario.requires_response,
    }
    return text, reference, max(1, min(5, round(score)))
