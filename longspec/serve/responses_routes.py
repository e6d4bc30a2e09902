"""OpenAI's Responses API on the server: POST /v1/responses (whole, or streamed as server-sent
events), and GET and DELETE /v1/responses/{id} of a stored response.

A request is translated into the chat request it asks for (openai_api/responses_schema.py) and
runs as one: the server's settings, submission and waiting (app.py's Server), the same tokens as
/v1/chat/completions. A response whose request did not say `store: false` is kept in memory with
its conversation (the previous response's items, the request's input items and the response's
output items), so that a request naming it (previous_response_id) continues that conversation;
the last STORED responses are kept, the oldest made dropped first, and none outlives the process.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from ..openai_api.responses import APIError
from ..openai_api.responses_schema import ResponsesBody
from ..openai_api.responses_shape import ResponseShape
from .worker import Finished, Job

if TYPE_CHECKING:
    from .app import Server

STORED = 256        # responses kept for previous_response_id and GET


@dataclass
class Stored:
    body: dict              # the response as it was sent
    items: list[dict]       # its conversation's items, its output's last


class ResponseStore:
    """The last `limit` stored responses by id, the oldest made dropped first."""

    def __init__(self, limit: int = STORED):
        self.limit = limit
        self.kept: OrderedDict[str, Stored] = OrderedDict()

    def get(self, response_id: str) -> Stored:
        """The response; a 404 where none is kept under that id."""
        if response_id not in self.kept:
            raise APIError(404, f"Response with id {response_id!r} not found", param="id")
        return self.kept[response_id]

    def conversation(self, response_id: str) -> list[dict]:
        """The items of the response's conversation, for a request that continues it; an
        APIError in OpenAI's words where none is kept under that id."""
        if response_id not in self.kept:
            raise APIError(400, f"Previous response with id {response_id!r} not found: it was "
                           "made with store false, deleted, or dropped (the server keeps its "
                           f"last {self.limit} responses)", param="previous_response_id",
                           code="previous_response_not_found")
        return self.kept[response_id].items

    def put(self, body: dict, items: list[dict]) -> None:
        self.kept[body["id"]] = Stored(body, items)
        while len(self.kept) > self.limit:
            self.kept.popitem(last=False)

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        del self.kept[response_id]


def add_responses_routes(app: FastAPI, server: Server) -> None:
    """The Responses API's routes on `app`, their generations run by `server`."""
    store = ResponseStore()

    @app.post("/v1/responses")
    async def create_response(request: Request, body: ResponsesBody):
        arrived = time.monotonic()
        previous = [] if body.previous_response_id is None else store.conversation(
            body.previous_response_id)
        try:
            chat = body.chat_body(previous)
        except ValidationError as e:       # a longspec field, as ChatBody checks it
            raise RequestValidationError(e.errors()) from None
        prompt, settings = server.settings(chat, chat=True)
        jobs = await server.submit(prompt, settings, [settings["seed"]], arrived)
        shape = ResponseShape(server.config.model_name, body.echo(), settings["seed"],
                              chat.return_token_ids, jobs[0].stream.tools)
        items = previous + body.items()

        def keep(response: dict) -> None:
            if body.store is not False:
                store.put(response, items + response["output"])

        if body.stream:
            return StreamingResponse(events(jobs[0], shape, keep),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        results = await server.results(jobs, request)
        if results is None:
            return Response(status_code=499)     # the client left; nobody reads this
        response = shape.whole(results[0])
        keep(response)
        return JSONResponse(response)

    async def events(job: Job, shape: ResponseShape, keep: Callable[[dict], None]):
        """A streamed response's events as its generation goes; the finished response is kept
        (`keep`) before its last event goes out."""
        for event in shape.start():
            yield event
        async for _, item in server.updates([job]):
            if not isinstance(item, Finished):
                for event in shape.delta(item.text):
                    yield event
            elif (error := server.ended_badly(item)) is not None:
                yield shape.failed(error)
            else:
                response, closing = shape.end(item.result)
                keep(response)
                for event in closing:
                    yield event

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str):
        return JSONResponse(store.get(response_id).body)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str):
        store.delete(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})
