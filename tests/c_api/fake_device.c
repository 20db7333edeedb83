/* SPDX-License-Identifier: Apache-2.0 */
/* The fake device of fake_device.h. Every callback is a request served under the device's
 * lock by serve(); the callbacks only fill one in. */
#define _POSIX_C_SOURCE 200809L

#include "fake_device.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct block {
    unsigned char* data;
    size_t bytes;
} block;

/* Device or pinned allocations. */
typedef struct block_list {
    block* items;
    size_t count, capacity;
} block_list;

enum op_kind { OP_COPY, OP_SET, OP_WAIT, OP_HOST };

/* Enqueued work: a copy, a memset to `value`, a wait for stream `stream` to have run
 * `position` ops, or a host function fn(user). */
typedef struct op {
    enum op_kind kind;
    unsigned char* dst;
    const unsigned char* src;
    int value;
    size_t bytes;
    size_t stream, position;
    devstage_host_function fn;
    void* user;
} op;

/* A stream (its work: ops[head, count) have not run) or an event (complete once stream
 * `stream` ran `position` ops; stream 0: never recorded). Ids are 1-based, never reused. */
typedef struct handle {
    int live;
    op* ops;
    size_t head, count, capacity;
    size_t stream, position;
    int polls;
} handle;

typedef struct handle_table {
    handle* items;
    size_t count, capacity;
} handle_table;

struct fake_device {
    pthread_mutex_t lock;
    size_t capacity, used;
    int streams;
    block_list device, pinned, registered;
    handle_table stream_table, event_table;
    unsigned calls[FAKE_OP_COUNT];
    unsigned fail_in[FAKE_OP_COUNT]; /* calls left until the failing one; 0: none */
};

enum request_kind {
    R_MALLOC,
    R_FREE,
    R_COPY,
    R_SET,
    R_CREATE_STREAM,
    R_DESTROY_STREAM,
    R_CREATE_EVENT,
    R_DESTROY_EVENT,
    R_RECORD,
    R_READY,
    R_SYNCHRONIZE,
    R_WAIT,
    R_SYNCHRONIZE_ALL,
    R_HOST_FUNCTION,
    R_REGISTER,
    R_UNREGISTER
};

/* One callback's arguments and results. */
typedef struct request {
    enum request_kind kind;
    fake_op op; /* the fault counter it counts against (FAKE_OP_COUNT: none) */
    int pinned; /* R_MALLOC, R_FREE: pinned, not device, memory */
    int async;  /* R_COPY, R_SET: enqueued on `stream` */
    int value;  /* R_SET */
    void* dst;  /* R_COPY; R_FREE: the pointer */
    const void* src;
    const void* device; /* R_COPY: the device side */
    size_t bytes;
    void* stream;
    void* event;
    void* made;                /* out: an allocation or a new handle */
    int ready;                 /* out: R_READY */
    devstage_host_function fn; /* R_HOST_FUNCTION */
    void* user;
} request;

/* `items` (of `count` elements of `size` bytes) with room for one more, or NULL (then `items`
 * is unchanged). */
static void* grown(void* items, size_t* capacity, size_t count, size_t size) {
    size_t bigger;
    void* moved;
    if (count < *capacity) return items;
    bigger = *capacity == 0 ? 8 : *capacity * 2;
    moved = realloc(items, bigger * size);
    if (moved != NULL) *capacity = bigger;
    return moved;
}

/* The block of `list` holding [p, p + bytes), or NULL. */
static block* find(block_list* list, const void* p, size_t bytes) {
    size_t i;
    const unsigned char* at = (const unsigned char*)p;
    for (i = 0; i < list->count; ++i) {
        block* b = &list->items[i];
        if (at >= b->data && at <= b->data + b->bytes && bytes <= (size_t)(b->data + b->bytes - at)) return b;
    }
    return NULL;
}

static void* allocate(fake_device* d, block_list* list, size_t bytes, int device) {
    void* p = NULL;
    block* items;
    if (device && (bytes > d->capacity || d->used > d->capacity - bytes)) return NULL;
    items = (block*)grown(list->items, &list->capacity, list->count, sizeof(block));
    if (items == NULL) return NULL;
    list->items = items;
    if (posix_memalign(&p, 256, bytes) != 0) return NULL;
    list->items[list->count].data = (unsigned char*)p;
    list->items[list->count].bytes = bytes;
    ++list->count;
    if (device) d->used += bytes;
    return p;
}

