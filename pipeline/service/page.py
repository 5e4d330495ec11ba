"""The jobs page of `corpusmill serve`: every job's state, progress, ETA and elapsed time, and a page per
job with its stages, ledger summary, log tail, config and report, refreshed while it runs.

Everything is served by the service itself (HTML, one stylesheet, one script, no font, no CDN), and
the Content-Security-Policy forbids loading anything from elsewhere or running inline script. The
script builds every element with `textContent` from the JSON API (`/v1/jobs...`), never with
innerHTML, so a job value holding HTML (a folder named `<img onerror=...>`, a document id with a
script tag) shows as that text. The pages authenticate with a session cookie set by a login form
(see session.py); the API still takes the bearer header. Labels in English and Chinese: `?lang=zh`
or `?lang=en` (remembered in a cookie), else the browser's Accept-Language.
"""
from __future__ import annotations

import hmac
import html
import json
import re
from typing import Any, Optional
from urllib.parse import parse_qs, quote

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from .session import COOKIE, MAX_AGE_S, Sessions

LANG_COOKIE = "corpusmill_lang"
LANGS = ("en", "zh")
_JOB_ID = re.compile(r"[0-9a-f]{16}")
_NEXT = re.compile(r"/jobs(/[0-9a-f]{16})?")
POLL_MS = 2000  # a running job's page asks for its status this often

PAGE_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
            "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
PAGE_HEADERS = {"Content-Security-Policy": PAGE_CSP, "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY", "Cache-Control": "no-store"}

LABELS: dict[str, dict[str, str]] = {
    "en": {
        "title": "corpusmill jobs", "jobs": "Jobs", "job": "Job", "all_jobs": "All jobs", "login": "Log in", "logout": "Log out",
        "token": "Service token", "wrong_token": "That is not the service's token.",
        "login_hint": "The token corpusmill serve was started with ($CORPUSMILL_TOKEN, --token-file, or STATE/token "
                      "on a loopback address). It is kept in no script: the page gets an HttpOnly session cookie.",
        "id": "ID", "kind": "Kind", "state": "State", "stage": "Stage", "progress": "Progress", "eta": "ETA",
        "elapsed": "Elapsed", "created": "Submitted", "started": "Started", "finished": "Finished", "out": "Run directory",
        "published": "Published to",
        "attempts": "Attempts", "restarts": "Restarts", "exit_code": "Exit code", "error": "Error",
        "stages": "Stages", "seconds": "Seconds", "docs_in": "Docs in", "docs_out": "Docs out", "removed": "Removed",
        "ledger": "Ledger", "ledger_partial": "Ledger so far (finished stages)", "input": "Input", "kept": "Kept",
        "filtered": "Filtered", "duplicates": "Duplicates", "quarantined": "Quarantined", "tokens": "Tokens",
        "balanced": "Counts add up", "not_balanced": "Counts do not add up", "log": "Log (last lines)",
        "config": "Config", "report": "Report", "open_report": "Open report.html", "no_report": "No report yet",
        "no_report_train": "Train jobs write no HTML report", "cancel": "Cancel job", "cancel_sent": "Cancel requested",
        "no_jobs": "No jobs yet. Submit one with: corpusmill jobs submit CONFIG", "training": "Training",
        "step": "Step", "loss": "Loss", "tokens_per_s": "Tokens/s", "dashboard": "Dask dashboard",
        "refresh_note": "Refreshed every 2 s while it runs.", "offline": "Cannot reach the service; retrying.",
        "no_job": "No such job.", "tasks": "tasks", "yes": "yes", "no": "no", "language": "Language",
        "queued": "queued", "running": "running", "succeeded": "succeeded", "failed": "failed", "cancelled": "cancelled",
        "pending": "pending", "done": "done", "skipped": "skipped", "interrupted": "interrupted",
        "eta_first": "after the first task", "stage_of": "stage {done}/{total} done",
    },
    "zh": {
        "title": "corpusmill 任务", "jobs": "任务", "job": "任务", "all_jobs": "全部任务", "login": "登录", "logout": "退出登录",
        "token": "服务令牌", "wrong_token": "这不是本服务的令牌。",
        "login_hint": "启动 corpusmill serve 时使用的令牌（$CORPUSMILL_TOKEN、--token-file，或回环地址上的 STATE/token）。"
                      "令牌不保存在任何脚本中：页面只获得一个 HttpOnly 会话 Cookie。",
        "id": "编号", "kind": "类型", "state": "状态", "stage": "阶段", "progress": "进度", "eta": "预计剩余",
        "elapsed": "已用时间", "created": "提交时间", "started": "开始时间", "finished": "结束时间", "out": "运行目录",
        "published": "发布到",
        "attempts": "尝试次数", "restarts": "重启次数", "exit_code": "退出码", "error": "错误",
        "stages": "各阶段", "seconds": "秒", "docs_in": "输入文档", "docs_out": "输出文档", "removed": "移除",
        "ledger": "文档账目", "ledger_partial": "目前的账目（已完成的阶段）", "input": "输入", "kept": "保留",
        "filtered": "过滤", "duplicates": "重复", "quarantined": "隔离", "tokens": "词元",
        "balanced": "数目相符", "not_balanced": "数目不符", "log": "日志（最后几行）",
        "config": "配置", "report": "报告", "open_report": "打开 report.html", "no_report": "尚无报告",
        "no_report_train": "训练任务不生成 HTML 报告", "cancel": "取消任务", "cancel_sent": "已请求取消",
        "no_jobs": "还没有任务。提交任务：corpusmill jobs submit CONFIG", "training": "训练",
        "step": "步数", "loss": "损失", "tokens_per_s": "词元/秒", "dashboard": "Dask 仪表板",
        "refresh_note": "运行期间每 2 秒刷新一次。", "offline": "无法连接服务，正在重试。",
        "no_job": "没有这个任务。", "tasks": "个任务", "yes": "是", "no": "否", "language": "语言",
        "queued": "排队中", "running": "运行中", "succeeded": "成功", "failed": "失败", "cancelled": "已取消",
        "pending": "等待中", "done": "完成", "skipped": "跳过", "interrupted": "已中断",
        "eta_first": "完成第一个任务后给出", "stage_of": "已完成 {done}/{total} 个阶段",
    },
}
assert LABELS["en"].keys() == LABELS["zh"].keys()

