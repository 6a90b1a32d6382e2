// bench/stream's reference: the best a server can do on this machine for the fan-out that
// bench/stream measures — deliver one event frame to every open stream of a user while the
// same client (streams.c, unchanged) reads them — with no database, no TLS, no allocation
// per stream and no work per stream but the `send(2)`. Measured in the same run as
// trunk-sync (bench/stream/run.sh, BENCH_REFERENCE), so trunk-sync's figures are read as
// ratios against what the kernel's loopback path and the client allow here.
//
//     reference HOST PORT     (PORT 0: any free port)
//
// Prints `listening port=N` on stdout once every thread listens. Environment:
// REFERENCE_THREADS (default: the online cores, like TRUNK_SYNC_EVENT_LOOPS).
//
// One thread per core, each with its own epoll and its own listening socket bound to the
// one port with SO_REUSEPORT (the kernel spreads new connections over them, as trunk-sync's
// loops do). It speaks just enough HTTP/1.1 for streams.c and the script:
//
// - `GET /sync/v1/stream` (Authorization: Bearer <token>): the same head trunk-sync sends
//   (`200`, `text/event-stream`, chunked) and its first chunk `retry: 1000`; the stream is
//   the thread's that accepted it.
// - `POST /sync/v1/events`: the user's next seq (1, 2, … per token, as trunk-sync numbers a
//   user's events), answered `200` with `{"results":[{…,"seq":N,…}]}` and closed; then one
//   chunk `id: N\nevent: event\ndata: {…}\n\n`, of the size and shape trunk-sync writes for
//   the bench's event, is sent to every stream of that user: by the accepting thread to
//   its own streams, and handed to every other thread (a lock-protected list and an
//   eventfd), which sends it to its own — each thread its own connections, one
//   non-blocking `send` each; what a socket does not take is kept and sent on EPOLLOUT
//   (more than 64 KiB kept ends the stream, as trunk-sync's TRUNK_SYNC_STREAM_BUFFER).
// - `GET /healthz`: `200`.
//
// A user is its bearer token (each of the script's tokens is another user's), so the
// client's isolation and order checks hold for the reference too. No heartbeats (the
// bench's streams are idle for seconds only), no keep-alive but on the streams.
// SIGTERM or SIGINT: every thread stops and is joined.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define REQUEST_MAX 16384     // a request's head and body (a token is ~1 KiB)
#define KEPT_MAX (64 * 1024)  // bytes a stream may have unsent before it ends (slow reader)
#define HANDOFFS 4096         // pushes waiting for one thread (the bench pushes one at a time)
#define USERS_MAX 100000

enum kind { REQUEST, STREAM };

struct conn {
    int fd;
    enum kind kind;
    int user;            // a stream's user
    size_t index;        // a stream's place in its thread's list
    char *in;            // a request being read (freed once the stream opened)
    size_t in_length;
    char *kept;          // bytes the socket did not take yet
    size_t kept_length;
    int closing;         // close once `kept` is sent (an answer with `Connection: close`)
};

// One event frame (an HTTP chunk), shared by the threads that send it.
struct frame {
    atomic_int references;
    int user;
    size_t length;
    char bytes[];
};

struct thread {
    pthread_t id;
    int index;
    int epoll;
    int listener;
    int wake;  // eventfd: a frame was handed over, or stop
    pthread_mutex_t lock;
    struct frame *handed[HANDOFFS];
    size_t handed_count;
    struct conn **streams;
    size_t stream_count, stream_capacity;
};

static struct thread *threads;
static int thread_count;
static atomic_int stopping;

// Users: one per distinct bearer token; their seqs. Taken on open and on push only.
static pthread_mutex_t users_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t user_hash[USERS_MAX];
static long user_seq[USERS_MAX];
static int user_count;

static char listener_tag, wake_tag;  // epoll data for the listener and the eventfd

static uint64_t fnv1a(const char *text, size_t length) {
    uint64_t hash = 1469598103934665603ull;
    for (size_t i = 0; i < length; i++) hash = (hash ^ (unsigned char)text[i]) * 1099511628211ull;
    return hash;
}

// The user of the request's bearer token, registered on first sight; -1 without one.
static int user_of(const char *head) {
    const char *at = strcasestr(head, "\r\nAuthorization: Bearer ");
    if (!at) return -1;
    at += strlen("\r\nAuthorization: Bearer ");
    size_t length = strcspn(at, "\r\n");
    uint64_t hash = fnv1a(at, length);
    pthread_mutex_lock(&users_lock);
    int user = -1;
    for (int u = 0; u < user_count; u++) {
        if (user_hash[u] == hash) {
            user = u;
            break;
        }
    }
    if (user < 0 && user_count < USERS_MAX) {
        user = user_count++;
        user_hash[user] = hash;
    }
    pthread_mutex_unlock(&users_lock);
    return user;
}

