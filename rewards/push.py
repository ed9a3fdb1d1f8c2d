"""Push-notification reward: JSON `{"title", "body"}` judged by the copy rules of contract §2,
each its own component (lengths, key information early in the body, emoji, caps, exclamations,
an action verb, payload bytes, PT-BR), and by what the copy says of its context: `personalised`
(the customer's name and the product, as whole words), `offer` (the discount said as a discount,
"15% off", the coupon code, the deadline), `intent` (the campaign's own message in words: a cart
waiting, a price that fell, a coupon...; and no other campaign's, which would mislead) and
`fluency` (sentences of real Portuguese words, not a dump of the context's fields or their
names, nor garbles such as "voio": each word that is no Portuguese word halves it, and so does
each word or phrase said twice over ("até até", "enquanto está disponível enquanto está
disponível") and each one-word sentence that is none of the campaign's facts ("Prato.", "Vitor.");
copy that repeats the system prompt is no copy at all).

The name and the offer count only in fluent copy, and a quarter of it when the copy never says
what the campaign is about; a name dropped as a sentence of its own ("... estoque. Vitor.")
addresses nobody and does not count. The rules are paid in proportion to what of the name and offer it
says, so copy that follows every rule but says nothing of this customer and
campaign earns almost nothing. With a reference, content-word
overlap with it (`reference_overlap`) weighs as much as the context checks together.
"""
from __future__ import annotations

import json
import re
from itertools import pairwise

import msgspec

from common.tasks import (
    PUSH_ACTION_VERBS,
    PUSH_BODY_MAX,
    PUSH_CAMPAIGNS,
    PUSH_KEY_INFO_WITHIN,
    PUSH_MAX_CAPS_LETTERS,
    PUSH_MAX_EMOJI,
    PUSH_MAX_PAYLOAD_BYTES,
    PUSH_TITLE_MAX,
    PushInput,
)
from rewards.parsing import format_score, parse_json_object
from rewards.text import content_f1, fold, ptbr_score, unknown_words, words

RULES = {"format": 0.04, "title_length": 0.04, "body_length": 0.04, "key_info_early": 0.06, "emoji": 0.02, "caps": 0.03,
         "exclamations": 0.03, "action_verb": 0.06, "payload_bytes": 0.02, "ptbr": 0.06}
