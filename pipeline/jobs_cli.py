"""`corpusmill jobs ...`: submit, list, follow, cancel and fetch the reports of `corpusmill serve` jobs.

A thin client of the service's JSON API (/v1/jobs...), on the standard library's urllib only (httpx is
a test extra), so it runs wherever corpusmill is installed and starts in a fraction of a second: it
imports nothing of Dask, MindSpore or pydantic. The server comes from --server or
$CORPUSMILL_SERVER; the token from --token-file or $CORPUSMILL_TOKEN (else, when it exists, the one
`corpusmill serve` generated into ./.corpusmill-service/token), never from the command line, and it
is never printed. Every failure is one line, `corpusmill: error: ...`, exit 2, like the rest of the
CLI; `jobs follow` ends with the job's own outcome (0 succeeded, the job's exit code when it failed,
130 when it was cancelled, as an interrupted CLI run).

cli.py adds the subcommand with `add_jobs(sub)` and runs it with `cmd_jobs(args)`; the command also
runs as `python -m corpusmill.pipeline.jobs_cli ...`.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Optional

SERVER_ENV = "CORPUSMILL_SERVER"
TOKEN_ENV = "CORPUSMILL_TOKEN"
DEFAULT_SERVER = "http://127.0.0.1:8787"
DEFAULT_TOKEN_FILE = Path(".corpusmill-service") / "token"  # what `corpusmill serve` generates on loopback
HTTP_TIMEOUT_S = 60.0
ACTIVE = ("queued", "running")
CANCELLED_EXIT = 130  # a cancelled job ends `jobs follow` as Ctrl-C ends a CLI run
_JOB_ID = re.compile(r"[0-9a-f]{16}")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # terminal control characters (a job's text could hold them)


class JobsError(Exception):
    """Something the user can fix (the server, the token, the job id, the config): one line, exit 2."""


def _printable(text: str) -> str:
    """Text from the service or a job, safe to print: control characters (an ANSI escape) shown as \\xNN."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _one_line(text: str) -> str:
    """A message of several lines (a config error names the section, then the key) as one."""
    out = ""
    for part in (p.strip() for p in str(text).splitlines()):
        if part:
            out += ("" if not out else " " if out.endswith(":") else " / ") + part
    return _printable(out)


