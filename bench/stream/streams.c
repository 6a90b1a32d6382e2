// bench/stream: opens COUNT event streams of one user, waits, then pushes COMMITS events one
// at a time and measures, for every stream, the time from sending the push to reading the
// event on that stream. In C so that reading 10,000 sockets costs the measurement next to
// nothing (a Python loop over them would add tens of milliseconds to every figure).
//
//     streams HOST PORT COUNT TOKEN COMMITS READY_FILE GO_FILE
//
// Connects from loopback addresses 127.0.0.2… (COUNT / 50 per address, under the server's
// per-client connection cap), sends `GET /sync/v1/stream` with `Accept: text/event-stream`
// on each and waits for each stream's `retry:`. Then writes COUNT to READY_FILE (the caller
// measures the server's memory) and waits until GO_FILE exists. Then, COMMITS times: push
// one event (`POST /sync/v1/events`), wait until every stream has read its `id: <seq>`, and
// record each stream's latency. Prints the latencies' percentiles; exits 1 when a stream
// ends, fails, or misses an event for 10 s.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SOURCES 50
#define TAIL 64

struct stream {
    int fd;
    int open;      // the `retry:` arrived
    long seen;     // the highest seq read
    size_t kept;   // bytes kept from the previous read (a message may span reads)
    char tail[TAIL];
};

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

// Reads what is there; scans for `retry:` and `id: N`. Returns -1 when the stream ended.
static int drain(struct stream *s) {
    char buffer[TAIL + 65536];
    for (;;) {
        memcpy(buffer, s->tail, s->kept);
        ssize_t count = recv(s->fd, buffer + s->kept, sizeof buffer - s->kept - 1, 0);
        if (count < 0 && errno == EINTR) continue;
        if (count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (count <= 0) return -1;
        size_t total = s->kept + (size_t)count;
        buffer[total] = 0;
        if (!s->open && strstr(buffer, "retry:")) s->open = 1;
        for (char *at = buffer; (at = strstr(at, "id: ")) != NULL; at += 4) {
            char *end;
            long seq = strtol(at + 4, &end, 10);
            if (*end == '\n' && seq > s->seen) s->seen = seq;
        }
        s->kept = total < TAIL ? total : TAIL;
        memcpy(s->tail, buffer + total - s->kept, s->kept);
        // A complete `id: N\n` in the tail was counted already; keeping it is harmless.
    }
}

int main(int argc, char **argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: streams HOST PORT COUNT TOKEN COMMITS READY_FILE GO_FILE\n");
        return 2;
    }
    const char *host = argv[1];
    int port = atoi(argv[2]), count = atoi(argv[3]), commits = atoi(argv[5]);
    const char *token = argv[4], *ready_file = argv[6], *go_file = argv[7];

    char request[4096];
    int request_length = snprintf(
        request, sizeof request,
        "GET /sync/v1/stream HTTP/1.1\r\nHost: %s:%d\r\nAuthorization: Bearer %s\r\nAccept: text/event-stream\r\n\r\n",
        host, port, token);
    struct stream *streams = calloc((size_t)count, sizeof *streams);
    int epoll = epoll_create1(EPOLL_CLOEXEC);
    double started = now_ms();
    for (int i = 0; i < count; i++) {
        streams[i].fd = connect_from(host, port, i);
        if (streams[i].fd < 0 || send_all(streams[i].fd, request, (size_t)request_length) != 0) {
            fprintf(stderr, "stream %d: cannot connect or send: %s\n", i, strerror(errno));
            return 1;
        }
        fcntl(streams[i].fd, F_SETFL, O_NONBLOCK);
        struct epoll_event event = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(epoll, EPOLL_CTL_ADD, streams[i].fd, &event);
    }
    struct epoll_event events[1024];
    int open = 0;
    while (open < count) {
        int ready = epoll_wait(epoll, events, 1024, 10000);
        if (ready <= 0) {
            fprintf(stderr, "only %d of %d streams opened\n", open, count);
            return 1;
        }
        for (int e = 0; e < ready; e++) {
            struct stream *s = &streams[events[e].data.u32];
            int was = s->open;
            if (drain(s) < 0) {
                fprintf(stderr, "a stream ended while opening\n");
                return 1;
            }
            if (!was && s->open) open++;
        }
    }
    fprintf(stderr, "%d streams open in %.1f s\n", count, (now_ms() - started) / 1e3);
    FILE *ready_out = fopen(ready_file, "w");
    fprintf(ready_out, "%d\n", count);
    fclose(ready_out);
    struct stat info;
    while (stat(go_file, &info) != 0) {
        // Heartbeats keep arriving meanwhile: read them so no buffer fills.
        int ready = epoll_wait(epoll, events, 1024, 100);
        for (int e = 0; e < ready; e++) {
            if (drain(&streams[events[e].data.u32]) < 0) {
                fprintf(stderr, "a stream ended while idle\n");
                return 1;
            }
        }
    }

    double *latencies = malloc(sizeof(double) * (size_t)count * (size_t)commits);
    size_t measured = 0;
    double worst_round = 0;
    for (int round = 1; round <= commits; round++) {
        char body[512], push[4096];
        int body_length = snprintf(
            body, sizeof body,
            "{\"events\":[{\"client_id\":\"00000000-0000-4000-8000-%012d\",\"type\":\"bench\","
            "\"payload\":{\"round\":%d},\"client_timestamp\":\"2026-11-23T00:00:00.000Z\"}]}",
            round, round);
        int push_length = snprintf(
            push, sizeof push,
            "POST /sync/v1/events HTTP/1.1\r\nHost: %s:%d\r\nAuthorization: Bearer %s\r\n"
            "Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
            host, port, token, body_length, body);
        int pusher = connect_from(host, port, count);
        double sent = now_ms();
        if (pusher < 0 || send_all(pusher, push, (size_t)push_length) != 0) {
            fprintf(stderr, "push %d failed\n", round);
            return 1;
        }
        int waiting = count;
        while (waiting > 0) {
            int ready = epoll_wait(epoll, events, 1024, 10000);
            if (ready <= 0) {
                fprintf(stderr, "round %d: %d streams did not get the event within 10 s\n", round, waiting);
                return 1;
            }
            double at = now_ms();
            for (int e = 0; e < ready; e++) {
                struct stream *s = &streams[events[e].data.u32];
                long before = s->seen;
                if (drain(s) < 0) {
                    fprintf(stderr, "round %d: a stream ended\n", round);
                    return 1;
                }
                if (before < round && s->seen >= round) {
                    latencies[measured++] = at - sent;
                    waiting--;
                }
            }
        }
        double round_time = now_ms() - sent;
        if (round_time > worst_round) worst_round = round_time;
        char answer[512];
        ssize_t got = recv(pusher, answer, sizeof answer - 1, 0);
        if (got <= 0 || strncmp(answer, "HTTP/1.1 200", 12) != 0) {
            fprintf(stderr, "push %d was not answered 200\n", round);
            return 1;
        }
        close(pusher);
        usleep(200000);  // commits apart: each is measured on its own
    }
    qsort(latencies, measured, sizeof(double), compare);
    printf(
        "latency_ms p50=%.1f p90=%.1f p99=%.1f max=%.1f samples=%zu slowest_round_ms=%.1f\n",
        latencies[measured / 2], latencies[measured * 9 / 10], latencies[measured * 99 / 100], latencies[measured - 1],
        measured, worst_round);
    return 0;
}