static void release(fake_device* d, block_list* list, void* p, int device) {
    size_t i;
    for (i = 0; i < list->count; ++i) {
        if (list->items[i].data != p) continue;
        if (device) d->used -= list->items[i].bytes;
        free(p);
        list->items[i] = list->items[--list->count];
        return;
    }
}

static int make_handle(handle_table* table, void** out) {
    handle* items = (handle*)grown(table->items, &table->capacity, table->count, sizeof(handle));
    if (items == NULL) return -12;
    table->items = items;
    memset(&items[table->count], 0, sizeof(handle));
    items[table->count++].live = 1;
    *out = (void*)(uintptr_t)table->count;
    return 0;
}

static handle* handle_of(handle_table* table, const void* h) {
    size_t id = (size_t)(uintptr_t)h;
    if (id == 0 || id > table->count || !table->items[id - 1].live) return NULL;
    return &table->items[id - 1];
}

static void run_until(fake_device* d, size_t id, size_t position);

static void run_op(fake_device* d, op o) {
    if (o.kind == OP_COPY) {
        memcpy(o.dst, o.src, o.bytes);
    } else if (o.kind == OP_SET) {
        memset(o.dst, o.value, o.bytes);
    } else if (o.kind == OP_HOST) {
        o.fn(o.user);
    } else {
        run_until(d, o.stream, o.position);
    }
}

/* Runs stream `id` until `position` ops ran; a wait runs what it waits for first. */
static void run_until(fake_device* d, size_t id, size_t position) {
    handle* s;
    if (id == 0 || id > d->stream_table.count) return;
    s = &d->stream_table.items[id - 1];
    while (s->head < position && s->head < s->count) run_op(d, s->ops[s->head++]);
}

static int enqueue(handle* s, op o) {
    op* ops = (op*)grown(s->ops, &s->capacity, s->count, sizeof(op));
    if (ops == NULL) return -12;
    s->ops = ops;
    s->ops[s->count++] = o;
    return 0;
}

