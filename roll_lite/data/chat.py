"""Chat templates: a prompt given as chat messages (or a string, with data.apply_chat_template) is
rendered by the tokenizer's own template, with the generation prompt appended, into token ids."""

from __future__ import annotations

from typing import Any

# model.chat_template: compact. One line per message, a role letter first; an assistant turn ends
# with the end-of-turn token <eos> (multi-turn needs one: roll_lite/environments/turns.py). Short, so
# that a character-level model's trajectories stay short.
COMPACT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}A: {{ message['content'] }}<eos>"
    "{% elif message['role'] == 'system' %}S: {{ message['content'] }}"
    "{% elif message['role'] == 'tool' %}T: {{ message['content'] }}"
    "{% else %}U: {{ message['content'] }}"
    "{% endif %}{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}A: {% endif %}"
)
CHAT_TEMPLATES = {"compact": COMPACT_CHAT_TEMPLATE}


def chat_template_source(setting: str) -> str:
    """model.chat_template's Jinja source: a named template (CHAT_TEMPLATES) or the setting itself."""
    if setting in CHAT_TEMPLATES:
        return CHAT_TEMPLATES[setting]
    if "{" not in setting:
        raise ValueError(
            f"model.chat_template: '{setting}' is neither one of {', '.join(CHAT_TEMPLATES)} nor a Jinja template"
        )
    return setting


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def as_messages(prompt: Any, role: str = "user") -> list[dict]:
    """A string prompt becomes one `role` message; chat messages stay as they are."""
    return [{"role": role, "content": prompt}] if isinstance(prompt, str) else list(prompt)


def message_problem(prompt: Any, parts: bool = False) -> str | None:
    """Why `prompt` is not a list of {role, content} chat messages, or None when it is. `parts`: a content
    may also be a list (of text and image parts: data.image_key, checked by roll_lite/data/images.py)."""
    if not isinstance(prompt, list):
        return f"is a {type(prompt).__name__}, not a string or a list of chat messages"
    if not prompt:
        return "is an empty list of messages"
    for i, message in enumerate(prompt):
        content = message.get("content") if isinstance(message, dict) else None
        if (
            not isinstance(message, dict)
            or not isinstance(message.get("role"), str)
            or not (isinstance(content, str) or (parts and isinstance(content, list)))
        ):
            kind = "str or a list of parts" if parts else "str"
            return f"message {i} is not a {{'role': str, 'content': {kind}}} dict: {str(message)[:80]}"
    return None


IMAGE_MARK = "<image>"  # where an image part stood, in a conversation read as text (content_text)


def content_text(content: Any) -> str:
    """A message's content as text: a string as it is; a list of parts (data.image_key rows, images shown by an
    environment) as its text parts in order, each image part as IMAGE_MARK. What a text-only reader of the
    conversation sees (an LLM judge, a reward model): it does not see the image itself."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise TypeError(f"a message's content is a {type(content).__name__}, not a str or a list of parts")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image":
            texts.append(IMAGE_MARK)
        else:
            raise TypeError(
                f"a content part is neither {{'type': 'text', 'text': str}} nor an image part: {str(part)[:80]}"
            )
    return "".join(texts)


def text_messages(messages: list[dict]) -> list[dict]:
    """The messages with each content as text (content_text)."""
    return [{**message, "content": content_text(message["content"])} for message in messages]


def render_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of the messages under the tokenizer's chat template, ending with the generation
    prompt unless told not to (the template adds its own special tokens, so no BOS is prepended)."""
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
    )
    return list(ids)
