#ifndef TRUNK_SYNC_CSYSTEM_H
#define TRUNK_SYNC_CSYSTEM_H
// Linux system calls that Swift's Glibc module does not export or imports awkwardly
// (they need _GNU_SOURCE, or are macros): epoll, eventfd, accept4, send flags, thread names.
// Thin wrappers only; all logic lives in Swift.
#include <stdint.h>
#include <stddef.h>
#include <sys/types.h>

/// Names the calling thread (Linux keeps the first 15 bytes); 0 on success.
int csystem_set_thread_name(const char *name);

/// Copies the calling thread's name into `buffer`; 0 on success.
int csystem_get_thread_name(char *buffer, size_t size);

/// Starts a joinable thread named `name` (15 bytes kept) with a stack of `stack_size` bytes
/// that runs `body(context)` once. Every such thread is registered until it is joined:
/// finished threads are joined without waiting (`pthread_tryjoin_np`) whenever another
/// starts, and `csystem_threads_join_all` joins the rest, so the process can exit knowing no
/// thread of its own still runs (a thread inside libpq or OpenSSL while `exit` runs their
/// clean-up corrupts the heap). 0 on success, else an errno value (`body` then never runs).
int csystem_thread_start(const char *name, size_t stack_size, void (*body)(void *), void *context);

/// Joins every thread started by `csystem_thread_start`, including threads started while it
/// waits, giving up after `timeout_ms`. Returns how many are still running (0: all joined).
/// Call it after everything that owns threads has been told to stop.
int csystem_threads_join_all(unsigned timeout_ms);

/// Threads started by `csystem_thread_start` and not joined yet (finished or not).
int csystem_threads_registered(void);

/// Sets the calling thread's scheduling policy: `SCHED_BATCH` when `batch` is non-zero, else
/// `SCHED_OTHER` (both at priority 0, no privilege needed). 0 on success, else an errno value.
int csystem_thread_set_batch_scheduling(int batch);

/// The scheduling policy of thread `tid` of this process (`SCHED_OTHER` 0, `SCHED_BATCH` 3),
/// or -1 with errno set.
int csystem_thread_scheduling_policy(int tid);

/// accept4(2) with SOCK_NONBLOCK | SOCK_CLOEXEC; the peer address is written as text
/// ("1.2.3.4" or "::1") into `address` (at least 64 bytes) and in network order into `raw`
/// (16 bytes; the first 4 for IPv4, IPv4-mapped IPv6 peers count as IPv4); `family` is 4, 6,
/// or 0 for a peer without an IP address.
int csystem_accept(int listener, char *address, size_t address_size, uint8_t *raw, int *family);

/// send(2) with MSG_NOSIGNAL (a closed peer gives EPIPE, never SIGPIPE).
ssize_t csystem_send(int fd, const void *buffer, size_t length);

/// Sets TCP_NODELAY (responses go out at once).
int csystem_set_nodelay(int fd);

/// Before a close for a timeout: makes that close a reset (RST) when `force` is set or the
/// kernel still holds bytes the peer has not acknowledged (SIOCOUTQ). A peer that stopped
/// reading never takes them: a plain close would queue the FIN behind them and leave an
/// orphaned socket holding its send buffer (megabytes) while the kernel probes a zero window
/// for minutes, and the peer would never learn the connection ended. Returns 1 when the close
/// will reset, 0 when it stays graceful, -1 on error.
int csystem_reset_on_close_if_unsent(int fd, int force);

/// A listening socket bound to host:port (numeric or resolvable host; "::" accepts IPv4 too),
/// non-blocking, close-on-exec, with SO_REUSEADDR. With `reuse_port` 1, also SO_REUSEPORT:
/// the sockets of one server's event loops bind the same port and the kernel spreads incoming
/// connections over them. With 2 (the group's first socket), the port is first bound without
/// the flag, so a port any other socket holds — shared or not, another trunk-sync's included —
/// is refused as in use, then bound with it (0 picks a free port). Returns the fd, or -1 with
/// errno set and a reason in `error` (at least 256 bytes). `bound_port` receives the actual port.
int csystem_listen(const char *host, int port, int backlog, int reuse_port, int *bound_port, char *error, size_t error_size);

/// Looks `host` up (`getaddrinfo`, blocking: call it on a thread that may wait) and writes
/// its addresses as numeric text, comma-separated, into `addresses` (as many as fit).
/// Returns how many were written, or -1 with the resolver's reason in `error`.
int csystem_resolve(const char *host, char *addresses, size_t size, char *error, size_t error_size);

/// epoll wrappers (the event constants are macros or packed structs in <sys/epoll.h>).
int csystem_epoll_create(void);
int csystem_epoll_add(int epoll, int fd, uint32_t events, uint64_t data);
int csystem_epoll_delete(int epoll, int fd);
int csystem_epoll_modify(int epoll, int fd, uint32_t events, uint64_t data);

/// Gives the allocator's free memory back to the system (glibc's malloc_trim(0), which also
/// releases free pages between used ones); returns 1 if some was released.
int csystem_release_free_memory(void);

/// One ready descriptor from `csystem_epoll_wait`.
typedef struct {
    uint32_t events;
    uint64_t data;
} csystem_event;

/// epoll_wait(2) into an unpacked array; returns the count or -1 with errno set.
int csystem_epoll_wait(int epoll, csystem_event *events, int max_events, int timeout_ms);

uint32_t csystem_epollin(void);
uint32_t csystem_epollout(void);
uint32_t csystem_epollrdhup(void);
uint32_t csystem_epollhup(void);
uint32_t csystem_epollerr(void);
uint32_t csystem_epollet(void);

/// eventfd(2), non-blocking and close-on-exec.
int csystem_eventfd(void);

/// 1 when `signo`'s disposition is SIG_IGN, 0 when it is anything else, -1 on error.
int csystem_signal_is_ignored(int signo);

/// Raises RLIMIT_NOFILE's soft limit to its hard limit; returns the new soft limit.
long csystem_raise_fd_limit(void);

/// Relaxed atomic add and load on a plain 64-bit cell (metric counters in a flat table:
/// Swift's `Atomic` cannot live in an array).
static inline void csystem_atomic_add(uint64_t *cell, uint64_t value) {
    __atomic_fetch_add(cell, value, __ATOMIC_RELAXED);
}
static inline uint64_t csystem_atomic_load(const uint64_t *cell) {
    return __atomic_load_n(cell, __ATOMIC_RELAXED);
}
/// Relaxed atomic add returning the value before it.
static inline uint64_t csystem_atomic_fetch_add(uint64_t *cell, uint64_t value) {
    return __atomic_fetch_add(cell, value, __ATOMIC_RELAXED);
}

#endif
