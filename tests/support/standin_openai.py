"""The stand-in's OpenAI-compatible routes, shaped like vLLM's and llama-server's answers.

* ``GET /v1/models``: ``{"object": "list", "data": [{"id": NAME, "object": "model", ...}]}``, one
  entry per ``--served-model-name`` (vLLM) or ``--alias`` (llama-server), else the ``--model`` file's
  name, else ``standin``.
* ``POST /v1/completions`` and ``POST /v1/chat/completions``: after the body's ``"sleep"`` (else
  ``--request-seconds``), a completion; with ``"stream": true`` server-sent events instead, one
  ``data: {...}`` chunk per token then ``data: [DONE]`` (chat: a first chunk with the assistant's
  role, the content chunks, a last chunk with ``finish_reason``).  How many content chunks: the
  body's ``"chunks"``, else its ``"max_tokens"``, else ``--chunks`` (3; a whole answer has as many
  words); the pause between two chunks: the body's ``"chunk_interval_s"``, else
  ``--chunk-interval`` (0).
* When names were given (``--served-model-name``/``--alias``), a request naming another model gets
  vLLM's 404 ``{"error": {"message": "The model `X` does not exist.", ...}}``; without names every
  model is accepted (the older tests name none).

A request counts as running (``/metrics``) from its arrival to its last byte, streams included,
as on vLLM.  A client that goes away mid-stream ends the stream (``stream aborted`` in the log),
as a real server stops generating.  Every answer carries ``x-standin-port`` (which stand-in
answered; an end-to-end test tells the backends apart by it).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Protocol

#: At most this many chunks per stream, whatever the body asks (a test's typo must not stream forever).
MAX_CHUNKS = 100_000
_WORDS = (" stand", "-in", " reply")


class _State(Protocol):
    args: Any

    def begin(self) -> int: ...
    def end(self) -> None: ...


def model_names(args: Any) -> list[str]:
    """The names ``/v1/models`` lists (see the module docstring)."""
    named = [*(args.served_model_name or []), *(args.alias or [])]
    if named:
        return named
    if args.model:
        return [os.path.basename(args.model)]
    return ["standin"]


def models_body(args: Any) -> dict[str, Any]:
    created = int(time.time())
    return {
        "object": "list",
        "data": [
            {"id": n, "object": "model", "created": created, "owned_by": "standin", "root": n}
            for n in model_names(args)
        ],
    }


def error_body(status: int, message: str, kind: str) -> dict[str, Any]:
    """An error in the OpenAI format (vLLM's ``ErrorResponse``)."""
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def refusal(args: Any, body: Any) -> tuple[int, dict[str, Any]] | None:
    """The 4xx answer a body gets before any work, or None when it is served."""
    if not isinstance(body, dict):
        return 400, error_body(400, "the body must be a JSON object", "BadRequestError")
    named = [*(args.served_model_name or []), *(args.alias or [])]
    model = body.get("model")
    if named and model is not None and model not in named:
        return 404, error_body(404, f"The model `{model}` does not exist.", "NotFoundError")
    return None


def chunk_plan(args: Any, body: dict[str, Any]) -> tuple[int, float]:
    """(content chunks, seconds before each) for a streamed answer."""
    count = body.get("chunks", body.get("max_tokens", args.chunks))
    interval = body.get("chunk_interval_s", args.chunk_interval)
    try:
        n = max(1, min(int(count), MAX_CHUNKS))
    except (TypeError, ValueError):
        n = args.chunks
    try:
        pause = max(0.0, float(interval))
    except (TypeError, ValueError):
        pause = args.chunk_interval
    return n, pause


def _word(i: int) -> str:
    return _WORDS[i % len(_WORDS)]


def completion(chat: bool, n: int, model: str, served: int) -> dict[str, Any]:
    """A whole (not streamed) answer."""
    text = "".join(_word(i) for i in range(n))
    usage = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}
    if chat:
        return {
            "id": f"chatcmpl-standin-{served}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": usage,
        }
    return {
        "id": f"cmpl-standin-{served}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
        "usage": usage,
    }


def stream_chunks(chat: bool, n: int, model: str, served: int) -> list[dict[str, Any]]:
    """The chunks of a streamed answer, in order (``[DONE]`` not included)."""
    created = int(time.time())
    if not chat:
        out = []
        for i in range(n):
            last = i == n - 1
            out.append(
                {
                    "id": f"cmpl-standin-{served}",
                    "object": "text_completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "text": _word(i),
                            "finish_reason": "stop" if last else None,
                            "logprobs": None,
                        }
                    ],
                }
            )
        return out
    head = {
        "id": f"chatcmpl-standin-{served}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
    }

    def choice(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    return [
        choice({"role": "assistant", "content": ""}, None),
        *(choice({"content": _word(i)}, None) for i in range(n)),
        choice({}, "stop"),
    ]


def serve(handler: Any, state: _State, chat: bool, body: dict[str, Any], log: Any) -> None:
    """Answer one completion request on ``handler`` (a ``BaseHTTPRequestHandler``), counted as running
    from now to its last byte (a whole answer: until it is ready to send, as before)."""
    args = state.args
    seconds = float(body.get("sleep", args.request_seconds))
    model = str(body.get("model") or model_names(args)[0])
    stream = body.get("stream") is True
    n, pause = chunk_plan(args, body)
    number = state.begin()
    ended = False
    try:
        time.sleep(seconds)
        if not stream:
            state.end()
            ended = True
            handler.send_json(200, completion(chat, n, model, number))
            return
        _stream(handler, stream_chunks(chat, n, model, number), pause, log)
    finally:
        if not ended:
            state.end()


def _stream(handler: Any, chunks: list[dict[str, Any]], pause: float, log: Any) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Cache-Control", "no-cache")
    handler.send_header("x-standin-port", str(handler.state.args.port))
    handler.end_headers()
    sent = 0
    try:
        for chunk in chunks:
            if pause and sent:
                time.sleep(pause)
            handler.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            handler.wfile.flush()
            sent += 1
        handler.wfile.write(b"data: [DONE]\n\n")
        handler.wfile.flush()
    except (BrokenPipeError, ConnectionResetError):
        log(f"stream aborted by the client after {sent} of {len(chunks)} chunks")
    handler.close_connection = True