# ---- the HTTP client -------------------------------------------------------------------
class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """The API never redirects; following one would send the token to wherever it points."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102
        return None  # urllib then raises HTTPError with the 3xx status


class Client:
    """The service at `server`, authenticated by `token`; every failure a JobsError of one line."""

    def __init__(self, server: str, token: Optional[str], timeout: float = HTTP_TIMEOUT_S):
        parsed = urllib.parse.urlsplit(server)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise JobsError(f"--server {server}: expected http://HOST:PORT or https://HOST:PORT")
        self.server, self.token, self.timeout = server.rstrip("/"), token, timeout
        # the service is local or named explicitly: no proxy from the environment sees the token
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())

    def request(self, method: str, path: str, body: Optional[dict] = None,
                query: Optional[dict] = None) -> tuple[int, dict, bytes]:
        """(status, headers, body) of a 2xx answer; JobsError for anything else."""
        url = self.server + path + (("?" + urllib.parse.urlencode(query)) if query else "")
        data = json.dumps(body).encode("utf-8") if body is not None else None
        req = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with self._opener.open(req, timeout=self.timeout) as r:
                return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
        except urllib.error.HTTPError as e:
            if 300 <= e.code < 400:
                raise JobsError(f"the service at {self.server} answered {e.code}, a redirect to "
                                f"{_one_line(e.headers.get('Location', '?'))}, which is not followed (the token would go "
                                "with it): give --server the service's own URL") from None
            raise JobsError(self._http_error(e.code, e.read())) from None
        except urllib.error.URLError as e:
            raise JobsError(self._unreachable(e.reason)) from None
        except (socket.timeout, TimeoutError):
            raise JobsError(f"the service at {self.server} did not answer within {self.timeout:.0f} s") from None
        except (ConnectionError, OSError) as e:
            raise JobsError(self._unreachable(e)) from None

    def json(self, method: str, path: str, body: Optional[dict] = None, query: Optional[dict] = None) -> Any:
        _, _, data = self.request(method, path, body, query)
        try:
            return json.loads(data.decode("utf-8"))
        except ValueError:
            raise JobsError(f"the service at {self.server} answered {path} with something that is not JSON "
                            "(is --server a corpusmill service?)") from None

    def _unreachable(self, reason: Any) -> str:
        if isinstance(reason, ConnectionRefusedError):
            why = "connection refused (is `corpusmill serve` running there?"
            return f"cannot reach the service at {self.server}: {why} set --server or ${SERVER_ENV})"
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return f"the service at {self.server} did not answer within {self.timeout:.0f} s"
        if isinstance(reason, socket.gaierror):
            return f"cannot reach the service at {self.server}: unknown host ({reason.strerror or reason})"
        text = getattr(reason, "strerror", None) or str(reason)
        return f"cannot reach the service at {self.server}: {_one_line(text)}"

    def _http_error(self, status: int, body: bytes) -> str:
        try:
            detail = json.loads(body.decode("utf-8")).get("detail")
        except (ValueError, AttributeError):
            detail = None
        detail = _one_line(detail if isinstance(detail, str) else body.decode("utf-8", "replace")[:300])
        if status == 401:
            source = "the token given" if self.token else "no token given"
            return (f"the service refused the request (401, {source}): set ${TOKEN_ENV} or --token-file to the "
                    "token `corpusmill serve` runs with")
        what = {403: "refused", 404: "not found", 409: "conflict", 413: "request too large", 422: "invalid request",
                429: "the queue is full"}.get(status, "the service failed" if status >= 500 else "error")
        return f"{what} ({status}): {detail}" if detail else f"{what} ({status})"


def load_token(token_file: Optional[str]) -> Optional[str]:
    """--token-file, else $CORPUSMILL_TOKEN, else the token `corpusmill serve` generated in its default state
    folder here; None when there is none (the service then answers 401, said in one line)."""
    path = Path(token_file) if token_file else None
    if path is None:
        env = os.environ.get(TOKEN_ENV, "").strip()
        if env:
            return env
        if not DEFAULT_TOKEN_FILE.is_file():
            return None
        path = DEFAULT_TOKEN_FILE
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise JobsError(f"--token-file {path}: cannot read it: {getattr(e, 'strerror', None) or e}") from None
    if not token:
        raise JobsError(f"--token-file {path} is empty")
    return token


# ---- what is printed -------------------------------------------------------------------
def duration(seconds: Optional[float]) -> str:
    """As the CLI's progress lines write it: 45s, 3m07s, 2h05m."""
    if seconds is None:
        return "-"
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def progress_text(job: dict) -> str:
    """`tokenize 3/8: 12/40 tasks (30%)` for a running job; the state otherwise."""
    p = job.get("progress")
    if not p:
        return "-"
    text = f"{p.get('stage') or '-'} {p.get('stages_done')}/{p.get('stages_total')}"
    if p.get("tasks_total"):
        text += f": {p['tasks_done']}/{p['tasks_total']} tasks"
        if p.get("percent") is not None:
            text += f" ({p['percent']:.0f}%)"
    return _printable(text)


def eta_text(job: dict) -> str:
    p = job.get("progress") or {}
    if not p.get("tasks_total"):
        return "-"
    return duration(p["eta_s"]) if p.get("eta_s") is not None else "?"


