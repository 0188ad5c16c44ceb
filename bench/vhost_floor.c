// The vhost-user floor: the least a vhost-user-blk back end must do per request, as a
// reference for the reactor busy time per I/O of flashpath's and SPDK's vhost targets.
//
// One client at a time on a Unix socket, one queue, a "null" disk of --blocks 512-byte sectors.
// The control plane takes exactly what fp-load's own frontend sends (QEMU's vhost-user
// protocol, docs/interop/vhost-user.rst) and drops a client on anything else. The data path is
// one busy-polling thread (pin it with taskset): each round reads avail->idx; each new chain
// (split ring, virtio 1.x) is walked through the one memory region, its header read, its
// status byte written (0 for reads and writes, nothing copied; UNSUPP otherwise) and its used
// element written; after the batch a release store of used->idx, a fence, and a call-eventfd
// write when the driver did not set VRING_AVAIL_F_NO_INTERRUPT (virtio 1.2 §2.7.10, the
// textbook order). Two variants, to measure what flashpath does differently:
//   --lazy-calls: the driver's flags are read without the fence first, and a driver that set
//     NO_INTERRUPT is looked at again each round (a load) until it clears the flag, when the
//     fence, a second look and the call follow: a polling driver costs no fence.
//   --predict: when new requests show, the last request's head descriptor and header are
//     prefetched, a guess that holds for a driver at low depth: their misses then overlap the
//     available ring's instead of following it.
// The back end never wants kicks (VRING_USED_F_NO_NOTIFY) and never reads the kick eventfd.
// The control socket is looked at only when the ring is idle.
//
// Busy accounting as a reactor counts it: a TSC read at each round's start; a round that
// completed a request adds its ticks to `busy`, others to `idle`. --stats PATH: a 4 KiB file of
// u64 busy_ticks, idle_ticks, requests, tick_hz.
//
// cc -O2 -Wall -pthread -o vhost_floor vhost_floor.c
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

// vhost-user requests (front end to back end).
enum {
    GET_FEATURES = 1,
    SET_FEATURES = 2,
    SET_OWNER = 3,
    SET_MEM_TABLE = 5,
    SET_VRING_NUM = 8,
    SET_VRING_ADDR = 9,
    SET_VRING_BASE = 10,
    GET_VRING_BASE = 11,
    SET_VRING_KICK = 12,
    SET_VRING_CALL = 13,
    GET_PROTOCOL_FEATURES = 15,
    SET_PROTOCOL_FEATURES = 16,
    GET_QUEUE_NUM = 17,
    SET_VRING_ENABLE = 18,
    GET_CONFIG = 24,
};

#define MSG_VERSION 0x1u
#define MSG_REPLY 0x4u
#define MSG_NEED_REPLY 0x8u
#define VRING_NOFD (1u << 8)

#define F_VERSION_1 (1ull << 32)
#define F_PROTOCOL_FEATURES (1ull << 30)
#define BLK_F_BLK_SIZE (1ull << 6)
#define OFFERED (F_VERSION_1 | F_PROTOCOL_FEATURES | BLK_F_BLK_SIZE)
#define PF_MQ (1ull << 0)
#define PF_CONFIG (1ull << 9)
#define PROTO_OFFERED (PF_MQ | PF_CONFIG)

#define DESC_F_NEXT 1
#define DESC_F_WRITE 2
#define DESC_F_INDIRECT 4
#define AVAIL_F_NO_INTERRUPT 1
#define USED_F_NO_NOTIFY 1

#define BLK_T_IN 0
#define BLK_T_OUT 1
#define BLK_S_OK 0
#define BLK_S_IOERR 1
#define BLK_S_UNSUPP 2

#define MAX_PAYLOAD 4096
#define IDLE_ROUNDS_PER_CONTROL_POLL 4096

struct msg_hdr {
    uint32_t request, flags, size;
} __attribute__((packed));

struct desc {
    uint64_t addr;
    uint32_t len;
    uint16_t flags, next;
};

struct used_elem {
    uint32_t id, len;
};

struct blk_hdr {
    uint32_t type, reserved;
    uint64_t sector;
};

struct stats {
    uint64_t busy_ticks, idle_ticks, requests, tick_hz;
};

