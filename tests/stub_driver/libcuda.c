/*
 * A stand-in for the CUDA driver (libcuda.so) with no GPU behind it, for
 * tests/stub_driver.rs: the real CUDA backend runs against it on machines
 * without CUDA. It fakes only what pinpool and the cudarc calls it makes
 * need, and is strict where the real driver is strict in ways the pool
 * must respect:
 *
 * - every call but cuInit and the error-string calls fails with
 *   CUDA_ERROR_NOT_INITIALIZED before cuInit;
 * - the current context is per thread; calls that need one (registration,
 *   synchronize, event and stream creation, copies) fail with
 *   CUDA_ERROR_INVALID_CONTEXT without one, and cuEventRecord fails unless
 *   the event's own context is current;
 * - primary contexts are fixed pointers, one per device, reference-counted
 *   by cuDevicePrimaryCtxRetain / cuDevicePrimaryCtxRelease_v2; as with the
 *   driver, releasing the last reference leaves the context current, a
 *   released one can still be made current, calls that need a context
 *   fail under it with CUDA_ERROR_CONTEXT_IS_DESTROYED (cuCtxGetDevice
 *   succeeds and reports device -1), and retaining it again revives it;
 *   one extra "application" context (stub_user_context) is always valid;
 * - registrations are recorded (base, length, flags); overlapping ones and
 *   unregistering a pointer that is not a registered base fail as the
 *   driver does;
 * - "device memory" is host memory, and copies run synchronously, so
 *   events complete at once (unless cuEventQuery is made to fail with
 *   CUDA_ERROR_NOT_READY).
 *
 * Configured by environment variables, read at cuInit:
 *   STUB_CUDA_DEVICES  the device count (default 1, at most 128);
 *   STUB_CUDA_NUMA     each device's CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID,
 *                      comma-separated (default -1: unknown);
 *   STUB_CUDA_FAIL     calls to fail: `name` (every call), `name@n` (the
 *                      n-th call, from 1), `name#d` (every call about
 *                      device d), each with an optional `=code` (default
 *                      999, CUDA_ERROR_UNKNOWN), comma-separated.
 * and at run time through the stub_* functions at the end (found with
 * dlsym), which also report what the driver saw.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef struct stub_event *CUevent;
typedef unsigned long long CUdeviceptr;

enum {
    SUCCESS = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    NOT_INITIALIZED = 3,
    NO_DEVICE = 100,
    INVALID_DEVICE = 101,
    INVALID_CONTEXT = 201,
    INVALID_HANDLE = 400,
    NOT_READY = 600,
    CONTEXT_IS_DESTROYED = 709,
    ALREADY_REGISTERED = 712,
    NOT_REGISTERED = 713,
    UNKNOWN = 999,
};

#define MAX_DEVICES 128
#define MAX_REGIONS 65536
#define MAX_RULES 32
#define MAX_LOG 4096

/* === the functions the stub counts and can fail === */

#define CALLS(X)                                                               \
    X(cuInit) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDevicePrimaryCtxRetain)   \
    X(cuDevicePrimaryCtxRelease_v2) X(cuDeviceGetAttribute)                    \
    X(cuDeviceGetPCIBusId) X(cuCtxGetCurrent) X(cuCtxSetCurrent)               \
    X(cuCtxGetDevice) X(cuCtxSynchronize) X(cuMemHostRegister_v2)              \
    X(cuMemHostUnregister) X(cuMemHostGetFlags) X(cuEventCreate)               \
    X(cuEventRecord) X(cuEventQuery) X(cuEventSynchronize)                     \
    X(cuEventDestroy_v2) X(cuStreamCreate) X(cuStreamDestroy_v2)               \
    X(cuStreamSynchronize) X(cuStreamWaitEvent) X(cuMemAlloc_v2)               \
    X(cuMemFree_v2) X(cuMemsetD8Async) X(cuMemcpyHtoDAsync_v2)                 \
    X(cuMemcpyDtoHAsync_v2)