def _print_table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def _print_status(job: dict) -> None:
    lines = [("job", job["id"]), ("kind", job["kind"]), ("state", job["state"] + (" (cancel requested)" if
                                                                                  job.get("cancel_requested") and job["state"] in ACTIVE else "")),
             ("submitted", job.get("created_utc") or "-"), ("started", job.get("started_utc") or "-"),
             ("finished", job.get("finished_utc") or "-"), ("elapsed", duration(job.get("elapsed_s"))),
             ("attempts", f"{job.get('attempts')} (restarts {job.get('restarts')})"), ("out", job.get("out") or "-")]
    if job["state"] == "running":
        lines += [("progress", progress_text(job)), ("ETA", eta_text(job))]
    if job.get("exit_code") is not None:
        lines.append(("exit code", str(job["exit_code"])))
    for key, value in lines:
        print(f"{key + ':':<11}{_printable(str(value))}")
    if job.get("stages"):
        rows = [["stage", "state", "seconds", "docs in", "docs out"]]
        for s in job["stages"]:
            c = s.get("counts") or {}
            rows.append([_printable(str(s["name"])), str(s["state"]), "-" if s.get("seconds") is None else f"{s['seconds']:.1f}",
                         str(c.get("docs_in", "-")), str(c.get("docs_out", "-"))])
        print()
        _print_table(rows)
    ledger = job.get("ledger")
    if ledger and not ledger.get("partial") and "input" in ledger:
        parts = [f"{k} {ledger[k]}" for k in ("kept", "filtered", "duplicates", "quarantined") if k in ledger]
        print(f"\ndocuments: input {ledger['input']} = {' + '.join(parts)}  "
              f"({'balanced' if ledger.get('balanced') else 'NOT balanced'})")
    train = job.get("train")
    if train:
        if train.get("done"):
            print(f"training: {train.get('steps')} steps, loss {train.get('first_loss')} -> {train.get('last_loss')}")
        else:
            print(f"training: step {train.get('step')}/{train.get('planned_steps')}, loss {train.get('loss')}")
    if job.get("error"):
        print("\nerror: " + _printable(job["error"]).replace("\n", "\n  "))


# ---- the commands ----------------------------------------------------------------------
def _job_id(value: str) -> str:
    if not _JOB_ID.fullmatch(value):
        raise JobsError(f"{_one_line(value)!r} is not a job id (16 hexadecimal digits, as `jobs submit` and `jobs list` print)")
    return value


def _read_config(path: str) -> dict:
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JobsError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise JobsError(f"{path}: cannot read it: {getattr(e, 'strerror', None) or e}") from None
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise JobsError(f"{path}: not valid YAML{where}: {_one_line(getattr(e, 'problem', None) or e)}") from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise JobsError(f"{path}: a config is a mapping of sections (input:, dedup:, ...), not a {type(config).__name__}")
    return config


def _submit(client: Client, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"kind": args.kind, "config": _read_config(args.config)}
    for key in ("out", "shards"):
        if getattr(args, key):
            body[key] = getattr(args, key)
    if args.resume:
        body["resume"] = True
    if args.format:
        body["format"] = args.format
    created = client.json("POST", "/v1/jobs", body)
    if args.quiet:
        print(created["id"])
    else:
        print(f"job {created['id']} {created['state']} ({args.kind}); out {_printable(created['out'])}")
        for note in created.get("notes") or []:
            print(f"  note: {_printable(note)}")
    sys.stdout.flush()
    return _follow(client, created["id"], args.interval) if args.follow else 0


def _list(client: Client, args: argparse.Namespace) -> int:
    query: dict[str, Any] = {"limit": args.limit, "newest_first": "true"}
    if args.state:
        query["state"] = args.state
    jobs = client.json("GET", "/v1/jobs", query=query)["jobs"]
    if args.json:
        print(json.dumps(jobs, indent=2, ensure_ascii=False))
        return 0
    if not jobs:
        print("no jobs" + (f" {args.state}" if args.state else ""))
        return 0
    rows = [["ID", "KIND", "STATE", "PROGRESS", "ETA", "ELAPSED", "SUBMITTED"]]
    rows += [[j["id"], j["kind"], j["state"], progress_text(j), eta_text(j), duration(j.get("elapsed_s")),
              j.get("created_utc") or "-"] for j in jobs]
    _print_table(rows)
    return 0


def _status(client: Client, args: argparse.Namespace) -> int:
    job = client.json("GET", f"/v1/jobs/{_job_id(args.id)}")
    if args.json:
        print(json.dumps(job, indent=2, ensure_ascii=False))
    else:
        _print_status(job)
    return 0


def _end_code(job: dict) -> int:
    if job["state"] == "succeeded":
        return 0
    if job["state"] == "cancelled":
        return CANCELLED_EXIT
    code = job.get("exit_code")
    return code if isinstance(code, int) and 0 < code < 256 else 1


