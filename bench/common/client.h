// What the C clients of bench/stream and bench/realtime share: a monotonic clock, sorting
// latencies, connecting from one of SOURCES loopback addresses (under the server's
// per-client connection cap), sending everything, and the seq a push was answered with.
#ifndef TRUNK_SYNC_BENCH_CLIENT_H
#define TRUNK_SYNC_BENCH_CLIENT_H
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SOURCES 50

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int connect_from(const char *host, int port, int index) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in source = {.sin_family = AF_INET};
    char address[32];
    snprintf(address, sizeof address, "127.0.0.%d", 2 + index % SOURCES);
    inet_pton(AF_INET, address, &source.sin_addr);
    if (strncmp(host, "127.", 4) == 0 && bind(fd, (struct sockaddr *)&source, sizeof source) != 0) {
        close(fd);
        return -1;
    }
    struct sockaddr_in target = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, host, &target.sin_addr);
    if (connect(fd, (struct sockaddr *)&target, sizeof target) != 0) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static int send_all(int fd, const char *data, size_t length) {
    while (length > 0) {
        ssize_t sent = send(fd, data, length, MSG_NOSIGNAL);
        if (sent < 0 && errno == EINTR) continue;
        if (sent <= 0) return -1;
        data += sent;
        length -= (size_t)sent;
    }
    return 0;
}

// The `"seq":N` of the push's answer (its one result), or -1.
static inline long answered_seq(int fd) {
    char answer[4096];
    size_t total = 0;
    for (;;) {
        ssize_t got = recv(fd, answer + total, sizeof answer - 1 - total, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        total += (size_t)got;
        if (total == sizeof answer - 1) break;
    }
    answer[total] = 0;
    if (strncmp(answer, "HTTP/1.1 200", 12) != 0) return -1;
    const char *seq = strstr(answer, "\"seq\":");
    return seq ? strtol(seq + 6, NULL, 10) : -1;
}

#endif
