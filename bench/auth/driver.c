// bench/auth's HTTP driver: sends prepared sign-in requests over CONNECTIONS keep-alive
// connections (from 127.0.0.2…51, as bench/common's clients, so the per-client rate limit
// buckets are spread like many clients'), times each from its first byte sent to the last
// byte of its answer, and prints one line of figures.
//
//   driver HOST PORT CONNECTIONS REQUESTS [-d SECONDS] [-p PAUSE_MS] [-o TOKENS] [-r]
//
// REQUESTS has one request a line: a path, a space, a JSON body (POSTed). Each line is sent
// once, in order, to whichever connection is free; sending stops when the lines are used up
// or after -d SECONDS, and the driver then waits for the answers in flight.
//   -p MS    each connection pauses before each request, exponentially distributed with mean
//            MS (Poisson arrivals; the latency stages run at a fixed fraction of the maximum)
//   -o FILE  writes each answer's "refresh_token" to FILE, one a line (the verify stage's
//            sessions, for the refresh stage)
//   -r       refresh chain: REQUESTS holds refresh tokens, one a line; each is sent as
//            POST /auth/v1/token?grant_type=refresh_token and its answer's new token is
//            queued to be sent in turn (a token is used once, as a client rotates them)
//
// Prints: requests N errors E seconds S rate R p50 A p90 B p99 C max D (latencies in ms).
// Any answer but 2xx counts as an error; the first one is printed on stderr.
#define _GNU_SOURCE
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <sys/epoll.h>

#include "../common/client.h"

struct line {
    char *text;
    size_t length;
};

static struct line *lines;
static size_t line_count, line_capacity, next_line;

static void push_line(const char *text, size_t length) {
    if (line_count == line_capacity) {
        line_capacity = line_capacity ? line_capacity * 2 : 4096;
        lines = realloc(lines, line_capacity * sizeof *lines);
        if (!lines) exit(1);
    }
    char *copy = malloc(length + 1);
    if (!copy) exit(1);
    memcpy(copy, text, length);
    copy[length] = 0;
    lines[line_count++] = (struct line){copy, length};
}

struct connection {
    int fd;
    int busy;          // a request is in flight
    double due;        // when the next request may be sent
    double sent_at;
    char *buffer;
    size_t used, capacity;
};

static double *latencies;
static size_t latency_count, latency_capacity;
static long errors;
static FILE *tokens_out;
static int chain;

static double pause_ms(double mean) {
    if (mean <= 0) return 0;
    return -log(1.0 - drand48()) * mean;
}

// The value of "refresh_token" in a JSON answer, or NULL.
static const char *refresh_token(const char *body, size_t *length) {
    const char *key = strstr(body, "\"refresh_token\":\"");
    if (!key) return NULL;
    key += 17;
    const char *end = strchr(key, '"');
    if (!end) return NULL;
    *length = (size_t)(end - key);
    return key;
}

static char request_buffer[8192];

static int send_request(struct connection *c, const char *host, int port) {
    const struct line *l = &lines[next_line++];
    const char *path = "/auth/v1/token?grant_type=refresh_token";
    char body[4096];
    const char *payload;
    size_t payload_length;
    if (chain) {
        payload_length = (size_t)snprintf(body, sizeof body, "{\"refresh_token\":\"%s\"}", l->text);
        payload = body;
    } else {
        const char *space = memchr(l->text, ' ', l->length);
        if (!space) {
            fprintf(stderr, "driver: a request line needs a path, a space and a body\n");
            exit(2);
        }
        snprintf(body, sizeof body, "%.*s", (int)(space - l->text), l->text);
        path = body;
        payload = space + 1;
        payload_length = l->length - (size_t)(space + 1 - l->text);
    }
    int n = snprintf(request_buffer, sizeof request_buffer,
                     "POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                     "User-Agent: trunk-sync-bench-auth\r\nContent-Length: %zu\r\n\r\n%.*s",
                     path, host, port, payload_length, (int)payload_length, payload);
    c->sent_at = now_ms();
    c->busy = 1;
    return send_all(c->fd, request_buffer, (size_t)n);
}

