"""Drives the router with the official `openai` client; prints one JSON line.

Usage: python openai_client.py BASE_URL
"""

import json
import sys

import openai
from openai import OpenAI

client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="sk-test", max_retries=0)
messages = [{"role": "user", "content": "Tell me a story"}]

chunks = list(
    client.chat.completions.create(
        model="m",
        messages=messages,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
)
streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
usage = next((c.usage for c in chunks if c.usage), None)

whole = client.chat.completions.create(model="m", messages=messages, max_tokens=8)

# Larger than the router's body limit (the test sets it to 4 KB).
huge = [{"role": "user", "content": "x" * 10_000}]
try:
    client.chat.completions.create(model="m", messages=huge, max_tokens=8)
    rejected = None
except openai.APIStatusError as e:
    rejected = {"status": e.status_code, "message": str(e.message)}

print(
    json.dumps(
        {
            "chunks": len(chunks),
            "streamed": streamed,
            "completion_tokens": usage.completion_tokens if usage else None,
            "whole": whole.choices[0].message.content,
            "rejected": rejected,
        }
    )
)
