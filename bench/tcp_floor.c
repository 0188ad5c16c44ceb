/*
 * tcp_floor: the NVMe/TCP floor, the least a server can do for an NVMe/TCP host's 4 KiB reads
 * on this machine. It speaks just enough of the protocol for SPDK's spdk_nvme_perf and
 * flashpath's bdev_nvme_attach_controller to connect and read: ICReq/ICResp, Fabrics Connect,
 * Property Get/Set, and the admin commands those hosts send, answered with fixed data (one
 * namespace of --blocks blocks); each read is answered with the PDUs flashpath's and SPDK's
 * targets send by default, one C2HData flagged LAST_PDU and SUCCESS and no CapsuleResp (--resp:
 * C2HData then CapsuleResp), its data from one static buffer. No NVMe logic beyond that: no
 * checks but those that keep the hosts talking, no bdev, no copy.
 *
 * The system calls are the kind flashpath's target makes: one thread pinned to the server core
 * (the caller's taskset), per round a non-blocking recv() on every connection into its receive
 * buffer and one gathered sendmsg() per connection with something to send; after 200 us
 * without work it sleeps in epoll_wait() (flashpath's reactor's idle window). --epoll: per
 * round one epoll_wait(timeout 0) and a recv() on the ready connections only (SPDK's posix
 * sock group). Connections are accepted, TCP_NODELAY set and their ICReq answered by a second
 * thread (flashpath's accept and handshake threads), then handed to the polling thread.
 *
 *   tcp_floor [--port P] [--blocks N] [--block-size B] [--epoll] [--resp]
 *
 * Prints "tcp_floor: listening on 127.0.0.1:PORT" once it accepts (PORT 0: any free port).
 * Built by bench/fpbench/floor.py: cc -O2 -pthread bench/tcp_floor.c -o tcp_floor
 *
 * Layouts: NVMe/TCP Transport Specification 1.0 ("TCP"): common header 3.6.1 (Figure 10),
 * ICReq 3.6.2.1, ICResp 3.6.2.2, CapsuleCmd 3.6.2.5, CapsuleResp 3.6.2.6, H2CData 3.6.2.7,
 * C2HData 3.6.2.8 (SUCCESS: no CapsuleResp follows), R2T 3.6.2.9. NVMe over Fabrics 1.1
 * ("Fabrics"): Connect 3.3 (Figures 19-21), Property Get/Set 3.4/3.5, Identify Controller's
 * fabrics fields (IOCCSZ, IORCSZ, ICDOFF, MSDBD) 4.1. NVMe Base 1.4 ("Base"): Identify 5.15,
 * Set/Get Features 5.21/5.9 (Number of Queues 5.21.1.7, Keep Alive Timer 5.21.1.15),
 * properties 3.1 (CAP, VS, CC, CSTS), completion queue entry 4.6.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* PDU types (TCP 3.6.1, Figure 11) and flags. */
enum { ICREQ = 0, ICRESP = 1, H2C_TERM = 2, CMD = 4, RSP = 5, H2C_DATA = 6, C2H_DATA = 7, R2T = 9 };
enum { F_LAST_PDU = 0x04, F_SUCCESS = 0x08 };
enum { CH_LEN = 8, IC_LEN = 128, CMD_HLEN = 72, RSP_LEN = 24, DATA_HLEN = 24 };
/* The largest transfer: MDTS 5 with 4 KiB pages (Base 5.15.2.1); also MAXH2CDATA. */
#define MAX_DATA (128 * 1024)
/* In-capsule data on I/O queues (SPDK's and flashpath's default): IOCCSZ = (64 + 4096) / 16. */
#define ICD 4096
#define MAX_CONNS 64
#define RX_CAP (256 * 1024)
#define MAX_IOV 1024
#define HDR_SLOTS 512
#define ADMIN_BUFS 4
#define IDLE_NS 200000LL