CONTENT = {"personalised": 0.15, "offer": 0.15, "intent": 0.2, "fluency": 0.1}
WEIGHTS = {**RULES, **CONTENT}
WEIGHTS_WITH_REFERENCE = {**{k: v * 0.65 for k, v in WEIGHTS.items()}, "reference_overlap": 0.35}
EMOJI = re.compile("[\U0001F000-\U0001FAFF\u2600-\u27BF\u2B00-\u2BFF\u2300-\u23FF]")
SHOUTING = re.compile(rf"\b[A-ZÀ-Ý]{{{PUSH_MAX_CAPS_LETTERS + 1},}}\b")
VERBS = frozenset(PUSH_ACTION_VERBS)
# What each campaign is about, as folded word beginnings: copy for it says at least one.
CAMPAIGN_WORDS: dict[str, tuple[str, ...]] = {
    "carrinho_abandonado": ("carrinho", "finaliz", "esquec", "espera", "complete"),
    "queda_de_preco": ("preco", "caiu", "baixou", "abaixou", "mais barato", "reduz"),
    "volta_ao_estoque": ("voltou", "de volta", "disponivel", "chegou de novo", "reposto", "reabastec", "novamente"),
    "pedido_enviado": ("enviado", "saiu", "a caminho", "despach", "rastre", "transport"),
    "pedido_entregue": ("entregue", "chegou", "entrega"),
    "cupom": ("cupom",),
    "black_friday": ("black friday", "blackfriday"),
    "pedir_avaliacao": ("avali", "opiniao", "conta pra gente", "nota", "conte"),
}
# What only one campaign says: copy that says another campaign's message misleads its reader
# (a price that fell, in a request for a review), and so does another campaign's call to action
# (version 13: "confira se está tudo certo com a sua compra", which asks about a delivered order,
# closed push-v2's Black Friday copy in run 64). Narrower than CAMPAIGN_WORDS, whose general
# words ("carrinho", "estoque", "entrega") other campaigns' copy uses too.
CAMPAIGN_CLAIMS: dict[str, tuple[str, ...]] = {
    "carrinho_abandonado": ("esquec", "te espera", "deixou no carrinho", "finalize sua compra"),
    "queda_de_preco": ("preco caiu", "caiu o preco", "baixou", "abaixou", "mais barato"),
    "volta_ao_estoque": ("voltou ao estoque", "de volta ao estoque", "disponivel de novo", "disponivel novamente", "reposto",
                         "esgote de novo"),
    "pedido_enviado": ("enviado", "a caminho", "despach", "saiu para entrega", "pedido saiu", "acompanhe a entrega"),
    "pedido_entregue": ("entregue", "confira se esta tudo certo"),
    "cupom": ("cupom",),
    "black_friday": ("black friday", "blackfriday"),
    "pedir_avaliacao": ("avali", "opiniao", "conta pra gente", "de uma nota"),
}
assert set(CAMPAIGN_WORDS) == set(PUSH_CAMPAIGNS) == set(CAMPAIGN_CLAIMS)
DISCOUNT_WORDS = re.compile(r"(?<!\w)(off|desconto|descontos|menos|economiz\w*|abaixo|oferta\w*|cupom|baixou|caiu)(?!\w)")
# Raw field names or identifiers in the copy: the context dumped, not written.
FIELD_DUMP = re.compile(r"\b[a-z]+_[a-z_]+\b|\b(campanha|cliente|produto|desconto \(%\)|cupom|prazo)\s*:", re.I)
# The system prompt's own words (folded) in the copy: the instructions echoed, not copy.
PROMPT_ECHO = re.compile(r"\b(voce escreve|notificacoes push|responda so com)\b")
SENTENCE_END = re.compile(r"[.!?\u2026]+")


def payload_bytes(value: dict) -> int:
    """Bytes of the payload as sent: compact JSON in UTF-8."""
    try:
        return len(msgspec.json.encode(value))
    except UnicodeEncodeError:  # a lone surrogate (from a `\\ud800` escape) has no UTF-8 form
        return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))


def key_information(facts: PushInput) -> str | None:
    """What the reader must see first: the discount, else the product, else the coupon."""
    if facts.discount_pct is not None:
        return f"{facts.discount_pct}%"
    return facts.product or facts.coupon or None


def _length(text: str, limit: int) -> float:
    return 1.0 if len(text) <= limit else max(0.0, 1.0 - (len(text) - limit) / limit)


def _said(phrase: str, folded_text: str) -> re.Match | None:
    return re.search(rf"(?<!\w){re.escape(phrase)}", folded_text)


def _discount_credit(percent: str, folded_text: str) -> float:
    """1.0 for the discount said as one ("15% off", "desconto de 15%"); half for the figure alone."""
    at = folded_text.find(percent)
    if at < 0:
        at = folded_text.find(percent.replace("%", " %"))
    if at < 0:
        return 0.0
    near = folded_text[max(0, at - 25):at + len(percent) + 25]
    return 1.0 if DISCOUNT_WORDS.search(near) else 0.5


def _offer(facts: PushInput, folded_text: str) -> tuple[float, str]:
    credits = []
    if facts.discount_pct is not None:
        credits.append(_discount_credit(fold(f"{facts.discount_pct}%"), folded_text))
    for given in (facts.coupon, facts.deadline):
        if given:
            credits.append(1.0 if fold(given) in folded_text else 0.0)
    if not credits:
        return 1.0, "no discount, coupon or deadline to say"
    return sum(credits) / len(credits), f"{sum(credits):g}/{len(credits)} of discount (as a discount)/coupon/deadline said"


