/*
 * fpio: the guest's data tool. Writes and checks the same deterministic pattern as the Rust
 * test harness (crates/flashpath/tests/common/mod.rs, `pattern`), so the host can check the
 * guest's writes in the backing file and the guest can check data the host wrote.
 *
 *   fpio [-b] write  PATH OFFSET LEN SEED   write pattern(SEED) over [OFFSET, OFFSET+LEN), fsync
 *   fpio [-b] verify PATH OFFSET LEN SEED   read it back and compare; report the first difference
 *   fpio [-b] check-zero PATH OFFSET LEN    the range must read back as zeroes
 *   fpio discard PATH OFFSET LEN            BLKDISCARD (the device's discard)
 *   fpio write-zeroes PATH OFFSET LEN       BLKZEROOUT (write-zeroes, or zeroes written if the
 *                                           device has no write-zeroes command)
 *   fpio [-b] write-must-fail PATH OFFSET LEN   try a write (then fsync); succeed only if it is
 *                                           refused, printing "refused at open|write|fsync: ERRNO"
 *   fpio stamp-write PATH STATE FIRST COUNT  write stamped 4 KiB blocks of [FIRST, FIRST+COUNT)
 *                                           until SIGTERM, recording each acknowledged write in
 *                                           STATE (created if missing; a later run goes on);
 *                                           prints "stamp-write ready" once SIGTERM is handled
 *   fpio stamp-verify PATH STATE            re-read every block of STATE's range and check it
 *                                           against the last acknowledged stamp
 *
 * I/O is O_DIRECT (buffers aligned to 4 KiB, at most 1 MiB per call) unless -b is given, in
 * which case it goes through the page cache. Every 8-byte word of
 * the pattern is  (pos / 8) * 0x9e3779b97f4a7c15 ^ rotl(SEED, 17) ^ 0xa5a500000000_5a5a
 * stored little-endian, where pos is the word's byte offset: a block that lands in the wrong
 * place reads back as wrong. OFFSET and LEN must be multiples of 8.
 *
 * Exit status: 0 success, 1 data mismatch or unexpected success, 2 usage, 3 I/O error.
 * Built statically by build-image.sh; the guest has no libc of its own.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/fs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK (1u << 20)

static int buffered;

static uint64_t word_at(uint64_t seed, uint64_t pos)
{
	uint64_t rot = (seed << 17) | (seed >> (64 - 17));
	return (pos / 8) * 0x9e3779b97f4a7c15ull ^ rot ^ 0xa5a5000000005a5aull;
}

static void fill(unsigned char *buf, uint64_t seed, uint64_t off, size_t len)
{
	for (size_t i = 0; i < len; i += 8) {
		uint64_t w = word_at(seed, off + i);
		for (int b = 0; b < 8; b++)
			buf[i + b] = (unsigned char)(w >> (8 * b));
	}
}

static const char *errno_name(int e)
{
	switch (e) {
	case EIO: return "EIO";
	case EPERM: return "EPERM";
	case EACCES: return "EACCES";
	case EROFS: return "EROFS";
	case EINVAL: return "EINVAL";
	case ENOSPC: return "ENOSPC";
	case EBADF: return "EBADF";
	case ENXIO: return "ENXIO";
	default: return "other";
	}
}

/* A number (decimal, or hex with 0x); offsets and lengths must be multiples of 8. */
static uint64_t num(const char *s, const char *what)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || *end || end == s || ((!strcmp(what, "offset") || !strcmp(what, "length")) && v % 8)) {
		fprintf(stderr, "fpio: bad %s '%s'\n", what, s);
		exit(2);
	}
	return v;
}

static int open_dev(const char *path, int flags)
{
	if (!buffered)
		flags |= O_DIRECT;
	return open(path, flags);
}

static unsigned char *alloc(void)
{
	void *p;
	if (posix_memalign(&p, 4096, CHUNK)) {
		fprintf(stderr, "fpio: out of memory\n");
		exit(3);
	}
	return p;
}

