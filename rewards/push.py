"""Push-notification reward: JSON `{"title", "body"}` judged by the copy rules of PRODUCT §2,
each its own component: lengths, key information early in the body, emoji, caps,
exclamations, personalisation, an action verb, payload bytes, PT-BR; with an optional reference,
word overlap with it.
"""
from __future__ import annotations

import json
import re

import msgspec

from common.tasks import (
    PUSH_ACTION_VERBS,
    PUSH_BODY_MAX,
    PUSH_KEY_INFO_WITHIN,
    PUSH_MAX_CAPS_LETTERS,
    PUSH_MAX_EMOJI,
    PUSH_MAX_PAYLOAD_BYTES,
    PUSH_TITLE_MAX,
)
from rewards.parsing import format_score, parse_json_object
from rewards.text import fold, ptbr_score, token_f1, words

WEIGHTS = {
    "format": 0.1, "title_length": 0.1, "body_length": 0.1, "key_info_early": 0.15, "emoji": 0.05, "caps": 0.05,
    "exclamations": 0.05, "personalised": 0.15, "action_verb": 0.1, "payload_bytes": 0.05, "ptbr": 0.1,
}
EMOJI = re.compile("[\U0001F000-\U0001FAFF\u2600-\u27BF\u2B00-\u2BFF\u2300-\u23FF]")
SHOUTING = re.compile(rf"\b[A-ZÀ-Ý]{{{PUSH_MAX_CAPS_LETTERS + 1},}}\b")
VERBS = frozenset(PUSH_ACTION_VERBS)


def payload_bytes(value: dict) -> int:
    """Bytes of the payload as sent: compact JSON in UTF-8."""
    try:
        return len(msgspec.json.encode(value))
    except UnicodeEncodeError:  # a lone surrogate (from a `\\ud800` escape) has no UTF-8 form
        return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))


def key_information(context: dict) -> str | None:
    """What the reader must see first: the discount, else the product, else the coupon."""
    if context.get("discount_pct") not in (None, ""):
        return f"{context['discount_pct']}%"
    for key in ("product", "coupon"):
        if context.get(key):
            return str(context[key])
    return None


def _length(text: str, limit: int) -> float:
    return 1.0 if len(text) <= limit else max(0.0, 1.0 - (len(text) - limit) / limit)


def score(completion: str, reference: dict | None, context: dict) -> tuple[dict, dict, dict, object]:
    parsed = parse_json_object(completion)
    weights = dict(WEIGHTS, reference_overlap=0.1) if reference else WEIGHTS
    components = dict.fromkeys(weights, 0.0)
    components["format"], fmt_reason = format_score(parsed)
    details = {"format": fmt_reason}
    value = parsed.value or {}
    title, body = value.get("title"), value.get("body")
    if not isinstance(title, str) or not isinstance(body, str) or not (title.strip() or body.strip()):
        details["content"] = "no title and body strings"
        return components, weights, details, parsed.value
    text = f"{title} {body}"

    components["title_length"] = _length(title, PUSH_TITLE_MAX)
    components["body_length"] = _length(body, PUSH_BODY_MAX)
    details["lengths"] = f"title {len(title)}/{PUSH_TITLE_MAX}, body {len(body)}/{PUSH_BODY_MAX}"

    folded_text = fold(text)
    key = key_information(context)
    if key is None:
        components["key_info_early"], details["key_info_early"] = 1.0, "no key information in context"
    else:
        folded_key = fold(key)
        position = fold(body).find(folded_key)
        components["key_info_early"] = 1.0 if 0 <= position < PUSH_KEY_INFO_WITHIN else (0.5 if folded_key in folded_text else 0.0)
        details["key_info_early"] = f"{key!r} at body position {position}"

    emoji = len(EMOJI.findall(text))
    components["emoji"] = 1.0 if emoji <= PUSH_MAX_EMOJI else max(0.0, 1.0 - 0.5 * (emoji - PUSH_MAX_EMOJI))
    coupon = str(context.get("coupon") or "")
    shouting = [w for w in SHOUTING.findall(text) if w != coupon]
    components["caps"] = 1.0 / (1 + len(shouting))
    components["exclamations"] = 0.0 if "!!" in text else 1.0
    details["style"] = f"{emoji} emoji, caps words {shouting[:3]}, {'with' if '!!' in text else 'no'} '!!'"

    wanted = [str(context[k]) for k in ("customer_name", "product") if context.get(k)]
    found = [w for w in wanted if fold(w) in folded_text]
    components["personalised"] = len(found) / len(wanted) if wanted else 1.0
    details["personalised"] = f"{len(found)}/{len(wanted)} of name/product present"

    verbs = [w for w in words(text) if w in VERBS]
    components["action_verb"] = 1.0 if verbs else 0.0
    details["action_verb"] = f"verbs {verbs[:3]}" if verbs else "no action verb"

    payload = payload_bytes(value)
    components["payload_bytes"] = 1.0 if payload < PUSH_MAX_PAYLOAD_BYTES else 0.0
    details["payload_bytes"] = f"{payload} bytes"
    components["ptbr"] = ptbr_score(text)

    if reference:
        ref_text = f"{reference.get('title', '')} {reference.get('body', '')}"
        components["reference_overlap"] = token_f1(text, ref_text)
    return components, weights, details, value