struct conn {
    int fd;
    uint16_t qid, sqsize, sqhd, cntlid;
    int dead;
    size_t rx_len, rx_off;
    int iov_head, iov_n; /* iovecs not yet sent: out[iov_head .. iov_head + iov_n) */
    int hdr_n;           /* headers written since the send queue was last empty */
    int admin_next;
    uint8_t rx[RX_CAP];
    struct iovec out[MAX_IOV];
    uint8_t hdr[HDR_SLOTS][32];
    uint8_t admin[ADMIN_BUFS][4096];
};

static uint8_t read_data[MAX_DATA] __attribute__((aligned(4096)));
static uint64_t blocks = 1 << 21;
static uint32_t block_shift = 9;
static int use_epoll, send_resp;
static char subnqn[256];
static uint16_t next_cntlid = 1;
static uint64_t cc;
static uint32_t kato;

static struct conn *conns[MAX_CONNS];
static int nconns;
static int ep, wake_fd;
/* Accepted connections on their way from the accept thread (one producer, one consumer). */
static int handoff[MAX_CONNS];
static _Atomic unsigned handoff_head, handoff_tail;

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p) { return get16(p) | (uint32_t)get16(p + 2) << 16; }
static uint64_t get64(const uint8_t *p) { return get32(p) | (uint64_t)get32(p + 4) << 32; }
static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { put16(p, (uint16_t)v); put16(p + 2, (uint16_t)(v >> 16)); }
static void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)v); put32(p + 4, (uint32_t)(v >> 32)); }

static void ch(uint8_t *h, uint8_t type, uint8_t flags, uint8_t hlen, uint8_t pdo, uint32_t plen)
{
    h[0] = type, h[1] = flags, h[2] = hlen, h[3] = pdo;
    put32(h + 4, plen);
}

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void push(struct conn *c, void *base, size_t len)
{
    c->out[c->iov_head + c->iov_n].iov_base = base;
    c->out[c->iov_head + c->iov_n].iov_len = len;
    c->iov_n++;
}

static uint8_t *new_hdr(struct conn *c)
{
    uint8_t *h = c->hdr[c->hdr_n++];
    memset(h, 0, 32);
    return h;
}

/* A CapsuleResp (TCP 3.6.2.6) with a successful completion (Base 4.6): DW0/DW1, SQHD, SQID, CID. */
static void respond(struct conn *c, uint16_t cid, uint32_t dw0, uint32_t dw1)
{
    uint8_t *h = new_hdr(c);
    ch(h, RSP, 0, RSP_LEN, 0, RSP_LEN);
    put32(h + 8, dw0);
    put32(h + 12, dw1);
    put16(h + 16, c->sqhd);
    put16(h + 18, c->qid);
    put16(h + 20, cid);
    push(c, h, RSP_LEN);
}

/* One C2HData PDU (TCP 3.6.2.8) carrying `len` bytes of `data`: LAST_PDU, and SUCCESS unless
 * --resp, which sends a CapsuleResp after it. */
static void send_data(struct conn *c, uint16_t cid, const void *data, uint32_t len)
{
    uint8_t *h = new_hdr(c);
    ch(h, C2H_DATA, F_LAST_PDU | (send_resp ? 0 : F_SUCCESS), DATA_HLEN, DATA_HLEN, DATA_HLEN + len);
    put16(h + 8, cid);
    put32(h + 16, len); /* DATAO 0 at 12, DATAL */
    push(c, h, DATA_HLEN);
    push(c, (void *)data, len);
    if (send_resp)
        respond(c, cid, 0, 0);
}

static void r2t(struct conn *c, uint16_t cid, uint32_t len)
{
    uint8_t *h = new_hdr(c);
    ch(h, R2T, 0, DATA_HLEN, 0, DATA_HLEN);
    put16(h + 8, cid);
    put16(h + 10, cid); /* TTAG: the command's own identifier */
    put32(h + 16, len); /* R2TO 0 at 12, R2TL */
    push(c, h, DATA_HLEN);
}

static void ascii(uint8_t *p, size_t len, const char *s)
{
    memset(p, ' ', len);
    memcpy(p, s, strlen(s) < len ? strlen(s) : len);
}

/* Identify data (Base 5.15): the controller (CNS 01h), namespace 1 (CNS 00h), the active
 * namespace list (CNS 02h); anything else is zeros. */
