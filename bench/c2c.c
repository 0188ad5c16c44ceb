/*
 * c2c: the round-trip time of one cache line between CPU 0 and CPU 1.
 *
 * Two threads, pinned to CPU 0 and CPU 1, take turns incrementing one shared counter, each
 * spinning until the other has written. That is the kind of cross-core traffic a polled
 * vhost-user-blk request causes (rings, descriptors, status byte). The program prints
 * nanoseconds per round trip.
 *
 *   cc -O2 -pthread bench/c2c.c -o /var/tmp/c2c && /var/tmp/c2c
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#define ROUNDS 200000L

static _Atomic long ball __attribute__((aligned(64)));

static void pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *pong(void *arg)
{
    (void)arg;
    pin(1);
    for (long i = 1; i <= ROUNDS; i++) {
        while (atomic_load_explicit(&ball, memory_order_acquire) != 2 * i - 1)
            ;
        atomic_store_explicit(&ball, 2 * i, memory_order_release);
    }
    return NULL;
}

int main(void)
{
    pthread_t t;
    struct timespec a, b;

    pin(0);
    pthread_create(&t, NULL, pong, NULL);
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 1; i <= ROUNDS; i++) {
        atomic_store_explicit(&ball, 2 * i - 1, memory_order_release);
        while (atomic_load_explicit(&ball, memory_order_acquire) != 2 * i)
            ;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    pthread_join(t, NULL);
    printf("%.0f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / ROUNDS);
    return 0;
}
