"""Command line of the simulated cluster (what `make sim-up|sim-down|sim-fault|sim-status` call).

  python -m npuops_sim up --nodes 4 --profile a3 [--fault 2:link_down:7 ...] [--inventory PATH]
  python -m npuops_sim up --nodes 8 --replicas 2 [--gateways 2] --inventory PATH   (two instances, a gateway pair)
  python -m npuops_sim down
  python -m npuops_sim fault --node 2 --fault link_down --device 7      (FAULT=clear clears the node)
  python -m npuops_sim status
  python -m npuops_sim exec NODE -- CMD...                            (a command inside a node)
  python -m npuops_sim image                                           (build/import the sim image only)
"""
import argparse
import json
import os
import sys
import time

from . import cluster, image, plan, profile, weights


def parse_fault(text):
    """`NODE:FAULT[:DEVICE]`, `NODE:fabric_cut:PEER` or `NODE:port_busy:PORT`."""
    parts = text.split(":")
    if len(parts) < 2:
        raise argparse.ArgumentTypeError("fault %r: expected NODE:FAULT[:DEVICE|PEER|PORT]" % text)
    item = {"node": parts[0], "fault": parts[1]}
    arg = parts[2] if len(parts) > 2 else None
    if parts[1] == "fabric_cut":
        item["peer"] = arg
    elif parts[1] == "port_busy":
        item["port"] = arg
    else:
        item["device"] = arg
    check_fault_name(item["fault"])
    return item


def check_fault_name(name):
    if name not in profile.FAULTS + ("clear",):
        raise argparse.ArgumentTypeError("unknown fault %r; known: %s, clear" % (name, ", ".join(profile.FAULTS)))
    return name


def int_or_none(text):
    return None if text in (None, "") else int(text)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="npuops_sim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--id", default=os.environ.get("SIM_ID", "npsim"), help="cluster id: prefix of every name")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up")
    up.add_argument("--nodes", type=int, default=4)
    up.add_argument("--profile", choices=sorted(plan.DEVICES), default="a3")
    up.add_argument("--superpod", action="store_true", help="A3 SuperPoD board: hccs_ping supported")
    up.add_argument("--fault", type=parse_fault, action="append", default=[])
    up.add_argument("--inventory", help="write the Ansible inventory of the nodes here")
    up.add_argument("--tier", help="npuops_tier to write into the inventory (default: from the node count)")
    up.add_argument("--prefill-nodes", type=int, default=None,
                    help="with a prefill/decode --tier: xPyD, the first N nodes of each instance prefill, the rest "
                         "decode (default: the tier's own sizes)")
    up.add_argument("--replicas", type=int, default=int(os.environ.get("SIM_REPLICAS", "1") or 1),
                    help="instances of the tier in the inventory (NODES / REPLICAS nodes each: instance_a, ...)")
    up.add_argument("--monitors", type=int, default=0,
                    help="an extra host without NPUs in group monitor (Prometheus away from the NPU nodes): 0 or 1")
    up.add_argument("--gateways", type=int, default=None,
                    help="extra hosts without NPUs in group gateway (HAProxy + keepalived); default 2 with "
                         "--replicas > 1, else 0")
    up.add_argument("--ping-interval", type=float, default=float(os.environ.get("SIM_PING_INTERVAL", "0") or 0),
                    help="seconds between the packets of hccn_tool -ping (default 0.2; ping's own default is 1)")
    sub.add_parser("down")
    fault = sub.add_parser("fault")
    fault.add_argument("--node", required=True)
    fault.add_argument("--fault", required=True, type=check_fault_name)
    fault.add_argument("--device", type=int_or_none)
    fault.add_argument("--peer")
    fault.add_argument("--port", type=int_or_none)
    fault.add_argument("--container", default="vllm", help="engine_hang: the container to freeze")
    sub.add_parser("status")
    ex = sub.add_parser("exec")
    ex.add_argument("node")
    ex.add_argument("argv", nargs=argparse.REMAINDER)
    sub.add_parser("image")
    w = sub.add_parser("weights", help="write synthetic safetensors weights into a node's model directory")
    w.add_argument("--node", required=True)
    w.add_argument("--size", default="1G", help="total size, e.g. 4G")
    w.add_argument("--files", type=int, default=8)
    w.add_argument("--dir", default="/srv/models/kimi-k3-w4a8", help="model directory inside the node")
    args = ap.parse_args(argv)

    c = cluster.Cluster(args.id, address_plan=plan.AddressPlan(
        os.environ.get("SIM_MGMT_NET", "10.213.0.0/24"), os.environ.get("SIM_FABRIC_NET", "10.214.0.0/20")))
    try:
        if args.cmd == "up":
            specs, timings = c.up(args.nodes, args.profile, faults=args.fault, inventory=args.inventory,
                                  tier=args.tier, superpod=args.superpod, ping_interval=args.ping_interval or None,
                                  replicas=args.replicas,
                                  gateways=args.gateways if args.gateways is not None else (2 if args.replicas > 1 else 0),
                                  monitors=args.monitors, prefill_nodes=args.prefill_nodes)
            for s in specs:
                print("  %s  ssh root@%s  fabric %s  netns %s" % (s.name, s.mgmt_ip, s.fabric_ip, s.netns))
            if args.inventory:
                print("inventory: %s" % args.inventory)
            print("sim-up: %d %s nodes in %.1fs (image %.1fs, network %.1fs, sshd %.1fs)"
                  % (len(specs), args.profile.upper(), timings["total"], timings["image"], timings["network"],
                     timings["sshd"]))
        elif args.cmd == "down":
            seconds = c.down()
            print("sim-down: done in %.1fs" % seconds)
        elif args.cmd == "fault":
            faults = c.fault(args.node, args.fault, device=args.device, peer=args.peer, port=args.port,
                             container=args.container)
            print("sim-fault: node %s now has faults: %s" % (args.node, json.dumps(faults) if faults else "none"))
        elif args.cmd == "status":
            state = c.load()
            if state is None:
                print("no simulated cluster is up")
                return 0
            print("cluster %s: %d %s nodes (+%d gateways), image %s" % (
                state["prefix"], state["count"], state["generation"].upper(), state.get("gateways", 0), state["image"]))
            for name in sorted(state["nodes"]):
                node = state["nodes"][name]
                alive = cluster.pid_alive(node["sshd_pid"]) if node.get("sshd_pid") else False
                faults = c.read_profile(name)["faults"] if alive else []
                print("  %s %-12s %s faults=%s" % (name, node["mgmt_ip"], "up" if alive else "DOWN",
                                                   json.dumps(faults) if faults else "none"))
        elif args.cmd == "exec":
            argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            proc = c.nsenter(args.node, argv, check=False, timeout=600)
            sys.stdout.write(proc.stdout)
            sys.stderr.write(proc.stderr)
            return proc.returncode
        elif args.cmd == "weights":
            root = c.root_of(args.node) + args.dir
            t0 = time.monotonic()
            paths = weights.write_model(root, weights.parse_size(args.size), args.files)
            print("weights: %d files, %.1f GB in %s on node %s (%.1fs)" % (
                len(paths), sum(os.path.getsize(p) for p in paths) / 1e9, args.dir, args.node, time.monotonic() - t0))
        elif args.cmd == "image":
            t0 = time.monotonic()
            print("image: %s (%.1fs)" % (image.ensure(), time.monotonic() - t0))
    except (cluster.SimError, ValueError) as e:
        print("npuops_sim: error: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
