#!/usr/bin/python3
"""docker, isula (and podman) on the simulated nodes - test infrastructure, not a product.

Each records every call (argv, one JSON list per line in /run/npuops-sim/<cli>.calls, the node's own /run), answers
where the real CLI answers differently (its --version, docker's swarm-only secrets, isula's inspect without
--type and its not-found message), and runs everything else through the node's podman, whose CLI is
docker-compatible for what the deployment uses (run, inspect, start, stop, rm, logs). So one deployment can be made
through each engine and the commands each received compared.
"""
import json
import os
import subprocess
import sys

CALLS = "/run/npuops-sim"
PODMAN = "/usr/bin/podman"
VERSION = {"docker": "Docker version 28.2.2, build e6534b4", "isula": "isula version 2.1.5"}


def main(argv):
    cli = os.path.basename(sys.argv[0])
    os.makedirs(CALLS, exist_ok=True)
    with open(os.path.join(CALLS, cli + ".calls"), "a") as f:
        f.write(json.dumps(argv) + "\n")
    if cli in VERSION and argv[:1] in (["--version"], ["version"]):
        print(VERSION[cli])
        return 0
    if cli == "docker" and argv[:1] == ["secret"]:
        # docker keeps secrets only in swarm mode (docs.docker.com/engine/swarm/secrets/)
        sys.stderr.write('Error response from daemon: This node is not a swarm manager. Use "docker swarm init" or '
                         '"docker swarm join" to connect this node to swarm and try again.\n')
        return 1
    if cli == "isula":
        if argv[:1] == ["secret"]:
            sys.stderr.write("isula: 'secret' is not a isula command.\nSee 'isula --help'\n")
            return 1
        if argv[:1] == ["inspect"]:
            if "--type" in argv:
                sys.stderr.write("isula inspect: unknown flag: --type\n")
                return 125
            # iSulad's inspect takes a container or an image (isula inspect CONTAINER|IMAGE)
            for kind in ("container", "image"):
                found = subprocess.run([PODMAN, "inspect", "--type", kind] + argv[1:], stdout=subprocess.PIPE,
                                       stderr=subprocess.DEVNULL, timeout=120, check=False)
                if found.returncode == 0:
                    sys.stdout.write(found.stdout.decode())
                    return 0
            # iSulad: isulad_set_error_message("No such image or container or accelerator:%s", id)
            sys.stderr.write("Error response from daemon: No such image or container or accelerator:%s\n" % argv[-1])
            return 1
        if argv[:1] == ["logs"] and "--since" in argv:
            sys.stderr.write("isula logs: unknown flag: --since\n")
            return 125
    os.execv(PODMAN, [PODMAN] + argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
