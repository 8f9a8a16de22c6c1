#!/usr/bin/env python3
"""Load on a running `tessera serve`: time to first token and aggregate decode rate.

CLIENTS threads each send streamed /v1/completions requests (greedy, MAX_TOKENS tokens, a prompt
of about PROMPT words) until REQUESTS have been sent in all; every request's time to its first
streamed chunk and its token count are recorded. Prints RESULT lines (median and 90th percentile
time to first token, aggregate generated tokens/s over the run, requests that failed) and the
server's own time-to-first-token summary from /metrics. Standard library only, so that it runs
on the GPU machine as it is.

    python3 scripts/serve_load.py --url http://127.0.0.1:8080 --clients 16 --requests 48
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse


def one_request(url, body):
    """Sends one streamed completion; returns (seconds to first chunk, chunks, seconds)."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"status {resp.status}: {resp.read()[:200]!r}")
    first, chunks = None, 0
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        ev = json.loads(data)
        if ev.get("choices"):
            chunks += 1
            if first is None:
                first = time.perf_counter() - t0
    conn.close()
    return first, chunks, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=100, help="prompt length in words")
    ap.add_argument("--tag", default="")
    a = ap.parse_args()

    u = urllib.parse.urlparse(a.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("GET", "/v1/models")
    model = json.loads(conn.getresponse().read())["data"][0]["id"]
    conn.close()
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge".split()
    lock = threading.Lock()
    next_id = [0]
    ttfts, chunks_all, failures = [], [], []

    def client():
        while True:
            with lock:
                if next_id[0] >= a.requests:
                    return
                i = next_id[0]
                next_id[0] += 1
            prompt = " ".join(words[(i + k) % len(words)] for k in range(a.prompt))
            body = {"model": model, "prompt": prompt, "max_tokens": a.max_tokens,
                    "temperature": 0, "stream": True}
            try:
                first, chunks, _ = one_request(a.url, body)
                with lock:
                    if first is not None:
                        ttfts.append(first)
                    chunks_all.append(chunks)
            except Exception as e:  # a failed request is counted and reported, not fatal
                with lock:
                    failures.append(str(e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0

    tag = f"serve {a.tag} clients={a.clients}".strip()
    if ttfts:
        q = sorted(ttfts)
        p90 = q[min(len(q) - 1, int(0.9 * len(q)))]
        print(f"RESULT {tag} ttft median {statistics.median(q) * 1e3:.1f} ms p90 {p90 * 1e3:.1f} ms")
    print(f"RESULT {tag} {len(chunks_all)} requests, {sum(chunks_all)} tokens in {wall:.2f} s: "
          f"{sum(chunks_all) / wall:.1f} tokens/s aggregate; {len(failures)} failed")
    for f in failures[:3]:
        print(f"RESULT {tag} failure: {f}")
    try:
        u = urllib.parse.urlparse(a.url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        conn.request("GET", "/metrics")
        for line in conn.getresponse().read().decode().splitlines():
            if line.startswith("tessera_time_to_first_token") or line.startswith("tessera_step"):
                print(f"RESULT {tag} metrics {line}")
    except OSError as e:
        print(f"RESULT {tag} metrics unavailable: {e}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
