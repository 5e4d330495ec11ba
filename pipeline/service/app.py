"""The HTTP API: submit, follow, fetch and cancel jobs; a job is exactly a `corpusmill run|dedup|train`.

Requests are checked before anything is queued — the body's size as it arrives (413, chunked or
not), the config by the same models as a YAML file (422 naming the key: unknown keys, values out of
their bounds, text that is not valid Unicode), every path and object-storage URL against the data
roots (403), a URL that is not plain (credentials, a query, `..`: 422), the file system's NAME_MAX /
PATH_MAX (422), the run directory for symlinks (422), the queue bound (429) — so a job that is accepted can only fail for
reasons found while running it. Files under a run directory are served without following links.
"""
from __future__ import annotations

import asyncio
import hmac
import os
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Any, Literal, Optional

from fastapi import Depends, FastAPI, HTTPException, Path as PathParam, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException
from pydantic import BaseModel, ConfigDict, Field, field_validator

from corpusmill.stages import storage

from .. import __version__
from ..config import ConfigError, escape_text, parse_config
from .guard import DataRoots, InputError, PathRefused, PathTooLong, UnsafeFolder, UrlRefused, check_no_links
from .page import add_page_routes
from .safefs import LinkRefused, read_bytes, read_range
from .session import COOKIE, CSRF_HEADER, Sessions
from .status import LOG_NAME, StepRates, job_counters, job_view, prometheus_text
from .store import ACTIVE, STATES, JobStore, OutInUse
from .supervisor import Supervisor

MAX_BODY_BYTES = 1 << 20
LOG_TAIL_BYTES = 16 << 20  # /log reads at most the last 16 MiB of a job's log
LOG_CHUNK_BYTES = 1 << 20  # /log?offset= answers at most 1 MiB at a time
# what a report.html may load: its own inline style and the data: images it embeds, nothing else (no script)
REPORT_CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'; "
              "frame-ancestors 'none'")
JOB_ID = r"^[0-9a-f]{16}$"


@dataclass
class ServiceContext:
    store: JobStore
    roots: DataRoots
    supervisor: Supervisor
    token: str
    scheduler: str
    dashboard: Optional[str]
    max_queued: int
    rates: StepRates = field(default_factory=StepRates)  # the running steps' ETAs, measured across status reads

    def view(self, row: dict) -> dict:
        return job_view(row, self.dashboard, self.rates)


# ---- API models ------------------------------------------------------------------------
class JobRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["run", "dedup", "train"] = Field(description="run: the whole pipeline (shards; training when "
                                                   "train.enabled); dedup: a batch dedup job; train: pretrain on shards.")
    config: dict[str, Any] = Field(default_factory=dict, description="The same fields as the YAML config "
                                   "(`corpusmill config example`); relative paths are taken from the first data root.")
    out: Optional[str] = Field(None, description="Run directory (train: its output folder), inside a data root; "
                               "or, for run and dedup jobs, an object-storage URL inside a URL data root "
                               "(s3://bucket/prefix/job) the results are published to at the end, as `corpusmill run "
                               "--out URL` does. Default FIRST_DATA_ROOT/jobs/ID.")
    work: Optional[str] = Field(None, description="With a URL `out` only: the local run directory (inside a folder "
                                "data root), as the CLI's --work; default STATE/work/ a folder named after the URL.")
    shards: Optional[str] = Field(None, description="train jobs: the shards/ folder (with manifest.json) to train on.")
    resume: bool = Field(False, description="Reuse finished stages (train: the newest checkpoint) already in `out`.")
    format: Literal["parquet", "jsonl"] = Field("parquet", description="dedup jobs: the format of OUT/kept/.")

    @field_validator("out", "shards", "work")
    @classmethod
    def _valid_unicode(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"not valid Unicode text: '{escape_text(v)}' holds a lone surrogate") from None
        return v


class ErrorBody(BaseModel):
    detail: str
    keys: list[str] = Field(default_factory=list, description="The request keys at fault, when known.")


class JobCreated(BaseModel):
    id: str
    state: str
    out: str = Field(description="The run directory, or the object-storage URL the results are published to.")
    work: Optional[str] = Field(None, description="A URL out's local run directory.")
    notes: list[str] = Field(default_factory=list, description="Config keys migrated from an older config_version.")