static int do_write(const char *path, uint64_t off, uint64_t len, uint64_t seed)
{
	int fd = open_dev(path, O_WRONLY | O_CREAT);
	if (fd < 0) {
		fprintf(stderr, "fpio: open %s for writing: %s\n", path, strerror(errno));
		return 3;
	}
	unsigned char *buf = alloc();
	for (uint64_t done = 0; done < len;) {
		size_t n = len - done < CHUNK ? (size_t)(len - done) : CHUNK;
		fill(buf, seed, off + done, n);
		ssize_t w = pwrite(fd, buf, n, (off_t)(off + done));
		if (w != (ssize_t)n) {
			fprintf(stderr, "fpio: write of %zu bytes at %" PRIu64 " in %s: %s\n", n, off + done,
				path, w < 0 ? strerror(errno) : "short write");
			return 3;
		}
		done += n;
	}
	if (fsync(fd)) {
		fprintf(stderr, "fpio: fsync %s: %s\n", path, strerror(errno));
		return 3;
	}
	close(fd);
	return 0;
}

/* Compares [off, off + len) with pattern(seed), or with zeroes if `zero`. */
static int do_verify(const char *path, uint64_t off, uint64_t len, uint64_t seed, int zero)
{
	int fd = open_dev(path, O_RDONLY);
	if (fd < 0) {
		fprintf(stderr, "fpio: open %s for reading: %s\n", path, strerror(errno));
		return 3;
	}
	unsigned char *buf = alloc(), *want = alloc();
	for (uint64_t done = 0; done < len;) {
		size_t n = len - done < CHUNK ? (size_t)(len - done) : CHUNK;
		ssize_t r = pread(fd, buf, n, (off_t)(off + done));
		if (r != (ssize_t)n) {
			fprintf(stderr, "fpio: read of %zu bytes at %" PRIu64 " in %s: %s\n", n, off + done, path,
				r < 0 ? strerror(errno) : "short read");
			return 3;
		}
		if (zero)
			memset(want, 0, n);
		else
			fill(want, seed, off + done, n);
		if (memcmp(buf, want, n)) {
			size_t i = 0;
			while (buf[i] == want[i])
				i++;
			fprintf(stderr, "fpio: %s differs at offset %" PRIu64 ": got %#04x, want %#04x (%s)\n",
				path, off + done + i, buf[i], want[i], zero ? "zeroes" : "pattern");
			return 1;
		}
		done += n;
	}
	close(fd);
	return 0;
}

/* BLKDISCARD or BLKZEROOUT over [off, off + len). */
static int range_ioctl(const char *path, unsigned long req, const char *name, uint64_t off, uint64_t len)
{
	int fd = open(path, O_WRONLY);
	if (fd < 0) {
		fprintf(stderr, "fpio: open %s: %s\n", path, strerror(errno));
		return 3;
	}
	uint64_t range[2] = { off, len };
	if (ioctl(fd, req, range)) {
		fprintf(stderr, "fpio: %s of [%" PRIu64 ", +%" PRIu64 ") on %s: %s\n", name, off, len, path,
			strerror(errno));
		return 3;
	}
	close(fd);
	return 0;
}

static int write_must_fail(const char *path, uint64_t off, uint64_t len)
{
	int fd = open_dev(path, O_WRONLY);
	if (fd < 0) {
		printf("refused at open: %s\n", errno_name(errno));
		return 0;
	}
	unsigned char *buf = alloc();
	memset(buf, 0x5a, len < CHUNK ? len : CHUNK);
	ssize_t w = pwrite(fd, buf, len < CHUNK ? len : CHUNK, (off_t)off);
	if (w < 0) {
		printf("refused at write: %s\n", errno_name(errno));
		return 0;
	}
	if (fsync(fd)) {
		printf("refused at fsync: %s\n", errno_name(errno));
		return 0;
	}
	fprintf(stderr, "fpio: a write of %zd bytes at %" PRIu64 " to %s succeeded\n", w, off, path);
	return 1;
}

