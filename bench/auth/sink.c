// bench/auth's mail sink: a small SMTP server that records each sign-in code it receives.
//
//   sink CODES_FILE      listens on 127.0.0.1 at a free port, prints "ready PORT"
//
// For each message it appends "ADDRESS CODE" to CODES_FILE (the RCPT TO address and the
// 6-digit code of the subject "Your sign-in code: CODE"), written at once, so the driver can
// look the codes up without asking the sink anything. It speaks just what trunk-sync's SMTP
// client sends without TLS or AUTH (EHLO, MAIL, RCPT, DATA, RSET, NOOP, QUIT; the message
// is scanned for the subject line and dropped). One thread, epoll, a fixed buffer per
// connection: it must stay far from being the bottleneck (run.sh reports its CPU time).
// scripts/smtp-sink.py (aiosmtpd, MIME checks) is the tests' sink. Exits on SIGTERM.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define LINE_MAX_BYTES 8192

struct session {
    int fd;
    int in_data;
    size_t used;
    char recipient[320];
    char code[7];
    char buffer[LINE_MAX_BYTES];
};

static int out;

static void reply(struct session *s, const char *text) {
    size_t length = strlen(text);
    // Replies are a few bytes to a client that reads them before it writes again.
    if (send(s->fd, text, length, MSG_NOSIGNAL) != (ssize_t)length) s->in_data = -1;
}

static void finish_message(struct session *s) {
    if (s->code[0]) {
        char record[400];
        int n = snprintf(record, sizeof record, "%s %s\n", s->recipient, s->code);
        if (write(out, record, (size_t)n) != n) perror("sink: write");
    }
    s->code[0] = 0;
}

// Handles one line (without its CRLF); returns 0 to go on, -1 to close.
static int line(struct session *s, char *text, size_t length) {
    if (s->in_data) {
        if (length == 1 && text[0] == '.') {
            s->in_data = 0;
            finish_message(s);
            reply(s, "250 OK\r\n");
            return 0;
        }
        static const char subject[] = "Subject: Your sign-in code: ";
        if (length == sizeof subject - 1 + 6 && memcmp(text, subject, sizeof subject - 1) == 0) {
            memcpy(s->code, text + sizeof subject - 1, 6);
            s->code[6] = 0;
        }
        return 0;
    }
    if (length >= 4 && (strncasecmp(text, "EHLO", 4) == 0 || strncasecmp(text, "HELO", 4) == 0)) {
        reply(s, "250-sink.bench\r\n250 8BITMIME\r\n");
    } else if (length >= 4 && strncasecmp(text, "RCPT", 4) == 0) {
        char *open = memchr(text, '<', length), *close = memrchr(text, '>', length);
        if (open && close && close > open && (size_t)(close - open - 1) < sizeof s->recipient) {
            memcpy(s->recipient, open + 1, (size_t)(close - open - 1));
            s->recipient[close - open - 1] = 0;
        }
        reply(s, "250 OK\r\n");
    } else if (length >= 4 && strncasecmp(text, "DATA", 4) == 0) {
        s->in_data = 1;
        s->code[0] = 0;
        reply(s, "354 go ahead\r\n");
    } else if (length >= 4 && strncasecmp(text, "QUIT", 4) == 0) {
        reply(s, "221 bye\r\n");
        return -1;
    } else if (length >= 4 && (strncasecmp(text, "MAIL", 4) == 0 || strncasecmp(text, "RSET", 4) == 0 ||
                               strncasecmp(text, "NOOP", 4) == 0)) {
        reply(s, "250 OK\r\n");
    } else {
        reply(s, "502 not here\r\n");
    }
    return s->in_data < 0 ? -1 : 0;
}

// Reads what is there; returns -1 when the session is over.
static int readable(struct session *s) {
    for (;;) {
        ssize_t got = recv(s->fd, s->buffer + s->used, sizeof s->buffer - s->used, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (got <= 0) return -1;
        s->used += (size_t)got;
        size_t start = 0;
        for (size_t i = 1; i < s->used; i++) {
            if (s->buffer[i - 1] == '\r' && s->buffer[i] == '\n') {
                if (line(s, s->buffer + start, i - 1 - start) < 0) return -1;
                start = i + 1;
            }
        }
        if (start == 0 && s->used == sizeof s->buffer) return -1;  // a line longer than SMTP allows
        memmove(s->buffer, s->buffer + start, s->used - start);
        s->used -= start;
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: sink CODES_FILE\n");
        return 2;
    }
    out = open(argv[1], O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (out < 0) {
        perror(argv[1]);
        return 1;
    }
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t length = sizeof address;
    if (bind(listener, (struct sockaddr *)&address, sizeof address) != 0 || listen(listener, 1024) != 0 ||
        getsockname(listener, (struct sockaddr *)&address, &length) != 0) {
        perror("sink: listen");
        return 1;
    }
    int epoll = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event event = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(epoll, EPOLL_CTL_ADD, listener, &event);
    printf("ready %d\n", ntohs(address.sin_port));
    fflush(stdout);
    for (;;) {
        struct epoll_event events[256];
        int ready = epoll_wait(epoll, events, 256, -1);
        if (ready < 0 && errno == EINTR) continue;
        for (int e = 0; e < ready; e++) {
            struct session *s = events[e].data.ptr;
            if (s == NULL) {
                int fd;
                while ((fd = accept4(listener, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    struct session *fresh = calloc(1, sizeof *fresh);
                    if (!fresh) {
                        close(fd);
                        continue;
                    }
                    fresh->fd = fd;
                    struct epoll_event add = {.events = EPOLLIN, .data.ptr = fresh};
                    epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &add);
                    reply(fresh, "220 sink.bench ESMTP\r\n");
                }
                continue;
            }
            if (readable(s) < 0) {
                close(s->fd);  // also leaves the epoll set
                free(s);
            }
        }
    }
}
