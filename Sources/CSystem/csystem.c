#define _GNU_SOURCE
#include "csystem.h"
#include <pthread.h>
#include <sys/socket.h>

int csystem_set_thread_name(const char *name) {
#ifdef __linux__
    char truncated[16];
    size_t i = 0;
    for (; i < 15 && name[i] != 0; i++) truncated[i] = name[i];
    truncated[i] = 0;
    return pthread_setname_np(pthread_self(), truncated);
#else
    return pthread_setname_np(name);
#endif
}

int csystem_get_thread_name(char *buffer, size_t size) {
    return pthread_getname_np(pthread_self(), buffer, size);
}

int csystem_accept_nonblocking(int fd, void *address, uint32_t *length) {
#ifdef __linux__
    return accept4(fd, (struct sockaddr *)address, (socklen_t *)length, SOCK_NONBLOCK | SOCK_CLOEXEC);
#else
    return accept(fd, (struct sockaddr *)address, (socklen_t *)length);
#endif
}