def _follow(client: Client, job_id: str, interval: float) -> int:
    """Print what the job prints (its progress lines, with ETA) as it prints them, until it ends."""
    job_id = _job_id(job_id)
    job = client.json("GET", f"/v1/jobs/{job_id}")
    _, headers, data = client.request("GET", f"/v1/jobs/{job_id}/log", query={"tail": 20})
    if data.strip():
        sys.stdout.write(_printable_log(data))
    offset = int(headers.get("x-log-offset", "0"))
    said = None
    try:
        while True:
            if job["state"] != said and job["state"] in ACTIVE:
                print(f"corpusmill jobs: job {job_id} {job['state']}", file=sys.stderr, flush=True)
                said = job["state"]
            _, headers, data = client.request("GET", f"/v1/jobs/{job_id}/log", query={"offset": offset})
            if data:
                sys.stdout.write(_printable_log(data))
                sys.stdout.flush()
            offset = int(headers.get("x-log-offset", offset))
            if job["state"] not in ACTIVE and not data:
                break  # ended, and the whole log is printed
            if job["state"] in ACTIVE:
                time.sleep(interval)
                job = client.json("GET", f"/v1/jobs/{job_id}")
    except KeyboardInterrupt:
        print(f"\ncorpusmill jobs: stopped following; job {job_id} goes on (`corpusmill jobs cancel {job_id}` stops it)",
              file=sys.stderr)
        return 130
    end = f"corpusmill jobs: job {job_id} {job['state']}"
    if job.get("exit_code") is not None:
        end += f" (exit code {job['exit_code']})"
    if job["state"] == "failed" and job.get("error"):
        end += ": " + _one_line(job["error"])
    print(end, file=sys.stderr, flush=True)
    return _end_code(job)


def _printable_log(data: bytes) -> str:
    text = data.decode("utf-8", "replace")
    return "\n".join(_printable(line) for line in text.split("\n"))


def _log(client: Client, args: argparse.Namespace) -> int:
    _, _, data = client.request("GET", f"/v1/jobs/{_job_id(args.id)}/log", query={"tail": args.tail})
    sys.stdout.write(_printable_log(data))
    return 0


def _cancel(client: Client, args: argparse.Namespace) -> int:
    job = client.json("POST", f"/v1/jobs/{_job_id(args.id)}/cancel")
    if job["state"] == "cancelled":
        print(f"job {job['id']} cancelled")
    else:
        print(f"job {job['id']}: cancel requested; it stops within seconds (SIGINT, SIGKILL after 15 s); "
              f"`corpusmill jobs follow {job['id']}` waits for it")
    return 0


def _report(client: Client, args: argparse.Namespace) -> int:
    _, _, data = client.request("GET", f"/v1/jobs/{_job_id(args.id)}/report")
    target = args.out
    if target is None and args.open:
        target = os.path.join(tempfile.gettempdir(), f"corpusmill-report-{args.id}.html")
    if target is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return 0
    try:
        Path(target).write_bytes(data)
    except OSError as e:
        raise JobsError(f"--out {target}: cannot write it: {e.strerror or e}") from None
    print(f"wrote {target} ({len(data):,} bytes)")
    if args.open:
        import webbrowser

        if not webbrowser.open(Path(target).resolve().as_uri()):
            raise JobsError(f"no web browser to open {target} with (set $BROWSER)")
    return 0


COMMANDS = {"submit": _submit, "list": _list, "status": _status, "log": _log, "cancel": _cancel, "report": _report}


