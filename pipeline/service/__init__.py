"""`corpusmill serve`: an authenticated job API over a Dask cluster.

app.py (HTTP), guard.py (data roots), store.py (SQLite job table), supervisor.py (job processes),
status.py (job status, ETA and metrics from run directories), jobproc.py (the job process), serve.py
(start-up: token, cluster, server), page.py (the jobs page: HTML, CSS and script, served locally),
session.py (the page's login cookie and CSRF token).
"""