static void identify(uint8_t *b, uint8_t cns, uint32_t nsid, uint16_t cntlid)
{
    memset(b, 0, 4096);
    if (cns == 0x01) {
        ascii(b + 4, 20, "FLOOR0001");
        ascii(b + 24, 40, "tcp_floor");
        ascii(b + 64, 8, "1");
        b[77] = 5; /* MDTS: 2^5 pages of 4 KiB */
        put16(b + 78, cntlid);
        put32(b + 80, 0x00010300); /* VER 1.3 */
        b[111] = 1;                 /* CNTRLTYPE: I/O controller */
        b[258] = 3;                 /* ACL */
        b[259] = 3;                 /* AERL */
        put16(b + 320, 1);          /* KAS: 100 ms units */
        b[512] = 0x66;              /* SQES */
        b[513] = 0x44;              /* CQES */
        put16(b + 514, 128);        /* MAXCMD */
        put32(b + 516, 1);          /* NN */
        put32(b + 536, 1 | 1u << 20 | 1u << 21); /* SGLS: supported, offsets, transport data block */
        memcpy(b + 768, subnqn, 255);
        put32(b + 1792, (64 + ICD) / 16); /* IOCCSZ (Fabrics 4.1) */
        put32(b + 1796, 1);               /* IORCSZ */
        b[1803] = 1;                      /* MSDBD */
    } else if (cns == 0x00 && nsid == 1) {
        put64(b, blocks);      /* NSZE */
        put64(b + 8, blocks);  /* NCAP */
        put64(b + 16, blocks); /* NUSE */
        put32(b + 128, block_shift << 16); /* LBAF0: LBADS, no metadata */
    } else if (cns == 0x02 && nsid < 1) {
        put32(b, 1);
    }
}

static uint64_t property(uint32_t ofst)
{
    switch (ofst) {
    case 0x00: /* CAP: MQES 127, CQR, TO 500 ms, CSS NVM */
        return 127 | 1u << 16 | 1u << 24 | 1ull << 37;
    case 0x08:
        return 0x00010300;
    case 0x14:
        return cc;
    case 0x1c: /* CSTS: RDY follows CC.EN, SHST complete once a shutdown is asked for */
        return (cc & 1) | (((cc >> 14) & 3) ? 2u << 2 : 0);
    default:
        return 0;
    }
}

/* Number of Queues granted: what was asked, at most 63 each (zero-based fields). */
static uint32_t queues(uint32_t asked)
{
    uint32_t sq = asked & 0xffff, cq = asked >> 16;
    return (sq < 62 ? sq : 62) | (cq < 62 ? cq : 62) << 16;
}

static void admin_command(struct conn *c, const uint8_t *sqe, uint16_t cid, uint32_t len)
{
    uint8_t opc = sqe[0];
    uint32_t nsid = get32(sqe + 4), cdw10 = get32(sqe + 40), cdw11 = get32(sqe + 44);
    uint8_t *buf = c->admin[c->admin_next++ % ADMIN_BUFS];
    if (len > 4096)
        len = 4096;
    switch (opc) {
    case 0x06: /* Identify */
        identify(buf, (uint8_t)cdw10, nsid, c->cntlid);
        send_data(c, cid, buf, len);
        return;
    case 0x09: /* Set Features */
        if ((cdw10 & 0xff) == 0x07) {
            respond(c, cid, queues(cdw11), 0);
            return;
        }
        if ((cdw10 & 0xff) == 0x0f)
            kato = cdw11;
        respond(c, cid, 0, 0);
        return;
    case 0x0a: /* Get Features */
        if ((cdw10 & 0xff) == 0x07)
            respond(c, cid, queues(62 | 62 << 16), 0);
        else
            respond(c, cid, (cdw10 & 0xff) == 0x0f ? kato : 0, 0);
        return;
    case 0x0c: /* Asynchronous Event Request: held, never completed */
        return;
    default:
        /* Keep Alive and the rest: success; a command that reads data gets zeros. */
        if ((opc & 3) == 2 && len) {
            memset(buf, 0, len);
            send_data(c, cid, buf, len);
        } else {
            respond(c, cid, 0, 0);
        }
    }
}

