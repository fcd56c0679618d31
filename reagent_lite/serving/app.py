"""The HTTP API of `reagent-lite serve` (FastAPI: its request bodies are the Pydantic
models of `schemas.py`, which the in-process `Policy` validates with too).

    POST /v1/act       a decision (batched with concurrent ones into one model call)
    POST /v1/feedback  a reward joined to its decision; 404 for an unknown id
    GET  /v1/health    liveness and the model serving
    GET  /v1/model     the model, exploration, batching and counters
    POST /v1/reload    load the model now in --model (also done on its own when it changes)

A bad request is a 422 whose `error` names the field and what was expected; a log that
cannot take decisions is a 503 with its message; anything else is a 500 without a trace
(the trace goes to the server's log).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from reagent_lite.errors import ConfigError
from reagent_lite.serving.batcher import Batcher
from reagent_lite.serving.decision_log import LogUnavailable
from reagent_lite.serving.model_files import files_key
from reagent_lite.serving.policy import Decision, Policy, RequestError
from reagent_lite.serving.schemas import ActRequest, ActResponse, FeedbackRequest, describe_errors

log = logging.getLogger("reagent_lite.serving")


def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


def _field_loc(loc: Sequence[Any]) -> list[Any]:
    rest = list(loc)[1:] if list(loc)[:1] == ["body"] else list(loc)
    return rest or ["body"]


def create_app(
    policy: Policy,
    *,
    max_batch: int = 64,
    max_wait_s: float = 0.002,
    reload_poll_s: float = 1.0,
    on_ready: Callable[[], None] | None = None,
) -> FastAPI:
    """The app serving `policy`; it closes the policy (and so its log) on shutdown, after
    the server has answered every request in flight."""
    batcher: Batcher[ActRequest, Decision | Exception] = Batcher(
        policy.act_batch, max_batch, max_wait_s
    )
    reload_lock = asyncio.Lock()

    async def reload(source: str) -> tuple[bool, str]:
        async with reload_lock:  # one load at a time: the watcher and /v1/reload alike
            old = policy.model.model_id
            try:
                new = await run_in_threadpool(policy.reload)
            except ConfigError as err:
                log.error("serving: %s: new model refused, still serving %s: %s", source, old, err)
                return False, str(err)
            log.info("serving: %s: now serving model %s (was %s)", source, new.model_id, old)
            return True, new.model_id

    async def watch() -> None:
        """Reloads when model.pt2 or model_meta.json is replaced; a refused pair is tried
        again only once either file changes again (a trainer writes them one by one)."""
        tried = policy.model.files
        while True:
            await asyncio.sleep(reload_poll_s)
            now = await run_in_threadpool(files_key, policy.model_dir)
            if now not in (tried, policy.model.files) and None not in now:
                tried = now
                await reload("model files changed")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        watcher = asyncio.get_running_loop().create_task(watch()) if reload_poll_s > 0 else None
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            if watcher is not None:
                watcher.cancel()
            await batcher.stop()
            try:
                await run_in_threadpool(policy.close)
            except LogUnavailable as err:  # the command exits non-zero with this message
                log.error("serving: the decision log could not be written out: %s", err)
            else:
                log.info("serving: decision log closed (%s)", policy.stats())

    app = FastAPI(title="reagent-lite serve", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # Fields are named as the client wrote them: `state_features.0`, not `body.…`.
        errors = [{**e, "loc": _field_loc(e.get("loc", ()))} for e in exc.errors()]
        detail = [{"loc": e["loc"], "msg": e.get("msg", "")} for e in errors]
        return _error(422, describe_errors(errors), detail=detail)

    @app.exception_handler(LogUnavailable)
    async def unavailable(request: Request, exc: LogUnavailable) -> JSONResponse:
        return _error(503, str(exc))

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        log.error("serving: %s %s failed", request.method, request.url.path, exc_info=exc)
        return _error(500, f"internal error ({type(exc).__name__}); the server log has details")

    @app.post("/v1/act", response_model=ActResponse)
    async def act(body: ActRequest) -> Any:
        outcome = await batcher.submit(body)
        if isinstance(outcome, RequestError):
            return _error(422, str(outcome), field=outcome.field)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome.as_dict()

    @app.post("/v1/feedback")
    def feedback(body: FeedbackRequest) -> Any:
        if not policy.feedback(body.decision_id, body.reward, body.metrics):
            return _error(
                404,
                f"decision_id {body.decision_id!r}: no such decision (unknown, already"
                " answered, or older than the feedback window)",
            )
        return {"decision_id": body.decision_id, "joined": True}

    @app.get("/v1/health")
    def health() -> Any:
        return {"status": "ok", "model_id": policy.model.model_id}

    @app.get("/v1/model")
    def model() -> Any:
        return {
            **policy.model.describe(),
            "exploration": str(policy.exploration),
            "max_batch": batcher.max_batch,
            "max_wait_ms": batcher.max_wait_s * 1000.0,
            "stats": policy.stats(),
        }

    @app.post("/v1/reload")
    async def reload_now() -> Any:
        ok, text = await reload("POST /v1/reload")
        if not ok:
            return _error(409, f"new model refused, still serving the old one: {text}")
        return policy.model.describe()

    return app