class StageStatus(BaseModel):
    name: str
    state: str
    seconds: Optional[float] = None
    counts: Optional[dict[str, Any]] = None
    step: Optional[dict[str, Any]] = Field(None, description="The running step's label and task count.")


class JobProgress(BaseModel):
    stage: Optional[str] = Field(None, description="The stage running now.")
    stages_done: int
    stages_total: int
    label: Optional[str] = Field(None, description="The running step (as the CLI's progress line names it).")
    tasks_done: Optional[int] = None
    tasks_total: Optional[int] = None
    percent: Optional[float] = Field(None, description="Of the running step's tasks (train: of the planned steps).")
    eta_s: Optional[float] = Field(None, description="Seconds the running step still needs, from the rate its tasks "
                                   "were seen to finish at; null until one was.")


class JobStatus(BaseModel):
    id: str
    kind: str
    state: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    created_utc: str
    started_utc: Optional[str] = None
    finished_utc: Optional[str] = None
    attempts: int
    restarts: int = Field(description="Times the job was resumed after the service stopped while it ran.")
    cancel_requested: bool
    exit_code: Optional[int] = None
    error: Optional[str] = None
    out: str = Field(description="The run directory, or the object-storage URL the results are published to.")
    work: Optional[str] = Field(None, description="A URL out's local run directory (status, report and log are read "
                                "from it).")
    dashboard: Optional[str] = Field(None, description="The Dask dashboard of the cluster the job runs on.")
    stage: Optional[str] = Field(None, description="The stage running now.")
    stages: list[StageStatus]
    ledger: Optional[dict[str, Any]] = Field(None, description="ledger.json when done; the finished stages' counts before.")
    train: Optional[dict[str, Any]] = None
    elapsed_s: Optional[float] = Field(None, description="Seconds since the job started (to its end once it ended).")
    progress: Optional[JobProgress] = Field(None, description="Where a running job is; null otherwise.")


class JobList(BaseModel):
    jobs: list[JobStatus]


class Health(BaseModel):
    status: str
    version: str


def _error(status: int, detail: str, keys: Optional[list[str]] = None) -> HTTPException:
    return HTTPException(status_code=status, detail={"detail": detail, "keys": keys or []})


def _printable(value: Any) -> Any:
    """An error body safe to encode as UTF-8 JSON: lone surrogates from the request escaped (else a 500)."""
    if isinstance(value, str):
        return escape_text(value)
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_printable(v) for v in value]
    return value