/* One CapsuleCmd (TCP 3.6.2.5); `data` its in-capsule data, `icd` bytes of it. */
static int command(struct conn *c, const uint8_t *sqe, const uint8_t *data, uint32_t icd)
{
    uint8_t opc = sqe[0];
    uint16_t cid = get16(sqe + 2);
    uint32_t len = get32(sqe + 24 + 8); /* the SGL descriptor's length (Base 4.4) */
    c->sqhd = (uint16_t)((c->sqhd + 1) % (c->sqsize ? c->sqsize : 1));
    if (opc == 0x7f) { /* Fabrics */
        uint8_t fctype = sqe[4];
        if (fctype == 0x01) { /* Connect: Fabrics Figures 19 and 20 */
            uint16_t cntlid;
            if (icd < 1024)
                return -1;
            c->qid = get16(sqe + 42);
            c->sqsize = (uint16_t)(get16(sqe + 44) + 1);
            c->sqhd = 1 % c->sqsize;
            if (c->qid == 0) {
                kato = get32(sqe + 48);
                memcpy(subnqn, data + 256, 255);
                cntlid = next_cntlid++;
            } else {
                cntlid = get16(data + 16);
            }
            c->cntlid = cntlid;
            respond(c, cid, cntlid, 0);
        } else if (fctype == 0x04) { /* Property Get */
            uint64_t v = property(get32(sqe + 44));
            respond(c, cid, (uint32_t)v, (sqe[40] & 7) ? (uint32_t)(v >> 32) : 0);
        } else {
            if (fctype == 0x00 && get32(sqe + 44) == 0x14) /* Property Set of CC */
                cc = get64(sqe + 48);
            respond(c, cid, 0, 0);
        }
        return 0;
    }
    if (c->qid == 0) {
        admin_command(c, sqe, cid, len);
        return 0;
    }
    if (opc == 0x02) { /* Read */
        if (len > MAX_DATA)
            return -1;
        send_data(c, cid, read_data, len);
    } else if (opc == 0x01 && len > icd) { /* Write without in-capsule data: ask for it */
        r2t(c, cid, len);
    } else {
        respond(c, cid, 0, 0);
    }
    return 0;
}

/* The whole PDUs in the receive buffer; stops early when the send queue is full. */
static int parse(struct conn *c)
{
    while (c->rx_len - c->rx_off >= CH_LEN) {
        const uint8_t *p = c->rx + c->rx_off;
        uint32_t plen = get32(p + 4);
        if (plen < CH_LEN || plen > RX_CAP)
            return -1;
        if (c->rx_len - c->rx_off < plen)
            break;
        if (c->iov_head + c->iov_n + 4 > MAX_IOV || c->hdr_n + 2 > HDR_SLOTS)
            break;
        switch (p[0]) {
        case CMD:
            if (plen < CMD_HLEN)
                return -1;
            if (command(c, p + CH_LEN, p + (p[3] ? p[3] : plen), plen - (p[3] ? p[3] : plen)) < 0)
                return -1;
            break;
        case H2C_DATA: /* data of a write, discarded; the last PDU completes the write */
            if (p[1] & F_LAST_PDU)
                respond(c, get16(p + 8), 0, 0);
            break;
        default: /* H2CTermReq or anything unexpected: the end of the connection */
            return -1;
        }
        c->rx_off += plen;
    }
    /* Room for the largest PDU (MAXH2CDATA of data and its header) after what is left. */
    if (c->rx_off == c->rx_len) {
        c->rx_off = c->rx_len = 0;
    } else if (c->rx_off && RX_CAP - c->rx_len < MAX_DATA + 256) {
        memmove(c->rx, c->rx + c->rx_off, c->rx_len - c->rx_off);
        c->rx_len -= c->rx_off;
        c->rx_off = 0;
    }
    return 0;
}