static void close_conn(struct thread *t, struct conn *c) {
    if (c->kind == STREAM) {  // out of the list: the last one takes its place
        struct conn *last = t->streams[--t->stream_count];
        t->streams[c->index] = last;
        last->index = c->index;
    }
    close(c->fd);  // also leaves the epoll set
    free(c->in);
    free(c->kept);
    free(c);
}

// Sends what was kept, then `bytes`; keeps what the socket does not take. Returns -1 when
// the connection is to end (gone, or too far behind).
static int send_or_keep(struct thread *t, struct conn *c, const char *bytes, size_t length) {
    if (c->kept_length == 0) {
        ssize_t sent = send(c->fd, bytes, length, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
        if (sent < 0) sent = 0;
        if ((size_t)sent == length) return 0;
        bytes += sent;
        length -= (size_t)sent;
        struct epoll_event event = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
        epoll_ctl(t->epoll, EPOLL_CTL_MOD, c->fd, &event);
    }
    if (c->kept_length + length > KEPT_MAX) return -1;
    char *grown = realloc(c->kept, c->kept_length + length);
    if (!grown) return -1;
    memcpy(grown + c->kept_length, bytes, length);
    c->kept = grown;
    c->kept_length += length;
    return 0;
}

// EPOLLOUT: sends what was kept.
static int flush(struct thread *t, struct conn *c) {
    while (c->kept_length > 0) {
        ssize_t sent = send(c->fd, c->kept, c->kept_length, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0 && errno == EINTR) continue;
        if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (sent <= 0) return -1;
        memmove(c->kept, c->kept + sent, c->kept_length - (size_t)sent);
        c->kept_length -= (size_t)sent;
    }
    free(c->kept);
    c->kept = NULL;
    if (c->closing) return -1;
    struct epoll_event event = {.events = EPOLLIN, .data.ptr = c};
    epoll_ctl(t->epoll, EPOLL_CTL_MOD, c->fd, &event);
    return 0;
}

// Sends `frame` to every stream of its user on this thread, then lets go of it.
static void fan_out(struct thread *t, struct frame *frame) {
    for (size_t i = 0; i < t->stream_count;) {
        struct conn *c = t->streams[i];
        if (c->user == frame->user && send_or_keep(t, c, frame->bytes, frame->length) != 0) {
            close_conn(t, c);  // its place now holds the last stream: look at i again
            continue;
        }
        i++;
    }
    if (atomic_fetch_sub(&frame->references, 1) == 1) free(frame);
}

// The push's `"round":N` (bench/stream/streams.c's body), 0 without one.
static long round_of(const char *body) {
    const char *at = strstr(body, "\"round\":");
    return at ? strtol(at + 8, NULL, 10) : 0;
}

// The event frame trunk-sync writes for the bench's push (bench/stream/streams.c's body)
// as seq `seq`: the same fields, lengths and order (an HTTP chunk of one SSE message).
static struct frame *event_frame(int user, long seq, const char *body) {
    long round = round_of(body);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct tm utc;
    gmtime_r(&now.tv_sec, &utc);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &utc);
    char event[1024];
    int event_length = snprintf(
        event, sizeof event,
        "id: %ld\nevent: event\ndata: {\"id\":\"13095e54-c6e9-4f8b-851c-%012ld\",\"seq\":%ld,\"type\":\"bench\","
        "\"payload\":{\"round\": %ld},\"client_id\":\"00000000-0000-4000-8000-%012ld\","
        "\"client_timestamp\":\"2026-11-23T00:00:00.000000Z\",\"created_at\":\"%s.%03ldZ\"}\n\n",
        seq, seq, seq, round, round, stamp, now.tv_nsec / 1000000);
    char size[16];
    int size_length = snprintf(size, sizeof size, "%x\r\n", event_length);
    struct frame *frame = malloc(sizeof *frame + (size_t)size_length + (size_t)event_length + 2);
    if (!frame) return NULL;
    atomic_init(&frame->references, 1);
    frame->user = user;
    memcpy(frame->bytes, size, (size_t)size_length);
    memcpy(frame->bytes + size_length, event, (size_t)event_length);
    memcpy(frame->bytes + size_length + event_length, "\r\n", 2);
    frame->length = (size_t)size_length + (size_t)event_length + 2;
    return frame;
}

static void http_date(char *out, size_t size) {
    time_t now = time(NULL);
    struct tm utc;
    gmtime_r(&now, &utc);
    strftime(out, size, "%a, %d %b %Y %H:%M:%S GMT", &utc);
}

