# shellcheck shell=bash
# Sourced by ./run: ./run demo. Needs scripts/lib.sh and scripts/install.sh.

# rpc METHOD [JSON]: one JSON-RPC call through the daemon's own client.
rpc() {
    "$BIN/flashpath" --rpc "$DEMO_WORK/rpc.sock" rpc "$@"
}

demo_cleanup() {
    local rc=$?
    if [ -n "${DAEMON_PID:-}" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
        kill -TERM "$DAEMON_PID" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$DAEMON_PID" 2>/dev/null || true
    fi
    if [ $rc -ne 0 ] && [ -f "${DEMO_WORK:-/nonexistent}/daemon.log" ]; then
        echo "---- daemon log (last 40 lines) ----" >&2
        tail -n 40 "$DEMO_WORK/daemon.log" >&2
    fi
    [ -n "${DEMO_WORK:-}" ] && rm -rf "$DEMO_WORK"
    exit $rc
}

cmd_demo() {
    ensure_toolchain
    local ncpu
    ncpu=$(nproc)
    local client_cpu=1
    if [ "$ncpu" -lt 2 ]; then
        echo "run: only one CPU: the client shares CPU 0 with the daemon (figures will be low)"
        client_cpu=0
    fi

    say "cargo build --release (flashpath, fp-load)"
    cargo build --release -p flashpath -p fp-loadgen
    BIN=$(target_dir)/release
    [ -x "$BIN/flashpath" ] && [ -x "$BIN/fp-load" ] || die "build did not produce $BIN/flashpath and $BIN/fp-load"

    # Not /tmp: it may be a tmpfs, which has no O_DIRECT for the file disk.
    DEMO_WORK=$(mktemp -d "${DEMO_DIR:-/var/tmp}/flashpath-demo.XXXXXX")
    trap demo_cleanup EXIT
    local vhost_dir=$DEMO_WORK/vhost
    local disk_img=$DEMO_WORK/disk.img
    local time=${DEMO_TIME:-3}

    say "preparing a 256 MiB file disk (random data, so reads hit real blocks) in $DEMO_WORK"
    head -c $((256 << 20)) /dev/urandom >"$disk_img"
    sync "$disk_img" 2>/dev/null || sync

    say "starting flashpath serve --cpus 0"
    "$BIN/flashpath" serve --cpus 0 --rpc "$DEMO_WORK/rpc.sock" --vhost-dir "$vhost_dir" \
        >"$DEMO_WORK/daemon.log" 2>&1 &
    DAEMON_PID=$!
    for _ in $(seq 200); do
        rpc bdev_get_bdevs >/dev/null 2>&1 && break
        kill -0 "$DAEMON_PID" 2>/dev/null || die "the daemon exited during start-up"
        sleep 0.1
    done
    rpc bdev_get_bdevs >/dev/null || die "the daemon does not answer on $DEMO_WORK/rpc.sock"

    rpc bdev_malloc_create '{"name": "Malloc0", "num_blocks": 524288, "block_size": 512}' >/dev/null
    rpc bdev_uring_create "{\"name\": \"Uring0\", \"filename\": \"$disk_img\"}" >/dev/null
    rpc vhost_create_blk_controller '{"ctrlr": "vhost.ram", "dev_name": "Malloc0"}' >/dev/null
    rpc vhost_create_blk_controller '{"ctrlr": "vhost.file", "dev_name": "Uring0"}' >/dev/null
    echo "RAM disk  (256 MiB): $vhost_dir/vhost.ram"
    echo "file disk (256 MiB): $vhost_dir/vhost.file  ($disk_img, io_uring)"

    # A RAM disk allocates its pages on first write and reads of untouched pages all hit the
    # kernel's shared zero page, which would flatter the read figures: write it all first.
    say "filling the RAM disk (sequential 128 KiB writes, wrapping, 2 s)"
    "$BIN/fp-load" --socket "$vhost_dir/vhost.ram" --pattern write --bs 128k --qd 8 --time 2 \
        --cpu "$client_cpu" --label fill --brief

    say "fp-load on CPU $client_cpu, 4 KiB, ${time}s per run (completion-fd queues, like a guest)"
    "$BIN/fp-load" --brief-header
    local disk pattern qd
    for disk in ram file; do
        for pattern in randread randwrite; do
            for qd in 1 32; do
                "$BIN/fp-load" --socket "$vhost_dir/vhost.$disk" --pattern "$pattern" --bs 4k \
                    --qd "$qd" --time "$time" --cpu "$client_cpu" --label "$disk" --brief
            done
        done
    done

    say "attaching a disk to a VM"
    cat <<EOF
With a daemon left running (default sockets: RPC /var/tmp/flashpath.sock, vhost-user sockets
in /var/tmp/flashpath/):

  $BIN/flashpath serve --cpus 0 &
  $BIN/flashpath rpc bdev_malloc_create '{"name": "Malloc0", "num_blocks": 524288, "block_size": 512}'
  $BIN/flashpath rpc vhost_create_blk_controller '{"ctrlr": "vhost.0", "dev_name": "Malloc0"}'

a VM attaches the disk like this; its RAM must be shared memory (memfd, share=on) so the
daemon can reach the guest's buffers:

  qemu-system-x86_64 -machine q35,accel=kvm,memory-backend=mem0 -cpu host -smp 2 -m 2G \\
      -object memory-backend-memfd,id=mem0,size=2G,share=on \\
      -chardev socket,id=vhost0,path=/var/tmp/flashpath/vhost.0 \\
      -device vhost-user-blk-pci,chardev=vhost0 \\
      -drive file=guest.qcow2,if=virtio -nographic

The controller offers 64 queues; QEMU uses one per vCPU (2 here), both on the daemon's one
reactor. Add num-queues=N to the -device line to use fewer.
EOF

    say "stopping the daemon"
    kill -TERM "$DAEMON_PID"
    local status=0
    wait "$DAEMON_PID" || status=$?
    DAEMON_PID=
    echo "flashpath serve exited with status $status"
}