/*
 * Stamped blocks, for the live-migration tests. A writer writes 4 KiB blocks of a range, one to
 * eight neighbours per O_DIRECT write, until SIGTERM. Every block of a write carries the write's
 * sequence number: it is pattern(seq) over the block's own offset with its first four words
 * replaced by STAMP_MAGIC, the block index, seq and ~seq, so a block that is torn, stale or in the
 * wrong place reads back as wrong. STATE is a file in the guest's tmpfs (guest RAM, which
 * migrates with the guest): the writer stores each write's range and seq there before it
 * submits it (the one write "in flight") and each block's seq once the write is acknowledged.
 * The verifier expects every block to hold its last acknowledged seq (no seq: zeroes); only a
 * block of the write in flight may hold either that or the new seq (the verifier then records
 * which, so the next run goes on from what the disk holds). Both print one line with a
 * digest (FNV-1a over each block's seq as 8 little-endian bytes, in block order) that the host
 * computes from the backing file to check it holds the same data.
 */
#define STAMP_BLOCK 4096u
#define STAMP_MAGIC 0x4b4c42474d495046ull /* "FPIMGBLK" little-endian */
#define STAMP_NONE UINT64_MAX

struct stamp_state {
	uint64_t magic, first, count;
	uint64_t next_seq;            /* the seq of the next write */
	uint64_t writes;              /* acknowledged writes, all runs */
	uint64_t inflight_first, inflight_n, inflight_seq; /* STAMP_NONE: nothing in flight */
	uint64_t seq[];               /* per block of the range: last acknowledged seq, 0 none */
};

static volatile sig_atomic_t stop_writing;
static void on_term(int sig)
{
	(void)sig;
	stop_writing = 1;
}

static void stamp_fill(unsigned char *buf, uint64_t block, uint64_t seq)
{
	fill(buf, seq, block * STAMP_BLOCK, STAMP_BLOCK);
	uint64_t head[4] = { STAMP_MAGIC, block, seq, ~seq };
	for (int w = 0; w < 4; w++)
		for (int b = 0; b < 8; b++)
			buf[8 * w + b] = (unsigned char)(head[w] >> (8 * b));
}

/* Maps STATE; creates it for [first, first + count) when `create` and it does not exist. */
static struct stamp_state *stamp_map(const char *path, int create, uint64_t first, uint64_t count)
{
	int fd = open(path, O_RDWR | (create ? O_CREAT : 0), 0600);
	struct stat st;
	if (fd < 0 || fstat(fd, &st)) {
		fprintf(stderr, "fpio: state %s: %s\n", path, strerror(errno));
		exit(3);
	}
	if (st.st_size && (size_t)st.st_size < sizeof(struct stamp_state)) {
		fprintf(stderr, "fpio: state %s is too short\n", path);
		exit(3);
	}
	size_t len = sizeof(struct stamp_state) + (st.st_size ? (st.st_size - sizeof(struct stamp_state)) : count * 8);
	int fresh = st.st_size == 0;
	if (fresh && (!create || ftruncate(fd, (off_t)len))) {
		fprintf(stderr, "fpio: state %s is empty\n", path);
		exit(3);
	}
	struct stamp_state *s = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (s == MAP_FAILED) {
		fprintf(stderr, "fpio: mmap %s: %s\n", path, strerror(errno));
		exit(3);
	}
	close(fd);
	if (fresh) {
		s->magic = STAMP_MAGIC;
		s->first = first;
		s->count = count;
		s->next_seq = 1;
		s->inflight_first = s->inflight_n = s->inflight_seq = STAMP_NONE;
	} else if (s->magic != STAMP_MAGIC || len != sizeof(*s) + s->count * 8 ||
		   (create && (s->first != first || s->count != count))) {
		fprintf(stderr, "fpio: state %s does not match\n", path);
		exit(3);
	}
	return s;
}