// The client's one memory region and its one queue.
struct conn {
    int fd;
    uint8_t *map;
    size_t map_len;
    uint64_t gpa, size, uva; // guest physical and front-end virtual base, length
    uint8_t *base;           // the region's first byte here (map + mmap_offset)
    uint16_t num, last_avail, used_idx;
    uint64_t desc_uva, avail_uva, used_uva;
    struct desc *desc;
    volatile uint16_t *avail; // flags, idx, ring[num]
    volatile uint16_t *used_flags, *used_idx_p;
    volatile struct used_elem *used_ring;
    int kick, call;
    int enabled, has_addr;
    uint16_t signalled; // the used index the driver was last told of
    uint16_t last_head;
    const void *last_hdr;
    int unsettled;      // a look without a fence declined a call: look again each round
};

static int lazy_calls, predict;

static uint64_t blocks;
static volatile struct stats *st;

// The fenced decision: calls the driver if it wants to hear of what was published since the
// last call. After the fence our used->idx is visible, so a driver enabling calls later sees it.
static void settle(struct conn *c) {
    c->unsettled = 0;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (c->call >= 0 && c->signalled != c->used_idx && !(c->avail[0] & AVAIL_F_NO_INTERRUPT)) {
        c->signalled = c->used_idx;
        uint64_t one = 1;
        if (write(c->call, &one, 8) < 0) {
            // EAGAIN: the counter is full, the driver will see the used ring anyway.
        }
    }
}

