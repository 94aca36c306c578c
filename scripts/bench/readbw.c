/* Read bandwidth of this machine: T threads each sum their share of a buffer far larger than the
 * caches, the best of several passes. What a decode step that reads every weight once per token
 * can reach at most. Usage: readbw [threads] [MiB]; prints GB/s (10^9 bytes a second). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct job { const uint64_t *p; size_t n; uint64_t sum; };

static void *sum(void *arg) {
    struct job *j = arg;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= j->n; i += 4) { a += j->p[i]; b += j->p[i + 1]; c += j->p[i + 2]; d += j->p[i + 3]; }
    j->sum = a + b + c + d;
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 2048;
    if (threads < 1 || threads > 256 || mib < 64) { fprintf(stderr, "readbw [threads] [MiB >= 64]\n"); return 2; }
    size_t words = mib * 1024 * 1024 / 8;
    uint64_t *buf = malloc(words * 8);
    if (!buf) { fprintf(stderr, "no memory for %zu MiB\n", mib); return 1; }
    for (size_t i = 0; i < words; i++) buf[i] = i * 2654435761u;
    pthread_t t[256];
    struct job jobs[256];
    double best = 0;
    uint64_t check = 0;
    for (int pass = 0; pass < 6; pass++) {
        double t0 = now();
        for (int k = 0; k < threads; k++) {
            size_t per = words / threads;
            jobs[k] = (struct job){ buf + k * per, per, 0 };
            pthread_create(&t[k], NULL, sum, &jobs[k]);
        }
        for (int k = 0; k < threads; k++) { pthread_join(t[k], NULL); check += jobs[k].sum; }
        double gbs = words * 8.0 / (now() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    printf("%.2f\n", best);
    fprintf(stderr, "readbw: %d threads, %zu MiB, best of 6 passes (checksum %llu)\n", threads, mib,
            (unsigned long long)(check & 0xffff));
    free(buf);
    return 0;
}