CSS = """
:root { color-scheme: light; --fg: #1d232a; --muted: #5b6570; --line: #d8dde3; --bg: #f6f7f9; --accent: #1f5fa8; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", "Noto Sans CJK SC", "Noto Sans SC",
       "WenQuanYi Micro Hei", "PingFang SC", "Microsoft YaHei", sans-serif; color: var(--fg); background: var(--bg); }
header { display: flex; align-items: center; gap: 1rem; padding: .6rem 1.2rem; background: #fff;
         border-bottom: 1px solid var(--line); }
header .brand { font-weight: 700; color: var(--fg); text-decoration: none; margin-right: auto; }
header nav { display: flex; gap: .8rem; align-items: center; }
header form { margin: 0; }
main { padding: 1rem 1.2rem 3rem; max-width: 1200px; }
h1 { font-size: 1.3rem; margin: .4rem 0 1rem; }
h2 { font-size: 1.05rem; margin: 1.6rem 0 .5rem; }
a { color: var(--accent); }
table { border-collapse: collapse; background: #fff; width: 100%; }
th, td { text-align: left; padding: .35rem .6rem; border-bottom: 1px solid var(--line); vertical-align: top; }
th { font-weight: 600; color: var(--muted); background: #fbfcfd; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.state { display: inline-block; padding: 0 .5rem; border-radius: .7rem; font-size: .85rem; background: #e6e9ed; }
.state-running { background: #dbeafe; color: #1e40af; } .state-queued { background: #f1f5f9; color: #475569; }
.state-succeeded, .state-done { background: #dcfce7; color: #166534; }
.state-failed { background: #fee2e2; color: #991b1b; } .state-cancelled, .state-interrupted { background: #fef3c7; color: #92400e; }
progress { width: 9rem; vertical-align: middle; margin-right: .4rem; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: .25rem 1rem; background: #fff; padding: .8rem 1rem;
           border: 1px solid var(--line); margin: 0; }
dl.facts dt { color: var(--muted); } dl.facts dd { margin: 0; overflow-wrap: anywhere; }
pre { background: #0f1720; color: #e5e7eb; padding: .8rem 1rem; overflow: auto; max-height: 28rem; font-size: .82rem;
      white-space: pre-wrap; overflow-wrap: anywhere; }
pre.config { background: #fff; color: var(--fg); border: 1px solid var(--line); }
.muted { color: var(--muted); } .error { color: #991b1b; } .banner { background: #fef3c7; padding: .4rem .8rem; }
button { font: inherit; padding: .3rem .9rem; cursor: pointer; }
.login { max-width: 28rem; background: #fff; border: 1px solid var(--line); padding: 1.2rem 1.4rem; }
.login input[type=password] { width: 100%; font: inherit; padding: .4rem; margin: .3rem 0 .8rem; }
.hidden { display: none; }
"""

