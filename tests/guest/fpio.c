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
#include <sys/ioctl.h>
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
	if (errno || *end || end == s || (strcmp(what, "seed") && v % 8)) {
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
	fprintf(stderr, "usage: fpio [-b] write|verify PATH OFFSET LEN SEED\n"
			"       fpio [-b] check-zero|write-must-fail PATH OFFSET LEN\n"
			"       fpio discard|write-zeroes PATH OFFSET LEN\n");
	return 2;
}
