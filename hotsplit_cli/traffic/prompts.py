"""Sample prompts for `balance` and `run` on real checkpoints."""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from hotsplit_cli.core.errors import InputFileError


def read_prompts(path: str | os.PathLike) -> list:
    """`.jsonl` with `{"prompt": str}` or `{"messages": [{"role", "content"}, ...]}` per line, or
    plain text with one prompt per non-empty line. Errors name the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file", "check the --prompts path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(f"{path}: cannot read as UTF-8 text ({exc})") from None
    prompts: list = []
    if path.suffix.lower() == ".jsonl":
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise InputFileError(f"{path}:{n}: not valid JSON ({exc})") from None
            if isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
                prompts.append(obj["prompt"])
            elif isinstance(obj, dict) and isinstance(obj.get("messages"), list) and all(
                    isinstance(m, dict) and isinstance(m.get("content"), str) for m in obj["messages"]):
                prompts.append(obj["messages"])
            else:
                raise InputFileError(f"{path}:{n}: expected {{\"prompt\": str}} or {{\"messages\": [{{\"role\", "
                                     "\"content\"}}, ...]}}")
    else:
        prompts = [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise InputFileError(f"{path}: no prompts", "one prompt per line, or .jsonl with prompt/messages")
    return prompts