JS_BODY = r"""
"use strict";
(function () {
  const lang = document.documentElement.lang.startsWith("zh") ? "zh" : "en";
  const L = LABELS[lang];
  const STATES = ["queued", "running", "succeeded", "failed", "cancelled", "pending", "done", "skipped", "interrupted"];
  const ACTIVE = ["queued", "running"];
  const csrf = (document.querySelector('meta[name="csrf-token"]') || {}).content || "";
  const main = document.getElementById("main");

  // every element is built here; data only ever reaches the page as text nodes (never innerHTML)
  function el(tag, cls, ...children) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
    }
    return e;
  }
  function link(href, text) { const a = el("a", null, text); a.href = href; return a; }
  function stateBadge(state) {
    const known = STATES.includes(state);
    return el("span", "state" + (known ? " state-" + state : ""), known ? L[state] : state);
  }
  function duration(s) {
    if (s === null || s === undefined) return "–";
    s = Math.max(0, Math.round(s));
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
    if (h) return h + "h" + String(m).padStart(2, "0") + "m";
    if (m) return m + "m" + String(sec).padStart(2, "0") + "s";
    return sec + "s";
  }
  function when(utc) { return utc ? utc.replace("T", " ").replace("Z", " UTC") : "–"; }
  function num(v) { return (v === null || v === undefined) ? "–" : Number(v).toLocaleString(lang === "zh" ? "zh-CN" : "en"); }
  function progressCell(job) {
    const p = job.progress;
    if (!p) return el("span", "muted", job.state === "succeeded" ? "100%" : "–");
    const cell = el("span");
    if (p.tasks_total) {
      const bar = el("progress");
      bar.max = p.tasks_total; bar.value = p.tasks_done;
      cell.appendChild(bar);
      cell.appendChild(document.createTextNode(p.tasks_done + "/" + p.tasks_total + " " + L.tasks +
        (p.percent !== null ? " (" + p.percent + "%)" : "")));
    }
    const where = [p.stage, p.label && p.label !== p.stage ? p.label : null].filter(Boolean).join(": ");
    cell.appendChild(el("div", "muted", where, " · ", L.stage_of.replace("{done}", p.stages_done).replace("{total}", p.stages_total)));
    return cell;
  }
  function etaText(job) {
    const p = job.progress;
    if (!p || !p.tasks_total) return "–";
    if (p.eta_s === null || p.eta_s === undefined) return p.tasks_done ? "…" : L.eta_first;
    return duration(p.eta_s);
  }
  async function api(path, options) {
    const r = await fetch(path, Object.assign({credentials: "same-origin", cache: "no-store"}, options || {}));
    if (r.status === 401) {
      location.href = "/login?next=" + encodeURIComponent(location.pathname);
      throw new Error("logged out");
    }
    return r;
  }
  let banner = null;
  function offline(on) {
    if (on && !banner) { banner = el("div", "banner", L.offline); main.prepend(banner); }
    if (!on && banner) { banner.remove(); banner = null; }
  }
  function table(headers, rows, numeric) {
    const t = el("table");
    const head = el("tr");
    headers.forEach((h, i) => head.appendChild(el("th", numeric && numeric.includes(i) ? "num" : null, h)));
    t.appendChild(el("thead", null, head));
    const body = el("tbody");
    for (const r of rows) body.appendChild(r);
    t.appendChild(body);
    return t;
  }
  function row(...cells) {
    const tr = el("tr");
    for (const c of cells) tr.appendChild(c instanceof HTMLElement && c.tagName === "TD" ? c : el("td", null, c));
    return tr;
  }
  function numCell(v) { return el("td", "num", num(v)); }

  // ---- the list of jobs ------------------------------------------------------------------
  async function listPage() {
    let active = false;
    try {
      const r = await api("/v1/jobs?limit=1000&newest_first=true");
      const jobs = (await r.json()).jobs;
      offline(false);
      active = jobs.some(j => ACTIVE.includes(j.state));
      const rows = jobs.map(j => row(el("td", null, link("/jobs/" + encodeURIComponent(j.id), j.id)), j.kind,
        el("td", null, stateBadge(j.state)), el("td", null, progressCell(j)), etaText(j), duration(j.elapsed_s),
        when(j.created_utc), el("td", "muted", j.out)));
      const content = el("div", null, el("h1", null, L.jobs),
        jobs.length ? table([L.id, L.kind, L.state, L.progress, L.eta, L.elapsed, L.created, L.out], rows)
                    : el("p", "muted", L.no_jobs));
      content.id = "jobs";
      const old = document.getElementById("jobs");
      if (old) old.replaceWith(content); else main.appendChild(content);
    } catch (e) {
      if (e.message === "logged out") return;
      offline(true);
    }
    setTimeout(listPage, active ? POLL_MS : 5 * POLL_MS);
  }

  // ---- one job ---------------------------------------------------------------------------
  function facts(job) {
    const dl = el("dl", "facts");
    const add = (k, v) => { dl.appendChild(el("dt", null, k)); dl.appendChild(el("dd", null, v)); };
    add(L.state, stateBadge(job.state));
    add(L.kind, job.kind);
    add(L.progress, progressCell(job));
    add(L.eta, etaText(job));
    add(L.elapsed, duration(job.elapsed_s));
    add(L.created, when(job.created_utc));
    add(L.started, when(job.started_utc));
    add(L.finished, when(job.finished_utc));
    add(L.attempts, String(job.attempts) + (job.restarts ? " (" + L.restarts + " " + job.restarts + ")" : ""));
    if (job.exit_code !== null) add(L.exit_code, String(job.exit_code));
    if (job.work) add(L.published, job.out);  // a URL out: the run directory is the local work folder
    add(L.out, job.work || job.out);
    if (job.dashboard && /^https?:\/\//.test(job.dashboard)) add(L.dashboard, link(job.dashboard, job.dashboard));
    return dl;
  }
  function stagesTable(job) {
    const rows = job.stages.map(s => {
      const c = s.counts || {};
      const removed = c.removed && typeof c.removed === "object"
        ? Object.entries(c.removed).map(([k, v]) => k + " " + v).join(", ") : (c.removed === undefined ? "" : String(c.removed));
      return row(s.name, el("td", null, stateBadge(s.state)), el("td", "num", s.seconds === null || s.seconds === undefined ? "–" : s.seconds.toFixed(1)),
        numCell(c.docs_in), numCell(c.docs_out), removed, numCell(c.tokens));
    });
    return table([L.stage, L.state, L.seconds, L.docs_in, L.docs_out, L.removed, L.tokens], rows, [2, 3, 4, 6]);
  }
  function ledgerBlock(ledger) {
    if (!ledger) return el("p", "muted", "–");
    if (ledger.partial) {
      const rows = Object.entries(ledger.stages || {}).map(([name, s]) => row(name, numCell(s.in), numCell(s.out),
        Object.entries(s.removed || {}).map(([k, v]) => k + " " + v).join(", ")));
      return el("div", null, el("p", "muted", L.ledger_partial), table([L.stage, L.docs_in, L.docs_out, L.removed], rows));
    }
    const keys = ["input", "kept", "filtered", "duplicates", "quarantined", "tokens"].filter(k => k in ledger);
    const t = table(keys.map(k => L[k]), [row(...keys.map(k => numCell(ledger[k])))], keys.map((_, i) => i));
    const ok = ledger.balanced;
    return el("div", null, t, el("p", ok ? "muted" : "error", ok ? "✓ " + L.balanced : "✗ " + L.not_balanced));
  }
  function trainBlock(train) {
    if (!train) return null;
    const t = table([L.step, L.loss, L.tokens_per_s], [row(
      num(train.done ? train.steps : train.step) + (train.planned_steps ? " / " + num(train.planned_steps) : ""),
      train.done ? (num(train.first_loss) + " → " + num(train.last_loss)) : num(train.loss), num(train.tokens_per_s))]);
    return el("section", null, el("h2", null, L.training), t);
  }
  function reportBlock(job) {
    if (job.kind === "train") return el("p", "muted", L.no_report_train);
    if (job.state !== "succeeded") return el("p", "muted", L.no_report);
    const a = link("/v1/jobs/" + encodeURIComponent(job.id) + "/report", L.open_report);
    a.target = "_blank"; a.rel = "noopener noreferrer";
    return el("p", null, a);
  }
  async function cancel(job, button) {
    button.disabled = true;
    const r = await api("/v1/jobs/" + encodeURIComponent(job.id) + "/cancel", {method: "POST", headers: {"X-CSRF-Token": csrf}});
    button.textContent = r.ok ? L.cancel_sent : ((await r.json()).detail || String(r.status));
  }
  let config = null;
  async function jobPage(id) {
    let active = true;
    try {
      const r = await api("/v1/jobs/" + encodeURIComponent(id));
      if (r.status === 404) { main.replaceChildren(el("h1", null, L.no_job)); return; }
      const job = await r.json();
      active = ACTIVE.includes(job.state);
      const log = await (await api("/v1/jobs/" + encodeURIComponent(id) + "/log?tail=40")).text();
      if (config === null) {
        const c = await api("/v1/jobs/" + encodeURIComponent(id) + "/request");
        config = c.ok ? JSON.stringify(await c.json(), null, 2) : "";
      }
      offline(false);
      const content = el("div", null, el("p", null, link("/jobs", "← " + L.all_jobs)),
        el("h1", null, L.job + " ", el("code", null, job.id), " ", stateBadge(job.state)), facts(job));
      content.id = "job";
      if (active) {
        content.appendChild(el("p", "muted", L.refresh_note));
        const b = el("button", null, L.cancel);
        b.id = "cancel";
        b.addEventListener("click", () => cancel(job, b));
        content.appendChild(el("p", null, b));
      }
      if (job.error) content.appendChild(el("section", null, el("h2", null, L.error), el("pre", "error-text", job.error)));
      content.appendChild(el("section", null, el("h2", null, L.stages), stagesTable(job)));
      if (job.kind !== "train") content.appendChild(el("section", null, el("h2", null, L.ledger), ledgerBlock(job.ledger)));
      const train = trainBlock(job.train);
      if (train) content.appendChild(train);
      content.appendChild(el("section", null, el("h2", null, L.report), reportBlock(job)));
      const logPre = el("pre", "log", log);
      logPre.id = "log";
      content.appendChild(el("section", null, el("h2", null, L.log), logPre));
      const cfg = el("pre", "config", config);
      cfg.id = "config";
      content.appendChild(el("section", null, el("h2", null, L.config), cfg));
      const old = document.getElementById("job");
      if (old) old.replaceWith(content); else main.appendChild(content);
      document.body.dataset.state = job.state;  // for scripts and tests: the state shown
      logPre.scrollTop = logPre.scrollHeight;
    } catch (e) {
      if (e.message === "logged out") return;
      offline(true);
    }
    if (active) setTimeout(() => jobPage(id), POLL_MS);
  }

  const page = document.body.dataset.page;
  if (page === "jobs") listPage();
  else if (page === "job") jobPage(document.body.dataset.job);
})();
"""

