"""The demo model's chat format and tool-call text protocol.

The demo tokenizer is trained in-process (``training.models``), so we choose its chat format.
It is deliberately small so a model of a few million parameters learns it in a short warm-up::

    <|user|>
    What is 23 + 45?<|end|>
    <|assistant|>
    \\boxed{68}<|end|>

Roles are ``system``, ``user``, ``assistant`` and ``tool``; every turn ends with ``<|end|>``,
which is also the tokenizer's end-of-sequence token, so generation of a turn stops on its own.

Tool calls (the protocol the policy learns, see ``training.agent``): an assistant turn calls a
tool by writing one block ::

    <tool>python
    print(37 * 48)
    </tool>

where the first line names the tool (``python`` runs the body as a Python program, ``shell``
runs it with ``sh -c``). The environment answers with a ``tool`` turn holding the observation
(see :func:`format_observation`) and the assistant continues. Parsed calls are mapped to
OpenAI-style ``tool_calls`` (``{"type": "function", "function": {"name": "python",
"arguments": "{\\"code\\": ...}"}}``) so trajectories look like every other chat log.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

END = "<|end|>"
PAD = "<|pad|>"
ROLE_TOKENS = {
    "system": "<|system|>",
    "user": "<|user|>",
    "assistant": "<|assistant|>",
    "tool": "<|tool|>",
}
SPECIAL_TOKENS = [PAD, END, *ROLE_TOKENS.values()]

# The same format as a Jinja chat template, so `tokenizer.apply_chat_template` agrees with
# `render_chat` for code that treats the demo model like any other Hugging Face model. Jinja
# cannot parse JSON, so tool-call arguments must be a dict there (transformers' convention);
# a JSON string is rendered as it is.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' }}"
    "{% if message['content'] %}{{ message['content'] }}{% endif %}"
    "{% if message.get('tool_calls') %}{% for call in message['tool_calls'] %}"
    "{% set arguments = call['function']['arguments'] %}"
    "{{ '<tool>' + call['function']['name'] + '\n' }}"
    "{% if arguments is mapping %}{{ arguments['code'] }}{% else %}{{ arguments }}{% endif %}"
    "{{ '\n</tool>' }}"
    "{% endfor %}{% endif %}"
    "{{ '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

_TOOL_BLOCK = re.compile(r"<tool>([a-z_]+)\n(.*?)\n?</tool>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call: the tool's name and the program or command it runs."""

    name: str
    code: str

    def to_openai(self, call_id: str) -> dict[str, Any]:
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps({"code": self.code})},
        }


def render_turn(role: str, content: str) -> str:
    if role not in ROLE_TOKENS:
        raise ValueError(f"unknown chat role {role!r}; expected one of {sorted(ROLE_TOKENS)}")
    return f"{ROLE_TOKENS[role]}\n{content}{END}\n"


def render_chat(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
    """Render OpenAI-style messages in the demo format (tool calls back into their text)."""
    parts = []
    for message in messages:
        content = message.get("content") or ""
        for call in message.get("tool_calls") or ():
            function = call["function"]
            arguments = function["arguments"]
            # OpenAI sends arguments as a JSON string; transformers' templates take a dict.
            code = (json.loads(arguments) if isinstance(arguments, str) else arguments)["code"]
            content += f"<tool>{function['name']}\n{code}\n</tool>"
        parts.append(render_turn(message["role"], content))
    if add_generation_prompt:
        parts.append(ROLE_TOKENS["assistant"] + "\n")
    return "".join(parts)


def user_prompt(question: str) -> str:
    """The prompt text for a single-turn task: the question, then the assistant's cue."""
    return render_chat([{"role": "user", "content": question}])


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Split an assistant turn into its prose and its tool calls (in order).

    Unknown tool names are kept as calls (the agent answers them with an error observation,
    which is a learnable signal) rather than silently treated as prose.
    """
    calls = [ToolCall(name=m.group(1), code=m.group(2)) for m in _TOOL_BLOCK.finditer(text)]
    prose = _TOOL_BLOCK.sub("", text).replace(END, "").strip()
    return prose, calls


def format_observation(stdout: str, stderr: str, exit_code: int | None, note: str = "") -> str:
    """The text of a tool turn: stdout, then stderr and the exit status only when they matter.

    Short on purpose: the demo model learns to copy a number out of it.
    """
    text = stdout.rstrip("\n")
    if stderr.strip():
        text += ("\n" if text else "") + "[stderr]\n" + stderr.rstrip("\n")
    if exit_code not in (0, None):
        text += ("\n" if text else "") + f"[exit {exit_code}]"
    if note:
        text += ("\n" if text else "") + f"[{note}]"
    return text