static void close_fd(int *fd) {
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static void drop(struct conn *c, const char *why) {
    if (why)
        fprintf(stderr, "vhost_floor: dropping the client: %s\n", why);
    if (c->map)
        munmap(c->map, c->map_len);
    close_fd(&c->kick);
    close_fd(&c->call);
    close_fd(&c->fd);
    memset(c, 0, sizeof *c);
    c->fd = c->kick = c->call = -1;
}

// A pointer to `len` bytes at guest physical address `gpa`, or NULL outside the region.
static inline void *gpa_ptr(const struct conn *c, uint64_t gpa, uint64_t len) {
    if (gpa < c->gpa || len > c->size || gpa - c->gpa > c->size - len)
        return NULL;
    return c->base + (gpa - c->gpa);
}

static void *uva_ptr(const struct conn *c, uint64_t uva, uint64_t len) {
    if (!c->base || uva < c->uva || len > c->size || uva - c->uva > c->size - len)
        return NULL;
    return c->base + (uva - c->uva);
}

static int send_reply(struct conn *c, uint32_t req, const void *payload, uint32_t size) {
    uint8_t buf[sizeof(struct msg_hdr) + MAX_PAYLOAD];
    struct msg_hdr h = {req, MSG_VERSION | MSG_REPLY, size};
    memcpy(buf, &h, sizeof h);
    memcpy(buf + sizeof h, payload, size);
    ssize_t n = send(c->fd, buf, sizeof h + size, MSG_NOSIGNAL);
    return n == (ssize_t)(sizeof h + size) ? 0 : -1;
}

static int reply_u64(struct conn *c, uint32_t req, uint64_t v) {
    return send_reply(c, req, &v, sizeof v);
}

// Points the queue at the region once both the ring addresses and the memory are known.
static int map_ring(struct conn *c) {
    uint64_t n = c->num;
    c->desc = uva_ptr(c, c->desc_uva, 16 * n);
    uint16_t *avail = uva_ptr(c, c->avail_uva, 6 + 2 * n);
    uint8_t *used = uva_ptr(c, c->used_uva, 6 + 8 * n);
    if (!c->desc || !avail || !used)
        return -1;
    c->avail = avail;
    c->used_flags = (volatile uint16_t *)used;
    c->used_idx_p = (volatile uint16_t *)(used + 2);
    c->used_ring = (volatile struct used_elem *)(used + 4);
    // A polling back end: the driver need not kick.
    *c->used_flags = USED_F_NO_NOTIFY;
    return 0;
}

// One control message; 0 to go on, -1 to drop the client (after saying why on stderr). The
// fds it keeps are set to -1 in `fds`; the caller closes the rest.
static int handle(struct conn *c, struct msg_hdr *h, uint8_t *p, int *fds, int nfds) {
    uint64_t u64 = 0;
    if (h->size >= 8)
        memcpy(&u64, p, 8);
    if (h->flags & MSG_NEED_REPLY) {
        fprintf(stderr, "vhost_floor: request %u asks for a reply ack (REPLY_ACK is not offered)\n", h->request);
        return -1;
    }
    switch (h->request) {
    case SET_OWNER:
    case SET_FEATURES:
    case SET_PROTOCOL_FEATURES:
        if (h->request != SET_OWNER && h->size != 8)
            break;
        if (h->request == SET_FEATURES && (u64 & ~OFFERED))
            break;
        if (h->request == SET_PROTOCOL_FEATURES && (u64 & ~PROTO_OFFERED))
            break;
        return 0;
    case GET_FEATURES:
        return reply_u64(c, h->request, OFFERED);
    case GET_PROTOCOL_FEATURES:
        return reply_u64(c, h->request, PROTO_OFFERED);
    case GET_QUEUE_NUM:
        return reply_u64(c, h->request, 1);
    case GET_CONFIG: {
        // offset, size, flags, then the config space (virtio-blk: capacity at 0, blk_size at 20).
        uint32_t off, len;
        if (h->size < 12)
            break;
        memcpy(&off, p, 4);
        memcpy(&len, p + 4, 4);
        if (h->size != 12 + len || len > MAX_PAYLOAD - 12 || off > 64 || len > 64 - off)
            break;
        uint8_t cfg[64] = {0};
        uint32_t blk_size = 512;
        memcpy(cfg, &blocks, 8);
        memcpy(cfg + 20, &blk_size, 4);
        memcpy(p + 12, cfg + off, len);
        return send_reply(c, h->request, p, h->size);
    }
    case SET_MEM_TABLE: {
        // nregions, padding, then { guest_phys_addr, memory_size, userspace_addr, mmap_offset }.
        uint32_t nreg;
        uint64_t r[4];
        if (h->size < 8 + 32)
            break;
        memcpy(&nreg, p, 4);
        if (nreg != 1 || nfds != 1 || c->map) {
            fprintf(stderr, "vhost_floor: SET_MEM_TABLE: one region with one fd, once (got %u regions, %d fds)\n",
                    nreg, nfds);
            return -1;
        }
        memcpy(r, p + 8, 32);
        uint64_t len = r[1] + r[3];
        if (r[1] == 0 || len < r[1]) {
            fprintf(stderr, "vhost_floor: SET_MEM_TABLE: bad region size\n");
            return -1;
        }
        // A region past the file's end would fault (SIGBUS) at the first touch: refused here.
        struct stat sb;
        if (fstat(fds[0], &sb) || (uint64_t)sb.st_size < len) {
            fprintf(stderr, "vhost_floor: SET_MEM_TABLE: the region ends past its file's end\n");
            return -1;
        }
        void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
        close(fds[0]);
        fds[0] = -1;
        if (m == MAP_FAILED) {
            fprintf(stderr, "vhost_floor: SET_MEM_TABLE: mmap: %s\n", strerror(errno));
            return -1;
        }
        c->map = m;
        c->map_len = len;
        c->gpa = r[0];
        c->size = r[1];
        c->uva = r[2];
        c->base = c->map + r[3];
        return 0;
    }
    case SET_VRING_NUM:
    case SET_VRING_BASE:
    case SET_VRING_ENABLE:
    case GET_VRING_BASE: {
        uint32_t idx, num;
        if (h->size != 8)
            break;
        memcpy(&idx, p, 4);
        memcpy(&num, p + 4, 4);
        if (idx != 0)
            break;
        if (h->request == SET_VRING_NUM) {
            if (num == 0 || num > 32768 || (num & (num - 1)) || c->has_addr)
                break;
            c->num = num;
        } else if (h->request == SET_VRING_BASE) {
            c->last_avail = c->used_idx = c->signalled = (uint16_t)num;
        } else if (h->request == SET_VRING_ENABLE) {
            if (num && !c->has_addr)
                break;
            c->enabled = num != 0;
        } else {
            // Stops the ring and tells where it stopped, deciding a call first.
            if (c->unsettled)
                settle(c);
            c->enabled = 0;
            num = c->last_avail;
            memcpy(p + 4, &num, 4);
            return send_reply(c, h->request, p, 8);
        }
        return 0;
    }
    case SET_VRING_ADDR: {
        // index, flags, desc, used, avail, log (front-end virtual addresses).
        uint32_t idx;
        uint64_t a[4];
        if (h->size != 40)
            break;
        memcpy(&idx, p, 4);
        memcpy(a, p + 8, 32);
        if (idx != 0 || c->num == 0)
            break;
        c->desc_uva = a[0];
        c->used_uva = a[1];
        c->avail_uva = a[2];
        if (map_ring(c)) {
            fprintf(stderr, "vhost_floor: SET_VRING_ADDR: the ring is not inside the memory table\n");
            return -1;
        }
        c->has_addr = 1;
        return 0;
    }
    case SET_VRING_KICK:
    case SET_VRING_CALL: {
        if (h->size != 8 || (u64 & 0xff) != 0)
            break;
        int want = (u64 & VRING_NOFD) ? 0 : 1;
        if (nfds != want)
            break;
        int *slot = h->request == SET_VRING_KICK ? &c->kick : &c->call;
        close_fd(slot);
        if (want) {
            *slot = fds[0];
            fds[0] = -1;
        }
        return 0;
    }
    default:
        fprintf(stderr, "vhost_floor: request %u is not served here\n", h->request);
        return -1;
    }
    fprintf(stderr, "vhost_floor: request %u: malformed (size %u)\n", h->request, h->size);
    return -1;
}

// Reads and handles one message if there is one (`block`: wait for it). 1 if one was
// handled, 0 if none was waiting, -1 when the client is gone or was dropped.
static int control(struct conn *c, int block) {
    struct msg_hdr h;
    uint8_t payload[MAX_PAYLOAD];
    int fds[8], nfds = 0;
    char cbuf[CMSG_SPACE(sizeof fds)];
    struct iovec iov = {&h, sizeof h};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
    ssize_t n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC | (block ? 0 : MSG_DONTWAIT));
    if (n < 0 && !block && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            int k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            memcpy(fds + nfds, CMSG_DATA(cm), k * sizeof(int));
            nfds += k;
        }
    }
    if (n <= 0) {
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        drop(c, n < 0 ? strerror(errno) : NULL); // 0: the client closed its end
        return -1;
    }
    if (n != sizeof h || (mh.msg_flags & MSG_CTRUNC) || (h.flags & 0x3) != MSG_VERSION || h.size > MAX_PAYLOAD) {
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        drop(c, "malformed message header");
        return -1;
    }
    size_t got = 0;
    while (got < h.size) {
        ssize_t k = recv(c->fd, payload + got, h.size - got, 0);
        if (k <= 0) {
            for (int i = 0; i < nfds; i++)
                close(fds[i]);
            drop(c, "short message");
            return -1;
        }
        got += k;
    }
    int bad = handle(c, &h, payload, fds, nfds);
    for (int i = 0; i < nfds; i++) // the ones the request did not keep
        if (fds[i] >= 0)
            close(fds[i]);
    if (bad) {
        drop(c, "bad request");
        return -1;
    }
    return 1;
}