def add_jobs(sub: argparse._SubParsersAction) -> None:
    """`corpusmill jobs submit|list|status|follow|log|cancel|report`."""
    j = sub.add_parser("jobs", help="submit, follow and cancel jobs of a corpusmill service (the client of `serve`)",
                       description="The client of `corpusmill serve`. The server is --server or $CORPUSMILL_SERVER "
                       f"(default {DEFAULT_SERVER}); the token is read from --token-file or $CORPUSMILL_TOKEN (else "
                       "./.corpusmill-service/token, where `corpusmill serve` generates one on loopback), never "
                       "given on the command line. Errors are one line and exit code 2.")
    common = argparse.ArgumentParser(add_help=False)  # accepted after every action: `jobs list --server URL`
    common.add_argument("--server", default=None, metavar="URL",
                        help=f"the service (default ${SERVER_ENV}, else {DEFAULT_SERVER})")
    common.add_argument("--token-file", metavar="FILE", help=f"file holding the token (default ${TOKEN_ENV})")
    common.add_argument("--timeout", type=float, default=HTTP_TIMEOUT_S,
                        help="seconds to wait for one answer (default 60)")
    j_sub = j.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    s = j_sub.add_parser("submit", parents=[common], help="queue a job: a YAML config, as `corpusmill run` takes",
                         description="Send CONFIG (YAML, the same fields as `corpusmill run`; relative paths are "
                         "taken from the service's first data root, and every path must lie inside a data root) "
                         "and print the job's id.")
    s.add_argument("config", metavar="CONFIG", help="YAML config file")
    s.add_argument("--kind", choices=["run", "dedup", "train"], default="run",
                   help="run: the whole pipeline (default); dedup: a batch dedup job; train: train on --shards")
    s.add_argument("--out", help="run directory on the service's side, inside a data root (default DATA_ROOT/jobs/ID)")
    s.add_argument("--shards", help="train jobs: the shards/ folder (with manifest.json) on the service's side")
    s.add_argument("--resume", action="store_true", help="reuse the finished stages already in --out")
    s.add_argument("--format", choices=["parquet", "jsonl"], help="dedup jobs: the format of OUT/kept/ (default parquet)")
    s.add_argument("--follow", action="store_true", help="then follow it as `jobs follow` does")
    s.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)
    s.add_argument("-q", "--quiet", action="store_true", help="print only the job id")
    ls = j_sub.add_parser("list", parents=[common], help="the jobs, newest first: state, progress, ETA, elapsed time")
    ls.add_argument("--state", choices=["queued", "running", "succeeded", "failed", "cancelled"])
    ls.add_argument("--limit", type=int, default=100, help="at most this many (1-1000, default 100)")
    ls.add_argument("--json", action="store_true", help="print the API's status documents")
    st = j_sub.add_parser("status", parents=[common], help="one job: state, progress and ETA, stages, ledger, error")
    st.add_argument("id", metavar="ID")
    st.add_argument("--json", action="store_true", help="print the API's status document")
    f = j_sub.add_parser("follow", parents=[common], help="print the job's progress lines (with ETA) as it runs, until it ends; "
                         "exit code 0 succeeded, the job's exit code failed, 130 cancelled")
    f.add_argument("id", metavar="ID")
    f.add_argument("--interval", type=float, default=1.0, help="seconds between polls (default 1)")
    lg = j_sub.add_parser("log", parents=[common], help="the last lines the job printed")
    lg.add_argument("id", metavar="ID")
    lg.add_argument("--tail", type=int, default=200, help="lines (1-100000, default 200)")
    c = j_sub.add_parser("cancel", parents=[common], help="cancel a queued job at once, or stop a running one")
    c.add_argument("id", metavar="ID")
    r = j_sub.add_parser("report", parents=[common], help="fetch the job's report.html (to stdout, --out FILE, or --open it)")
    r.add_argument("id", metavar="ID")
    r.add_argument("--out", metavar="FILE", help="write it here")
    r.add_argument("--open", action="store_true", help="open it in the web browser ($BROWSER)")


def cmd_jobs(args: argparse.Namespace) -> int:
    """Run a `jobs` action; a problem with the server, the token or the request is one line, exit 2."""
    try:
        if args.timeout <= 0:
            raise JobsError(f"--timeout {args.timeout}: must be above 0")
        if getattr(args, "interval", 1.0) <= 0:
            raise JobsError(f"--interval {args.interval}: must be above 0")
        if args.jobs_command == "list" and not 1 <= args.limit <= 1000:
            raise JobsError(f"--limit {args.limit}: must be 1 to 1000")
        if args.jobs_command == "log" and not 1 <= args.tail <= 100000:
            raise JobsError(f"--tail {args.tail}: must be 1 to 100000")
        server = args.server or os.environ.get(SERVER_ENV, "").strip() or DEFAULT_SERVER
        client = Client(server, load_token(args.token_file), timeout=args.timeout)
        if args.jobs_command == "follow":
            return _follow(client, args.id, args.interval)
        return COMMANDS[args.jobs_command](client, args)
    except JobsError as e:
        print(f"corpusmill: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `corpusmill jobs list | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m corpusmill.pipeline.jobs_cli list ...`: the command without cli.py (tests, scripts)."""
    p = argparse.ArgumentParser(prog="corpusmill")
    add_jobs(p.add_subparsers(dest="command", required=True))
    return cmd_jobs(p.parse_args(["jobs", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    raise SystemExit(main())