/* Serves `r` (the lock is held): 0, or the failure the runtime would report. */
static int serve(fake_device* d, request* r) {
    handle* s = r->stream != NULL ? handle_of(&d->stream_table, r->stream) : NULL;
    handle* e = r->event != NULL ? handle_of(&d->event_table, r->event) : NULL;
    op o;
    memset(&o, 0, sizeof o);
    if (r->op != FAKE_OP_COUNT) {
        ++d->calls[r->op];
        if (d->fail_in[r->op] != 0 && --d->fail_in[r->op] == 0) return -5;
    }
    switch (r->kind) {
        case R_MALLOC:
            r->made = allocate(d, r->pinned ? &d->pinned : &d->device, r->bytes, !r->pinned);
            return r->made != NULL ? 0 : -12;
        case R_FREE:
            release(d, r->pinned ? &d->pinned : &d->device, r->dst, !r->pinned);
            return 0;
        case R_COPY:
        case R_SET:
            if (find(&d->device, r->device, r->bytes) == NULL || (r->async && s == NULL)) return -22;
            o.kind = r->kind == R_SET ? OP_SET : OP_COPY;
            o.dst = (unsigned char*)r->dst;
            o.src = (const unsigned char*)r->src;
            o.value = r->value;
            o.bytes = r->bytes;
            if (r->async) return enqueue(s, o);
            run_op(d, o);
            return 0;
        case R_CREATE_STREAM:
            return make_handle(&d->stream_table, &r->made);
        case R_DESTROY_STREAM:
            if (s == NULL) return -22;
            run_until(d, (size_t)(uintptr_t)r->stream, s->count); /* its work completes first */
            free(s->ops);
            s->ops = NULL;
            s->capacity = 0;
            s->live = 0; /* head == count: its events stay complete */
            return 0;
        case R_CREATE_EVENT:
            return make_handle(&d->event_table, &r->made);
        case R_DESTROY_EVENT:
            if (e == NULL) return -22;
            e->live = 0;
            return 0;
        case R_RECORD:
            if (e == NULL || s == NULL) return -22;
            e->stream = (size_t)(uintptr_t)r->stream;
            e->position = s->count;
            e->polls = 0;
            return 0;
        case R_READY:
            if (e == NULL) return -22;
            /* Not ready once per recording; then its work runs, so polling ends. */
            r->ready = e->stream == 0 || d->stream_table.items[e->stream - 1].head >= e->position || e->polls++ > 0;
            if (r->ready) run_until(d, e->stream, e->position);
            return 0;
        case R_SYNCHRONIZE:
            if (e == NULL) return -22;
            run_until(d, e->stream, e->position);
            return 0;
        case R_WAIT:
            if (e == NULL || s == NULL) return -22;
            o.kind = OP_WAIT;
            o.stream = e->stream;
            o.position = e->position;
            return enqueue(s, o);
        case R_SYNCHRONIZE_ALL: {
            size_t i;
            for (i = 0; i < d->stream_table.count; ++i) run_until(d, i + 1, d->stream_table.items[i].count);
            return 0;
        }
        case R_HOST_FUNCTION:
            if (s == NULL || r->fn == NULL) return -22;
            o.kind = OP_HOST;
            o.fn = r->fn;
            o.user = r->user;
            return enqueue(s, o);
        case R_REGISTER: {
            size_t i;
            const unsigned char* at = (const unsigned char*)r->dst;
            block* items;
            for (i = 0; i < d->registered.count; ++i) {
                const block* b = &d->registered.items[i];
                if (at < b->data + b->bytes && b->data < at + r->bytes) return -22; /* twice, or overlapping */
            }
            items = (block*)grown(d->registered.items, &d->registered.capacity, d->registered.count, sizeof(block));
            if (items == NULL) return -12;
            d->registered.items = items;
            items[d->registered.count].data = (unsigned char*)r->dst;
            items[d->registered.count].bytes = r->bytes;
            ++d->registered.count;
            return 0;
        }
        case R_UNREGISTER: {
            size_t i;
            for (i = 0; i < d->registered.count; ++i) {
                if (d->registered.items[i].data != r->dst) continue;
                d->registered.items[i] = d->registered.items[--d->registered.count];
                return 0;
            }
            return -22;
        }
    }
    return -22;
}

static int locked(void* context, request* r) {
    fake_device* d = (fake_device*)context;
    int result;
    pthread_mutex_lock(&d->lock);
    result = serve(d, r);
    pthread_mutex_unlock(&d->lock);
    return result;
}

/* ---- the callbacks --------------------------------------------------------------------- */

static void* allocated(void* context, fake_op op, int pinned, size_t bytes) {
    request r = {.kind = R_MALLOC, .op = op, .pinned = pinned, .bytes = bytes};
    return locked(context, &r) == 0 ? r.made : NULL;
}
static void freed(void* context, int pinned, void* p) {
    request r = {.kind = R_FREE, .op = FAKE_OP_COUNT, .pinned = pinned, .dst = p};
    (void)locked(context, &r);
}
static int copied(void* context, fake_op op, void* dst, const void* src, const void* device, size_t bytes,
                  void* stream) {
    request r = {.kind = R_COPY, .op = op, .dst = dst, .src = src, .device = device, .bytes = bytes, .stream = stream};
    r.async = op == FAKE_COPY_TO_DEVICE_ASYNC || op == FAKE_COPY_FROM_DEVICE_ASYNC;
    return locked(context, &r);
}
/* A request on a stream and/or an event; `made` receives a new handle. */
static int on_handles(void* context, enum request_kind kind, fake_op op, void* stream, void* event, void** made) {
    request r = {.kind = kind, .op = op, .stream = stream, .event = event};
    const int result = locked(context, &r);
    if (result == 0 && made != NULL) *made = r.made;
    return result;
}

