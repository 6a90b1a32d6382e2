#define _GNU_SOURCE
#include "csystem.h"
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/epoll.h>
#include <sys/eventfd.h>
#endif

int csystem_set_thread_name(const char *name) {
    char truncated[16];
    size_t i = 0;
    for (; i < 15 && name[i] != 0; i++) truncated[i] = name[i];
    truncated[i] = 0;
    return pthread_setname_np(pthread_self(), truncated);
}

int csystem_get_thread_name(char *buffer, size_t size) {
    return pthread_getname_np(pthread_self(), buffer, size);
}

int csystem_accept(int listener, char *address, size_t address_size, uint8_t *raw, int *family) {
    struct sockaddr_storage storage;
    socklen_t length = sizeof(storage);
    int fd;
    do {
        fd = accept4(listener, (struct sockaddr *)&storage, &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return fd;
    address[0] = 0;
    *family = 0;
    if (storage.ss_family == AF_INET) {
        struct in_addr *in4 = &((struct sockaddr_in *)&storage)->sin_addr;
        inet_ntop(AF_INET, in4, address, (socklen_t)address_size);
        memcpy(raw, in4, 4);
        *family = 4;
    } else if (storage.ss_family == AF_INET6) {
        struct in6_addr *in6 = &((struct sockaddr_in6 *)&storage)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(in6)) {
            inet_ntop(AF_INET, &in6->s6_addr[12], address, (socklen_t)address_size);
            memcpy(raw, &in6->s6_addr[12], 4);
            *family = 4;
        } else {
            inet_ntop(AF_INET6, in6, address, (socklen_t)address_size);
            memcpy(raw, in6->s6_addr, 16);
            *family = 6;
        }
    }
    return fd;
}

ssize_t csystem_send(int fd, const void *buffer, size_t length) {
    ssize_t sent;
    do {
        sent = send(fd, buffer, length, MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    return sent;
}

int csystem_set_nodelay(int fd) {
    int one = 1;
    return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int csystem_reset_on_close_if_unsent(int fd, int force) {
    if (!force) {
        int queued = 0;
        if (ioctl(fd, SIOCOUTQ, &queued) != 0) return -1;
        if (queued <= 0) return 0;
    }
    struct linger abortive = {.l_onoff = 1, .l_linger = 0};
    return setsockopt(fd, SOL_SOCKET, SO_LINGER, &abortive, sizeof(abortive)) == 0 ? 1 : -1;
}

int csystem_listen(const char *host, int port, int backlog, int reuse_port, int *bound_port, char *error, size_t error_size) {
    if (reuse_port == 2) {
        // First of a group: the port must be free of every other socket, shared or not. A
        // bind without SO_REUSEPORT fails on any socket holding it (another trunk-sync's
        // loops included, which would otherwise let this one join them), then the group's
        // first socket binds the port the probe got.
        int probe_port = 0;
        int probe = csystem_listen(host, port, 1, 0, &probe_port, error, error_size);
        if (probe < 0) return -1;
        close(probe);
        return csystem_listen(host, probe_port, backlog, 1, bound_port, error, error_size);
    }
    struct addrinfo hints, *results = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    char service[16];
    snprintf(service, sizeof(service), "%d", port);
    int status = getaddrinfo(host, service, &hints, &results);
    if (status != 0) {
        snprintf(error, error_size, "cannot resolve %s: %s", host, gai_strerror(status));
        errno = EINVAL;
        return -1;
    }
    int fd = -1;
    int saved = 0;
    for (struct addrinfo *entry = results; entry != NULL; entry = entry->ai_next) {
        fd = socket(entry->ai_family, entry->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, entry->ai_protocol);
        if (fd < 0) { saved = errno; continue; }
        int one = 1, zero = 0;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (reuse_port && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0) {
            saved = errno;
            close(fd);
            fd = -1;
            continue;
        }
        if (entry->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
        if (bind(fd, entry->ai_addr, entry->ai_addrlen) == 0 && listen(fd, backlog) == 0) {
            struct sockaddr_storage bound;
            socklen_t length = sizeof(bound);
            getsockname(fd, (struct sockaddr *)&bound, &length);
            *bound_port = bound.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&bound)->sin6_port)
                                                      : ntohs(((struct sockaddr_in *)&bound)->sin_port);
            freeaddrinfo(results);
            return fd;
        }
        saved = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(results);
    snprintf(error, error_size, "cannot listen on %s:%d: %s", host, port, strerror(saved));
    errno = saved;
    return -1;
}

int csystem_epoll_create(void) { return epoll_create1(EPOLL_CLOEXEC); }

int csystem_epoll_add(int epoll, int fd, uint32_t events, uint64_t data) {
    struct epoll_event event;
    event.events = events;
    event.data.u64 = data;
    return epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event);
}

int csystem_epoll_delete(int epoll, int fd) {
    struct epoll_event event;
    memset(&event, 0, sizeof(event));
    return epoll_ctl(epoll, EPOLL_CTL_DEL, fd, &event);
}

int csystem_epoll_modify(int epoll, int fd, uint32_t events, uint64_t data) {
    struct epoll_event event;
    memset(&event, 0, sizeof(event));
    event.events = events;
    event.data.u64 = data;
    return epoll_ctl(epoll, EPOLL_CTL_MOD, fd, &event);
}

int csystem_epoll_wait(int epoll, csystem_event *events, int max_events, int timeout_ms) {
    struct epoll_event raw[256];
    if (max_events > 256) max_events = 256;
    int count = epoll_wait(epoll, raw, max_events, timeout_ms);
    for (int i = 0; i < count; i++) {
        events[i].events = raw[i].events;
        events[i].data = raw[i].data.u64;
    }
    return count;
}

uint32_t csystem_epollin(void) { return EPOLLIN; }
uint32_t csystem_epollout(void) { return EPOLLOUT; }
uint32_t csystem_epollrdhup(void) { return EPOLLRDHUP; }
uint32_t csystem_epollhup(void) { return EPOLLHUP; }
uint32_t csystem_epollerr(void) { return EPOLLERR; }
uint32_t csystem_epollet(void) { return EPOLLET; }

int csystem_eventfd(void) { return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }

int csystem_signal_is_ignored(int signo) {
    struct sigaction current;
    if (sigaction(signo, NULL, &current) != 0) return -1;
    return current.sa_handler == SIG_IGN ? 1 : 0;
}

long csystem_raise_fd_limit(void) {
    struct rlimit limit;
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return -1;
    if (limit.rlim_cur < limit.rlim_max) {
        limit.rlim_cur = limit.rlim_max;
        setrlimit(RLIMIT_NOFILE, &limit);
        getrlimit(RLIMIT_NOFILE, &limit);
    }
    return (long)limit.rlim_cur;
}

int csystem_resolve(const char *host, char *addresses, size_t size, char *error, size_t error_size) {
    struct addrinfo hints, *results = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (size == 0) return -1;
    addresses[0] = 0;
    int status = getaddrinfo(host, NULL, &hints, &results);
    if (status != 0) {
        snprintf(error, error_size, "%s", status == EAI_SYSTEM ? strerror(errno) : gai_strerror(status));
        return -1;
    }
    size_t used = 0;
    int count = 0;
    for (struct addrinfo *entry = results; entry != NULL; entry = entry->ai_next) {
        char text[NI_MAXHOST];
        if (getnameinfo(entry->ai_addr, entry->ai_addrlen, text, sizeof(text), NULL, 0, NI_NUMERICHOST) != 0) continue;
        size_t length = strlen(text);
        if (used + length + 2 > size) break;
        if (used > 0) addresses[used++] = ',';
        memcpy(addresses + used, text, length);
        used += length;
        addresses[used] = 0;
        count++;
    }
    freeaddrinfo(results);
    if (count == 0) snprintf(error, error_size, "no address");
    return count > 0 ? count : -1;
}

#ifdef __GLIBC__
#include <malloc.h>
#endif

int csystem_release_free_memory(void) {
#ifdef __GLIBC__
    return malloc_trim(0);
#else
    return 0;
#endif
}
