#ifndef TRUNK_SYNC_CLIBPQ_SHIM_H
#define TRUNK_SYNC_CLIBPQ_SHIM_H
#include <libpq-fe.h>
#include <poll.h>
#endif