static void* device_malloc(void* context, size_t bytes) {
    return allocated(context, FAKE_DEVICE_MALLOC, 0, bytes);
}
static void device_free(void* context, void* device) {
    freed(context, 0, device);
}
static void* pinned_malloc(void* context, size_t bytes) {
    return allocated(context, FAKE_PINNED_MALLOC, 1, bytes);
}
static void pinned_free(void* context, void* host) {
    freed(context, 1, host);
}
static int copy_to_device(void* context, void* device_dst, const void* host_src, size_t bytes) {
    return copied(context, FAKE_COPY_TO_DEVICE, device_dst, host_src, device_dst, bytes, NULL);
}
static int copy_from_device(void* context, void* host_dst, const void* device_src, size_t bytes) {
    return copied(context, FAKE_COPY_FROM_DEVICE, host_dst, device_src, device_src, bytes, NULL);
}
static int copy_to_device_async(void* context, void* device_dst, const void* host_src, size_t bytes, void* stream) {
    return copied(context, FAKE_COPY_TO_DEVICE_ASYNC, device_dst, host_src, device_dst, bytes, stream);
}
static int copy_from_device_async(void* context, void* host_dst, const void* device_src, size_t bytes, void* stream) {
    return copied(context, FAKE_COPY_FROM_DEVICE_ASYNC, host_dst, device_src, device_src, bytes, stream);
}
static int device_memset(void* context, void* device_dst, int value, size_t bytes) {
    request r = {.kind = R_SET, .op = FAKE_DEVICE_MEMSET, .dst = device_dst, .device = device_dst, .value = value};
    r.bytes = bytes;
    return locked(context, &r);
}
static int device_memset_async(void* context, void* device_dst, int value, size_t bytes, void* stream) {
    request r = {.kind = R_SET, .op = FAKE_DEVICE_MEMSET, .async = 1, .dst = device_dst, .value = value};
    r.device = device_dst, r.bytes = bytes, r.stream = stream;
    return locked(context, &r);
}
static int create_stream(void* context, void** stream) {
    return on_handles(context, R_CREATE_STREAM, FAKE_CREATE_STREAM, NULL, NULL, stream);
}
static int destroy_stream(void* context, void* stream) {
    return on_handles(context, R_DESTROY_STREAM, FAKE_OP_COUNT, stream, NULL, NULL);
}
static int create_event(void* context, void** event) {
    return on_handles(context, R_CREATE_EVENT, FAKE_CREATE_EVENT, NULL, NULL, event);
}
static int destroy_event(void* context, void* event) {
    return on_handles(context, R_DESTROY_EVENT, FAKE_OP_COUNT, NULL, event, NULL);
}
static int record_event(void* context, void* event, void* stream) {
    return on_handles(context, R_RECORD, FAKE_RECORD_EVENT, stream, event, NULL);
}
static int event_ready(void* context, void* event, int* ready) {
    request r = {.kind = R_READY, .op = FAKE_EVENT_READY, .event = event};
    const int result = locked(context, &r);
    if (result == 0) *ready = r.ready;
    return result;
}
static int synchronize_event(void* context, void* event) {
    return on_handles(context, R_SYNCHRONIZE, FAKE_SYNCHRONIZE_EVENT, NULL, event, NULL);
}
static int stream_wait_event(void* context, void* stream, void* event) {
    return on_handles(context, R_WAIT, FAKE_STREAM_WAIT_EVENT, stream, event, NULL);
}

static int synchronize(void* context) {
    request r = {.kind = R_SYNCHRONIZE_ALL, .op = FAKE_SYNCHRONIZE};
    return locked(context, &r);
}
static int launch_host_function(void* context, void* stream, devstage_host_function fn, void* user) {
    request r = {.kind = R_HOST_FUNCTION, .op = FAKE_LAUNCH_HOST_FUNCTION, .stream = stream, .fn = fn, .user = user};
    return locked(context, &r);
}
static int host_register(void* context, void* host, size_t bytes) {
    request r = {.kind = R_REGISTER, .op = FAKE_HOST_REGISTER, .dst = host, .bytes = bytes};
    return locked(context, &r);
}
static int host_unregister(void* context, void* host) {
    request r = {.kind = R_UNREGISTER, .op = FAKE_HOST_REGISTER, .dst = host};
    return locked(context, &r);
}

/* ---- the device ------------------------------------------------------------------------ */