static int stamp_write(const char *path, const char *state, uint64_t first, uint64_t count)
{
	if (count == 0) {
		fprintf(stderr, "fpio: an empty range\n");
		return 2;
	}
	struct stamp_state *s = stamp_map(state, 1, first, count);
	if (s->inflight_seq != STAMP_NONE) {
		fprintf(stderr, "fpio: %s has a write in flight; stamp-verify settles it first\n", state);
		return 2;
	}
	struct sigaction sa = { .sa_handler = on_term };
	sigaction(SIGTERM, &sa, NULL);
	/* From here SIGTERM stops the writer cleanly; before, it would kill it: say so. */
	printf("stamp-write ready\n");
	fflush(stdout);
	int fd = open(path, O_WRONLY | O_DIRECT);
	if (fd < 0) {
		fprintf(stderr, "fpio: open %s: %s\n", path, strerror(errno));
		return 3;
	}
	unsigned char *buf = alloc();
	uint64_t start_seq = s->next_seq, rng = s->next_seq * 0x9e3779b97f4a7c15ull + first;
	while (!stop_writing) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		uint64_t i = (rng >> 33) % count, n = 1 + ((rng >> 20) & 7);
		if (i + n > count)
			n = count - i;
		uint64_t seq = s->next_seq++;
		for (uint64_t k = 0; k < n; k++)
			stamp_fill(buf + k * STAMP_BLOCK, first + i + k, seq);
		s->inflight_first = i;
		s->inflight_n = n;
		s->inflight_seq = seq;
		ssize_t w = pwrite(fd, buf, n * STAMP_BLOCK, (off_t)((first + i) * STAMP_BLOCK));
		if (w != (ssize_t)(n * STAMP_BLOCK)) {
			/* Not acknowledged: it stays in flight for the verifier. */
			fprintf(stderr, "fpio: stamp write of block %" PRIu64 " (+%" PRIu64 ") seq %" PRIu64 ": %s\n",
				first + i, n, seq, w < 0 ? strerror(errno) : "short write");
			return 3;
		}
		for (uint64_t k = 0; k < n; k++)
			s->seq[i + k] = seq;
		s->writes++;
		s->inflight_first = s->inflight_n = s->inflight_seq = STAMP_NONE;
	}
	printf("stamp-write first=%" PRIu64 " count=%" PRIu64 " seqs=%" PRIu64 "..%" PRIu64 " writes=%" PRIu64 "\n",
	       first, count, start_seq, s->next_seq - 1, s->writes);
	return 0;
}

/* Whether `buf` is block `block` stamped with `seq` (0: all zeroes). */
static int stamp_is(const unsigned char *buf, unsigned char *want, uint64_t block, uint64_t seq)
{
	if (seq == 0)
		memset(want, 0, STAMP_BLOCK);
	else
		stamp_fill(want, block, seq);
	return !memcmp(buf, want, STAMP_BLOCK);
}

static uint64_t read_le64(const unsigned char *p)
{
	uint64_t v = 0;
	for (int b = 7; b >= 0; b--)
		v = v << 8 | p[b];
	return v;
}