// Answers a complete request: 0 to keep the connection (a stream), -1 to close it after
// what was queued.
static int answer(struct thread *t, struct conn *c, const char *head, const char *body) {
    char date[64], out[1024];
    http_date(date, sizeof date);
    if (strncmp(head, "GET /sync/v1/stream", 19) == 0 && (head[19] == ' ' || head[19] == '?')) {
        int user = user_of(head);
        if (user < 0) return -1;
        int length = snprintf(
            out, sizeof out,
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nCache-Control: no-store\r\n"
            "X-Accel-Buffering: no\r\nX-Request-Id: reference-%d\r\nTransfer-Encoding: chunked\r\nDate: %s\r\n"
            "Server: trunk-sync\r\nConnection: keep-alive\r\n\r\nd\r\nretry: 1000\n\n\r\n",
            c->fd, date);
        if (t->stream_count == t->stream_capacity) {
            size_t capacity = t->stream_capacity ? t->stream_capacity * 2 : 1024;
            struct conn **grown = realloc(t->streams, capacity * sizeof *grown);
            if (!grown) return -1;
            t->streams = grown;
            t->stream_capacity = capacity;
        }
        free(c->in);
        c->in = NULL;
        c->in_length = 0;
        c->kind = STREAM;
        c->user = user;
        c->index = t->stream_count;
        t->streams[t->stream_count++] = c;
        return send_or_keep(t, c, out, (size_t)length);
    }
    if (strncmp(head, "POST /sync/v1/events ", 21) == 0) {
        int user = user_of(head);
        if (user < 0) return -1;
        pthread_mutex_lock(&users_lock);
        long seq = ++user_seq[user];
        pthread_mutex_unlock(&users_lock);
        struct frame *frame = event_frame(user, seq, body);
        if (!frame) return -1;
        char result[256];
        int result_length = snprintf(
            result, sizeof result,
            "{\"accepted\":1,\"duplicates\":0,\"results\":[{\"client_id\":\"00000000-0000-4000-8000-%012ld\","
            "\"status\":\"created\",\"seq\":%ld}]}",
            round_of(body), seq);
        int length = snprintf(
            out, sizeof out,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\nX-Request-Id: reference-%d\r\n"
            "Content-Length: %d\r\nDate: %s\r\n"
            "Server: trunk-sync\r\nConnection: close\r\n\r\n%s",
            c->fd, result_length, date, result);
        c->closing = 1;
        int kept = send_or_keep(t, c, out, (size_t)length);
        // The other threads' streams: each thread sends to its own.
        atomic_store(&frame->references, thread_count);
        for (int i = 0; i < thread_count; i++) {
            struct thread *other = &threads[i];
            if (other == t) continue;
            pthread_mutex_lock(&other->lock);
            int room = other->handed_count < HANDOFFS;
            if (room) other->handed[other->handed_count++] = frame;
            pthread_mutex_unlock(&other->lock);
            if (!room) {
                fprintf(stderr, "reference: thread %d has %d pushes waiting\n", i, HANDOFFS);
                exit(1);
            }
            uint64_t one = 1;
            while (write(other->wake, &one, 8) < 0 && errno == EINTR) {}
        }
        fan_out(t, frame);
        return kept != 0 || c->kept_length == 0 ? -1 : 0;  // closed once the answer is sent
    }
    const char *status = strncmp(head, "GET /healthz ", 13) == 0 ? "200 OK" : "404 Not Found";
    int length = snprintf(
        out, sizeof out, "HTTP/1.1 %s\r\nContent-Length: 0\r\nDate: %s\r\nServer: trunk-sync\r\nConnection: close\r\n\r\n",
        status, date);
    c->closing = 1;
    return send_or_keep(t, c, out, (size_t)length) != 0 || c->kept_length == 0 ? -1 : 0;
}

