#!/usr/bin/python3
"""Stand-in for vllm-ascend's examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py in the
npuops simulated image (test infrastructure): the same command line, routes and failure behaviour as the real
script of the vllm-ascend line the image claims (NPUOPS_SIM_PROXY: v0.23.0 or main; data/images.yml).

Read in the real script (vllm-ascend tag v0.23.0 and main):
- auth_headers(): every request to an engine carries `Authorization: Bearer $OPENAI_API_KEY` from the proxy's own
  environment (the literal "Bearer None" when it is unset); the client's Authorization header is ignored and the
  proxy itself checks none.
- build_prefill_request(): the prefill copy gets kv_transfer_params.do_remote_decode, stream false, max_tokens 1,
  min_tokens 1, max_completion_tokens 1 when present, no stream_options; the decode request gets the
  kv_transfer_params the prefill answered.
- A prefill refusal: v0.23.0 retries every error, then the exception escapes the handler (HTTP 500, "Internal
  Server Error"); main does not retry a 400 and answers with the engine's own status and body (PR #12097).
- A decode refusal comes after the StreamingResponse started: the client gets HTTP 200 and an empty body (both).
- main also serves GET /v1/models (the first engine that answers, PR #14129) and writes the prefill's
  usage.prompt_tokens_details.cached_tokens into the decode's usage (0 when the prefill reported none).
"""
import argparse
import itertools
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, "/opt/npuops-sim")
try:
    from npuops_vllm_sim import versions
except ImportError:  # run from a checkout (the loopback conformance tests put the package on PYTHONPATH)
    import npuops_vllm_sim.versions as versions  # noqa: F811


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--host", type=str, default="localhost")
    ap.add_argument("--prefiller-hosts", type=str, nargs="+", default=["localhost"])
    ap.add_argument("--prefiller-ports", type=int, nargs="+", default=[8001])
    ap.add_argument("--decoder-hosts", type=str, nargs="+", default=["localhost"])
    ap.add_argument("--decoder-ports", type=int, nargs="+", default=[8002])
    ap.add_argument("--max-retries", type=int, default=3)
    ap.add_argument("--retry-delay", type=float, default=0.001)
    ap.add_argument("--max-waiting-retries", type=int, default=3)
    ap.add_argument("--waiting-retry-interval", type=float, default=10)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--log-level", type=str, default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"])
    args = ap.parse_args()
    if len(args.prefiller_hosts) != len(args.prefiller_ports):
        raise ValueError("Number of prefiller hosts must match number of prefiller ports")
    if len(args.decoder_hosts) != len(args.decoder_ports):
        raise ValueError("Number of decoder hosts must match number of decoder ports")
    return args


def auth_headers(request_id):
    return {"Authorization": "Bearer %s" % os.environ.get("OPENAI_API_KEY"), "X-Request-Id": request_id,
            "Content-Type": "application/json"}


def build_prefill_request(body):
    payload = dict(body)
    payload["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                                     "remote_block_ids": None, "remote_host": None, "remote_port": None}
    payload["stream"] = False
    payload["max_tokens"] = 1
    payload["min_tokens"] = 1
    if "max_completion_tokens" in payload:
        payload["max_completion_tokens"] = 1
    payload.pop("stream_options", None)
    return payload


class Upstream(Exception):
    """An engine answered with an error status (httpx.HTTPStatusError in the real script)."""

    def __init__(self, code, body):
        Exception.__init__(self, "HTTP %d" % code)
        self.code = code
        self.body = body


def post(url, body, request_id, timeout=3600):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=auth_headers(request_id))
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        raise Upstream(e.code, e.read())


def with_retries(fn, args, line):
    attempts = max(1, args.max_retries)
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Upstream as e:
            if attempt == attempts or (line != "v0.23.0" and e.code == 400):
                raise
        except (urllib.error.URLError, OSError):
            if attempt == attempts:
                raise
        time.sleep(args.retry_delay * (2 ** (attempt - 1)))


def cached_tokens(body):
    details = (body.get("usage") or {}).get("prompt_tokens_details") or {}
    value = details.get("cached_tokens")
    return value if isinstance(value, int) else 0


