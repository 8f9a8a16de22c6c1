"""`tessera serve` against a client nobody here wrote: the `openai` Python package.

Usage: python openai_client.py PATH/TO/tessera [DEVICE (default cpu)]

Starts the server (on the CPU unless a device is named) with the test model on a free loopback port and checks: chat and
completions streamed and not (the streamed text equals the other), log-probabilities, stop
strings, embeddings, /v1/models, the API key, prompts taken from cached prefixes, 8 clients at once whose greedy answers equal the
same requests sent one at a time (to the first near-tie: a step whose top-2 log-probabilities
are within 0.5 in the sequential run), then faults: malformed JSON, wrong types, negative and
huge max_tokens, an unknown model and route, a prompt past the context, a 100 MB body, a client
that disconnects mid-stream, 200 requests at 16 at a time (every one answered and counted), the
server's memory after the load, /health still answering, and a graceful shutdown on SIGTERM
with a stream running. Exits non-zero on the first failure.
"""

import concurrent.futures as cf
import http.client
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import openai

KEY = "test-key"
CTX = 256


def start(binary, parallel=4, queue=64):
    device = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    args = [binary, "serve", "--device", device, "--port", "0", "--parallel", str(parallel),
            "--ctx", str(CTX), "--queue", str(queue), "--api-key", KEY,
            "--body-limit", str(1 << 20)]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    lines = []
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"listening on http://([\d.]+):(\d+)", line)
        if m:
            # Keep draining stderr so the server never blocks on a full pipe.
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, int(m.group(2))
    proc.kill()
    raise SystemExit("the server did not start:\n" + "".join(lines))


