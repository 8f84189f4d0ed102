// An LD_PRELOAD shim that shifts the wall clock (CLOCK_REALTIME) of the process it is
// loaded into, by an offset that another process changes while it runs: dlm-testkit's
// `ClockSkew` (src/skew.rs) compiles it and starts redis-servers with it.
//
// The offset (signed 64-bit nanoseconds, native byte order) lives in the file named by
// CLOCKSKEW_FILE, mapped MAP_SHARED: a test writes 8 bytes there and the server sees the
// jump on its next clock read. The real time comes from the raw clock_gettime system
// call, not from dlsym: Debian's redis-server is linked with jemalloc, whose early calls
// must not recurse through the dynamic loader.
//
// Overridden: clock_gettime (CLOCK_REALTIME and CLOCK_REALTIME_COARSE only; every other
// clock, the monotonic ones included, is left alone), gettimeofday and time. Redis takes
// the time for key expiry, stream IDs (XADD *) and TIME from gettimeofday.
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile int64_t *skew_ns = 0;
static int ready = 0;

static void init(void) {
    if (__atomic_exchange_n(&ready, 1, __ATOMIC_ACQ_REL)) return;
    const char *path = getenv("CLOCKSKEW_FILE");
    if (!path) return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    void *m = mmap(0, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m != MAP_FAILED) skew_ns = (volatile int64_t *)m;
}

__attribute__((constructor)) static void on_load(void) { init(); }

static int64_t skew(void) {
    init();
    return skew_ns ? __atomic_load_n(skew_ns, __ATOMIC_RELAXED) : 0;
}

static void shift(struct timespec *ts) {
    int64_t ns = (int64_t)ts->tv_sec * 1000000000LL + ts->tv_nsec + skew();
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += 1000000000LL;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int r = (int)syscall(SYS_clock_gettime, clock, ts);
    if (r == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) shift(ts);
    return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    int r = clock_gettime(CLOCK_REALTIME, &ts);
    if (r == 0 && tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return r;
}

time_t time(time_t *t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
