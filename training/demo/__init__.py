"""Demo domains and the demo chat format (see ``domains`` and ``chat``).

``demo_domains()`` returns the task families the demo model (``training.models``) is warmed up
on; each has a ``name``, a ``rubric_spec`` for the rewards library and ``make_tasks(n, seed,
split)``.
"""

from training.demo.chat import (
    CHAT_TEMPLATE,
    END,
    SPECIAL_TOKENS,
    ToolCall,
    format_observation,
    parse_tool_calls,
    render_chat,
    user_prompt,
)
from training.demo.domains import SPLITS, DemoDomain, demo_domains, get_domain

__all__ = [
    "CHAT_TEMPLATE",
    "END",
    "SPECIAL_TOKENS",
    "SPLITS",
    "DemoDomain",
    "ToolCall",
    "demo_domains",
    "format_observation",
    "get_domain",
    "parse_tool_calls",
    "render_chat",
    "user_prompt",
]