JS = f"const LABELS = {json.dumps(LABELS, ensure_ascii=True)};\nconst POLL_MS = {POLL_MS};\n{JS_BODY}"


def page_language(request: Request, asked: Optional[str]) -> str:
    """`?lang=`, else the language cookie, else the first of en/zh in Accept-Language, else English."""
    if asked in LANGS:
        return asked
    remembered = request.cookies.get(LANG_COOKIE)
    if remembered in LANGS:
        return remembered
    ranked = []
    for i, part in enumerate(request.headers.get("accept-language", "").split(",")[:20]):
        tag, _, q = part.strip().partition(";q=")
        try:
            weight = float(q) if q else 1.0
        except ValueError:
            continue
        ranked.append((-weight, i, tag.strip().lower()))
    for _, _, tag in sorted(ranked):
        for lang in LANGS:
            if tag == lang or tag.startswith(lang + "-"):
                return lang
    return "en"


def _shell(lang: str, title: str, body: str, *, csrf: str = "", page: str = "", job: str = "",
           logged_in: bool = False) -> str:
    """The HTML around a page: our stylesheet and script only; every server-side value escaped."""
    L = LABELS[lang]
    esc = html.escape
    other = "zh" if lang == "en" else "en"
    nav = f'<a href="?lang={other}" hreflang="{other}">{"中文" if other == "zh" else "English"}</a>'
    if logged_in:
        nav += (f'<form method="post" action="/logout"><input type="hidden" name="csrf" value="{esc(csrf)}">'
                f'<button type="submit">{esc(L["logout"])}</button></form>')
    data = f' data-page="{esc(page)}"' + (f' data-job="{esc(job)}"' if job else "")
    return (f'<!doctype html>\n<html lang="{"zh-CN" if lang == "zh" else "en"}"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<meta name="csrf-token" content="{esc(csrf)}"><title>{esc(title)}</title>'
            f'<link rel="stylesheet" href="/static/page.css">'
            + ('<script src="/static/page.js" defer></script>' if page else "")
            + f'</head><body{data}><header><a class="brand" href="/jobs">corpusmill</a><nav>{nav}</nav></header>'
            f'<main id="main">{body}</main></body></html>')


