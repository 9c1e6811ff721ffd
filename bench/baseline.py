"""The baseline: the same demo model streamed as SSE straight from a FastAPI endpoint.

No Temporal, no database, no auth: a request comes in, `DemoModel.stream` runs in the request
handler and each token goes out as a `delta` event, closed by a `done` event. It uses the same
SSE library (sse-starlette) and server (uvicorn) as the Parley API, and runs as its own process.

    python -m bench.baseline --port 8765 --token-delay-ms 5
"""

from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI
from pydantic import BaseModel
from sse_starlette import EventSourceResponse, ServerSentEvent

from parley.config import Settings
from parley.gateway.base import ModelRequest, TextDelta
from parley.gateway.demo import DemoModel


class StreamIn(BaseModel):
    text: str
    client_message_id: str | None = None
    expected_last_seq: int | None = None


def create_app(token_delay_s: float) -> FastAPI:
    app = FastAPI(title="bench baseline")
    model = DemoModel(token_delay_s=token_delay_s)
    system_prompt = Settings(database_url=None).system_prompt

    def events(text: str) -> EventSourceResponse:
        request = ModelRequest(
            model="demo-1",
            messages=[
                {"role": "system", "content": system_prompt},
                {"role": "user", "content": text},
            ],
        )
        message_id = f"msg_{uuid.uuid4().hex}"

        async def stream() -> AsyncIterator[ServerSentEvent]:
            seq = 0
            parts: list[str] = []
            async for item in model.stream(request):
                if isinstance(item, TextDelta):
                    seq += 1
                    parts.append(item.text)
                    yield ServerSentEvent(
                        id=str(seq),
                        event="delta",
                        data=json.dumps(
                            {"message_id": message_id, "text": item.text}, separators=(",", ":")
                        ),
                    )
            seq += 1
            done = {"message": {"id": message_id, "role": "assistant", "text": "".join(parts)}}
            yield ServerSentEvent(
                id=str(seq), event="done", data=json.dumps(done, separators=(",", ":"))
            )

        return EventSourceResponse(
            stream(), headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        )

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/stream", response_class=EventSourceResponse)
    async def post_stream(body: StreamIn) -> EventSourceResponse:
        return events(body.text)

    @app.get("/v1/stream", response_class=EventSourceResponse)
    async def get_stream(text: str) -> EventSourceResponse:
        return events(text)

    return app


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.baseline")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token-delay-ms", type=float, required=True)
    args = parser.parse_args()

    import uvicorn

    # Same uvicorn settings as `parley api` (which runs with log_level="info").
    uvicorn.run(
        create_app(args.token_delay_ms / 1000), host=args.host, port=args.port, log_level="info"
    )


if __name__ == "__main__":
    main()