def raw(port, method, path, body=None, headers=None, key=KEY):
    """One request on its own connection: (status, headers, parsed JSON or text)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = "Bearer " + key
    h.update(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    try:
        data = json.loads(data)
    except ValueError:
        pass
    return r.status, dict(r.getheaders()), data


def check(cond, what):
    if not cond:
        raise SystemExit("FAIL: " + what)
    print("ok:", what)


def expect_error(port, body, status, path="/v1/chat/completions", what=""):
    s, _, data = raw(port, "POST", path, body)
    check(s == status and isinstance(data, dict) and "message" in data.get("error", {}),
          f"{what}: {status} with an error object (got {s} {str(data)[:200]})")
    return data


def metric(port, name, labels=""):
    _, _, text = raw(port, "GET", "/metrics")
    m = re.search(r"^tessera_%s%s (\S+)$" % (re.escape(name), re.escape(labels)), text, re.M)
    return float(m.group(1)) if m else None


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def tokens_and_gaps(choice):
    """Token strings and each step's top-2 gap from a chat choice's logprobs."""
    out = []
    for t in choice.logprobs.content:
        tops = sorted((x.logprob for x in t.top_logprobs), reverse=True)
        out.append((t.token, tops[0] - tops[1] if len(tops) > 1 else math.inf))
    return out


def same_to_near_tie(seq, conc):
    """The concurrent tokens equal the sequential ones up to the first near-tie of the latter."""
    for i, (tok, gap) in enumerate(seq):
        if gap < 0.5:
            return True
        if i >= len(conc) or conc[i][0] != tok:
            return False
    return len(conc) == len(seq)


def main():
    binary = sys.argv[1]
    proc, port = start(binary)
    try:
        run(proc, port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    proc, port = start(binary, parallel=1, queue=1)
    try:
        overflow(port)
    finally:
        proc.kill()
        proc.wait()


def overflow(port):
    """One slot and a queue of one: of 6 requests at once, those past them get 503 with
    Retry-After, the others their answer."""
    body = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}
    with cf.ThreadPoolExecutor(6) as ex:
        got = list(ex.map(lambda _: raw(port, "POST", "/v1/completions", body), range(6)))
    ok = [g for g in got if g[0] == 200 and g[2]["choices"][0]["text"]]
    busy = [g for g in got if g[0] == 503 and g[1].get("retry-after", g[1].get("Retry-After"))
            and g[2]["error"]["code"] == "server_busy"]
    check(len(ok) + len(busy) == 6 and ok and busy,
          f"past the slots and the queue: 503 with Retry-After ({len(ok)} answered, "
          f"{len(busy)} busy)")


def run(proc, port):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0,
                           timeout=300)
    models = client.models.list().data
    check(len(models) == 1 and models[0].object == "model", "/v1/models lists the model")
    mid = models[0].id

    def chat(content, **kw):
        return client.chat.completions.create(
            model=mid, messages=[{"role": "user", "content": content}], **kw)

    # Chat, streamed and not.
    full = chat("What is the capital of France?", temperature=0, max_tokens=16)
    text = full.choices[0].message.content
    check(full.usage.completion_tokens > 0 and text, "chat answers")
    parts, reason = [], None
    for ch in chat("What is the capital of France?", temperature=0, max_tokens=16, stream=True):
        if ch.choices:
            parts.append(ch.choices[0].delta.content or "")
            reason = ch.choices[0].finish_reason or reason
    check("".join(parts) == text and reason == full.choices[0].finish_reason,
          f"streamed chat text equals the non-streamed one ({text!r})")
    # The second request's prompt was the first's: it came from the cached prefix.
    check(metric(port, "prefix_tokens_total") >= full.usage.prompt_tokens - 1,
          "a repeated prompt is taken from the cached prefix")

    # Completions, streamed and not, with a stop string taken from the plain output.
    comp = client.completions.create(model=mid, prompt="The three primary colors are",
                                     temperature=0, max_tokens=16)
    ctext = comp.choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=mid, prompt="The three primary colors are", temperature=0, max_tokens=16,
        stream=True) if c.choices)
    check(streamed == ctext, f"streamed completion equals the non-streamed one ({ctext!r})")
    words = ctext.split()
    if len(words) >= 3:
        stop = words[2]
        cut = client.completions.create(model=mid, prompt="The three primary colors are",
                                        temperature=0, max_tokens=16, stop=[stop])
        check(cut.choices[0].text == ctext[:ctext.find(stop)] and
              cut.choices[0].finish_reason == "stop", f"stop string {stop!r} ends the text")
    lp = client.completions.create(model=mid, prompt="The three primary colors are",
                                   temperature=0, max_tokens=4, logprobs=2)
    l = lp.choices[0].logprobs
    check(len(l.tokens) == 4 and len(l.top_logprobs) == 4 and
          all(abs(max(t.values()) - v) < 1e-4 for t, v in zip(l.top_logprobs, l.token_logprobs)),
          "completion logprobs: greedy picks the top token")
    seeded = [client.completions.create(model=mid, prompt="Once upon a time", temperature=0.9,
                                        max_tokens=8, seed=7).choices[0].text for _ in range(2)]
    check(seeded[0] == seeded[1], "the same seed gives the same sampled text")

    # Embeddings of two texts.
    emb = client.embeddings.create(model=mid, input=["The cat sat on the mat.",
                                                     "Quarterly revenue grew."])
    v = [d.embedding for d in emb.data]
    norms = [math.sqrt(sum(x * x for x in e)) for e in v]
    check(len(v) == 2 and len(v[0]) == len(v[1]) > 0 and all(abs(n - 1) < 1e-3 for n in norms)
          and v[0] != v[1], f"embeddings: two unit vectors of {len(v[0])}")

    # The API key.
    try:
        openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong",
                      max_retries=0).models.list()
        check(False, "a wrong API key is refused")
    except openai.AuthenticationError:
        check(True, "a wrong API key gets 401")
    s, _, _ = raw(port, "GET", "/health", key=None)
    check(s == 200, "/health answers without the key")

    # 8 clients at once against the same requests one at a time.
    questions = ["Name a color.", "What is 2+2?", "Say hello.", "Name a fruit.",
                 "What is the sun?", "Count to three.", "Name an animal.", "What is rain?"]

    def ask(q):
        r = chat(q, temperature=0, max_tokens=12, logprobs=True, top_logprobs=2)
        return tokens_and_gaps(r.choices[0])

    sequential = [ask(q) for q in questions]
    with cf.ThreadPoolExecutor(8) as ex:
        concurrent = list(ex.map(ask, questions))
    same = [same_to_near_tie(s, c) for s, c in zip(sequential, concurrent)]
    check(all(same), f"8 concurrent greedy answers equal the sequential ones ({same})")

    # Faults.
    expect_error(port, "{not json", 400, what="malformed JSON")
    expect_error(port, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"},
                 400, what="max_tokens of the wrong type")
    expect_error(port, {"messages": "hi"}, 400, what="messages of the wrong type")
    expect_error(port, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}, 400,
                 what="negative max_tokens")
    expect_error(port, {"messages": [{"role": "user", "content": "hi"}], "n": 2}, 400,
                 what="n=2")
    expect_error(port, {"prompt": "hi", "model": "no-such-model"}, 404, "/v1/completions",
                 what="unknown model")
    e = expect_error(port, {"prompt": "word " * (2 * CTX)}, 400, "/v1/completions",
                     what="a prompt past the context")
    check(e["error"]["code"] == "context_length_exceeded", "... with code context_length_exceeded")
    s, _, data = raw(port, "GET", "/v1/nothing-here")
    check(s == 404 and "error" in data, "an unknown route gets 404 with an error object")
    huge = client.completions.create(model=mid, prompt="Once", temperature=0,
                                     max_tokens=10**9)
    check(huge.choices[0].finish_reason in ("length", "stop") and
          huge.usage.prompt_tokens + huge.usage.completion_tokens <= CTX,
          "a huge max_tokens stops at the context's end")
    try:
        s, _, data = raw(port, "POST", "/v1/completions", b"x" * (100 << 20))
        check(s == 413 and "error" in data, "a 100 MB body gets 413")
    except (ConnectionError, BrokenPipeError) as err:
        # The server may close the connection while the client still writes past the limit.
        check(True, f"a 100 MB body is cut off ({type(err).__name__})")

    # A client that disconnects mid-stream frees its slot.
    before = metric(port, "disconnects_total")
    sock = socket.create_connection(("127.0.0.1", port))
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 200, "stream": True,
                       "temperature": 0})
    sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}")
                 .encode())
    got = b""
    while b"data:" not in got:
        got += sock.recv(4096)
    sock.close()
    deadline = time.time() + 30
    while metric(port, "disconnects_total") == before and time.time() < deadline:
        time.sleep(0.2)
    check(metric(port, "disconnects_total") > before, "a client gone mid-stream frees its slot")

    # 200 requests, 16 at a time: every one answered, and counted by the server.
    idle = rss_kb(proc.pid)
    done_before = metric(port, "requests_total", '{route="completions"}')
    outcomes = {}
    lock = threading.Lock()

    def one(i):
        try:
            r = client.completions.create(model=mid, prompt=f"Item {i}:", temperature=0,
                                          max_tokens=3)
            key = "ok" if r.choices[0].finish_reason in ("length", "stop") else "bad"
        except openai.APIStatusError as err:
            key = "503" if err.status_code == 503 else f"status {err.status_code}"
        except Exception as err:  # noqa: BLE001 - any other failure is counted as lost
            key = f"lost: {type(err).__name__}"
        with lock:
            outcomes[key] = outcomes.get(key, 0) + 1

    with cf.ThreadPoolExecutor(16) as ex:
        list(ex.map(one, range(200)))
    check(sum(outcomes.get(k, 0) for k in ("ok", "503")) == 200,
          f"200 requests at 16 at a time: all answered, ok or 503 ({outcomes})")
    counted = metric(port, "requests_total", '{route="completions"}') - done_before
    check(counted == 200, f"/metrics counted the 200 requests ({counted})")
    s, _, _ = raw(port, "GET", "/health")
    check(s == 200, "/health still answers after the load")
    after = rss_kb(proc.pid)
    check(after < idle * 1.25 + 64 * 1024,
          f"memory after the load near its size before ({idle} -> {after} kB)")

    # Graceful shutdown with a stream running: it ends with [DONE] and the server exits 0.
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": "Once upon a time", "max_tokens": 200, "stream": True, "temperature": 0}),
        headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
    r = c.getresponse()
    first = r.readline()
    proc.send_signal(signal.SIGTERM)
    rest = first + r.read()
    check(rest.rstrip().endswith(b"data: [DONE]"), "a running stream ends cleanly on SIGTERM")
    code = proc.wait(timeout=30)
    check(code == 0, f"the server exits 0 after SIGTERM (got {code})")


if __name__ == "__main__":
    main()
