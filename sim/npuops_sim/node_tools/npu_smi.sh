#!/bin/sh
# Simulated npu-smi for the npuops test cluster (test infrastructure, not a product).
# Prints the answers npuops_sim rendered from the node's profile (npu_smi.py render_all) where the real
# tool asks the driver; without the driver's device (/dev/davinci_manager) DCMI fails, as the real one does.
STATE=${NPUOPS_SIM_NPU_SMI:-/usr/local/Ascend/driver/lib64/npuops_sim/npu_smi}
DEVMGR=${NPUOPS_SIM_DEVMGR:-/dev/davinci_manager}

say() {
  while IFS= read -r line || [ -n "$line" ]; do printf '%s\n' "$line"; done < "$1"
}

if [ "$1" != "info" ]; then
  echo "Usage: npu-smi info [-m | -l | -t <type> -i <card> [-c <chip>]]"
  exit 1
fi
if [ ! -e "$DEVMGR" ] || [ ! -d "$STATE" ]; then
  echo "dcmi module initialize failed. ret is -8005"
  exit 1
fi
shift
# a wedged driver: the real tool blocks in the DCMI call and never returns
if [ -e "$STATE/hang" ]; then
  exec sleep 86400
fi
case "$*" in
  "")
    # the table lists the processes using the NPUs right now: the Python renderer looks for them
    if [ -f "$STATE/../npu_smi.py" ] && command -v python3 >/dev/null 2>&1; then
      exec python3 "$STATE/../npu_smi.py" info
    fi
    say "$STATE/info"; exit 0 ;;
  "-m") say "$STATE/info_-m"; exit 0 ;;
  "-l") say "$STATE/info_-l"; exit 0 ;;
esac
type= card= chip=
while [ $# -gt 0 ]; do
  case "$1" in
    -t) type=$2; shift 2 ;;
    -i) card=$2; shift 2 ;;
    -c) chip=$2; shift 2 ;;
    *) echo "Error: invalid parameter $1"; exit 2 ;;
  esac
done
if [ -z "$type" ] || [ -z "$card" ]; then
  echo "Error: -t and -i are required"
  exit 2
fi
if [ ! -f "$STATE/t/board_$card" ]; then
  echo "Error: card id $card is invalid."
  exit 2
fi
f="$STATE/t/${type}_$card${chip:+_$chip}"
if [ ! -f "$f" ]; then
  if [ -n "$chip" ] && [ ! -f "$STATE/t/board_${card}_$chip" ]; then
    echo "Error: chip id $chip is invalid."
  else
    echo "This device does not support querying $type."
  fi
  exit 2
fi
say "$f"
