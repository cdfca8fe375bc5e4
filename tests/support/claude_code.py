"""A Claude Code conversation as Claude Code 2.1.197 sends it on its defaults (cut down from
one captured from ``claude -p "run ls in this folder"``): model ``claude-opus-4-8``, its
tools led by Agent (which takes no command) and Bash, the user's turn a system reminder and
the words, and the conversation ending with a mid-conversation ``system`` message (the
agent list) after them. The tool's result comes back in a user message and the agent list
stays last."""

from __future__ import annotations

from typing import Any

MODEL = "claude-opus-4-8"  # what Claude Code asks for with no --model
SMALL_MODEL = "claude-haiku-4-5-20251001"  # its side tasks' model
SYSTEM = [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197"},
    {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
]
BASH_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "command": {"description": "The command to execute", "type": "string"},
        "timeout": {"description": "Optional timeout in milliseconds (max 600000)", "type": "number"},
        "description": {"description": "What this command does, in active voice.", "type": "string"},
        "run_in_background": {"description": "Run this command in the background.", "type": "boolean"},
        "dangerouslyDisableSandbox": {"description": "Run without sandboxing.", "type": "boolean"},
    },
    "required": ["command"],
    "additionalProperties": False,
}
TOOLS: list[dict[str, Any]] = [
    {
        "name": "Agent",
        "description": "Launch a new agent to handle complex, multi-step tasks autonomously.",
        "input_schema": {
            "type": "object",
            "properties": {
                "description": {"type": "string"},
                "prompt": {"type": "string"},
                "subagent_type": {"type": "string"},
            },
            "required": ["description", "prompt"],
            "additionalProperties": False,
        },
    },
    {"name": "Bash", "description": "Executes a given bash command.", "input_schema": BASH_SCHEMA},
    {
        "name": "Read",
        "description": "Reads a file from the local filesystem.",
        "input_schema": {
            "type": "object",
            "properties": {"file_path": {"type": "string"}, "offset": {"type": "integer"}},
            "required": ["file_path"],
            "additionalProperties": False,
        },
    },
]
REMINDER = (
    "<system-reminder>\nAs you answer the user's questions, you can use the following context:\n"
    "# currentDate\nToday's date is 2026-12-05.\n</system-reminder>\n"
)
ASK = "run ls in this folder"
AGENT_LIST = {
    "role": "system",
    "content": "Available agent types for the Agent tool:\n- claude: Catch-all for any task. (Tools: *)",
}
USER_TURN: dict[str, Any] = {
    "role": "user",
    "content": [{"type": "text", "text": REMINDER}, {"type": "text", "text": ASK}],
}
RESULT = "README.md\nconfig.toml\nhello-from-ls"


def request(messages: list[dict[str, Any]], *, model: str = MODEL, max_tokens: int = 32000) -> dict[str, Any]:
    """A Messages body as Claude Code sends it around ``messages`` (it streams them all:
    ``messages.stream(**request(...))``, or ``"stream": true`` added)."""
    return {
        "model": model,
        "max_tokens": max_tokens,
        "system": SYSTEM,
        "messages": messages,
        "tools": TOOLS,
        "metadata": {"user_id": "device-1"},
    }


def first_turn() -> list[dict[str, Any]]:
    """The user's words, then the agent list."""
    return [USER_TURN, AGENT_LIST]


def after_call(call: dict[str, Any], result: str = RESULT) -> list[dict[str, Any]]:
    """The conversation once the tool ran: ``call`` (a ``tool_use`` block), its result, the agent list last."""
    return [
        USER_TURN,
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": result}]},
        AGENT_LIST,
    ]