class BodyLimit:
    """413 for a request body over `max_bytes`, counted as it arrives: a Content-Length over the limit is
    refused before reading, and a chunked body (no length) as soon as its running total passes the limit.
    The body (at most `max_bytes`) is then handed on to the app as one message."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def _too_large(self, scope, receive, send) -> None:
        response = JSONResponse({"detail": f"request body over {self.max_bytes} bytes", "keys": []}, status_code=413,
                                headers={"Connection": "close"})  # the rest of the body is never read
        await response(scope, receive, send)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and (not value.isdigit() or int(value) > self.max_bytes):
                await self._too_large(scope, receive, send)
                return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        pending = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay():
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)


ERRORS = {401: {"model": ErrorBody, "description": "Missing or wrong bearer token."},
          422: {"model": ErrorBody, "description": "Invalid request; `keys` names what is wrong."}}
_JSON_ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}


def text_errors(*codes: int) -> dict:
    """Error responses of a route that answers text or HTML: its errors are still JSON."""
    return {c: {"description": "See ErrorBody.detail.", "content": _JSON_ERROR} for c in (401, 422, *codes)}


# ---- the request checks ---------------------------------------------------------------
def prepare_job(req: JobRequest, roots: DataRoots, job_id: str) -> tuple[dict, list[str]]:
    """Validate a request into what the job will run: the config resolved, every path checked."""
    try:
        cfg = parse_config(req.config, "request body: config")
    except ConfigError as e:
        raise _error(422, str(e), [f"config.{k}" for k in e.keys] or ["config"]) from None
    if cfg.cluster.address:
        raise _error(422, "config.cluster.address: jobs run on the service's Dask cluster; leave it unset",
                     ["config.cluster.address"])
    config = cfg.model_dump(mode="json")
    try:
        if req.kind in ("run", "dedup"):
            config["input"]["paths"] = roots.resolve_inputs("config.input.paths", cfg.input.paths)
        else:
            config["input"]["paths"] = [roots.resolve("config.input.paths", p) for p in cfg.input.paths]
        if cfg.tokenizer.model:
            config["tokenizer"]["model"] = model = roots.resolve("config.tokenizer.model", cfg.tokenizer.model)
            if req.kind == "run" and not (os.path.isfile(model) or os.path.isfile(os.path.join(model, "tokenizer.json"))):
                raise _error(422, f"config.tokenizer.model: {cfg.tokenizer.model} is not a file (nor a folder holding "
                             "tokenizer.json)", ["config.tokenizer.model"])
        config["dedup"]["reference"] = [roots.resolve(f"config.dedup.reference[{i}]", p)
                                        for i, p in enumerate(cfg.dedup.reference)]
        if cfg.filter.blocked_words.file:
            config["filter"]["blocked_words"]["file"] = roots.resolve("config.filter.blocked_words.file",
                                                                      cfg.filter.blocked_words.file)
        for i, s in enumerate(cfg.decontaminate.sets):
            config["decontaminate"]["sets"][i]["path"] = roots.resolve(f"config.decontaminate.sets[{i}].path", s.path)
        for i, c in enumerate(cfg.filter.classifiers):  # fastText models: files read by every worker
            config["filter"]["classifiers"][i]["model"] = roots.resolve(f"config.filter.classifiers[{i}].model", c.model)
        shards = None
        if req.kind == "train":
            if not req.shards:
                raise _error(422, "train jobs need `shards`: the shards/ folder of a finished run", ["shards"])
            shards = roots.resolve("shards", req.shards)
            if not os.path.isfile(os.path.join(shards, "manifest.json")):
                raise _error(422, f"shards: {req.shards} holds no manifest.json", ["shards"])
        elif req.shards:
            raise _error(422, "`shards` is for train jobs only", ["shards"])
        named = req.out or roots.default_out(job_id, local=req.kind == "train")
        url = roots.out_url("out", named) if storage.is_url(named) else None
        if url and req.kind == "train":
            raise _error(422, "out: a train job writes to a local folder; name one inside a folder data root", ["out"])
        if req.work and not url:
            raise _error(422, "work: is for an object-storage out (as the CLI's --work); with a local out the run "
                         "directory is out", ["work"])
        out = roots.work_dir("work", req.work, url) if url else roots.out_dir("out", named, named)
    except PathRefused as e:
        raise _error(403, str(e), [e.key]) from None
    except (PathTooLong, UrlRefused) as e:
        raise _error(422, str(e), [e.key]) from None
    except InputError as e:
        raise _error(422, f"config.input.paths: {e}", ["config.input.paths"]) from None
    try:
        if shards:
            check_no_links("shards", shards)
        check_no_links("work" if url else "out", out)
    except UnsafeFolder as e:
        raise _error(422, str(e), [e.key]) from None
    if url:
        _check_published(url, req.resume)
    if shards and (out == shards or out.startswith(shards + os.sep)):
        raise _error(409, "out: the training output must not be inside the shards folder", ["out"])
    where = "work" if url else "out"
    if os.path.isdir(out) and any(os.scandir(out)) and not req.resume:
        raise _error(409, f"{where}: {out} already holds files; set resume: true to continue it, or choose another "
                     f"{'out' if url else where}", [where])
    if os.path.exists(out) and not os.path.isdir(out):
        raise _error(409, f"{where}: {out} is a file", [where])
    # a URL out: `out` is the URL (what the job publishes to), `work` its local run directory
    request = {"kind": req.kind, "config": config, "out": url or out, "work": out if url else None, "shards": shards,
               "resume": req.resume, "format": req.format}
    return request, list(cfg.migration_notes)


def _check_published(url: str, resume: bool) -> None:
    """A URL out as a local one: 422 when the store cannot be used (no such bucket, access denied; one
    line without endpoint or credential), 409 when the prefix already holds objects and the job is no
    resume (the next publish would replace them)."""
    try:
        held = storage.listing(url)
    except storage.StorageError as e:
        raise _error(422, f"out: {e}", ["out"]) from None
    if held and not resume:
        raise _error(409, f"out: {url} already holds {len(held)} object(s); set resume: true to continue that run, "
                     "or choose another out", ["out"])


# ---- the app ---------------------------------------------------------------------------
def create_app(ctx: ServiceContext) -> FastAPI:
    """The job API over `ctx` (its store, supervisor, data roots and token)."""
    sessions = Sessions(ctx.token)
    authorized = _bearer_check(ctx.token, sessions)
    app = FastAPI(title="corpusmill", version=__version__, lifespan=_lifespan(ctx),
                  description="Submit dedup, shard and pretraining jobs, follow them, fetch their reports.")
    _add_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)
    # the order of the routes is the order of the OpenAPI document
    _add_health(app)
    _add_job_routes(app, ctx, authorized)
    _add_job_files(app, ctx, authorized)
    _add_cancel(app, ctx, authorized)
    _add_metrics(app, ctx, authorized)
    add_page_routes(app, ctx, sessions)  # the jobs page (no OpenAPI entries)
    assert set(STATES) == {"queued", "running", "succeeded", "failed", "cancelled"}
    return app


def _bearer_check(token: str, sessions: Sessions) -> Callable[..., None]:
    """A dependency that refuses (401) a request without the service token, or without the jobs page's
    session cookie; a POST on the cookie alone also needs the session's X-CSRF-Token (403 without)."""
    bearer = HTTPBearer(auto_error=False, description="The service token (CORPUSMILL_TOKEN or --token-file).")
    expected = token.encode()

    def authorized(request: Request, creds: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> None:
        cookie = request.cookies.get(COOKIE)
        if creds is None and sessions.valid(cookie):
            if request.method not in ("GET", "HEAD") and not sessions.csrf_ok(cookie, request.headers.get(CSRF_HEADER)):
                raise _error(403, "a request that changes something needs the page's X-CSRF-Token header "
                             "(or the bearer token)")
            return
        given = (creds.credentials if creds and creds.scheme.lower() == "bearer" else "").encode()
        if not hmac.compare_digest(given, expected):  # constant time, whatever is wrong with it
            raise HTTPException(status_code=401, detail={"detail": "missing or wrong bearer token", "keys": []},
                                headers={"WWW-Authenticate": "Bearer"})

    return authorized


def _lifespan(ctx: ServiceContext) -> Callable:
    """The supervisor recovers interrupted jobs at start and runs until the app stops."""
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        ctx.supervisor.recover()
        task = asyncio.create_task(ctx.supervisor.run_forever())
        try:
            yield
        finally:
            ctx.supervisor.shutdown()
            task.cancel()

    return lifespan


def _add_error_handlers(app: FastAPI) -> None:
    """Every error body is ErrorBody JSON ({detail, keys}), safe to encode whatever the request held."""
    @app.exception_handler(StarletteHTTPException)  # FastAPI's own and the ones it raises itself (body parsing)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        body = exc.detail if isinstance(exc.detail, dict) else {"detail": str(exc.detail), "keys": []}
        status = exc.status_code
        if status == 400 and body["detail"] == "There was an error parsing the body":
            # JSON that json.loads cannot take (an integer of over 4300 digits, nesting too deep): as any other
            # undecodable body, a 422
            status, body = 422, {"detail": "body: JSON that cannot be decoded (an integer of more than 4300 digits, "
                                 "or nesting too deep?)", "keys": ["body"]}
        return JSONResponse(_printable(body), status_code=status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        keys = [".".join(str(p) for p in e["loc"] if p != "body") or "body" for e in errors]
        detail = "; ".join(f"{k or 'body'}: {e['msg']}" for k, e in zip(keys, errors))
        return JSONResponse(_printable({"detail": detail, "keys": keys}), status_code=422)


def _job_row(ctx: ServiceContext, job_id: str) -> dict:
    row = ctx.store.get(job_id)
    if row is None:
        raise _error(404, f"no job {job_id}")
    return row


def _add_health(app: FastAPI) -> None:
    @app.get("/v1/health", response_model=Health, tags=["service"])
    def health() -> dict:
        """Liveness (no token needed)."""
        return {"status": "ok", "version": __version__}


def _add_job_routes(app: FastAPI, ctx: ServiceContext, authorized: Callable) -> None:
    """Submit, list and look at jobs."""
    @app.post("/v1/jobs", status_code=201, response_model=JobCreated, tags=["jobs"], dependencies=[Depends(authorized)],
              responses={**ERRORS, 403: {"model": ErrorBody, "description": "A path outside the data roots."},
                         400: {"model": ErrorBody, "description": "The body is not parseable JSON."},
                         409: {"model": ErrorBody, "description": "`out` is in use or already holds files."},
                         413: {"model": ErrorBody, "description": "Request body too large."},
                         429: {"model": ErrorBody, "description": "The queue is full."}})
    def submit(req: JobRequest) -> dict:
        """Queue a job. The config is validated and every path checked before it is accepted."""
        import uuid

        job_id = uuid.uuid4().hex[:16]
        request, notes = prepare_job(req, ctx.roots, job_id)
        run_dir = request["work"] or request["out"]
        try:
            added = ctx.store.add(req.kind, request, run_dir, ctx.max_queued, job_id=job_id, named=request["out"])
        except OutInUse as e:
            raise _error(409, f"out: job {e.job_id} is already writing to {e.where}", ["out"]) from None
        if not added:
            raise _error(429, f"the queue is full ({ctx.max_queued} jobs waiting); retry later")
        return {"id": job_id, "state": "queued", "out": request["out"], "work": request["work"], "notes": notes}

    @app.get("/v1/jobs", response_model=JobList, tags=["jobs"], dependencies=[Depends(authorized)], responses=ERRORS)
    def list_jobs(state: Optional[Literal["queued", "running", "succeeded", "failed", "cancelled"]] = None,
                  limit: int = Query(100, ge=1, le=1000), offset: int = Query(0, ge=0, le=2**31),
                  newest_first: bool = Query(False, description="The newest job first.")) -> dict:
        """Jobs in submission order (or newest first), optionally of one state."""
        return {"jobs": [ctx.view(r) for r in ctx.store.list(state, limit, offset, newest_first)]}

    @app.get("/v1/jobs/{job_id}", response_model=JobStatus, tags=["jobs"], dependencies=[Depends(authorized)],
             responses={**ERRORS, 404: {"model": ErrorBody}})
    def get_job(job_id: str = PathParam(pattern=JOB_ID)) -> dict:
        """State, current stage, per-stage progress and timings, the ledger so far, the error when failed."""
        return ctx.view(_job_row(ctx, job_id))

    @app.get("/v1/jobs/{job_id}/request", tags=["jobs"], dependencies=[Depends(authorized)],
             responses={**ERRORS, 404: {"model": ErrorBody}})
    def get_request(job_id: str = PathParam(pattern=JOB_ID)) -> dict:
        """What the job runs: the validated request (kind, the whole config with defaults, paths resolved, out)."""
        return _job_row(ctx, job_id)["request"]


def _add_job_files(app: FastAPI, ctx: ServiceContext, authorized: Callable) -> None:
    """What a job wrote: its report, ledger and log (read without following a link)."""
    @app.get("/v1/jobs/{job_id}/report", response_class=HTMLResponse, tags=["jobs"], dependencies=[Depends(authorized)],
             responses=text_errors(403, 404))
    def get_report(job_id: str = PathParam(pattern=JOB_ID)) -> HTMLResponse:
        """The run's report.html (written when a run or dedup job finishes); never through a symlink (403)."""
        row = _job_row(ctx, job_id)
        if row["kind"] == "train":
            raise _error(404, "train jobs write no HTML report (see /ledger)")
        try:
            data = read_bytes(Path(row["out"]) / "report.html")
        except LinkRefused as e:
            raise _error(403, f"refused: {e}") from None
        except OSError:
            raise _error(404, f"no report yet (job {row['state']})") from None
        return HTMLResponse(data.decode("utf-8", "replace"), headers={"Content-Security-Policy": REPORT_CSP,
                                                                      "X-Content-Type-Options": "nosniff"})

    @app.get("/v1/jobs/{job_id}/ledger", tags=["jobs"], dependencies=[Depends(authorized)],
             responses={**ERRORS, 404: {"model": ErrorBody}})
    def get_ledger(job_id: str = PathParam(pattern=JOB_ID)) -> dict:
        """ledger.json (partial while running: the finished stages' counts); train jobs: summary.json."""
        row = _job_row(ctx, job_id)
        view = ctx.view(row)
        if row["kind"] == "train":
            if not view["train"]:
                raise _error(404, f"no training progress yet (job {row['state']})")
            return view["train"]
        if not view["ledger"]:
            raise _error(404, f"no ledger yet (job {row['state']})")
        return view["ledger"]

    @app.get("/v1/jobs/{job_id}/log", response_class=PlainTextResponse, tags=["jobs"],
             dependencies=[Depends(authorized)], responses=text_errors(403, 404))
    def get_log(job_id: str = PathParam(pattern=JOB_ID), tail: int = Query(200, ge=1, le=100000),
                offset: Optional[int] = Query(None, ge=0, le=2**62, description="Instead of the last `tail` lines: "
                                              "what the job printed from this byte on (at most 1 MiB, whole lines "
                                              "while it runs). Follow a log with the X-Log-Offset of each answer.")
                ) -> PlainTextResponse:
        """The last `tail` lines the job printed, or what it printed from `offset` on. The X-Log-Offset header is
        where the text ends in the log, the offset to ask for next."""
        row = _job_row(ctx, job_id)
        try:
            data, start, _ = read_range(ctx.supervisor.job_dir(job_id) / LOG_NAME, offset,
                                        LOG_CHUNK_BYTES if offset is not None else LOG_TAIL_BYTES)
        except LinkRefused as e:
            raise _error(403, f"refused: {e}") from None
        except OSError:
            data, start = b"", 0
        if row["state"] in ACTIVE and b"\n" in data:  # a line still being written is sent once it is whole
            data = data[:data.rindex(b"\n") + 1]
        headers = {"X-Log-Offset": str(start + len(data))}
        text = data.decode("utf-8", "replace")
        if offset is not None:
            return PlainTextResponse(text, headers=headers)
        return PlainTextResponse("\n".join(text.splitlines()[-tail:]) + "\n", headers=headers)


def _add_cancel(app: FastAPI, ctx: ServiceContext, authorized: Callable) -> None:
    @app.post("/v1/jobs/{job_id}/cancel", status_code=202, response_model=JobStatus, tags=["jobs"],
              dependencies=[Depends(authorized)],
              responses={**ERRORS, 400: {"model": ErrorBody}, 404: {"model": ErrorBody},
                         403: {"model": ErrorBody, "description": "A page session without its X-CSRF-Token."},
                         409: {"model": ErrorBody, "description": "Already finished."}})
    def cancel(job_id: str = PathParam(pattern=JOB_ID)) -> dict:
        """Cancel a queued job at once, or a running one (SIGINT, then SIGKILL after a grace period)."""
        from ..progress import utc_now

        row = _job_row(ctx, job_id)
        if row["state"] == "queued" and ctx.store.update(job_id, expect=("queued",), state="cancelled",
                                                         cancel_requested=1, finished_utc=utc_now()):
            return ctx.view(_job_row(ctx, job_id))
        if ctx.store.update(job_id, expect=("running",), cancel_requested=1):
            return ctx.view(_job_row(ctx, job_id))
        row = _job_row(ctx, job_id)
        if row["state"] in ACTIVE:  # it moved from queued to running in between: cancel the running job
            ctx.store.update(job_id, expect=ACTIVE, cancel_requested=1)
            return ctx.view(_job_row(ctx, job_id))
        raise _error(409, f"job {job_id} already {row['state']}")


def _add_metrics(app: FastAPI, ctx: ServiceContext, authorized: Callable) -> None:
    @app.get("/metrics", response_class=PlainTextResponse, tags=["service"], dependencies=[Depends(authorized)],
             responses=text_errors())
    def metrics() -> PlainTextResponse:
        """Prometheus text: jobs by state, documents and tokens processed, stage seconds."""
        rows = ctx.store.list(None, limit=1_000_000)
        live = {r["id"]: job_counters(r) for r in rows if r["state"] in ACTIVE or r["summary"] is None}
        return PlainTextResponse(prometheus_text(ctx.store.counts(), rows, live),
                                 media_type="text/plain; version=0.0.4")
