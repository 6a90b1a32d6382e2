// A registry of the process's own threads, so that every one of them is joined before the
// process exits (see csystem_thread_start in csystem.h).
#define _GNU_SOURCE
#include "csystem.h"
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct thread_record {
    pthread_t thread;
    void (*body)(void *);
    void *context;
    char name[16];
    struct thread_record *next;
} thread_record;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static thread_record *registry = NULL;
static int registered = 0;

static void *thread_main(void *argument) {
    thread_record *record = argument;
    pthread_setname_np(pthread_self(), record->name);
    record->body(record->context);
    return NULL;
}

/// Joins the finished threads of the registry without waiting; the lock must be held.
static void reap_finished(void) {
    thread_record **link = &registry;
    while (*link != NULL) {
        thread_record *record = *link;
        if (pthread_tryjoin_np(record->thread, NULL) == 0) {
            *link = record->next;
            registered--;
            free(record);
        } else {
            link = &record->next;
        }
    }
}

int csystem_thread_start(const char *name, size_t stack_size, void (*body)(void *), void *context) {
    thread_record *record = calloc(1, sizeof(thread_record));
    if (record == NULL) return ENOMEM;
    record->body = body;
    record->context = context;
    strncpy(record->name, name, sizeof(record->name) - 1);
    pthread_attr_t attributes;
    pthread_attr_init(&attributes);
    if (stack_size > 0) pthread_attr_setstacksize(&attributes, stack_size);
    pthread_mutex_lock(&registry_lock);
    reap_finished();
    int result = pthread_create(&record->thread, &attributes, thread_main, record);
    if (result == 0) {
        record->next = registry;
        registry = record;
        registered++;
    } else {
        free(record);
    }
    pthread_mutex_unlock(&registry_lock);
    pthread_attr_destroy(&attributes);
    return result;
}

int csystem_threads_join_all(unsigned timeout_ms) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);  // pthread_timedjoin_np's clock
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec += 1;
        deadline.tv_nsec -= 1000000000L;
    }
    for (;;) {
        // Taken out of the registry while waiting: the threads may start others meanwhile
        // (a pool opening a connection), which the next round joins.
        pthread_mutex_lock(&registry_lock);
        thread_record *batch = registry;
        registry = NULL;
        pthread_mutex_unlock(&registry_lock);
        if (batch == NULL) return 0;
        thread_record *left = NULL;
        int joined = 0;
        while (batch != NULL) {
            thread_record *record = batch;
            batch = record->next;
            if (pthread_timedjoin_np(record->thread, NULL, &deadline) == 0) {
                free(record);
                joined++;
            } else {
                record->next = left;
                left = record;
            }
        }
        pthread_mutex_lock(&registry_lock);
        registered -= joined;
        int remaining = 0;
        while (left != NULL) {
            thread_record *record = left;
            left = record->next;
            record->next = registry;
            registry = record;
            remaining++;
        }
        int total = registered;
        pthread_mutex_unlock(&registry_lock);
        if (remaining > 0) return total;  // the deadline passed
    }
}

int csystem_threads_registered(void) {
    pthread_mutex_lock(&registry_lock);
    int count = registered;
    pthread_mutex_unlock(&registry_lock);
    return count;
}

int csystem_thread_set_batch_scheduling(int batch) {
    struct sched_param param = {0};
    // On Linux the policy belongs to the thread: 0 names the caller's thread, not the process.
    return sched_setscheduler(0, batch ? SCHED_BATCH : SCHED_OTHER, &param) == 0 ? 0 : errno;
}

int csystem_thread_scheduling_policy(int tid) { return sched_getscheduler(tid); }