/* One gathered sendmsg of what the connection has queued; 1 if something went. */
static int flush(struct conn *c)
{
    struct msghdr m = {0};
    ssize_t n;
    if (!c->iov_n)
        return 0;
    m.msg_iov = c->out + c->iov_head;
    m.msg_iovlen = c->iov_n < 1024 ? c->iov_n : 1024;
    n = sendmsg(c->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0)
        return errno == EAGAIN ? 0 : -1;
    while (n > 0) {
        struct iovec *v = &c->out[c->iov_head];
        if ((size_t)n >= v->iov_len) {
            n -= (ssize_t)v->iov_len;
            c->iov_head++, c->iov_n--;
        } else {
            v->iov_base = (uint8_t *)v->iov_base + n;
            v->iov_len -= (size_t)n;
            n = 0;
        }
    }
    if (!c->iov_n) {
        c->iov_head = c->hdr_n = 0;
    } else if (c->iov_head > MAX_IOV / 2) {
        memmove(c->out, c->out + c->iov_head, sizeof(c->out[0]) * (size_t)c->iov_n);
        c->iov_head = 0;
    }
    return 1;
}

/* A non-blocking recv into the connection's buffer and what it completes; 1 if bytes came,
 * -1 when the connection ended. */
static int receive(struct conn *c)
{
    ssize_t n;
    if (c->rx_len == RX_CAP) /* whole PDUs a full send queue left behind: no room to receive */
        return parse(c);
    n = recv(c->fd, c->rx + c->rx_len, RX_CAP - c->rx_len, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN))
        return -1;
    if (n < 0)
        return parse(c); /* a full send queue may have left whole PDUs behind */
    c->rx_len += (size_t)n;
    return parse(c) < 0 ? -1 : 1;
}

static void drop(int i)
{
    close(conns[i]->fd);
    free(conns[i]);
    conns[i] = conns[--nconns];
}

static void take_new(void)
{
    unsigned tail = atomic_load_explicit(&handoff_tail, memory_order_acquire);
    unsigned head = atomic_load_explicit(&handoff_head, memory_order_relaxed);
    for (; head != tail; head++) {
        int fd = handoff[head % MAX_CONNS];
        struct conn *c = calloc(1, sizeof(*c));
        struct epoll_event e = {.events = EPOLLIN};
        if (!c || nconns == MAX_CONNS) {
            close(fd);
            free(c);
            continue;
        }
        c->fd = fd;
        c->sqsize = 1;
        e.data.ptr = c;
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
        conns[nconns++] = c;
    }
    atomic_store_explicit(&handoff_head, head, memory_order_release);
}

/* The accept thread: TCP_NODELAY, the ICReq read and the ICResp written (TCP 3.6.2.1-2), both
 * blocking with a bound, then the connection handed to the polling thread. */