def _intent(facts: PushInput, folded_text: str) -> tuple[float, str]:
    """The campaign's own message, and no other campaign's."""
    campaign = facts.campaign or ""
    stems = CAMPAIGN_WORDS.get(campaign)
    if not stems:
        return 1.0, "no known campaign"
    said = [s for s in stems if _said(s, folded_text)]
    if not said:
        return 0.0, f"nothing of {campaign}"
    own = folded_text
    for phrase in CAMPAIGN_CLAIMS[campaign] + tuple(said):  # its own words are no other campaign's
        own = own.replace(phrase, " ")
    others = [other for other, claims in CAMPAIGN_CLAIMS.items() if other != campaign
              and not (other == "cupom" and facts.coupon) and any(_said(c, own) for c in claims)]
    if others:
        return 1.0 / (1 + 2 * len(others)), f"says {said[0]!r}, and the message of {', '.join(others)} too"
    return 1.0, f"says {said[0]!r}"


def fragments(body: str, facts: PushInput) -> list[str]:
    """The body's one-word sentences that are none of the campaign's facts (its product, coupon,
    deadline or a figure such as "15% off", which copy may lead with as a sentence of their own):
    "Prato.", "Satu.", and the customer's name tacked on as "Vitor."."""
    facts_said = {fold(v) for v in (facts.product, facts.coupon, facts.deadline) if v}
    pieces = (piece.strip() for piece in SENTENCE_END.split(body))
    return [piece for piece in pieces if len(words(piece)) == 1 and fold(piece) not in facts_said
            and not any(c.isdigit() for c in piece)]


def repeats(text: str) -> int:
    """Words said twice in a row ("até até") and three-word phrases said again ("enquanto está
    disponível enquanto está disponível"): degenerate text, never copy."""
    tokens = words(text)
    back_to_back = sum(1 for a, b in pairwise(tokens) if a == b)
    phrases = list(zip(tokens, tokens[1:], tokens[2:]))
    return back_to_back + len(phrases) - len(set(phrases))


def _fluency(title: str, body: str, facts: PushInput, stray: list[str]) -> tuple[float, str]:
    """Sentences of real PT-BR words: each word that is no Portuguese word (a garble such as
    "voio"; the context's names and codes aside), each repetition within the title or the body,
    and each one-word sentence that is no fact of the campaign (`stray`: `fragments`) halves the credit."""
    text = f"{title} {body}"
    if FIELD_DUMP.search(text):
        return 0.0, "field names or identifiers in the copy"
    if PROMPT_ECHO.search(fold(text)):
        return 0.0, "the system prompt repeated"
    body_words = words(body)
    if len(body_words) < 4:
        return 0.0, "the body is not a sentence"
    given = " ".join(v or "" for v in (facts.customer_name, facts.product, facts.coupon, facts.deadline))
    faults = [*(f"not a Portuguese word: {w}" for w in unknown_words(text, given)),
              *(f"said twice over in the {part}" for part, said in (("title", title), ("body", body)) for _ in range(repeats(said))),
              *(f"a one-word sentence: {piece!r}" for piece in stray)]
    if faults:
        return ptbr_score(text) * 0.5 ** len(faults), "; ".join(faults[:4])
    return ptbr_score(text), "sentences of Portuguese words"


def valid(output) -> bool:
    """A title and a body, each within its limit, whatever they say."""
    return isinstance(output, dict) and isinstance(output.get("title"), str) and isinstance(output.get("body"), str) \
        and len(output["title"]) <= PUSH_TITLE_MAX and len(output["body"]) <= PUSH_BODY_MAX


