"""The demo models' chat templates. ChatML (`<|im_start|>role ... <|im_end|>`, as Qwen and the
production Tucano2 models use, and SmolLM2 was trained on) for the tiny models and SmolLM2;
Gemma's turns for Gemma 3. The Think model's template opens `<think>` for the assistant, as Qwen3
thinking models do; no template adds a default system prompt.
"""
from __future__ import annotations

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Gemma has no system turn: the system prompt opens the first user turn.
GEMMA = (
    "{{ '<bos>' }}{% set ns = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set ns.system = message['content'] + '\n\n' %}"
    "{% else %}{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\n' + "
    "ns.system + message['content'] + '<end_of_turn>\n' }}{% set ns.system = '' %}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
END_OF_TURN = {"chatml": "<|im_end|>", "gemma": "<end_of_turn>"}


def _thinking(template: str, opener: str) -> str:
    think = template.replace(f"{{{{ '{opener}' }}}}", f"{{{{ '{opener}<think>\n' }}}}")
    assert think != template
    return think


CHATML_THINK = _thinking(CHATML, "<|im_start|>assistant\n")
GEMMA_THINK = _thinking(GEMMA, "<start_of_turn>model\n")
TEMPLATES = {"chatml": {"base": CHATML, "think": CHATML_THINK}, "gemma": {"base": GEMMA, "think": GEMMA_THINK}}