// Serves the chains made available since the last round; how many.
static inline unsigned serve(struct conn *c) {
    if (c->unsettled && !(c->avail[0] & AVAIL_F_NO_INTERRUPT))
        settle(c);
    uint16_t avail_idx = __atomic_load_n(&c->avail[1], __ATOMIC_ACQUIRE);
    uint16_t mask = c->num - 1;
    unsigned done = 0;
    if (predict && c->last_avail != avail_idx && c->last_hdr) {
        __builtin_prefetch(&c->desc[c->last_head]);
        __builtin_prefetch(c->last_hdr, 1);
    }
    while (c->last_avail != avail_idx) {
        uint16_t head = c->avail[2 + (c->last_avail & mask)];
        c->last_avail++;
        uint8_t status = BLK_S_OK;
        uint32_t written = 0, data = 0;
        uint8_t *status_p = NULL;
        const struct blk_hdr *bh = NULL;
        uint16_t i = head;
        // header, data..., status; at most `num` descriptors in a chain.
        for (unsigned n = 0; n < c->num; n++) {
            if (i >= c->num)
                break;
            const struct desc *d = &c->desc[i];
            uint16_t fl = d->flags;
            if (fl & DESC_F_INDIRECT)
                break;
            if (!bh) {
                bh = gpa_ptr(c, d->addr, sizeof *bh);
                if (!bh || d->len < sizeof *bh || (fl & DESC_F_WRITE))
                    break;
            } else if (!(fl & DESC_F_NEXT)) {
                status_p = (fl & DESC_F_WRITE) && d->len >= 1 ? gpa_ptr(c, d->addr, 1) : NULL;
                break;
            } else {
                if (!gpa_ptr(c, d->addr, d->len))
                    break;
                data += d->len;
            }
            if (!(fl & DESC_F_NEXT))
                break;
            i = d->next;
        }
        c->last_head = head;
        c->last_hdr = bh;
        if (bh && status_p) {
            uint32_t type = bh->type;
            uint64_t sector = bh->sector;
            if (type == BLK_T_IN || type == BLK_T_OUT) {
                if ((data & 511) || sector > blocks || (data >> 9) > blocks - sector)
                    status = BLK_S_IOERR;
                else if (type == BLK_T_IN)
                    written = data;
            } else {
                status = BLK_S_UNSUPP;
            }
            *status_p = status;
            written += 1;
        }
        // A chain without a header or a status byte goes back untouched (length 0).
        volatile struct used_elem *u = &c->used_ring[c->used_idx & mask];
        u->id = head;
        u->len = written;
        c->used_idx++;
        done++;
    }
    if (done) {
        __atomic_store_n(c->used_idx_p, c->used_idx, __ATOMIC_RELEASE);
        if (!lazy_calls || !(c->avail[0] & AVAIL_F_NO_INTERRUPT))
            settle(c);
        else
            c->unsettled = 1;
    }
    return done;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static uint64_t tick_hz(void) {
    uint64_t n0 = now_ns(), t0 = __rdtsc();
    struct timespec d = {0, 100 * 1000 * 1000};
    while (nanosleep(&d, &d) && errno == EINTR) {
    }
    uint64_t n1 = now_ns(), t1 = __rdtsc();
    return (uint64_t)((double)(t1 - t0) * 1e9 / (double)(n1 - n0));
}

static void usage(void) {
    fprintf(stderr, "usage: vhost_floor --socket PATH --blocks N [--stats PATH] [--lazy-calls] [--predict]\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *sock_path = NULL, *stats_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--socket") && i + 1 < argc)
            sock_path = argv[++i];
        else if (!strcmp(argv[i], "--blocks") && i + 1 < argc)
            blocks = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--stats") && i + 1 < argc)
            stats_path = argv[++i];
        else if (!strcmp(argv[i], "--lazy-calls"))
            lazy_calls = 1;
        else if (!strcmp(argv[i], "--predict"))
            predict = 1;
        else
            usage();
    }
    if (!sock_path || !blocks)
        usage();
    signal(SIGPIPE, SIG_IGN);

    static struct stats scratch;
    st = &scratch;
    if (stats_path) {
        int sfd = open(stats_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (sfd < 0 || ftruncate(sfd, 4096)) {
            perror("vhost_floor: stats file");
            return 1;
        }
        void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, sfd, 0);
        if (m == MAP_FAILED) {
            perror("vhost_floor: stats mmap");
            return 1;
        }
        close(sfd);
        st = m;
    }
    st->tick_hz = tick_hz();

    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(sock_path) >= sizeof sa.sun_path) {
        fprintf(stderr, "vhost_floor: socket path too long\n");
        return 1;
    }
    strcpy(sa.sun_path, sock_path);
    unlink(sock_path);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) || listen(lfd, 4)) {
        perror("vhost_floor: listen");
        return 1;
    }
    printf("vhost_floor: listening on %s\n", sock_path);
    fflush(stdout);

    struct conn c;
    memset(&c, 0, sizeof c);
    c.fd = c.kick = c.call = -1;
    uint64_t busy = 0, idle = 0, requests = 0;
    for (;;) {
        c.fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (c.fd < 0) {
            if (errno != EINTR)
                perror("vhost_floor: accept");
            continue;
        }
        // Set-up: block on the socket until the queue is enabled.
        while (c.fd >= 0 && !c.enabled)
            control(&c, 1);
        // The busy loop. One TSC read per round: the round that began at `t0` ends at the next.
        uint64_t t0 = __rdtsc();
        unsigned idle_rounds = 0;
        while (c.fd >= 0) {
            unsigned done = c.enabled ? serve(&c) : 0;
            uint64_t t1 = __rdtsc();
            if (done) {
                busy += t1 - t0;
                requests += done;
                st->busy_ticks = busy;
                st->requests = requests;
            } else {
                idle += t1 - t0;
                if (++idle_rounds == IDLE_ROUNDS_PER_CONTROL_POLL) {
                    idle_rounds = 0;
                    st->idle_ticks = idle;
                    // Blocks while the queue is stopped (GET_VRING_BASE, then the close).
                    while (control(&c, !c.enabled) > 0 && !c.enabled) {
                    }
                    t1 = __rdtsc(); // a wait for the next client is nobody's time
                }
            }
            t0 = t1;
        }
        st->idle_ticks = idle;
    }
}
