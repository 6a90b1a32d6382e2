#ifndef TRUNK_SYNC_CSYSTEM_H
#define TRUNK_SYNC_CSYSTEM_H
// Linux system calls that Swift's Glibc module does not export (they need _GNU_SOURCE):
// epoll, accept4, thread names. Thin wrappers only; all logic lives in Swift.
#include <stdint.h>
#include <sys/types.h>

#ifdef __linux__
#include <sys/epoll.h>
#include <sys/eventfd.h>
#endif

/// Names the calling thread (Linux keeps the first 15 bytes); 0 on success.
int csystem_set_thread_name(const char *name);

/// Copies the calling thread's name into `buffer`; 0 on success.
int csystem_get_thread_name(char *buffer, size_t size);

/// accept4(2) with SOCK_NONBLOCK | SOCK_CLOEXEC.
int csystem_accept_nonblocking(int fd, void *address, uint32_t *length);

#endif
