#!/usr/bin/env bash
# A throwaway single-node Ceph cluster for tests and benchmarks: one monitor and one memstore OSD
# on 127.0.0.1, no manager, a size-1 pool `rbd`; everything (config, keyring, data, logs, pids)
# in one directory, nothing in /etc/ceph. Recipe: ../shared/ceph-single-node.md.
#
#   tests/ceph/cluster.sh start DIR [PORT]   prints the ceph.conf path when the pool is usable
#   tests/ceph/cluster.sh stop DIR           kills the daemons by their own pids
#
# PORT (default: from the shell's pid) is the monitor's v2 port; PORT+1 is its v1 port.
set -euo pipefail

cmd=${1:?usage: cluster.sh start|stop DIR [PORT]}
dir=$(realpath -m "${2:?DIR}")

stop() {
    # The daemons remove their pid files as they exit: read them all first.
    local pids=()
    for p in "$dir"/*.pid; do
        [ -f "$p" ] && pids+=("$(cat "$p")")
    done
    # A daemon stopped by a fault test (SIGSTOP) acts on SIGTERM only once continued.
    for pid in "${pids[@]}"; do kill -CONT "$pid" 2>/dev/null || true; kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
    done
    rm -f "$dir"/*.pid
}

if [ "$cmd" = stop ]; then
    stop
    exit 0
fi
[ "$cmd" = start ] || { echo "cluster.sh: unknown command '$cmd'" >&2; exit 2; }

# The default stays below Linux's ephemeral ports (32768 and up) and above the tests' ranges.
port=${3:-$((32400 + $$ % 180 * 2))}
mkdir -p "$dir"
conf=$dir/ceph.conf
fsid=$(uuidgen)
cat > "$conf" <<CONF
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:$port,v1:127.0.0.1:$((port + 1))]
public addr = 127.0.0.1
auth cluster required = none
auth service required = none
auth client required = none
keyring = $dir/keyring
run dir = $dir
log file = $dir/\$name.log
pid file = $dir/\$name.pid
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon data avail warn = 1
# A nearly full host disk must not stop the test monitor (its data is small).
mon data avail crit = 0
osd crush chooseleaf type = 0
osd pool default pg autoscale mode = off
paxos propose interval = 0.1
[mon]
# Daemons only: clients (flashpath, the rbd tool, qsd) would race for one socket name.
admin socket = $dir/\$name.asok
mon data = $dir/mon.\$id
[osd]
admin socket = $dir/\$name.asok
# A client killed with SIGKILL keeps its image's exclusive lock until its watch times out
# (30 s by default); the crash-restart tests wait for that.
osd client watch timeout = 5
osd data = $dir/osd.\$id
osd objectstore = memstore
memstore device bytes = 4294967296
osd memory target = 1073741824
CONF

ceph-authtool --create-keyring "$dir/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
ceph-authtool "$dir/keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *' >/dev/null
monmaptool --create --clobber --fsid "$fsid" \
    --addv a "[v2:127.0.0.1:$port,v1:127.0.0.1:$((port + 1))]" "$dir/monmap" >/dev/null
ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/keyring"
ceph-mon -c "$conf" -i a 2>>"$dir/mon.a.stderr"
ceph -c "$conf" --connect-timeout 20 mon stat >/dev/null

uuid=$(uuidgen)
id=$(ceph -c "$conf" osd new "$uuid")
mkdir -p "$dir/osd.$id"
ceph-osd -c "$conf" -i "$id" --mkfs --osd-uuid "$uuid" >/dev/null 2>&1
ceph-osd -c "$conf" -i "$id" 2>>"$dir/osd.$id.stderr"
for _ in $(seq 200); do
    ceph -c "$conf" osd dump 2>/dev/null | grep -q "^osd.$id up" && break
    sleep 0.05
done
ceph -c "$conf" osd dump | grep -q "^osd.$id up" || { echo "cluster.sh: osd.$id did not come up" >&2; stop; exit 1; }

ceph -c "$conf" osd pool create rbd 8 8 >/dev/null 2>&1
rbd -c "$conf" pool init rbd
echo "$conf"
