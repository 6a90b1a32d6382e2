// The measurement both bench clients run (bench/stream/streams.c, bench/realtime/sockets.c),
// included at the end of each after it defines: `struct stream` (with fd, user, open, seen,
// events, disorder), `drain()` (reads what is there; sets open once the stream or socket is
// ready, counts each event of the user into events, seen and disorder; -1 when it ended),
// `open_request()` (the bytes that open one, for a user's token), and CLIENT and KIND (names
// for messages). Opens COUNT of them over USERS users, then COMMITS pushes, each timed to
// every one of its user's; see bench/stream/streams.c.
#ifndef TRUNK_SYNC_BENCH_MAIN_H
#define TRUNK_SYNC_BENCH_MAIN_H

// Reads every stream that has data for up to `ms` milliseconds; counts the events read by
// streams of any user but `user` into *foreign. Returns -1 when a stream ended.
static int read_for(int epoll, struct stream *streams, double ms, int user, long *foreign) {
    struct epoll_event events[1024];
    double until = now_ms() + ms;
    for (double left = ms; left > 0; left = until - now_ms()) {
        int ready = epoll_wait(epoll, events, 1024, (int)left + 1);
        for (int e = 0; e < ready; e++) {
            struct stream *s = &streams[events[e].data.u32];
            long before = s->events;
            if (drain(s) < 0) return -1;
            if (s->user != user) *foreign += s->events - before;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 9) {
        fprintf(stderr, "usage: " CLIENT " HOST PORT COUNT USERS TOKENS_FILE COMMITS READY_FILE GO_FILE\n");
        return 2;
    }
    const char *host = argv[1];
    int port = atoi(argv[2]), count = atoi(argv[3]), users = atoi(argv[4]), commits = atoi(argv[6]);
    const char *tokens_file = argv[5], *ready_file = argv[7], *go_file = argv[8];
    if (count < 1 || users < 1 || users > count || commits < 1) {
        fprintf(stderr, CLIENT ": need 1 <= USERS <= COUNT and COMMITS >= 1\n");
        return 2;
    }

    char (*tokens)[TOKEN] = calloc((size_t)users, TOKEN);
    FILE *tokens_in = fopen(tokens_file, "r");
    for (int u = 0; u < users; u++) {
        if (!tokens_in || !fgets(tokens[u], TOKEN, tokens_in)) {
            fprintf(stderr, CLIENT ": %s has fewer than %d tokens\n", tokens_file, users);
            return 2;
        }
        tokens[u][strcspn(tokens[u], "\r\n")] = 0;
    }
    fclose(tokens_in);

    char request[2 * TOKEN + 1024];
    struct stream *streams = calloc((size_t)count, sizeof *streams);
    int epoll = epoll_create1(EPOLL_CLOEXEC);
    double started = now_ms();
    for (int i = 0; i < count; i++) {
        streams[i].user = i % users;
        int request_length = open_request(request, sizeof request, host, port, tokens[streams[i].user]);
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
            fprintf(stderr, "only %d of %d " KIND " opened\n", open, count);
            return 1;
        }
        for (int e = 0; e < ready; e++) {
            struct stream *s = &streams[events[e].data.u32];
            int was = s->open;
            if (drain(s) < 0) {
                fprintf(stderr, "one of the " KIND " ended while opening (a limit too low?)\n");
                return 1;
            }
            if (!was && s->open) open++;
        }
    }
    fprintf(stderr, "%d " KIND " of %d users open in %.1f s\n", count, users, (now_ms() - started) / 1e3);
    FILE *ready_out = fopen(ready_file, "w");
    fprintf(ready_out, "%d\n", count);
    fclose(ready_out);
    struct stat info;
    long foreign = 0;
    while (stat(go_file, &info) != 0) {
        // Heartbeats may arrive meanwhile: read them so no buffer fills.
        if (read_for(epoll, streams, 100, -1, &foreign) < 0) {
            fprintf(stderr, "one of the " KIND " ended while idle\n");
            return 1;
        }
    }
    if (foreign != 0) {
        fprintf(stderr, "%ld events arrived before the first commit\n", foreign);
        return 1;
    }

    long *pushed = calloc((size_t)users, sizeof *pushed);  // each user's events so far
    size_t most = (size_t)commits * (size_t)(count / users + 1);
    double *latencies = malloc(sizeof(double) * most);
    size_t measured = 0;
    double worst_round = 0;
    for (int round = 1; round <= commits; round++) {
        // Spread evenly over the users: with COMMITS <= USERS, each commit is another user's.
        int user = (int)((long)(round - 1) * users / commits % users);
        if (commits > users) user = (round - 1) % users;
        char body[512], push[TOKEN + 1024];
        int body_length = snprintf(
            body, sizeof body,
            "{\"events\":[{\"client_id\":\"00000000-0000-4000-8000-%012d\",\"type\":\"bench\","
            "\"payload\":{\"round\":%d},\"client_timestamp\":\"2026-11-23T00:00:00.000Z\"}]}",
            round, round);
        int push_length = snprintf(
            push, sizeof push,
            "POST /sync/v1/events HTTP/1.1\r\nHost: %s:%d\r\nAuthorization: Bearer %s\r\n"
            "Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
            host, port, tokens[user], body_length, body);
        long seq = ++pushed[user];
        int pusher = connect_from(host, port, count);
        double sent = now_ms();
        if (pusher < 0 || send_all(pusher, push, (size_t)push_length) != 0) {
            fprintf(stderr, "push %d failed\n", round);
            return 1;
        }
        int waiting = 0;
        for (int i = 0; i < count; i++) waiting += streams[i].user == user;
        while (waiting > 0) {
            int ready = epoll_wait(epoll, events, 1024, 10000);
            if (ready <= 0) {
                fprintf(stderr, "round %d: %d streams of user %d did not get the event within 10 s (%ld events read by other users' streams)\n",
                        round, waiting, user, foreign);
                return 1;
            }
            double at = now_ms();
            for (int e = 0; e < ready; e++) {
                struct stream *s = &streams[events[e].data.u32];
                long before_seen = s->seen, before_events = s->events;
                if (drain(s) < 0) {
                    fprintf(stderr, "round %d: a stream ended\n", round);
                    return 1;
                }
                if (s->user != user) {
                    foreign += s->events - before_events;
                } else if (before_seen < seq && s->seen >= seq) {
                    latencies[measured++] = at - sent;
                    waiting--;
                }
            }
        }
        double round_time = now_ms() - sent;
        if (round_time > worst_round) worst_round = round_time;
        long answered = answered_seq(pusher);
        close(pusher);
        if (answered != seq) {
            fprintf(stderr, "push %d was not answered 200 with seq %ld (got %ld)\n", round, seq, answered);
            return 1;
        }
        // Commits apart, each measured on its own; meanwhile any stray event is counted.
        if (read_for(epoll, streams, 200, user, &foreign) < 0) {
            fprintf(stderr, "round %d: a stream ended\n", round);
            return 1;
        }
    }

    long wrong = 0, disorder = 0;  // streams whose events are not exactly their user's
    for (int i = 0; i < count; i++) {
        wrong += streams[i].events != pushed[streams[i].user] || streams[i].seen != pushed[streams[i].user];
        disorder += streams[i].disorder;
    }
    int touched = 0;
    for (int u = 0; u < users; u++) touched += pushed[u] > 0;
    qsort(latencies, measured, sizeof(double), compare);
    printf(
        "latency_ms p50=%.1f p90=%.1f p99=%.1f max=%.1f samples=%zu slowest_round_ms=%.1f\n"
        "isolation users_pushed=%d other_users_events=%ld streams_wrong=%ld out_of_order=%ld\n",
        latencies[measured / 2], latencies[measured * 9 / 10], latencies[measured * 99 / 100], latencies[measured - 1],
        measured, worst_round, touched, foreign, wrong, disorder);
    if (foreign != 0 || wrong != 0 || disorder != 0) {
        fprintf(stderr, "isolation failed: an event reached a stream it does not belong to, or not exactly once\n");
        return 1;
    }
    return 0;
}
#endif
