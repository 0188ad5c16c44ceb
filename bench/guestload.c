/*
 * guestload: the migration benchmark's in-guest load, 4 KiB random writes with O_DIRECT kept
 * at a fixed queue depth through Linux native AIO (io_submit / io_getevents, raw system calls:
 * no libaio, so the static binary needs nothing else in the guest's initramfs).
 *
 *   guestload DEVICE QD      runs until killed; each completion is replaced at once
 *
 * It prints nothing while it runs: the host reads the guest's progress from the disk's
 * completed-writes counter (/proc/diskstats), which the benchmark's init prints every second.
 * Built by bench/fpbench/guest.py: cc -O2 -static bench/guestload.c -o guestload
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/aio_abi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <linux/fs.h>
#include <unistd.h>

#define BS 4096
#define MAXQD 256

static uint64_t rng = 0x9e3779b97f4a7c15ull;

/* splitmix64: offsets spread over the whole device. */
static uint64_t next_rand(void)
{
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: guestload DEVICE QD\n");
        return 2;
    }
    int qd = atoi(argv[2]);
    if (qd < 1 || qd > MAXQD) {
        fprintf(stderr, "guestload: QD must be 1..%d\n", MAXQD);
        return 2;
    }
    int fd = open(argv[1], O_RDWR | O_DIRECT);
    if (fd < 0) {
        perror("guestload: open");
        return 1;
    }
    uint64_t size = 0;
    if (ioctl(fd, BLKGETSIZE64, &size) != 0 || size < BS) {
        perror("guestload: BLKGETSIZE64");
        return 1;
    }
    uint64_t blocks = size / BS;
    aio_context_t ctx = 0;
    if (syscall(SYS_io_setup, qd, &ctx) != 0) {
        perror("guestload: io_setup");
        return 1;
    }
    static struct iocb cbs[MAXQD];
    struct iocb *ptrs[MAXQD];
    char *bufs;
    if (posix_memalign((void **)&bufs, BS, (size_t)qd * BS) != 0)
        return 1;
    memset(bufs, 0xa5, (size_t)qd * BS);
    for (int i = 0; i < qd; i++) {
        memset(&cbs[i], 0, sizeof cbs[i]);
        cbs[i].aio_fildes = fd;
        cbs[i].aio_lio_opcode = IOCB_CMD_PWRITE;
        cbs[i].aio_buf = (uint64_t)(uintptr_t)(bufs + (size_t)i * BS);
        cbs[i].aio_nbytes = BS;
        cbs[i].aio_offset = (int64_t)((next_rand() % blocks) * BS);
        cbs[i].aio_data = i;
        ptrs[i] = &cbs[i];
    }
    if (syscall(SYS_io_submit, ctx, qd, ptrs) != qd) {
        perror("guestload: io_submit");
        return 1;
    }
    struct io_event evs[MAXQD];
    for (;;) {
        long n = syscall(SYS_io_getevents, ctx, 1, qd, evs, NULL);
        if (n < 0)
            continue; /* EINTR */
        for (long e = 0; e < n; e++) {
            if (evs[e].res != BS) {
                fprintf(stderr, "guestload: write failed: %lld\n", (long long)evs[e].res);
                return 1;
            }
            struct iocb *cb = &cbs[evs[e].data];
            cb->aio_offset = (int64_t)((next_rand() % blocks) * BS);
            ptrs[e] = cb;
        }
        if (syscall(SYS_io_submit, ctx, n, ptrs) != n) {
            perror("guestload: io_submit");
            return 1;
        }
    }
}