fake_device* fake_device_create(size_t capacity, int streams) {
    fake_device* d = (fake_device*)calloc(1, sizeof(fake_device));
    if (d == NULL) return NULL;
    pthread_mutex_init(&d->lock, NULL);
    d->capacity = capacity;
    d->streams = streams;
    return d;
}

void fake_device_destroy(fake_device* d) {
    size_t i;
    if (d == NULL) return;
    for (i = 0; i < d->device.count; ++i) free(d->device.items[i].data);
    for (i = 0; i < d->pinned.count; ++i) free(d->pinned.items[i].data);
    for (i = 0; i < d->stream_table.count; ++i) free(d->stream_table.items[i].ops);
    free(d->device.items);
    free(d->pinned.items);
    free(d->registered.items);
    free(d->stream_table.items);
    free(d->event_table.items);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

void fake_device_callbacks(fake_device* d, devstage_callbacks* c) {
    memset(c, 0, sizeof *c);
    c->name = "fake";
    c->context = d;
    c->device_malloc = device_malloc;
    c->device_free = device_free;
    c->copy_to_device = copy_to_device;
    c->copy_from_device = copy_from_device;
    c->pinned_malloc = pinned_malloc;
    c->pinned_free = pinned_free;
    c->device_memset = device_memset;
    c->host_register = host_register;
    c->host_unregister = host_unregister;
    if (!d->streams) return;
    c->synchronize = synchronize;
    c->launch_host_function = launch_host_function;
    c->device_memset_async = device_memset_async;
    c->create_stream = create_stream;
    c->destroy_stream = destroy_stream;
    c->copy_to_device_async = copy_to_device_async;
    c->copy_from_device_async = copy_from_device_async;
    c->create_event = create_event;
    c->destroy_event = destroy_event;
    c->record_event = record_event;
    c->event_ready = event_ready;
    c->synchronize_event = synchronize_event;
    c->stream_wait_event = stream_wait_event;
}

void fake_device_fail(fake_device* d, fake_op op, unsigned k) {
    pthread_mutex_lock(&d->lock);
    d->fail_in[op] = k;
    pthread_mutex_unlock(&d->lock);
}

enum count_kind { C_CALLS, C_DEVICE, C_PINNED, C_STREAMS, C_EVENTS, C_PENDING, C_REGISTERED };

/* A counter, read under the lock (the device is shared between threads). */
static size_t counted(const fake_device* device, enum count_kind kind, fake_op op) {
    fake_device* d = (fake_device*)device;
    size_t i, n = 0;
    pthread_mutex_lock(&d->lock);
    switch (kind) {
        case C_CALLS:
            n = d->calls[op];
            break;
        case C_DEVICE:
            n = d->device.count;
            break;
        case C_PINNED:
            n = d->pinned.count;
            break;
        case C_REGISTERED:
            n = d->registered.count;
            break;
        case C_STREAMS:
        case C_PENDING:
            for (i = 0; i < d->stream_table.count; ++i) {
                const handle* s = &d->stream_table.items[i];
                n += kind == C_STREAMS ? (size_t)(s->live != 0) : s->count - s->head;
            }
            break;
        case C_EVENTS:
            for (i = 0; i < d->event_table.count; ++i) n += d->event_table.items[i].live != 0;
            break;
    }
    pthread_mutex_unlock(&d->lock);
    return n;
}

unsigned fake_device_calls(const fake_device* d, fake_op op) {
    return (unsigned)counted(d, C_CALLS, op);
}
size_t fake_device_live_device(const fake_device* d) {
    return counted(d, C_DEVICE, FAKE_OP_COUNT);
}
size_t fake_device_live_pinned(const fake_device* d) {
    return counted(d, C_PINNED, FAKE_OP_COUNT);
}
size_t fake_device_live_streams(const fake_device* d) {
    return counted(d, C_STREAMS, FAKE_OP_COUNT);
}
size_t fake_device_live_events(const fake_device* d) {
    return counted(d, C_EVENTS, FAKE_OP_COUNT);
}
size_t fake_device_pending(const fake_device* d) {
    return counted(d, C_PENDING, FAKE_OP_COUNT);
}
size_t fake_device_registered(const fake_device* d) {
    return counted(d, C_REGISTERED, FAKE_OP_COUNT);
}