def _html(text: str, status: int = 200, lang: Optional[str] = None, set_lang: bool = False) -> HTMLResponse:
    response = HTMLResponse(text, status_code=status, headers=PAGE_HEADERS)
    if set_lang and lang:
        response.set_cookie(LANG_COOKIE, lang, max_age=365 * 86400, samesite="strict", path="/")
    return response


def _login_form(lang: str, next_path: str, wrong: bool = False) -> str:
    L = LABELS[lang]
    esc = html.escape
    error = f'<p class="error" id="login-error">{esc(L["wrong_token"])}</p>' if wrong else ""
    body = (f'<h1>{esc(L["title"])}</h1><form class="login" method="post" action="/login">{error}'
            f'<label for="token">{esc(L["token"])}</label>'
            f'<input type="password" id="token" name="token" autocomplete="off" required autofocus>'
            f'<input type="hidden" name="next" value="{esc(next_path)}">'
            f'<input type="hidden" name="lang" value="{esc(lang)}">'
            f'<button type="submit" id="login">{esc(L["login"])}</button>'
            f'<p class="muted">{esc(L["login_hint"])}</p></form>')
    return _shell(lang, f'{L["login"]} · {L["title"]}', body)


def _safe_next(value: Optional[str]) -> str:
    """Where to go after logging in: one of the service's own pages, never another site."""
    return value if value and _NEXT.fullmatch(value) else "/jobs"


