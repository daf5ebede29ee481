#!/bin/sh
# Simulated hccn_tool for the npuops test cluster (test infrastructure, not a product).
#
# Get items print the real tool's formats (vllm-ascend docs/source/installation.md "Verify Multi-Node
# Communication", Ascend/msit msprechecker's parsers) from the device state
# the simulator renders per physical device (where the real tool asks the driver). `-ping` really probes:
# it sends ICMP echo requests from the device's fabric address, so a device whose link the simulator cut,
# or a fabric route it blocked, really loses the packets. Plain sh and iputils ping: the real tool is a
# small binary, and preflight calls it hundreds of times per node.
STATE=${NPUOPS_SIM_HCCN:-/usr/local/Ascend/driver/lib64/npuops_sim/hccn}

say() {  # print a rendered file without spawning cat
  while IFS= read -r line || [ -n "$line" ]; do printf '%s\n' "$line"; done < "$1"
}

if [ "$1" != "-i" ] || [ $# -lt 3 ]; then
  echo "Usage: hccn_tool -i <device_id> -<item> -g|-s ..."
  exit 1
fi
id=$2 item=$3
case "$id" in *[!0-9]*|'') echo "Invalid device id $id"; exit 1 ;; esac
dev="$STATE/$id"
if [ ! -d "$dev" ]; then
  echo "Invalid device id $id"
  exit 1
fi
if [ "$4" != "-g" ]; then
  echo "Only -g (get) is supported by the simulator"
  exit 1
fi

case "$item" in
  -ping|-hccs_ping)
    if [ "$item" = "-hccs_ping" ] && [ ! -e "$STATE/superpod" ]; then
      echo "This device does not support this function."
      exit 1
    fi
    if [ "$5" != "address" ] || [ -z "$6" ]; then
      echo "Usage: hccn_tool -i <id> $item -g address <ip> [pkt <n>]"
      exit 1
    fi
    target=$6 count=3 interval=0.2
    # the pace between packets: 0.2 s keeps the tests fast; bench/preflight uses 1 s, ping's default
    [ -f "$STATE/ping_interval" ] && read -r interval < "$STATE/ping_interval"
    [ "$7" = "pkt" ] || [ "$7" = "cnt" ] && count=$8
    hccs=
    [ "$item" = "-hccs_ping" ] && hccs=1
    read -r src < "$dev/address"
    echo "device $id PING $target"
    # a removed source address (link down) makes ping fail to bind: every packet is lost
    ping -n -c "$count" -i "$interval" -W 1 -I "$src" "$target" 2>/dev/null | awk -v id="$id" -v n="$count" -v hccs="$hccs" '
      /icmp_seq=/ { match($0, /icmp_seq=[0-9]+/); seq = substr($0, RSTART + 9, RLENGTH - 9) - 1
                    match($0, /time=[0-9.]+/); t = substr($0, RSTART + 5, RLENGTH - 5)
                    if (hccs) { print "This pkt ping success!"; printf "recv seq %d, time = %.3fus, L1 plane check result = 0x0\n", seq, t * 1000 }
                    else printf "recv seq=%d,time=%.6fms\n", seq, t
                    got++ }
      END { loss = 100 * (n - got) / n
            if (got < n) for (i = got; i < n; i++) print (hccs ? "This pkt send fail!" : "recv time out seq=" i)
            if (hccs) printf "%d packets transmitted, %d received, %.2f%% packets loss\n", n, got, loss
            else printf "%d packets transmitted, %d received, %.2f%% packet loss\n", n, got, loss
            exit (got ? 0 : 1) }'
    exit $?
    ;;
esac

f="$dev/${item#-}"
if [ ! -f "$f" ]; then
  echo "Unsupported item $item in the simulator"
  exit 1
fi
say "$f"
if [ -f "$f.rc" ]; then
  read -r rc < "$f.rc"
  exit "$rc"
fi
exit 0