def score(completion: str, reference: dict | None, campaign: PushInput | None) -> tuple[dict, dict, dict, object]:
    """`campaign`: the request's input, the facts the copy should say (None: scored without them)."""
    facts = campaign if campaign is not None else PushInput.model_construct()  # no facts: every field unset
    parsed = parse_json_object(completion)
    weights = WEIGHTS_WITH_REFERENCE if reference else WEIGHTS
    components = dict.fromkeys(weights, 0.0)
    fmt, details = format_score(parsed)
    details = {"format": details}
    value = parsed.value or {}
    title, body = value.get("title"), value.get("body")
    if not isinstance(title, str) or not isinstance(body, str) or not (title.strip() or body.strip()):
        details["content"] = "no title and body strings"
        return components, weights, details, parsed.value
    text = f"{title} {body}"
    folded_text = fold(text)

    # what the copy says of its context
    wanted = [v for v in (facts.customer_name, facts.product) if v]
    stray = fragments(body, facts)  # read once: for who the copy addresses and for its fluency
    dropped = {fold(piece) for piece in stray}  # a name as a sentence of its own addresses nobody
    addressed = fold(" ".join([title, *(p for p in SENTENCE_END.split(body) if fold(p.strip()) not in dropped)]))
    found = [w for w in wanted if re.search(rf"(?<!\w){re.escape(fold(w))}(?!\w)", addressed)]
    components["personalised"] = len(found) / len(wanted) if wanted else 1.0
    details["personalised"] = f"{len(found)}/{len(wanted)} of name/product present"
    components["offer"], details["offer"] = _offer(facts, folded_text)
    components["intent"], details["intent"] = _intent(facts, folded_text)
    components["fluency"], details["fluency"] = _fluency(title, body, facts, stray)
    # facts dumped without prose are not copy; copy that never says what the campaign is about is weak
    about = 0.25 + 0.75 * components["intent"]
    components["personalised"] *= components["fluency"] * about
    components["offer"] *= components["fluency"] * about
    content = (components["personalised"] + components["offer"]) / 2

    # the copy rules, paid in proportion to the content
    rules = {"format": fmt, "title_length": _length(title, PUSH_TITLE_MAX), "body_length": _length(body, PUSH_BODY_MAX)}
    details["lengths"] = f"title {len(title)}/{PUSH_TITLE_MAX}, body {len(body)}/{PUSH_BODY_MAX}"
    key = key_information(facts)
    if key is None:
        rules["key_info_early"], details["key_info_early"] = 1.0, "no key information in context"
    else:
        folded_key = fold(key)
        position = fold(body).find(folded_key)
        rules["key_info_early"] = 1.0 if 0 <= position < PUSH_KEY_INFO_WITHIN else (0.5 if folded_key in folded_text else 0.0)
        details["key_info_early"] = f"{key!r} at body position {position}"
    emoji = len(EMOJI.findall(text))
    rules["emoji"] = 1.0 if emoji <= PUSH_MAX_EMOJI else max(0.0, 1.0 - 0.5 * (emoji - PUSH_MAX_EMOJI))
    coupon = facts.coupon or ""
    shouting = [w for w in SHOUTING.findall(text) if w != coupon]
    rules["caps"] = 1.0 / (1 + len(shouting))
    rules["exclamations"] = 0.0 if "!!" in text else 1.0
    details["style"] = f"{emoji} emoji, caps words {shouting[:3]}, {'with' if '!!' in text else 'no'} '!!'"
    verbs = [w for w in words(text) if w in VERBS]
    rules["action_verb"] = 1.0 if verbs else 0.0
    details["action_verb"] = f"verbs {verbs[:3]}" if verbs else "no action verb"
    payload = payload_bytes(value)
    rules["payload_bytes"] = 1.0 if payload < PUSH_MAX_PAYLOAD_BYTES else 0.0
    details["payload_bytes"] = f"{payload} bytes"
    rules["ptbr"] = ptbr_score(text)
    components.update({name: credit * content for name, credit in rules.items()})
    details["rules"] = f"paid at {content:.2f} (the content's share)"

    if reference:
        ref_text = f"{reference.get('title', '')} {reference.get('body', '')}"
        components["reference_overlap"] = content_f1(text, ref_text)
    return components, weights, details, value