def _static(text: str, media_type: str) -> Response:
    return Response(text, media_type=media_type, headers={**PAGE_HEADERS, "Cache-Control": "no-cache"})


def add_page_routes(app: FastAPI, ctx: Any, sessions: Sessions) -> None:
    """/ and /jobs (the list), /jobs/{id}, /login, /logout and the page's two static files."""
    token = ctx.token.encode()

    def session(request: Request) -> Optional[str]:
        cookie = request.cookies.get(COOKIE)
        return cookie if sessions.valid(cookie) else None

    def to_login(request: Request) -> RedirectResponse:
        return RedirectResponse("/login?next=" + quote(_safe_next(request.url.path)), status_code=303,
                                headers=PAGE_HEADERS)

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/jobs", status_code=303)

    @app.get("/static/page.css", include_in_schema=False)
    def page_css() -> Response:
        return _static(CSS, "text/css; charset=utf-8")

    @app.get("/static/page.js", include_in_schema=False)
    def page_js() -> Response:
        return _static(JS, "text/javascript; charset=utf-8")

    @app.get("/login", include_in_schema=False)
    def login_form(request: Request, next: Optional[str] = None, lang: Optional[str] = None) -> HTMLResponse:
        language = page_language(request, lang)
        return _html(_login_form(language, _safe_next(next)), lang=language, set_lang=lang in LANGS)

    @app.post("/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        form = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=10)
        first = {k: v[0] for k, v in form.items() if v}
        language = page_language(request, first.get("lang"))
        given = first.get("token", "").strip().encode()
        if not hmac.compare_digest(given, token):
            return _html(_login_form(language, _safe_next(first.get("next")), wrong=True), status=401)
        response = RedirectResponse(_safe_next(first.get("next")), status_code=303, headers=PAGE_HEADERS)
        response.set_cookie(COOKIE, sessions.issue(), max_age=MAX_AGE_S, httponly=True, samesite="strict",
                            secure=request.url.scheme == "https", path="/")
        return response

    @app.post("/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        form = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=10)
        cookie = session(request)
        if cookie and not sessions.csrf_ok(cookie, (form.get("csrf") or [""])[0]):
            return _html("<p>403: the logout form's CSRF token is missing or wrong</p>", status=403)
        response = RedirectResponse("/login", status_code=303, headers=PAGE_HEADERS)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response

    @app.get("/jobs", include_in_schema=False)
    def jobs_page(request: Request, lang: Optional[str] = None) -> Response:
        cookie = session(request)
        if not cookie:
            return to_login(request)
        language = page_language(request, lang)
        L = LABELS[language]
        return _html(_shell(language, L["title"], f'<noscript>{html.escape(L["jobs"])}: JavaScript</noscript>',
                            csrf=sessions.csrf(cookie), page="jobs", logged_in=True),
                     lang=language, set_lang=lang in LANGS)

    @app.get("/jobs/{job_id}", include_in_schema=False)
    def job_page(request: Request, job_id: str, lang: Optional[str] = None) -> Response:
        cookie = session(request)
        if not cookie:
            return to_login(request)
        language = page_language(request, lang)
        L = LABELS[language]
        if not _JOB_ID.fullmatch(job_id) or ctx.store.get(job_id) is None:
            return _html(_shell(language, L["title"], f'<h1>{html.escape(L["no_job"])}</h1>', logged_in=True,
                                csrf=sessions.csrf(cookie)), status=404)
        return _html(_shell(language, f'{job_id} · {L["title"]}', "", csrf=sessions.csrf(cookie), page="job",
                            job=job_id, logged_in=True), lang=language, set_lang=lang in LANGS)