static int stamp_verify(const char *path, const char *state)
{
	struct stamp_state *s = stamp_map(state, 0, 0, 0);
	int fd = open(path, O_RDONLY | O_DIRECT);
	if (fd < 0) {
		fprintf(stderr, "fpio: open %s: %s\n", path, strerror(errno));
		return 3;
	}
	unsigned char *buf = alloc(), *want = alloc();
	uint64_t per = CHUNK / STAMP_BLOCK, written = 0, newer = 0, digest = 0xcbf29ce484222325ull;
	for (uint64_t i = 0; i < s->count; i += per) {
		uint64_t n = s->count - i < per ? s->count - i : per;
		ssize_t r = pread(fd, buf, n * STAMP_BLOCK, (off_t)((s->first + i) * STAMP_BLOCK));
		if (r != (ssize_t)(n * STAMP_BLOCK)) {
			fprintf(stderr, "fpio: read at block %" PRIu64 ": %s\n", s->first + i,
				r < 0 ? strerror(errno) : "short read");
			return 3;
		}
		for (uint64_t k = 0; k < n; k++) {
			uint64_t idx = i + k, block = s->first + idx, seq = s->seq[idx];
			const unsigned char *b = buf + k * STAMP_BLOCK;
			int inflight = s->inflight_seq != STAMP_NONE && idx >= s->inflight_first &&
				       idx < s->inflight_first + s->inflight_n;
			if (!stamp_is(b, want, block, seq)) {
				if (inflight && stamp_is(b, want, block, s->inflight_seq)) {
					/* Settled: the next run starts from what the disk holds. */
					seq = s->seq[idx] = s->inflight_seq;
					newer++;
				} else {
					uint64_t got = read_le64(b) == STAMP_MAGIC ? read_le64(b + 16) : 0;
					fprintf(stderr,
						"fpio: block %" PRIu64 " of %s holds %s%" PRIu64 ", want seq %" PRIu64
						"%s\n",
						block, path, read_le64(b) == STAMP_MAGIC ? "seq " : "no stamp, ", got,
						seq, inflight ? " or the write in flight's" : "");
					return 1;
				}
			}
			written += seq != 0;
			for (int byte = 0; byte < 8; byte++)
				digest = (digest ^ ((seq >> (8 * byte)) & 0xff)) * 0x100000001b3ull;
		}
	}
	printf("stamp-verify first=%" PRIu64 " count=%" PRIu64 " written=%" PRIu64 " writes=%" PRIu64
	       " inflight=%s newer=%" PRIu64 " digest=%016" PRIx64 "\n",
	       s->first, s->count, written, s->writes, s->inflight_seq == STAMP_NONE ? "none" : "one", newer, digest);
	s->inflight_first = s->inflight_n = s->inflight_seq = STAMP_NONE;
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	int a = 1;
	if (a < argc && !strcmp(argv[a], "-b")) {
		buffered = 1;
		a++;
	}
	if (argc - a == 5 && !strcmp(argv[a], "write"))
		return do_write(argv[a + 1], num(argv[a + 2], "offset"), num(argv[a + 3], "length"),
				num(argv[a + 4], "seed"));
	if (argc - a == 5 && !strcmp(argv[a], "verify"))
		return do_verify(argv[a + 1], num(argv[a + 2], "offset"), num(argv[a + 3], "length"),
				 num(argv[a + 4], "seed"), 0);
	if (argc - a == 4 && !strcmp(argv[a], "check-zero"))
		return do_verify(argv[a + 1], num(argv[a + 2], "offset"), num(argv[a + 3], "length"), 0, 1);
	if (argc - a == 4 && !strcmp(argv[a], "discard"))
		return range_ioctl(argv[a + 1], BLKDISCARD, "discard", num(argv[a + 2], "offset"),
				   num(argv[a + 3], "length"));
	if (argc - a == 4 && !strcmp(argv[a], "write-zeroes"))
		return range_ioctl(argv[a + 1], BLKZEROOUT, "write-zeroes", num(argv[a + 2], "offset"),
				   num(argv[a + 3], "length"));
	if (argc - a == 4 && !strcmp(argv[a], "write-must-fail"))
		return write_must_fail(argv[a + 1], num(argv[a + 2], "offset"), num(argv[a + 3], "length"));
	if (argc - a == 5 && !strcmp(argv[a], "stamp-write"))
		return stamp_write(argv[a + 1], argv[a + 2], num(argv[a + 3], "first block"),
				   num(argv[a + 4], "block count"));
	if (argc - a == 3 && !strcmp(argv[a], "stamp-verify"))
		return stamp_verify(argv[a + 1], argv[a + 2]);
	fprintf(stderr, "usage: fpio [-b] write|verify PATH OFFSET LEN SEED\n"
			"       fpio [-b] check-zero|write-must-fail PATH OFFSET LEN\n"
			"       fpio discard|write-zeroes PATH OFFSET LEN\n"
			"       fpio stamp-write PATH STATE FIRST COUNT\n"
			"       fpio stamp-verify PATH STATE\n");
	return 2;
}
