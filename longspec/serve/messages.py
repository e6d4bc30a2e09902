"""Anthropic's Messages API on the server: POST /v1/messages (whole, or streamed as named
server-sent events) and POST /v1/messages/count_tokens.

A body becomes the chat body the OpenAI endpoint takes (anthropic_api/translate.py) and from
there runs as every request does: Server.settings (the model name, then the settings), submit,
then results or updates. Errors on these routes, the app's exception handlers' and the API
key's included, come back in Anthropic's shape (`on_messages`, `anthropic_error`); one that
ends a stream already under way is an `error` event.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..anthropic_api.messages import Reply, error_body, event
from ..anthropic_api.schemas import CountTokensBody, MessagesBody
from ..anthropic_api.translate import chat_body
from ..api import make_request
from ..openai_api.responses import APIError
from ..request import encode_request
from .worker import Finished, Job

if TYPE_CHECKING:
    from .app import Server

PATH = "/v1/messages"


def on_messages(request: Request) -> bool:
    """Whether a request is one of this API's (its errors then take Anthropic's shape)."""
    return request.url.path.startswith(PATH)


def anthropic_error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status, headers=headers)


def add_messages_routes(app: FastAPI, server: Server) -> None:
    """The Messages API's routes on the app, served by its Server."""

    @app.post(PATH)
    async def messages(request: Request, body: MessagesBody):
        arrived = time.monotonic()
        prompt, settings = server.settings(chat_body(body), chat=True)
        jobs = await server.submit(prompt, settings, [settings["seed"]], arrived)
        reply = Reply(server.config.model_name, settings["seed"], server.model.tokenizer,
                      body.stop_sequences or [], jobs[0].stream.tools, body.return_token_ids)
        if body.stream:
            return StreamingResponse(_events(server, jobs, reply),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        results = await server.results(jobs, request)
        if results is None:
            return Response(status_code=499)     # the client left; nobody reads this
        return JSONResponse(reply.whole(results[0]))

    @app.post(PATH + "/count_tokens")
    async def count_tokens(body: CountTokensBody):
        """The prompt's tokens, as /v1/messages encodes them (the same template and tools)."""
        prompt, settings = server.settings(chat_body(body), chat=True)
        try:
            ids = await asyncio.to_thread(encode_request, server.model,
                                          make_request(prompt, settings))
        except (ValueError, TypeError) as e:
            raise APIError(400, str(e)) from None
        return {"input_tokens": len(ids)}


async def _events(server: Server, jobs: list[Job], reply: Reply):
    """A message's events as its chunks come; one that does not finish ends with an error
    event."""
    yield reply.start(len(jobs[0].stream.prompt_ids))
    async for _, item in server.updates(jobs):
        if not isinstance(item, Finished):
            if piece := reply.delta(item.text):
                yield piece
        elif (error := server.ended_badly(item)) is not None:
            yield event("error", error_body(error.status, error.message))
            return
        else:
            yield reply.end(item.result)