static void *acceptor(void *arg)
{
    int lfd = *(int *)arg;
    for (;;) {
        uint8_t req[IC_LEN], resp[IC_LEN] = {0};
        struct timeval tv = {.tv_sec = 10};
        int one = 1, fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        uint64_t w = 1;
        size_t got = 0;
        if (fd < 0) { /* out of descriptors, say: not a spin */
            usleep(1000);
            continue;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        while (got < IC_LEN) {
            ssize_t n = recv(fd, req + got, IC_LEN - got, 0);
            if (n <= 0)
                break;
            got += (size_t)n;
        }
        if (got < IC_LEN || req[0] != ICREQ) {
            close(fd);
            continue;
        }
        /* PFV 0, CPDA 0, no digests, MAXH2CDATA. */
        ch(resp, ICRESP, 0, IC_LEN, 0, IC_LEN);
        put32(resp + 12, MAX_DATA);
        if (send(fd, resp, IC_LEN, MSG_NOSIGNAL) != IC_LEN) {
            close(fd);
            continue;
        }
        unsigned tail = atomic_load_explicit(&handoff_tail, memory_order_relaxed);
        while (tail - atomic_load_explicit(&handoff_head, memory_order_acquire) >= MAX_CONNS)
            usleep(1000);
        handoff[tail % MAX_CONNS] = fd;
        atomic_store_explicit(&handoff_tail, tail + 1, memory_order_release);
        if (write(wake_fd, &w, sizeof w) < 0)
            perror("tcp_floor: eventfd");
    }
    return NULL;
}

static void run(void)
{
    struct epoll_event evs[MAX_CONNS + 1];
    long long idle_since = 0;
    unsigned empty = 0;
    for (;;) {
        int worked = 0, i;
        if (atomic_load_explicit(&handoff_tail, memory_order_acquire) !=
            atomic_load_explicit(&handoff_head, memory_order_relaxed))
            take_new();
        if (use_epoll) {
            int n = epoll_wait(ep, evs, MAX_CONNS + 1, 0);
            for (i = 0; i < n; i++) {
                struct conn *c = evs[i].data.ptr;
                int r;
                if (!c) { /* the accept thread's wake-up */
                    uint64_t v;
                    if (read(wake_fd, &v, sizeof v) < 0 && errno != EAGAIN)
                        perror("tcp_floor: eventfd");
                    continue;
                }
                r = receive(c);
                c->dead |= r < 0;
                worked |= r > 0;
            }
        } else {
            for (i = 0; i < nconns; i++) {
                int r = receive(conns[i]);
                conns[i]->dead |= r < 0;
                worked |= r > 0;
            }
        }
        for (i = 0; i < nconns; i++) {
            struct conn *c = conns[i];
            int r = c->dead ? -1 : flush(c);
            /* PDUs a full send queue left behind (--epoll reads only sockets with new bytes). */
            if (r >= 0 && use_epoll && c->rx_off != c->rx_len)
                r = parse(c) < 0 ? -1 : r;
            if (r < 0)
                drop(i--);
            else
                worked |= r;
        }
        if (worked) {
            empty = 0;
            continue;
        }
        /* Idle: after the idle window, sleep until a connection or the accept thread wakes us
         * (the clock is read every 64 empty rounds: the vDSO's, no system call). */
        if (empty++ == 0)
            idle_since = now_ns();
        if (empty % 64 || now_ns() - idle_since < IDLE_NS)
            continue;
        epoll_wait(ep, evs, MAX_CONNS + 1, 100);
        uint64_t v;
        if (read(wake_fd, &v, sizeof v) < 0 && errno != EAGAIN)
            perror("tcp_floor: eventfd");
        idle_since = now_ns();
        empty = 0;
    }
}

int main(int argc, char **argv)
{
    int port = 0, lfd, one = 1, i;
    uint32_t bs = 512;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    pthread_t t;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--port") && i + 1 < argc)
            port = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--blocks") && i + 1 < argc)
            blocks = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--block-size") && i + 1 < argc)
            bs = (uint32_t)strtoul(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--epoll"))
            use_epoll = 1;
        else if (!strcmp(argv[i], "--resp"))
            send_resp = 1;
        else {
            fprintf(stderr, "usage: tcp_floor [--port P] [--blocks N] [--block-size B] [--epoll] [--resp]\n");
            return 2;
        }
    }
    for (block_shift = 9; (1u << block_shift) < bs && block_shift < 16; block_shift++)
        ;
    if ((1u << block_shift) != bs || !blocks) {
        fprintf(stderr, "tcp_floor: --block-size must be a power of two from 512 to 65536, --blocks above 0\n");
        return 2;
    }
    lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    a.sin_port = htons((uint16_t)port);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) < 0 || listen(lfd, 64) < 0 ||
        getsockname(lfd, (struct sockaddr *)&a, &alen) < 0) {
        perror("tcp_floor: listen");
        return 1;
    }
    ep = epoll_create1(EPOLL_CLOEXEC);
    wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    {
        struct epoll_event e = {.events = EPOLLIN, .data.ptr = NULL};
        if (ep < 0 || wake_fd < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, wake_fd, &e) < 0) {
            perror("tcp_floor: epoll");
            return 1;
        }
    }
    if (pthread_create(&t, NULL, acceptor, &lfd)) {
        fprintf(stderr, "tcp_floor: no accept thread\n");
        return 1;
    }
    printf("tcp_floor: listening on 127.0.0.1:%d\n", ntohs(a.sin_port));
    fflush(stdout);
    run();
    return 0;
}
