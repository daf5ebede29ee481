"""What the gateway tests share: a playbook through ansible-runner as a platform runs it, clients that load the
floating address (and check what they are answered), and what HAProxy says of its servers."""
import json
import re
import threading
import time
import urllib.error
import urllib.request

from npuops_sim.testing import REPO, env

MODEL = "kimi-k3"
CLIENTS = 4


def runner(c, tmp, playbook, cmdline=""):
    """A playbook through ansible-runner, as a platform runs it: -> (rc, stdout, stats artifact_data)."""
    import ansible_runner
    data = tmp / ("runner-" + playbook)
    data.mkdir(exist_ok=True)
    r = ansible_runner.run(private_data_dir=str(data), project_dir=REPO, playbook="playbooks/%s.yml" % playbook,
                           inventory=c.inventory, quiet=True, timeout=900, cmdline=cmdline,
                           envvars=dict((k, v) for k, v in env().items() if k in ("ANSIBLE_CONFIG", "PATH",
                                                                                  "PYTHONPATH")))
    text = re.sub(r"\x1b\[[0-9;]*m", "", r.stdout.read())
    stats = [e for e in r.events if e.get("event") == "playbook_on_stats"][0]["event_data"]["artifact_data"]
    return r.rc, text, stats


def complete(url, key=None, timeout=5.0):
    """One small completion: -> (status, served-by server name or None)."""
    req = urllib.request.Request(url + "/v1/completions", method="POST", data=json.dumps(
        {"model": MODEL, "prompt": "hi", "max_tokens": 2}).encode(), headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status, r.headers.get("X-Npuops-Server")
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("X-Npuops-Server")
    except OSError:
        return None, None


class Clients:
    """`n` threads, each calling `send()` -> (status, server) one after another, `pause(k)` seconds apart, until the
    block ends; each answer recorded as (start, end, status, server)."""

    def __init__(self, n, send, pause=lambda k: 0.0, join_timeout=10):
        self.send, self.pause, self.join_timeout = send, pause, join_timeout
        self.results, self.lock, self.done = [], threading.Lock(), threading.Event()
        self.threads = [threading.Thread(target=self.client, args=(k,), daemon=True) for k in range(n)]

    def client(self, k):
        while not self.done.is_set():
            t0 = time.monotonic()
            status, server = self.send()
            with self.lock:
                self.results.append((t0, time.monotonic(), status, server))
            self.done.wait(self.pause(k))

    def __enter__(self):
        self.t0 = time.monotonic()
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        for t in self.threads:
            t.join(timeout=self.join_timeout)
        self.t1 = time.monotonic()


class Load(Clients):
    """CLIENTS threads sending completions to the gateway until the block ends; every request bounded by
    `timeout` seconds (a request takes about 0.1 s on the simulator)."""

    def __init__(self, url, timeout=5.0):
        # paced (about 5 requests/s per client, 20 in all: a gap of a tenth of a second shows): the load must not
        # starve the 2 cores the playbooks run on
        Clients.__init__(self, CLIENTS, lambda: complete(url, timeout=timeout), lambda k: 0.2)

    @property
    def failed(self):
        return sum(1 for r in self.results if r[2] != 200)

    def gap(self):
        """The longest time without a successful answer (from the start of the load to its end)."""
        ends = sorted([self.t0] + [r[1] for r in self.results if r[2] == 200] + [self.t1])
        return max(b - a for a, b in zip(ends, ends[1:]))

    def servers_after(self, t):
        return {r[3] for r in self.results if r[2] == 200 and r[0] > t}


def vip_holder(c):
    for gw in ("gw01", "gw02"):
        out = c.api.nsenter(gw, ["ip", "-4", "-o", "addr", "show"], check=False).stdout
        if " %s/" % c.vip in out:
            return gw
    return None


def admin_rows(c, gw):
    """{server: status} of be_service at one gateway host, from its admin socket."""
    stat = c.api.nsenter(gw, ["python3", "-c", "import socket;s=socket.socket(socket.AF_UNIX);"
                                               "s.connect('/run/haproxy/admin.sock');s.sendall(b'show stat\\n');"
                                               "import sys;sys.stdout.write(s.makefile().read())"]).stdout
    # HAProxy shows a drained server as "DRAIN (agent)" whenever it has an agent check: the admin state is the word
    return dict((r.split(",")[1], r.split(",")[17].split(" ")[0]) for r in stat.splitlines()
                if r.startswith("be_service,") and not r.startswith("be_service,BACKEND"))




def ask(url, a, b, timeout=10.0):
    """One chat question whose answer is known (a * b), as a user asks it through `url`: -> (status, server, right)
    where right says whether the answer holds the product (None when nothing came back)."""
    req = urllib.request.Request(url + "/v1/chat/completions", method="POST", data=json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "What is %d*%d?" % (a, b)}], "max_tokens": 64,
         "temperature": 0}).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = json.loads(r.read())
            content = (body["choices"][0]["message"].get("content") or "")
            return r.status, r.headers.get("X-Npuops-Server"), str(a * b) in content
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("X-Npuops-Server"), None
    except (OSError, ValueError, KeyError, IndexError):
        return None, None, None


class Questions(Clients):
    """CLIENTS threads asking questions whose answers are known through the gateway until the block ends, paced like
    Load; every answer checked. `wrong` counts the answers served that were wrong (what users must never get)."""

    def __init__(self, url, timeout=10.0):
        self.n = 0
        Clients.__init__(self, CLIENTS, self.one, lambda k: 0.2)
        self.url, self.timeout = url, timeout

    def one(self):
        with self.lock:
            self.n += 1
            a, b = 11 + self.n % 89, 13 + self.n % 83
        status, server, right = ask(self.url, a, b, self.timeout)
        return status, (server, right)

    @property
    def failed(self):
        return sum(1 for r in self.results if r[2] != 200)

    @property
    def wrong(self):
        return [r for r in self.results if r[2] == 200 and r[3][1] is False]

    @property
    def answered(self):
        return [r for r in self.results if r[2] == 200]
