#!/usr/bin/env bash
# A throwaway single-node Ceph cluster for tests and benchmarks: one monitor and one memstore OSD
# on 127.0.0.1, no manager, a size-1 pool `rbd`; everything (config, keyring, data, logs, pids)
# in one directory, nothing in /etc/ceph. Recipe: ../shared/ceph-single-node.md.
#
#   tests/ceph/cluster.sh start DIR [PORT]   prints the ceph.conf path when the pool is usable
#   tests/ceph/cluster.sh rgw DIR RGW_PORT   adds a RADOS Gateway (S3) on 127.0.0.1:RGW_PORT to
#                                            the cluster started in DIR, with a user whose keys
#                                            are fixed; prints its URL, access key and secret
#                                            key, one a line, once it answers HTTP
#   tests/ceph/cluster.sh stop DIR           kills the daemons (rgw's too) by their own pids
#
# PORT (default: from the shell's pid) is the monitor's v2 port; PORT+1 is its v1 port.
set -euo pipefail

cmd=${1:?usage: cluster.sh start|stop DIR [PORT]}
dir=$(realpath -m "${2:?DIR}")

# terminate PID...: SIGTERM, then SIGKILL to whichever has not exited 5 s later.
terminate() {
    local pid
    # A daemon stopped by a fault test (SIGSTOP) acts on SIGTERM only once continued.
    for pid in "$@"; do kill -CONT "$pid" 2>/dev/null || true; kill "$pid" 2>/dev/null || true; done
    for pid in "$@"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
    done
}

stop() {
    # The daemons remove their pid files as they exit: read them all first. One kind after
    # the other, the gateway (client.rgw.a), the OSD, the monitor: each waits for the next at
    # its shutdown (the gateway unregisters from its control objects, the OSD tells the
    # monitor it goes down), and waits out a 5 s timeout when it is gone. In that order the
    # stop takes about 3.3 s (5.6 with the gateway), all at once about 7.
    local clients=() osds=() mons=() p
    for p in "$dir"/*.pid; do
        [ -f "$p" ] || continue
        case ${p##*/} in
            mon.*) mons+=("$(cat "$p")") ;;
            osd.*) osds+=("$(cat "$p")") ;;
            *) clients+=("$(cat "$p")") ;;
        esac
    done
    [ ${#clients[@]} -eq 0 ] || terminate "${clients[@]}"
    [ ${#osds[@]} -eq 0 ] || terminate "${osds[@]}"
    [ ${#mons[@]} -eq 0 ] || terminate "${mons[@]}"
    rm -f "$dir"/*.pid
}

# The gateway's S3 user. Fixed test keys: the endpoint listens on 127.0.0.1 only and lives as
# long as the throwaway cluster.
rgw_uid=flashpath-test
rgw_access_key=FLASHPATHTESTACCESS1
rgw_secret_key=flashpath-test-secret-key-for-the-rgw-0001

# rgw DIR PORT: radosgw (beast frontend) on 127.0.0.1:PORT. Its first start creates its pools
# (.rgw.root, default.rgw.{log,control,meta}; the bucket index and data pools follow with the
# first bucket) with `osd pool default pg num` (8, set in ceph.conf): Ceph's default, 32 each,
# would pass the OSD's limit of 250 placement groups with the rgw pools and rbd.
rgw() {
    local port=${1:?usage: cluster.sh rgw DIR RGW_PORT}
    local conf=$dir/ceph.conf url=http://127.0.0.1:$port
    [ -f "$conf" ] || { echo "cluster.sh: no cluster in $dir (cluster.sh start first)" >&2; exit 1; }
    mkdir -p "$dir/rgw.a"
    # What the log holds already is an earlier attempt's (a port found taken).
    local log=$dir/client.rgw.a.log log_start=1
    [ -f "$log" ] && log_start=$(($(stat -c %s "$log") + 1))
    # radosgw forks once it has connected to the cluster and created its pools (its pid file is
    # then written); HTTP answers a moment later. The mount timeout bounds a monitor that does
    # not answer (300 s by default).
    radosgw -c "$conf" -n client.rgw.a --client-mount-timeout 20 --rgw-init-timeout 60 \
        --rgw-frontends "beast endpoint=127.0.0.1:$port" 2>>"$dir/client.rgw.a.stderr" ||
        { echo "cluster.sh: radosgw did not start: $(tail -n 5 "$dir/client.rgw.a.stderr")" >&2; exit 1; }
    # The pid is read at once: the daemon removes its pid file as it exits.
    local code=000 pid
    pid=$(cat "$dir/client.rgw.a.pid" 2>/dev/null || true)
    for _ in $(seq 300); do
        code=$(curl -s -o /dev/null -m 2 -w '%{http_code}' "$url/" || true)
        [ "$code" = 200 ] && break
        # A frontend that could not bind ends the daemon, not always at once.
        if { [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; } ||
            tail -c +"$log_start" "$log" 2>/dev/null | grep -q 'failed initializing frontend'; then
            break
        fi
        sleep 0.05
    done
    if [ "$code" != 200 ]; then
        # Beast logs a port it cannot bind ("Address already in use") and the daemon exits.
        echo "cluster.sh: radosgw does not answer on $url (HTTP $code): $(tail -c +"$log_start" "$log" 2>/dev/null |
            grep -m 3 -iE 'error|failed|in use')" >&2
        # Not left behind for a retry on another port.
        [ -z "$pid" ] || kill -9 "$pid" 2>/dev/null || true
        rm -f "$dir/client.rgw.a.pid"
        exit 1
    fi
    radosgw-admin -c "$conf" user create --uid "$rgw_uid" --display-name "flashpath tests" \
        --access-key "$rgw_access_key" --secret-key "$rgw_secret_key" >/dev/null
    printf '%s\n' "$url" "$rgw_access_key" "$rgw_secret_key"
}

if [ "$cmd" = stop ]; then
    stop
    exit 0
fi
if [ "$cmd" = rgw ]; then
    rgw "${3:-}"
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
# Pools created without a count (the RADOS Gateway's, seven or eight of them) get 8 placement
# groups: a quick peering on one OSD, and far below its limit of 250.
osd pool default pg num = 8
osd pool default pgp num = 8
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
[client.rgw.a]
# Used only when "cluster.sh rgw" starts the gateway. A daemon asks the monitor for a secure
# connection by default, which authentication none cannot give (it would retry until its
# mount timeout): crc is what the other clients use.
ms mon client mode = crc secure
admin socket = $dir/\$name.asok
rgw data = $dir/rgw.\$id
# No usage or ops logging, one frontend thread pool of modest size: a test gateway.
rgw enable usage log = false
rgw enable ops log = false
rgw thread pool size = 32
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