// Reads what is there; returns 1 when a whole answer was read (and handled), 0 when more is
// needed, -1 when the connection failed.
static int read_answer(struct connection *c) {
    for (;;) {
        if (c->capacity - c->used < 4096) {
            c->capacity = c->capacity ? c->capacity * 2 : 16384;
            c->buffer = realloc(c->buffer, c->capacity);
            if (!c->buffer) exit(1);
        }
        ssize_t got = recv(c->fd, c->buffer + c->used, c->capacity - c->used - 1, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (got <= 0) return -1;
        c->used += (size_t)got;
    }
    c->buffer[c->used] = 0;
    char *head_end = strstr(c->buffer, "\r\n\r\n");
    if (!head_end) return 0;
    size_t head_length = (size_t)(head_end + 4 - c->buffer);
    const char *length_header = strcasestr(c->buffer, "\r\ncontent-length:");
    if (!length_header || length_header > head_end) {
        fprintf(stderr, "driver: an answer without Content-Length\n");
        return -1;
    }
    size_t body_length = strtoul(length_header + 17, NULL, 10);
    if (c->used < head_length + body_length) return 0;
    double done = now_ms();
    int status = atoi(c->buffer + 9);
    char saved = c->buffer[head_length + body_length];
    c->buffer[head_length + body_length] = 0;
    const char *body = c->buffer + head_length;
    if (status / 100 != 2) {
        if (errors++ == 0) fprintf(stderr, "driver: answer %d: %s\n", status, body);
    } else if (tokens_out || chain) {
        size_t length;
        const char *token = refresh_token(body, &length);
        if (!token) {
            if (errors++ == 0) fprintf(stderr, "driver: no refresh_token in %s\n", body);
        } else {
            if (tokens_out) fprintf(tokens_out, "%.*s\n", (int)length, token);
            if (chain) push_line(token, length);
        }
    }
    if (latency_count == latency_capacity) {
        latency_capacity = latency_capacity ? latency_capacity * 2 : 65536;
        latencies = realloc(latencies, latency_capacity * sizeof *latencies);
        if (!latencies) exit(1);
    }
    latencies[latency_count++] = done - c->sent_at;
    c->buffer[head_length + body_length] = saved;
    memmove(c->buffer, c->buffer + head_length + body_length, c->used - head_length - body_length);
    c->used -= head_length + body_length;
    c->busy = 0;
    return 1;
}

static void load(const char *path) {
    FILE *file = fopen(path, "r");
    if (!file) {
        perror(path);
        exit(2);
    }
    char *text = NULL;
    size_t capacity = 0;
    ssize_t length;
    while ((length = getline(&text, &capacity, file)) > 0) {
        while (length > 0 && (text[length - 1] == '\n' || text[length - 1] == '\r')) length--;
        if (length > 0) push_line(text, (size_t)length);
    }
    free(text);
    fclose(file);
}

static double percentile(double p) {
    if (latency_count == 0) return 0;
    size_t index = (size_t)(p * (double)latency_count);
    if (index >= latency_count) index = latency_count - 1;
    return latencies[index];
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: driver HOST PORT CONNECTIONS REQUESTS [-d SECONDS] [-p PAUSE_MS] [-o TOKENS] [-r]\n");
        return 2;
    }
    const char *host = argv[1];
    int port = atoi(argv[2]), count = atoi(argv[3]);
    double seconds = 0, mean_pause = 0;
    for (int i = 5; i < argc; i++) {
        if (strcmp(argv[i], "-d") == 0 && i + 1 < argc) seconds = atof(argv[++i]);
        else if (strcmp(argv[i], "-p") == 0 && i + 1 < argc) mean_pause = atof(argv[++i]);
        else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) {
            tokens_out = fopen(argv[++i], "w");
            if (!tokens_out) {
                perror(argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "-r") == 0) chain = 1;
        else {
            fprintf(stderr, "driver: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (count < 1) return 2;
    load(argv[4]);
    if (chain && line_count < (size_t)count) {
        fprintf(stderr, "driver: -r needs at least one token per connection (%zu for %d)\n", line_count, count);
        return 2;
    }
    srand48((long)getpid());

    int epoll = epoll_create1(EPOLL_CLOEXEC);
    struct connection *connections = calloc((size_t)count, sizeof *connections);
    for (int i = 0; i < count; i++) {
        struct connection *c = &connections[i];
        c->fd = connect_from(host, port, i);
        if (c->fd < 0) {
            perror("driver: connect");
            return 1;
        }
        fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
        struct epoll_event event = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(epoll, EPOLL_CTL_ADD, c->fd, &event);
    }
    double start = now_ms(), stop_sending = seconds > 0 ? start + seconds * 1000 : INFINITY;
    for (int i = 0; i < count; i++) connections[i].due = start + pause_ms(mean_pause);
    double last_answer = start;
    int in_flight = 0;
    for (;;) {
        double now = now_ms();
        int sending = now < stop_sending;
        double earliest = INFINITY;
        for (int i = 0; sending && i < count; i++) {
            struct connection *c = &connections[i];
            if (c->busy) continue;
            if (next_line >= line_count) break;
            if (c->due <= now) {
                if (send_request(c, host, port) != 0) {
                    perror("driver: send");
                    return 1;
                }
                in_flight++;
            } else if (c->due < earliest) {
                earliest = c->due;
            }
        }
        int idle_and_done = in_flight == 0 && (!sending || (next_line >= line_count && !chain));
        if (idle_and_done) break;
        if (in_flight == 0 && chain && next_line >= line_count) {
            fprintf(stderr, "driver: the refresh chain ran dry\n");
            return 1;
        }
        int timeout = -1;
        if (sending && earliest < INFINITY) timeout = (int)ceil(earliest - now_ms());
        if (sending && stop_sending < INFINITY) {
            int left = (int)ceil(stop_sending - now_ms());
            if (timeout < 0 || left < timeout) timeout = left < 0 ? 0 : left;
        }
        struct epoll_event events[256];
        int ready = epoll_wait(epoll, events, 256, timeout);
        if (ready < 0 && errno != EINTR) {
            perror("driver: epoll_wait");
            return 1;
        }
        for (int e = 0; e < ready; e++) {
            struct connection *c = &connections[events[e].data.u32];
            int result = read_answer(c);
            if (result < 0) {
                fprintf(stderr, "driver: a connection closed\n");
                return 1;
            }
            if (result == 1) {
                in_flight--;
                last_answer = now_ms();
                c->due = last_answer + pause_ms(mean_pause);
            }
        }
    }
    if (tokens_out) fclose(tokens_out);
    double elapsed = (last_answer - start) / 1000;
    qsort(latencies, latency_count, sizeof *latencies, compare);
    printf("requests %zu errors %ld seconds %.2f rate %.1f p50 %.2f p90 %.2f p99 %.2f max %.2f\n", latency_count,
           errors, elapsed, elapsed > 0 ? (double)latency_count / elapsed : 0, percentile(0.50), percentile(0.90),
           percentile(0.99), latency_count ? latencies[latency_count - 1] : 0);
    return errors == 0 ? 0 : 1;
}
