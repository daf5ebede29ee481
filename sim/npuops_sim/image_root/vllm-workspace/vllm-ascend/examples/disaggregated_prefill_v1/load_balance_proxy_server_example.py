#!/usr/bin/python3
"""Stand-in for vllm-ascend's examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py in the
npuops simulated image (test infrastructure): the same command line and endpoints. A request goes to a
prefill instance first (max_tokens=1, kv_transfer_params.do_remote_decode), then to a decode instance with
the kv_transfer_params the prefill answered, so the KV really moves from a prefill node to a decode node.
"""
import argparse
import itertools
import json
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--host", default="localhost")
    ap.add_argument("--prefiller-hosts", nargs="+", required=True)
    ap.add_argument("--prefiller-ports", nargs="+", type=int, required=True)
    ap.add_argument("--decoder-hosts", nargs="+", required=True)
    ap.add_argument("--decoder-ports", nargs="+", type=int, required=True)
    ap.add_argument("--max-retries", type=int, default=3)
    ap.add_argument("--retry-delay", type=float, default=0.001)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--log-level", default="info")
    args = ap.parse_args()
    if len(args.prefiller_hosts) != len(args.prefiller_ports):
        ap.error("Number of prefiller hosts must match number of prefiller ports")
    if len(args.decoder_hosts) != len(args.decoder_ports):
        ap.error("Number of decoder hosts must match number of decoder ports")
    prefill = ["http://%s:%d" % hp for hp in zip(args.prefiller_hosts, args.prefiller_ports)]
    decode = ["http://%s:%d" % hp for hp in zip(args.decoder_hosts, args.decoder_ports)]
    state = {"p": itertools.cycle(prefill), "d": itertools.cycle(decode), "n": 0, "lock": threading.Lock()}

    def post(url, body, auth, timeout=3600):
        req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **({"Authorization": auth}
                                                                                     if auth else {})})
        return urllib.request.urlopen(req, timeout=timeout)

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

        def do_GET(self):
            if self.path == "/healthcheck":
                return self.send(200, {"status": "ok", "prefill_instances": len(prefill),
                                       "decode_instances": len(decode), "request_num": state["n"]})
            if self.path == "/v1/models":
                try:
                    with urllib.request.urlopen(next(state["d"]) + "/v1/models", timeout=30) as r:
                        return self.send(r.status, r.read())
                except urllib.error.URLError as e:
                    return self.send(502, {"error": str(e)})
            self.send(404, {"detail": "Not Found"})

        def do_POST(self):
            if self.path not in ("/v1/chat/completions", "/v1/completions"):
                return self.send(404, {"detail": "Not Found"})
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            auth = self.headers.get("Authorization")
            with state["lock"]:
                state["n"] += 1
                p_url, d_url = next(state["p"]), next(state["d"])
            first = dict(body, max_tokens=1, stream=False, kv_transfer_params={
                "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                "remote_block_ids": None, "remote_host": None, "remote_port": None})
            first.pop("max_completion_tokens", None)
            try:
                with post(p_url + self.path, first, auth) as r:
                    params = json.loads(r.read()).get("kv_transfer_params") or {}
                second = dict(body, kv_transfer_params=params)
                with post(d_url + self.path, second, auth) as r:
                    if body.get("stream"):
                        self.send_response(200)
                        self.send_header("Content-Type", "text/event-stream")
                        self.send_header("Transfer-Encoding", "chunked")
                        self.end_headers()
                        for line in r:
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                            self.wfile.flush()
                        self.wfile.write(b"0\r\n\r\n")
                        return
                    return self.send(r.status, r.read())
            except urllib.error.HTTPError as e:
                return self.send(e.code, e.read())
            except urllib.error.URLError as e:
                return self.send(502, {"error": "an instance did not answer: %s" % e})

    srv = ThreadingHTTPServer((args.host, args.port), H)
    srv.daemon_threads = True
    print("proxy listening on %s:%d (%d prefill, %d decode)" % (args.host, args.port, len(prefill), len(decode)),
          flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
