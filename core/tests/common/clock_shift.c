/* Shifts a process's wall clock while it runs, for tests of Redis clock steps.
 * Loaded into redis-server with LD_PRELOAD; DELAYQ_CLOCK_SHIFT_FILE names a file of
 * 8 bytes, a native-endian signed count of milliseconds, added to every reading of
 * CLOCK_REALTIME (clock_gettime, gettimeofday, time). The file is mapped, so the test
 * steps the clock by rewriting it. Monotonic clocks are left alone, as a real step
 * leaves them. libfaketime does more and crashes Debian's redis-server at start. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile int64_t *shift_ms;

static int64_t shift(void) {
  if (!shift_ms) {
    const char *path = getenv("DELAYQ_CLOCK_SHIFT_FILE");
    int fd = path ? open(path, O_RDONLY) : -1;
    if (fd < 0) return 0;
    void *p = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return 0;
    shift_ms = p;
  }
  return *shift_ms;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
  static int (*real)(clockid_t, struct timespec *);
  if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
  int rc = real(id, ts);
  if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
    int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + shift() * 1000000;
    ts->tv_sec = ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
  }
  return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
  (void)tz;
  struct timespec ts;
  int rc = clock_gettime(CLOCK_REALTIME, &ts);
  if (rc == 0) {
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
  }
  return rc;
}

time_t time(time_t *out) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (out) *out = ts.tv_sec;
  return ts.tv_sec;
}
