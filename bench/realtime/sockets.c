// bench/realtime: opens COUNT Realtime sockets (GET /realtime/v1/websocket, vsn 2.0.0 as
// supabase-js) spread over USERS users, each joining one channel with a postgres_changes
// INSERT binding on public.events, waits, then pushes COMMITS events one at a time, each by
// one user, and measures, for every socket of that user, the time from sending the push to
// reading its postgres_changes message; and counts the changes that reach a socket of any
// other user (there must be none). The same harness as bench/stream/streams.c, in C for the
// same reason.
//
//     sockets HOST PORT COUNT USERS TOKENS_FILE COMMITS READY_FILE GO_FILE
//
// Socket i is user i % USERS's. A socket counts as open once its join is answered ok.
// Exits 1 when a socket closes, misses a change for 10 s, or reads a change that is not its
// user's, or not exactly once and in order.
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

#include "../common/client.h"

#define TOKEN 4096
#define FRAME 4096

struct stream {
    int fd;
    int user;
    int upgraded;    // the 101 arrived
    int open;        // the join was answered ok
    long seen;       // the last seq of a change read (a user's seqs count 1, 2, …)
    long events;     // changes read
    long disorder;   // changes that did not follow the previous one by exactly 1
    size_t kept;     // bytes of an unfinished frame (or the 101's head)
    char buffer[FRAME];
};

// One complete text frame (a Phoenix message as a JSON array).
static void message(struct stream *s, const char *text, size_t length) {
    char copy[FRAME + 1];
    memcpy(copy, text, length);
    copy[length] = 0;
    if (strstr(copy, "\"phx_reply\"") && strstr(copy, "\"status\":\"ok\"")) s->open = 1;
    const char *seq = strstr(copy, "\"postgres_changes\"") ? strstr(copy, "\"seq\":") : NULL;
    if (seq) {
        long value = strtol(seq + 6, NULL, 10);
        if (value != s->seen + 1) s->disorder++;
        s->seen = value;
        s->events++;
    }
}

// Reads what is there, frame by frame. Returns -1 when the socket closed (or sent a close
// frame, or a frame too large for the buffer).
static int drain(struct stream *s) {
    for (;;) {
        ssize_t count = recv(s->fd, s->buffer + s->kept, FRAME - s->kept, 0);
        if (count < 0 && errno == EINTR) continue;
        if (count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (count <= 0) return -1;
        s->kept += (size_t)count;
        size_t at = 0;
        if (!s->upgraded) {
            char *end = memmem(s->buffer, s->kept, "\r\n\r\n", 4);
            if (!end) continue;
            if (strncmp(s->buffer, "HTTP/1.1 101", 12) != 0) return -1;
            s->upgraded = 1;
            at = (size_t)(end - s->buffer) + 4;
        }
        for (;;) {
            if (s->kept - at < 2) break;
            unsigned char *frame = (unsigned char *)s->buffer + at;
            size_t header = 2, length = frame[1] & 0x7F;
            if (length == 126) {
                if (s->kept - at < 4) break;
                header = 4;
                length = (size_t)frame[2] << 8 | frame[3];
            } else if (length == 127) {
                return -1;
            }
            if (header + length > FRAME) return -1;
            if (s->kept - at < header + length) break;
            int opcode = frame[0] & 0x0F;
            if (opcode == 8) return -1;
            if (opcode == 1) message(s, (const char *)frame + header, length);
            at += header + length;
        }
        memmove(s->buffer, s->buffer + at, s->kept - at);
        s->kept -= at;
    }
}

// The handshake, then the join (vsn 2.0.0, as supabase-js sends it) as a masked text frame
// with a zero key (the payload as is), for the user whose token is `token`.
static int open_request(char *out, size_t size, const char *host, int port, const char *token) {
    char join[TOKEN + 512];
    int join_length = snprintf(
        join, sizeof join,
        "[\"1\",\"1\",\"realtime:bench\",\"phx_join\",{\"config\":{\"broadcast\":{\"ack\":false,\"self\":false},"
        "\"presence\":{\"key\":\"\",\"enabled\":false},\"postgres_changes\":[{\"event\":\"INSERT\",\"schema\":\"public\","
        "\"table\":\"events\"}],\"private\":false},\"access_token\":\"%s\"}]",
        token);
    int length = snprintf(
        out, size,
        "GET /realtime/v1/websocket?apikey=bench&vsn=2.0.0 HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        host, port);
    unsigned char frame[8] = {0x81, 0x80 | 126, (unsigned char)(join_length >> 8), (unsigned char)join_length, 0, 0, 0, 0};
    memcpy(out + length, frame, sizeof frame);
    memcpy(out + length + sizeof frame, join, (size_t)join_length);
    return length + (int)sizeof frame + join_length;
}

#define CLIENT "sockets"
#define KIND "sockets"
#include "../common/main.h"
