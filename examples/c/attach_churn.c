/* Multi-threaded churn for `heapdump attach` tests, started WITHOUT the shim: THREADS threads
 * (argv[1], default 4) make malloc/realloc/free calls at full speed, in rounds of ITERS
 * (argv[2], default 100,000) calls over a ring of 64 live blocks, writing and summing their
 * bytes; every round of a thread is the same (same seed), so its sum must be the same. Prints
 * "ready PID" once the threads run. Commands on stdin:
 *   h  hold: each thread finishes its round (its ring freed), then allocates HOLD blocks of
 *      known sizes (24 + 16 * (k % 40) bytes: glibc's usable size is the request, unless it
 *      handed out a chunk whose remainder was too small to split off) filled with
 *      a known byte, and waits; once all hold, prints "held ADDR..." (every held block, in
 *      hex) and "mallinfo UORDBLKS HBLKHD HBLKS" (glibc's mallinfo2 then);
 *   q  (or end of input) the threads finish their round (or check and free their held
 *      blocks), and it prints "sum S bad B" (S: the first rounds' sums, which do not depend
 *      on the timing; B: rounds whose sum differed from their thread's first plus held blocks
 *      whose bytes changed, 0 when every block held what was written), then exits 0. */
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HOLD 250

static long iters = 100000;
static volatile int stop, hold, holding;
static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;

struct result {
    unsigned long first, bad, rounds;
    unsigned char *held[HOLD];
};

static unsigned long round_sum(unsigned long id) {
    unsigned long seed = id * 2654435761u + 1, sum = 0;
    unsigned char *ring[64] = {0};
    for (long i = 0; i < iters; i++) {
        seed = seed * 6364136223846793005ul + 1442695040888963407ul;
        int k = (seed >> 33) % 64;
        size_t n = 1 + (seed >> 40) % 600;
        if (ring[k] && (seed & 1)) {
            ring[k] = realloc(ring[k], n);
        } else {
            free(ring[k]);
            ring[k] = malloc(n);
        }
        memset(ring[k], (int)(i & 0xff), n);
        sum += ring[k][n - 1] + ring[k][0] + n;
    }
    for (int k = 0; k < 64; k++) free(ring[k]);
    return sum;
}

static size_t held_size(unsigned long id, int k) { return 24 + 16 * ((id * HOLD + k) % 40); }

static void *churn(void *arg) {
    struct result *r = arg;
    unsigned long id = r->first;
    r->first = round_sum(id);
    r->rounds = 1;
    while (!stop && !hold) {
        if (round_sum(id) != r->first) r->bad++;
        r->rounds++;
    }
    if (!hold) return NULL;
    for (int k = 0; k < HOLD; k++) {
        r->held[k] = malloc(held_size(id, k));
        memset(r->held[k], (int)(id * 31 + k) & 0xff, held_size(id, k));
    }
    pthread_mutex_lock(&held_lock);
    holding++;
    pthread_mutex_unlock(&held_lock);
    while (!stop) usleep(1000);
    for (int k = 0; k < HOLD; k++) {
        for (size_t j = 0; j < held_size(id, k); j++) {
            if (r->held[k][j] != ((id * 31 + k) & 0xff)) {
                r->bad++;
                break;
            }
        }
        free(r->held[k]);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    if (threads > 64) threads = 64;
    if (argc > 2) iters = atol(argv[2]);
    pthread_t t[64];
    static struct result res[64];
    for (int i = 0; i < threads; i++) {
        res[i].first = i;
        pthread_create(&t[i], NULL, churn, &res[i]);
    }
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    char c;
    while (read(0, &c, 1) == 1 && c != 'q') {
        if (c != 'h' || hold) continue;
        hold = 1;
        for (;;) {
            pthread_mutex_lock(&held_lock);
            int n = holding;
            pthread_mutex_unlock(&held_lock);
            if (n == threads) break;
            usleep(1000);
        }
        printf("held");
        for (int i = 0; i < threads; i++)
            for (int k = 0; k < HOLD; k++) printf(" %p", (void *)res[i].held[k]);
        printf("\n");
        struct mallinfo2 mi = mallinfo2();
        printf("mallinfo %zu %zu %zu\n", mi.uordblks, mi.hblkhd, mi.hblks);
        fflush(stdout);
    }
    stop = 1;
    unsigned long total = 0, bad = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        total += res[i].first;
        bad += res[i].bad;
    }
    printf("sum %lu bad %lu\n", total, bad);
    return 0;
}