def main():
    args = parse_args()
    behaviour = versions.proxy()
    routes = set(behaviour["routes"])
    line = behaviour["line"]
    prefill = ["http://%s:%d" % hp for hp in zip(args.prefiller_hosts, args.prefiller_ports)]
    decode = ["http://%s:%d" % hp for hp in zip(args.decoder_hosts, args.decoder_ports)]
    state = {"p": itertools.cycle(prefill), "d": itertools.cycle(decode), "n": 0, "lock": threading.Lock()}

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):
            sys.stdout.write("proxy: %s\n" % (fmt % a))
            sys.stdout.flush()

        def send(self, code, data, ctype="application/json"):
            data = data if isinstance(data, bytes) else json.dumps(data).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def route(self, method):
            if "%s %s" % (method, self.path) in routes:
                return True
            other = "POST" if method == "GET" else "GET"
            if "%s %s" % (other, self.path) in routes:
                self.send(405, {"detail": "Method Not Allowed"})
            else:
                self.send(404, {"detail": "Not Found"})
            return False

        def do_GET(self):
            if not self.route("GET"):
                return
            if self.path == "/healthcheck":
                return self.send(200, {"status": "ok", "prefill_instances": len(prefill),
                                       "decode_instances": len(decode), "request_num": state["n"]})
            failed = []
            for base in prefill + decode:  # GET /v1/models (main): the first instance that answers
                try:
                    req = urllib.request.Request(base + "/v1/models", headers=auth_headers(str(uuid.uuid4())))
                    with urllib.request.urlopen(req, timeout=3) as r:
                        return self.send(200, r.read())
                except (urllib.error.URLError, OSError):
                    failed.append(base.split("//", 1)[1])
            self.send(503, {"error": "All backend instances failed to serve /v1/models", "failed": failed})

        def do_POST(self):
            body_bytes = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not self.route("POST"):
                return
            if self.path not in ("/v1/chat/completions", "/v1/completions"):
                return self.send(200, b"")
            try:
                body = json.loads(body_bytes or b"{}")
            except ValueError:
                return self.send(500, b"Internal Server Error", "text/plain; charset=utf-8")
            with state["lock"]:
                state["n"] += 1
                p_url, d_url = next(state["p"]), next(state["d"])
            rid = str(uuid.uuid4())
            try:
                def first():
                    with post(p_url + self.path, build_prefill_request(body), rid) as r:
                        return json.loads(r.read())
                answer = with_retries(first, args, line)
            except Upstream as e:
                print("Error occurred in disagg prefill proxy server - %s endpoint: HTTP %d" % (self.path, e.code),
                      flush=True)
                if behaviour["prefill_error"] == "upstream":
                    try:
                        return self.send(e.code, json.loads(e.body))
                    except ValueError:
                        return self.send(e.code, {"error": {"message": e.body.decode("utf-8", "replace")
                                                            or "upstream error"}})
                return self.send(500, b"Internal Server Error", "text/plain; charset=utf-8")
            except (urllib.error.URLError, OSError) as e:
                print("Error occurred in disagg prefill proxy server - %s endpoint: %s" % (self.path, e), flush=True)
                return self.send(500, b"Internal Server Error", "text/plain; charset=utf-8")
            second = dict(body)
            if answer.get("kv_transfer_params"):
                second["kv_transfer_params"] = answer["kv_transfer_params"]
            stream = bool(body.get("stream", False))
            # StreamingResponse: the status line goes out before the decode side answers
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8" if stream else "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                with with_retries(lambda: post(d_url + self.path, second, rid), args, line) as r:
                    for piece in (r if stream else [r.read()]):
                        piece = self.rewrite(piece, stream, cached_tokens(answer)) if line != "v0.23.0" else piece
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                        self.wfile.flush()
            except (Upstream, urllib.error.URLError, OSError) as e:
                print("Error during streaming from decoder %s: %s while handling request %s" % (d_url, e, rid),
                      flush=True)
            self.wfile.write(b"0\r\n\r\n")

        @staticmethod
        def rewrite(piece, stream, cached):
            """main: the prefill's cached_tokens in the decode's usage (update_cached_tokens_in_chunk)."""
            text = piece.decode("utf-8", "replace").strip()
            sse = text.startswith("data: ")
            try:
                event = json.loads(text[6:] if sse else text)
            except ValueError:
                return piece
            if not isinstance(event, dict) or not isinstance(event.get("usage"), dict) or \
                    (stream and event.get("choices")):
                return piece
            details = event["usage"].get("prompt_tokens_details")
            event["usage"]["prompt_tokens_details"] = dict(details if isinstance(details, dict) else {},
                                                           cached_tokens=cached)
            data = json.dumps(event, ensure_ascii=False).encode("utf-8")
            return b"data: " + data + b"\n\n" if sse else data

    srv = ThreadingHTTPServer((args.host, args.port), H)
    srv.daemon_threads = True
    print("proxy (vllm-ascend %s) listening on %s:%d (%d prefill, %d decode)"
          % (line, args.host, args.port, len(prefill), len(decode)), flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