#define AS_ENUM(name) CALL_##name,
enum { CALLS(AS_ENUM) CALL_COUNT };
#define AS_NAME(name) #name,
static const char *const call_names[CALL_COUNT] = {CALLS(AS_NAME)};

struct rule {
    int call;
    long nth; /* 0: every call */
    int dev;  /* -1: any device */
    CUresult code;
};

struct region {
    uintptr_t base;
    size_t len;
    unsigned flags;
};

struct registration {
    uintptr_t base;
    size_t len;
    unsigned flags;
    CUcontext ctx;
};

struct stub_event {
    CUcontext ctx;
    int recorded;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static int devices = 1;
static int numa[MAX_DEVICES];
static char primary[MAX_DEVICES]; /* the contexts are &primary[i] */
static long primary_refs[MAX_DEVICES];
static char user_context;
static long calls[CALL_COUNT];
static struct rule rules[MAX_RULES];
static int rule_count;
static struct region regions[MAX_REGIONS];
static int region_count;
static struct registration reg_log[MAX_LOG];
static long reg_log_count;
static long events_live;
static long streams_live;
static long wrong_context;
static char stream_storage[1];

static __thread CUcontext current;

static int call_index(const char *name, size_t len) {
    for (int i = 0; i < CALL_COUNT; i++) {
        if (strlen(call_names[i]) == len && strncmp(call_names[i], name, len) == 0) {
            return i;
        }
    }
    return -1;
}

static void add_rule(int call, long nth, int dev, CUresult code) {
    if (rule_count < MAX_RULES) {
        rules[rule_count++] = (struct rule){call, nth, dev, code};
    }
}

/* Parses STUB_CUDA_FAIL; an unknown name aborts, so a typo in a test
   cannot pass silently. */
static void parse_rules(const char *text) {
    while (text && *text) {
        const char *end = strchr(text, ',');
        size_t item = end ? (size_t)(end - text) : strlen(text);
        size_t name_len = strcspn(text, "@#=,");
        if (name_len > item) {
            name_len = item;
        }
        int call = call_index(text, name_len);
        if (call < 0) {
            fprintf(stderr, "stub libcuda: unknown call in STUB_CUDA_FAIL: %.*s\n",
                    (int)name_len, text);
            abort();
        }
        long nth = 0;
        int dev = -1;
        CUresult code = UNKNOWN;
        const char *at = memchr(text, '@', item);
        const char *hash = memchr(text, '#', item);
        const char *eq = memchr(text, '=', item);
        if (at) {
            nth = strtol(at + 1, NULL, 10);
        }
        if (hash) {
            dev = (int)strtol(hash + 1, NULL, 10);
        }
        if (eq) {
            code = (CUresult)strtol(eq + 1, NULL, 10);
        }
        add_rule(call, nth, dev, code);
        text = end ? end + 1 : NULL;
    }
}

static void configure(void) {
    const char *n = getenv("STUB_CUDA_DEVICES");
    if (n) {
        devices = atoi(n);
        if (devices < 0) {
            devices = 0;
        }
        if (devices > MAX_DEVICES) {
            devices = MAX_DEVICES;
        }
    }
    for (int i = 0; i < MAX_DEVICES; i++) {
        numa[i] = -1;
    }
    const char *nodes = getenv("STUB_CUDA_NUMA");
    for (int i = 0; nodes && *nodes && i < MAX_DEVICES; i++) {
        numa[i] = atoi(nodes);
        nodes = strchr(nodes, ',');
        if (nodes) {
            nodes++;
        }
    }
    parse_rules(getenv("STUB_CUDA_FAIL"));
}

/* Counts a call (about device `dev`, or -1) and returns the failure the
   rules give it, if any. Called with the lock held. */
static CUresult enter(int call, int dev) {
    long n = ++calls[call];
    for (int i = 0; i < rule_count; i++) {
        const struct rule *r = &rules[i];
        if (r->call == call && (r->nth == 0 || r->nth == n) && (r->dev < 0 || r->dev == dev)) {
            return r->code;
        }
    }
    if (call != CALL_cuInit && !initialized) {
        return NOT_INITIALIZED;
    }
    return SUCCESS;
}

#define ENTER(name) ENTER_ON(name, -1)
#define ENTER_ON(name, dev)                                                    \
    pthread_mutex_lock(&lock);                                                 \
    CUresult rc_ = enter(CALL_##name, (dev));                                  \
    if (rc_ != SUCCESS) {                                                      \
        pthread_mutex_unlock(&lock);                                           \
        return rc_;                                                            \
    }
#define LEAVE(rc)                                                              \
    do {                                                                       \
        CUresult out_ = (rc);                                                  \
        pthread_mutex_unlock(&lock);                                           \
        return out_;                                                           \
    } while (0)

static int device_of(CUcontext ctx) {
    char *p = ctx;
    if (p >= primary && p < primary + MAX_DEVICES) {
        return (int)(p - primary);
    }
    return -1;
}

/* Whether `ctx` may be current: a primary context still retained, or the
   application's own. With the lock held. */
static int live_context(CUcontext ctx) {
    if (ctx == &user_context) {
        return 1;
    }
    int dev = device_of(ctx);
    return dev >= 0 && dev < devices && primary_refs[dev] > 0;
}

/* Whether `ctx` is a context the driver knows: the application's own, or
   a device's primary context, retained or not. */
static int known_context(CUcontext ctx) {
    int dev = device_of(ctx);
    return ctx == &user_context || (dev >= 0 && dev < devices);
}

/* Why the calling thread's context cannot be used (SUCCESS if it can): none
   is current, or it is a released primary context. With the lock held. */
static CUresult context_error(void) {
    if (current && live_context(current)) {
        return SUCCESS;
    }
    wrong_context++;
    return current ? CONTEXT_IS_DESTROYED : INVALID_CONTEXT;
}

/* Returns the calling thread's context error, if any, from a call. */
#define NEED_CONTEXT()                                                         \
    do {                                                                       \
        CUresult why_ = context_error();                                       \
        if (why_ != SUCCESS) {                                                 \
            LEAVE(why_);                                                       \
        }                                                                      \
    } while (0)

/* === initialization and devices === */

CUresult cuInit(unsigned flags) {
    pthread_mutex_lock(&lock);
    if (!initialized && calls[CALL_cuInit] == 0) {
        configure();
    }
    CUresult rc = enter(CALL_cuInit, -1);
    if (rc == SUCCESS) {
        initialized = flags == 0;
        rc = initialized ? SUCCESS : INVALID_VALUE;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

CUresult cuDeviceGetCount(int *count) {
    ENTER(cuDeviceGetCount);
    *count = devices;
    LEAVE(SUCCESS);
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    ENTER_ON(cuDeviceGet, ordinal);
    if (ordinal < 0 || ordinal >= devices) {
        LEAVE(INVALID_DEVICE);
    }
    *device = ordinal;
    LEAVE(SUCCESS);
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    ENTER_ON(cuDevicePrimaryCtxRetain, dev);
    if (dev < 0 || dev >= devices) {
        LEAVE(INVALID_DEVICE);
    }
    primary_refs[dev]++;
    *ctx = &primary[dev];
    LEAVE(SUCCESS);
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    ENTER_ON(cuDevicePrimaryCtxRelease_v2, dev);
    if (dev < 0 || dev >= devices) {
        LEAVE(INVALID_DEVICE);
    }
    if (primary_refs[dev] == 0) {
        LEAVE(INVALID_CONTEXT);
    }
    primary_refs[dev]--;
    LEAVE(SUCCESS);
}

CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev) {
    ENTER_ON(cuDeviceGetAttribute, dev);
    if (dev < 0 || dev >= devices) {
        LEAVE(INVALID_DEVICE);
    }
    switch (attribute) {
    case 134: /* CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID */
        *value = numa[dev];
        break;
    default: /* memory pools (115) and the rest: not supported */
        *value = 0;
    }
    LEAVE(SUCCESS);
}

CUresult cuDeviceGetPCIBusId(char *id, int len, CUdevice dev) {
    ENTER_ON(cuDeviceGetPCIBusId, dev);
    if (dev < 0 || dev >= devices) {
        LEAVE(INVALID_DEVICE);
    }
    if (len < 13) {
        LEAVE(INVALID_VALUE);
    }
    snprintf(id, (size_t)len, "0000:%02X:00.0", (dev + 1) & 0xff);
    LEAVE(SUCCESS);
}

/* === contexts === */

CUresult cuCtxGetCurrent(CUcontext *ctx) {
    ENTER(cuCtxGetCurrent);
    *ctx = current;
    LEAVE(SUCCESS);
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
    ENTER(cuCtxSetCurrent);
    if (ctx && !known_context(ctx)) {
        LEAVE(INVALID_CONTEXT);
    }
    current = ctx;
    LEAVE(SUCCESS);
}

CUresult cuCtxGetDevice(CUdevice *device) {
    ENTER(cuCtxGetDevice);
    if (current && !live_context(current)) {
        /* What the driver does under a released primary context. */
        *device = -1;
        LEAVE(SUCCESS);
    }
    NEED_CONTEXT();
    int dev = device_of(current);
    *device = dev < 0 ? 0 : dev;
    LEAVE(SUCCESS);
}

CUresult cuCtxSynchronize(void) {
    ENTER(cuCtxSynchronize);
    NEED_CONTEXT();
    LEAVE(SUCCESS);
}

/* === registration === */

static int find_region(uintptr_t p) {
    for (int i = 0; i < region_count; i++) {
        if (p >= regions[i].base && p < regions[i].base + regions[i].len) {
            return i;
        }
    }
    return -1;
}

CUresult cuMemHostRegister_v2(void *p, size_t len, unsigned flags) {
    ENTER(cuMemHostRegister_v2);
    NEED_CONTEXT();
    uintptr_t base = (uintptr_t)p;
    if (!p || len == 0) {
        LEAVE(INVALID_VALUE);
    }
    for (int i = 0; i < region_count; i++) {
        if (base < regions[i].base + regions[i].len && regions[i].base < base + len) {
            LEAVE(ALREADY_REGISTERED);
        }
    }
    if (region_count == MAX_REGIONS) {
        LEAVE(OUT_OF_MEMORY);
    }
    regions[region_count++] = (struct region){base, len, flags};
    if (reg_log_count < MAX_LOG) {
        reg_log[reg_log_count] = (struct registration){base, len, flags, current};
    }
    reg_log_count++;
    LEAVE(SUCCESS);
}

CUresult cuMemHostUnregister(void *p) {
    ENTER(cuMemHostUnregister);
    NEED_CONTEXT();
    int i = find_region((uintptr_t)p);
    if (i < 0 || regions[i].base != (uintptr_t)p) {
        LEAVE(NOT_REGISTERED);
    }
    regions[i] = regions[--region_count];
    LEAVE(SUCCESS);
}

CUresult cuMemHostGetFlags(unsigned *flags, void *p) {
    ENTER(cuMemHostGetFlags);
    int i = find_region((uintptr_t)p);
    if (i < 0) {
        LEAVE(INVALID_VALUE);
    }
    *flags = regions[i].flags;
    LEAVE(SUCCESS);
}

/* === events and streams === */

CUresult cuEventCreate(CUevent *event, unsigned flags) {
    (void)flags;
    ENTER(cuEventCreate);
    NEED_CONTEXT();
    struct stub_event *e = calloc(1, sizeof *e);
    if (!e) {
        LEAVE(OUT_OF_MEMORY);
    }
    e->ctx = current;
    events_live++;
    *event = e;
    LEAVE(SUCCESS);
}

CUresult cuEventRecord(CUevent event, CUstream stream) {
    (void)stream;
    ENTER(cuEventRecord);
    if (!event) {
        LEAVE(INVALID_HANDLE);
    }
    if (current != event->ctx) {
        wrong_context++;
        LEAVE(INVALID_CONTEXT);
    }
    NEED_CONTEXT();
    event->recorded = 1;
    LEAVE(SUCCESS);
}

CUresult cuEventQuery(CUevent event) {
    ENTER(cuEventQuery);
    LEAVE(event ? SUCCESS : INVALID_HANDLE);
}

CUresult cuEventSynchronize(CUevent event) {
    ENTER(cuEventSynchronize);
    LEAVE(event ? SUCCESS : INVALID_HANDLE);
}

CUresult cuEventDestroy_v2(CUevent event) {
    ENTER(cuEventDestroy_v2);
    if (!event) {
        LEAVE(INVALID_HANDLE);
    }
    free(event);
    events_live--;
    LEAVE(SUCCESS);
}

CUresult cuStreamCreate(CUstream *stream, unsigned flags) {
    (void)flags;
    ENTER(cuStreamCreate);
    NEED_CONTEXT();
    streams_live++;
    *stream = stream_storage;
    LEAVE(SUCCESS);
}

CUresult cuStreamDestroy_v2(CUstream stream) {
    ENTER(cuStreamDestroy_v2);
    if (stream != stream_storage) {
        LEAVE(INVALID_HANDLE);
    }
    streams_live--;
    LEAVE(SUCCESS);
}

CUresult cuStreamSynchronize(CUstream stream) {
    (void)stream;
    ENTER(cuStreamSynchronize);
    LEAVE(SUCCESS);
}

CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned flags) {
    (void)stream;
    (void)flags;
    ENTER(cuStreamWaitEvent);
    LEAVE(event ? SUCCESS : INVALID_HANDLE);
}

/* === "device" memory: host memory, copied synchronously === */

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t len) {
    ENTER(cuMemAlloc_v2);
    NEED_CONTEXT();
    void *p = calloc(1, len ? len : 1);
    if (!p) {
        LEAVE(OUT_OF_MEMORY);
    }
    *dptr = (CUdeviceptr)(uintptr_t)p;
    LEAVE(SUCCESS);
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
    ENTER(cuMemFree_v2);
    free((void *)(uintptr_t)dptr);
    LEAVE(SUCCESS);
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t len, CUstream stream) {
    (void)stream;
    ENTER(cuMemsetD8Async);
    NEED_CONTEXT();
    memset((void *)(uintptr_t)dst, value, len);
    LEAVE(SUCCESS);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t len, CUstream stream) {
    (void)stream;
    ENTER(cuMemcpyHtoDAsync_v2);
    NEED_CONTEXT();
    memcpy((void *)(uintptr_t)dst, src, len);
    LEAVE(SUCCESS);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t len, CUstream stream) {
    (void)stream;
    ENTER(cuMemcpyDtoHAsync_v2);
    NEED_CONTEXT();
    memcpy(dst, (const void *)(uintptr_t)src, len);
    LEAVE(SUCCESS);
}

/* === error strings (never counted, never failed) === */

CUresult cuGetErrorString(CUresult code, const char **text) {
    switch (code) {
    case SUCCESS: *text = "no error"; break;
    case INVALID_VALUE: *text = "invalid argument"; break;
    case OUT_OF_MEMORY: *text = "out of memory"; break;
    case NOT_INITIALIZED: *text = "initialization error"; break;
    case NO_DEVICE: *text = "no CUDA-capable device is detected"; break;
    case INVALID_DEVICE: *text = "invalid device ordinal"; break;
    case INVALID_CONTEXT: *text = "invalid device context"; break;
    case NOT_READY: *text = "device not ready"; break;
    case CONTEXT_IS_DESTROYED: *text = "context is destroyed"; break;
    case ALREADY_REGISTERED: *text = "part or all of the requested memory range is already mapped"; break;
    case NOT_REGISTERED: *text = "pointer does not correspond to a registered memory region"; break;
    default: *text = "unknown error (stub)";
    }
    return SUCCESS;
}

CUresult cuGetErrorName(CUresult code, const char **text) {
    (void)code;
    *text = "CUDA_ERROR (stub)";
    return SUCCESS;
}

/* === for the tests (found with dlsym) === */

/* How many times `name` was called (failed calls included); -1 for a name
   the stub does not know. */
long stub_calls(const char *name) {
    int call = call_index(name, strlen(name));
    if (call < 0) {
        return -1;
    }
    pthread_mutex_lock(&lock);
    long n = calls[call];
    pthread_mutex_unlock(&lock);
    return n;
}

/* Fails the `nth` call of `name` from now on (0: every call), about
   device `dev` (-1: any), with `code`; returns -1 for an unknown name. */
int stub_fail(const char *name, long nth, int dev, CUresult code) {
    int call = call_index(name, strlen(name));
    if (call < 0) {
        return -1;
    }
    pthread_mutex_lock(&lock);
    add_rule(call, nth ? calls[call] + nth : 0, dev, code);
    pthread_mutex_unlock(&lock);
    return 0;
}

/* Drops every failure rule, those from STUB_CUDA_FAIL included. */
void stub_heal(void) {
    pthread_mutex_lock(&lock);
    rule_count = 0;
    pthread_mutex_unlock(&lock);
}

/* References held on device `dev`'s primary context. */
long stub_primary_refs(int dev) {
    if (dev < 0 || dev >= MAX_DEVICES) {
        return -1;
    }
    pthread_mutex_lock(&lock);
    long n = primary_refs[dev];
    pthread_mutex_unlock(&lock);
    return n;
}

/* Device `dev`'s primary context (retained or not). */
CUcontext stub_primary(int dev) {
    return dev >= 0 && dev < MAX_DEVICES ? &primary[dev] : NULL;
}

/* A context of the application's own, always valid. */
CUcontext stub_user_context(void) {
    return &user_context;
}

/* Live registrations. */
long stub_registered(void) {
    pthread_mutex_lock(&lock);
    long n = region_count;
    pthread_mutex_unlock(&lock);
    return n;
}

/* The `i`-th successful registration (from 0): 0 if there is none (or it
   is past the log), else 1 with its base, length, flags and context. */
int stub_registration(long i, void **base, size_t *len, unsigned *flags, CUcontext *ctx) {
    pthread_mutex_lock(&lock);
    int found = i >= 0 && i < reg_log_count && i < MAX_LOG;
    if (found) {
        *base = (void *)reg_log[i].base;
        *len = reg_log[i].len;
        *flags = reg_log[i].flags;
        *ctx = reg_log[i].ctx;
    }
    pthread_mutex_unlock(&lock);
    return found;
}

/* Events created and not destroyed. */
long stub_events_live(void) {
    pthread_mutex_lock(&lock);
    long n = events_live;
    pthread_mutex_unlock(&lock);
    return n;
}

/* Streams created and not destroyed. */
long stub_streams_live(void) {
    pthread_mutex_lock(&lock);
    long n = streams_live;
    pthread_mutex_unlock(&lock);
    return n;
}

/* Calls that needed a current context (or the event's own) and had none. */
long stub_wrong_context(void) {
    pthread_mutex_lock(&lock);
    long n = wrong_context;
    pthread_mutex_unlock(&lock);
    return n;
}
