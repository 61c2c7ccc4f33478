#!/usr/bin/env python3
"""Expected renders of Qwen3's chat template, made with Jinja2 configured as transformers
configures it (sandboxed, trim_blocks, lstrip_blocks), with and without `enable_thinking`.

The template (crates/starling-models/tests/fixtures/chat/qwen3.jinja) is Qwen3's
tokenizer_config.json `chat_template` (the hybrid thinking models: Qwen3-0.6B ... 32B).
Writes crates/starling-models/tests/fixtures/chat/qwen3.json, read by tests/chat_templates.rs.

usage: make_qwen3_chat_fixture.py   (needs jinja2)
"""
import json
from pathlib import Path

from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = Path(__file__).resolve().parent.parent / "crates/starling-models/tests/fixtures/chat"

CHATS = [
    ([{"role": "user", "content": "What is 2+2?"}], True, {}),
    ([{"role": "user", "content": "What is 2+2?"}], True, {"enable_thinking": True}),
    ([{"role": "user", "content": "What is 2+2?"}], True, {"enable_thinking": False}),
    (
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<think>\nGreet back.\n</think>\n\nHello."},
            {"role": "user", "content": "Bye"},
        ],
        True,
        {"enable_thinking": False},
    ),
    (
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<think>\nGreet back.\n</think>\n\nHello."},
        ],
        False,
        {},
    ),
]


def main() -> None:
    source = (HERE / "qwen3.jinja").read_text()
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(source)
    chats = []
    for messages, add_generation_prompt, kwargs in CHATS:
        rendered = template.render(
            messages=messages, add_generation_prompt=add_generation_prompt, tools=None, **kwargs
        )
        chats.append(
            {
                "messages": messages,
                "add_generation_prompt": add_generation_prompt,
                "chat_template_kwargs": kwargs,
                "rendered": rendered,
            }
        )
    fixture = {
        "generator": "scripts/make_qwen3_chat_fixture.py",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "chat_template": source,
        "chats": chats,
    }
    (HERE / "qwen3.json").write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
    for chat in chats:
        print(repr(chat["rendered"]))


if __name__ == "__main__":
    main()