// EPOLLIN on a connection: reads; answers once the request is complete. -1: close it.
static int readable(struct thread *t, struct conn *c) {
    for (;;) {
        if (c->kind == STREAM || c->closing) {  // a stream's client sends nothing more
            char scratch[4096];
            ssize_t count = recv(c->fd, scratch, sizeof scratch, 0);
            if (count < 0 && errno == EINTR) continue;
            if (count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
            return count > 0 ? 0 : -1;
        }
        if (c->in_length == REQUEST_MAX - 1) return -1;
        ssize_t count = recv(c->fd, c->in + c->in_length, REQUEST_MAX - 1 - c->in_length, 0);
        if (count < 0 && errno == EINTR) continue;
        if (count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (count <= 0) return -1;
        c->in_length += (size_t)count;
        c->in[c->in_length] = 0;
        char *end = strstr(c->in, "\r\n\r\n");
        if (!end) continue;
        const char *body = end + 4;
        const char *length_field = strcasestr(c->in, "\r\nContent-Length: ");
        size_t body_length = length_field && length_field < end ? strtoul(length_field + 18, NULL, 10) : 0;
        if ((size_t)(c->in + c->in_length - body) < body_length) continue;
        *end = 0;  // the head is a string of its own; the body follows
        return answer(t, c, c->in, body);
    }
}

static void accept_all(struct thread *t) {
    for (;;) {
        int fd = accept4(t->listener, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;  // EAGAIN (or EMFILE: the bench raises the limit first)
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct conn *c = calloc(1, sizeof *c);
        if (c) c->in = malloc(REQUEST_MAX);
        if (!c || !c->in) {
            if (c) free(c);
            close(fd);
            continue;
        }
        c->fd = fd;
        c->kind = REQUEST;
        struct epoll_event event = {.events = EPOLLIN, .data.ptr = c};
        epoll_ctl(t->epoll, EPOLL_CTL_ADD, fd, &event);
    }
}

static void *run(void *argument) {
    struct thread *t = argument;
    struct epoll_event events[1024];
    while (!atomic_load(&stopping)) {
        int ready = epoll_wait(t->epoll, events, 1024, -1);
        for (int e = 0; e < ready; e++) {
            void *tag = events[e].data.ptr;
            if (tag == &listener_tag) {
                accept_all(t);
            } else if (tag == &wake_tag) {
                uint64_t counter;
                (void)!read(t->wake, &counter, 8);
                struct frame *handed[HANDOFFS];
                pthread_mutex_lock(&t->lock);
                size_t count = t->handed_count;
                memcpy(handed, t->handed, count * sizeof *handed);
                t->handed_count = 0;
                pthread_mutex_unlock(&t->lock);
                for (size_t i = 0; i < count; i++) fan_out(t, handed[i]);
            } else {
                struct conn *c = tag;
                int end = 0;
                if (events[e].events & (EPOLLERR | EPOLLHUP)) end = 1;
                if (!end && (events[e].events & EPOLLOUT)) end = flush(t, c) != 0;
                if (!end && (events[e].events & EPOLLIN)) end = readable(t, c) != 0;
                if (end) close_conn(t, c);
            }
        }
    }
    while (t->stream_count > 0) close_conn(t, t->streams[t->stream_count - 1]);
    return NULL;
}

// A listening socket on HOST:PORT shared by every thread (SO_REUSEPORT); PORT 0 picks one.
static int listen_on(const char *host, int *port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((uint16_t)*port)};
    inet_pton(AF_INET, host, &address.sin_addr);
    socklen_t size = sizeof address;
    if (bind(fd, (struct sockaddr *)&address, sizeof address) != 0 || listen(fd, 4096) != 0 ||
        getsockname(fd, (struct sockaddr *)&address, &size) != 0) {
        fprintf(stderr, "reference: cannot listen on %s:%d: %s\n", host, *port, strerror(errno));
        exit(1);
    }
    *port = ntohs(address.sin_port);
    return fd;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: reference HOST PORT\n");
        return 2;
    }
    int port = atoi(argv[2]);
    thread_count = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (getenv("REFERENCE_THREADS")) thread_count = atoi(getenv("REFERENCE_THREADS"));
    if (thread_count < 1 || thread_count > 1024) {
        fprintf(stderr, "reference: REFERENCE_THREADS must be 1…1024\n");
        return 2;
    }
    // SIGTERM and SIGINT are taken by sigwait below, in no thread else.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &signals, NULL);

    threads = calloc((size_t)thread_count, sizeof *threads);
    for (int i = 0; i < thread_count; i++) {
        struct thread *t = &threads[i];
        t->index = i;
        t->listener = listen_on(argv[1], &port);  // the first picks the port, the others join it
        t->epoll = epoll_create1(EPOLL_CLOEXEC);
        t->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        pthread_mutex_init(&t->lock, NULL);
        struct epoll_event listening = {.events = EPOLLIN, .data.ptr = &listener_tag};
        struct epoll_event woken = {.events = EPOLLIN, .data.ptr = &wake_tag};
        epoll_ctl(t->epoll, EPOLL_CTL_ADD, t->listener, &listening);
        epoll_ctl(t->epoll, EPOLL_CTL_ADD, t->wake, &woken);
    }
    for (int i = 0; i < thread_count; i++) {
        if (pthread_create(&threads[i].id, NULL, run, &threads[i]) != 0) {
            fprintf(stderr, "reference: cannot start thread %d\n", i);
            return 1;
        }
    }
    printf("reference listening threads=%d port=%d\n", thread_count, port);
    fflush(stdout);
    int signal;
    sigwait(&signals, &signal);
    atomic_store(&stopping, 1);
    for (int i = 0; i < thread_count; i++) {
        uint64_t one = 1;
        (void)!write(threads[i].wake, &one, 8);
    }
    for (int i = 0; i < thread_count; i++) pthread_join(threads[i].id, NULL);
    return 0;
}
