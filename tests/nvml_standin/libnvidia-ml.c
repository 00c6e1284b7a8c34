/*
 * A small NVML stand-in for nvdp's tests: the functions (and versioned symbols) that pynvml calls
 * for nvdp's real backend, over a node described by a text file. See README.md next to this file.
 *
 *   NVML_STANDIN_NODE=FILE      the node (read by nvmlInit); lines:
 *       driver 550.54.15
 *       cuda 12040
 *       gpu uuid=GPU-... minor=0 memory_mib=40960 cc=8.0 bus=00000000:07:00.0 numa=0 mig=0 lost=0 name=NAME
 *       mig gpu=0 uuid=MIG-... gi=1 ci=0 gi_slices=1 ci_slices=1 memory_mb=4864 profile=0
 *       topo 0 1 10                (nvmlGpuTopologyLevel_t of a pair; default: 40 same NUMA, else 50)
 *       fabric gpu=0 cluster=UUID clique=N state=3 status=0   (default: NOT_SUPPORTED)
 *       fabric_v1 0                (nvmlDeviceGetGpuFabricInfo answers FUNCTION_NOT_FOUND)
 *   NVML_STANDIN_COMMANDS=FILE  followed from its start, checked at every call; lines:
 *       xid GPU_INDEX XID [GI CI]  deliver an XID event (GI/CI default: none, 0xFFFFFFFF)
 *       lost GPU_INDEX             the GPU's queries fail with NVML_ERROR_GPU_IS_LOST
 *       restored GPU_INDEX         undo `lost`
 *       mig-mode GPU_INDEX 0|1     MIG disabled / enabled (a MIG-capable GPU)
 *       mig-clear GPU_INDEX        destroy the GPU's MIG devices
 *       mig gpu=GPU_INDEX ...      create a MIG device (the node file's `mig` line)
 *       unplug GPU_INDEX           hot-unplug: gone from the count and the indices (they shift);
 *                                  its handles answer NVML_ERROR_GPU_IS_LOST
 *       plug GPU_INDEX             undo `unplug`
 *
 * A lost GPU still answers what the driver knows without asking the GPU: handles, UUID, minor
 * number and PCI info. Every entry point is serialised by one mutex; nvmlEventSetWait_v2 drops it
 * while it sleeps on a condition variable, signalled when an event is queued (by any caller applying
 * the commands file); with a commands file it reads the file again every COMMANDS_CHECK_MS while it
 * sleeps, so an event reaches a waiter that is the only caller. Idle, a waiter costs 10 wake-ups/s
 * with a commands file and none without, as real NVML sleeps in the driver.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
enum {
    OK = 0, UNINITIALIZED = 1, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, NOT_FOUND = 6,
    INSUFFICIENT_SIZE = 7, TIMEOUT = 10, FUNCTION_NOT_FOUND = 13, GPU_IS_LOST = 15,
    ARGUMENT_VERSION_MISMATCH = 25,
    UNKNOWN = 999,
};
#define NO_INSTANCE 0xFFFFFFFFu
#define XID_CRITICAL 0x8ull
#define SUPPORTED_EVENTS 0xBull /* single-bit ECC, double-bit ECC, XID */
#define MAX_GPUS 16
#define MAX_MIGS 7
#define MAX_SETS 16
#define MAX_QUEUE 256

struct device;
typedef struct device *nvmlDevice_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount,
        sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;
typedef struct {
    unsigned int version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount,
        copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} nvmlGpuInstanceProfileInfo_v2_t;
#define PROFILE_INFO_V2 ((unsigned int)(sizeof(nvmlGpuInstanceProfileInfo_v2_t) | (2u << 24)))
typedef struct { unsigned int start, size; } nvmlGpuInstancePlacement_t;
typedef struct gpu_instance *nvmlGpuInstance_t;
typedef struct {
    nvmlDevice_t device;
    unsigned int id, profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

/* nvml.h's fabric structs: the state is an unsigned char (pynvml declares a c_uint). */
typedef unsigned char nvmlGpuFabricState_t;
typedef struct {
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    nvmlGpuFabricState_t state;
} nvmlGpuFabricInfo_t;
typedef struct {
    unsigned int version;
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    nvmlGpuFabricState_t state;
    unsigned int healthMask;
    unsigned char healthSummary; /* v3 only */
} nvmlGpuFabricInfoV_t;
#define FABRIC_INFO_V2 ((unsigned int)(offsetof(nvmlGpuFabricInfoV_t, healthSummary) | (2u << 24)))
#define FABRIC_INFO_V3 ((unsigned int)(sizeof(nvmlGpuFabricInfoV_t) | (3u << 24)))

struct gpu_instance { struct device *parent; unsigned int id, profile; };

struct device {
    int index, is_mig, minor, numa, cc_major, cc_minor, mig_enabled, lost, unplugged, nmigs;
    char uuid[96], name[96], bus[32];
    unsigned long long memory_mib;
    struct device *parent;
    unsigned int gi, ci, gi_slices, ci_slices;
    struct gpu_instance instance;
    struct device *migs[MAX_MIGS];
    int has_fabric;
    nvmlGpuFabricInfo_t fabric;
};

struct event_set {
    int used;
    unsigned long long types[MAX_GPUS];
    nvmlEventData_t queue[MAX_QUEUE];
    int head, count;
};
typedef struct event_set *nvmlEventSet_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static char driver[80] = "550.54.15";
static int cuda = 12040;
static struct device gpus[MAX_GPUS], migs[MAX_GPUS * MAX_MIGS];
static int ngpus, nmigs;
static int topo[MAX_GPUS][MAX_GPUS];
static int fabric_v1 = 1; /* 0: nvmlDeviceGetGpuFabricInfo answers FUNCTION_NOT_FOUND */
static struct event_set sets[MAX_SETS];
static long commands_offset;
static pthread_cond_t queued; /* an event was queued (CLOCK_MONOTONIC; made by queued_init) */
static pthread_once_t queued_once = PTHREAD_ONCE_INIT;
#define COMMANDS_CHECK_MS 100 /* a waiter reads the commands file again this often */

static void queued_init(void) {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&queued, &attr);
    pthread_condattr_destroy(&attr);
}

static const char *field(const char *line, const char *key) {
    size_t n = strlen(key);
    for (const char *p = line; (p = strstr(p, key)) != NULL; p += n)
        if ((p == line || p[-1] == ' ') && p[n] == '=') return p + n + 1;
    return NULL;
}

static void word(const char *line, const char *key, char *out, size_t size) {
    const char *v = field(line, key);
    size_t n = 0;
    if (v == NULL) return;
    while (v[n] && v[n] != ' ' && v[n] != '\n' && n + 1 < size) n++;
    memcpy(out, v, n);
    out[n] = 0;
}

static long number(const char *line, const char *key, long fallback) {
    const char *v = field(line, key);
    return v ? strtol(v, NULL, 0) : fallback;
}

static void parse_gpu(const char *line) {
    if (ngpus >= MAX_GPUS) return;
    struct device *d = &gpus[ngpus];
    memset(d, 0, sizeof *d);
    d->index = ngpus++;
    word(line, "uuid", d->uuid, sizeof d->uuid);
    word(line, "bus", d->bus, sizeof d->bus);
    d->minor = (int)number(line, "minor", d->index);
    d->memory_mib = (unsigned long long)number(line, "memory_mib", 40960);
    d->numa = (int)number(line, "numa", -1);
    d->mig_enabled = (int)number(line, "mig", -1); /* -1: not MIG capable */
    d->lost = (int)number(line, "lost", 0);
    const char *cc = field(line, "cc");
    if (cc == NULL || sscanf(cc, "%d.%d", &d->cc_major, &d->cc_minor) != 2) d->cc_major = 8;
    const char *name = field(line, "name");
    snprintf(d->name, sizeof d->name, "%s", name ? name : "NVIDIA A100-SXM4-40GB");
    d->name[strcspn(d->name, "\n")] = 0;
}

static void parse_mig(const char *line) {
    long g = number(line, "gpu", -1);
    if (g < 0 || g >= ngpus || gpus[g].nmigs >= MAX_MIGS) return;
    struct device *m = &migs[nmigs++], *p = &gpus[g];
    memset(m, 0, sizeof *m);
    m->is_mig = 1;
    m->parent = p;
    m->index = p->nmigs;
    p->migs[p->nmigs++] = m;
    word(line, "uuid", m->uuid, sizeof m->uuid);
    m->gi = (unsigned)number(line, "gi", 0);
    m->ci = (unsigned)number(line, "ci", 0);
    m->gi_slices = (unsigned)number(line, "gi_slices", 1);
    m->ci_slices = (unsigned)number(line, "ci_slices", m->gi_slices);
    m->memory_mib = (unsigned long long)number(line, "memory_mb", 4864);
    m->instance.parent = p;
    m->instance.id = m->gi;
    m->instance.profile = (unsigned)number(line, "profile", 0);
}

static void parse_fabric(const char *line) {
    long g = number(line, "gpu", -1);
    char cluster[64] = "";
    unsigned int b[16];
    if (g < 0 || g >= ngpus) return;
    struct device *d = &gpus[g];
    word(line, "cluster", cluster, sizeof cluster);
    if (sscanf(cluster, "%2x%2x%2x%2x-%2x%2x-%2x%2x-%2x%2x-%2x%2x%2x%2x%2x%2x", &b[0], &b[1], &b[2], &b[3],
               &b[4], &b[5], &b[6], &b[7], &b[8], &b[9], &b[10], &b[11], &b[12], &b[13], &b[14], &b[15])
        != 16)
        return;
    for (int i = 0; i < 16; i++) d->fabric.clusterUuid[i] = (unsigned char)b[i];
    d->fabric.cliqueId = (unsigned int)number(line, "clique", 0);
    d->fabric.state = (nvmlGpuFabricState_t)number(line, "state", 3);
    d->fabric.status = (nvmlReturn_t)number(line, "status", OK);
    d->has_fabric = 1;
}

static nvmlReturn_t load_node(void) {
    const char *path = getenv("NVML_STANDIN_NODE");
    FILE *f = path ? fopen(path, "r") : NULL;
    char line[512];
    if (f == NULL) return UNKNOWN;
    ngpus = nmigs = 0;
    fabric_v1 = 1;
    memset(topo, 0, sizeof topo);
    while (fgets(line, sizeof line, f)) {
        int a, b, level;
        if (strncmp(line, "gpu ", 4) == 0) parse_gpu(line + 4);
        else if (strncmp(line, "mig ", 4) == 0) parse_mig(line + 4);
        else if (strncmp(line, "fabric ", 7) == 0) parse_fabric(line + 7);
        else if (strncmp(line, "fabric_v1 ", 10) == 0) fabric_v1 = atoi(line + 10);
        else if (strncmp(line, "driver ", 7) == 0) sscanf(line + 7, "%79s", driver);
        else if (strncmp(line, "cuda ", 5) == 0) cuda = atoi(line + 5);
        else if (sscanf(line, "topo %d %d %d", &a, &b, &level) == 3 && a >= 0 && b >= 0 && a < MAX_GPUS
                 && b < MAX_GPUS)
            topo[a][b] = topo[b][a] = level;
    }
    fclose(f);
    return OK;
}

static void deliver(int index, unsigned long long xid, unsigned gi, unsigned ci) {
    for (int s = 0; s < MAX_SETS; s++) {
        struct event_set *set = &sets[s];
        if (!set->used || !(set->types[index] & XID_CRITICAL) || set->count == MAX_QUEUE) continue;
        nvmlEventData_t *e = &set->queue[(set->head + set->count++) % MAX_QUEUE];
        e->device = &gpus[index];
        e->eventType = XID_CRITICAL;
        e->eventData = xid;
        e->gpuInstanceId = gi;
        e->computeInstanceId = ci;
    }
    pthread_cond_broadcast(&queued);
}

static void command(const char *line) {
    int index, mode;
    unsigned long long xid;
    unsigned gi = NO_INSTANCE, ci = NO_INSTANCE;
    if (sscanf(line, "xid %d %llu %u %u", &index, &xid, &gi, &ci) >= 2 && index >= 0 && index < ngpus)
        deliver(index, xid, gi, ci);
    else if (sscanf(line, "lost %d", &index) == 1 && index >= 0 && index < ngpus)
        gpus[index].lost = 1;
    else if (sscanf(line, "restored %d", &index) == 1 && index >= 0 && index < ngpus)
        gpus[index].lost = 0;
    else if (sscanf(line, "mig-mode %d %d", &index, &mode) == 2 && index >= 0 && index < ngpus
             && gpus[index].mig_enabled >= 0)
        gpus[index].mig_enabled = mode ? 1 : 0;
    else if (sscanf(line, "mig-clear %d", &index) == 1 && index >= 0 && index < ngpus) {
        for (int i = 0; i < gpus[index].nmigs; i++) gpus[index].migs[i]->uuid[0] = 0; /* destroyed */
        gpus[index].nmigs = 0;
    } else if (strncmp(line, "mig ", 4) == 0 && nmigs < MAX_GPUS * MAX_MIGS)
        parse_mig(line + 4);
    else if (sscanf(line, "unplug %d", &index) == 1 && index >= 0 && index < ngpus)
        gpus[index].unplugged = 1;
    else if (sscanf(line, "plug %d", &index) == 1 && index >= 0 && index < ngpus)
        gpus[index].unplugged = 0;
}

/* The index-th GPU still plugged in, or NULL. */
static struct device *plugged(unsigned int index) {
    for (int i = 0; i < ngpus; i++)
        if (!gpus[i].unplugged && index-- == 0) return &gpus[i];
    return NULL;
}

/* Apply the complete lines appended to the commands file since the last call. */
static void poll_commands(void) {
    const char *path = getenv("NVML_STANDIN_COMMANDS");
    FILE *f = path ? fopen(path, "r") : NULL;
    char line[512];
    if (f == NULL) return;
    fseek(f, commands_offset, SEEK_SET);
    while (fgets(line, sizeof line, f) && strchr(line, '\n')) {
        commands_offset += (long)strlen(line);
        command(line);
    }
    fclose(f);
}

#define ENTER()                           \
    pthread_mutex_lock(&lock);            \
    if (!initialized) {                   \
        pthread_mutex_unlock(&lock);      \
        return UNINITIALIZED;             \
    }                                     \
    poll_commands()
#define LEAVE(value)                      \
    do {                                  \
        nvmlReturn_t r_ = (value);        \
        pthread_mutex_unlock(&lock);      \
        return r_;                        \
    } while (0)

static int is_gpu(nvmlDevice_t d) { return d >= &gpus[0] && d < &gpus[ngpus]; }
static int is_mig(nvmlDevice_t d) { return d >= &migs[0] && d < &migs[nmigs]; }
static int valid(nvmlDevice_t d) { return is_gpu(d) || is_mig(d); }
/* Queries that need the GPU to answer: NVML_ERROR_GPU_IS_LOST for a lost one (or its MIG devices). */
static int lost(nvmlDevice_t d) {
    struct device *gpu = d->is_mig ? d->parent : d;
    return gpu->lost || gpu->unplugged;
}
#define CHECK(d)                                      \
    if (!valid(d)) LEAVE(INVALID_ARGUMENT);           \
    if (lost(d)) LEAVE(GPU_IS_LOST)

static nvmlReturn_t init(void) {
    pthread_once(&queued_once, queued_init);
    pthread_mutex_lock(&lock);
    nvmlReturn_t r = initialized ? OK : load_node();
    if (r == OK) initialized++;
    pthread_mutex_unlock(&lock);
    return r;
}
nvmlReturn_t nvmlInit_v2(void) { return init(); }
nvmlReturn_t nvmlInit(void) { return init(); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return init(); }

nvmlReturn_t nvmlShutdown(void) {
    ENTER();
    if (--initialized == 0) memset(sets, 0, sizeof sets);
    pthread_cond_broadcast(&queued); /* waiters on a set now gone answer at once */
    LEAVE(OK);
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case OK: return "Success";
    case UNINITIALIZED: return "Uninitialized";
    case INVALID_ARGUMENT: return "Invalid Argument";
    case NOT_SUPPORTED: return "Not Supported";
    case NOT_FOUND: return "Not Found";
    case INSUFFICIENT_SIZE: return "Insufficient Size";
    case TIMEOUT: return "Timeout";
    case FUNCTION_NOT_FOUND: return "Function Not Found";
    case GPU_IS_LOST: return "GPU is lost";
    case ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy(char *out, unsigned int size, const char *text) {
    if (out == NULL || strlen(text) + 1 > size) return INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return OK;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *out, unsigned int size) { ENTER(); LEAVE(copy(out, size, driver)); }
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *out) { ENTER(); *out = cuda; LEAVE(OK); }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *out) { ENTER(); *out = cuda; LEAVE(OK); }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *out) {
    ENTER();
    *out = 0;
    for (int i = 0; i < ngpus; i++) *out += !gpus[i].unplugged;
    LEAVE(OK);
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *out) { return nvmlDeviceGetCount_v2(out); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *out) {
    ENTER();
    if ((*out = plugged(index)) == NULL) LEAVE(INVALID_ARGUMENT);
    LEAVE(OK);
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *out) { return nvmlDeviceGetHandleByIndex_v2(i, out); }

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *out) {
    ENTER();
    for (int i = 0; i < ngpus; i++)
        if (!gpus[i].unplugged && strcmp(gpus[i].uuid, uuid) == 0) { *out = &gpus[i]; LEAVE(OK); }
    for (int i = 0; i < nmigs; i++)
        if (migs[i].uuid[0] && !migs[i].parent->unplugged && strcmp(migs[i].uuid, uuid) == 0) {
            *out = &migs[i];
            LEAVE(OK);
        }
    LEAVE(NOT_FOUND);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *out, unsigned int size) {
    ENTER();
    if (!valid(d)) LEAVE(INVALID_ARGUMENT);
    LEAVE(copy(out, size, d->uuid));
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *out) {
    ENTER();
    if (!is_gpu(d)) LEAVE(is_mig(d) ? NOT_SUPPORTED : INVALID_ARGUMENT);
    *out = (unsigned)d->minor;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *out) {
    ENTER();
    if (!is_gpu(d)) LEAVE(INVALID_ARGUMENT);
    memset(out, 0, sizeof *out);
    snprintf(out->busId, sizeof out->busId, "%s", d->bus);
    snprintf(out->busIdLegacy, sizeof out->busIdLegacy, "%s", d->bus + 4);
    sscanf(d->bus, "%x:%x:%x", &out->domain, &out->bus, &out->device);
    out->pciDeviceId = 0x20B010DE;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *out, unsigned int size) {
    ENTER();
    CHECK(d);
    LEAVE(copy(out, size, d->is_mig ? d->parent->name : d->name));
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *out) {
    ENTER();
    CHECK(d);
    out->total = d->memory_mib * 1024ull * 1024ull;
    out->used = 0;
    out->free = out->total;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
    ENTER();
    CHECK(d);
    *major = (d->is_mig ? d->parent : d)->cc_major;
    *minor = (d->is_mig ? d->parent : d)->cc_minor;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t d, int *out) {
    ENTER();
    CHECK(d);
    if (d->numa < 0) LEAVE(NOT_SUPPORTED);
    *out = d->numa;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    ENTER();
    CHECK(d);
    if (!is_gpu(d) || d->mig_enabled < 0) LEAVE(NOT_SUPPORTED);
    *current = *pending = (unsigned)d->mig_enabled;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *out) {
    ENTER();
    CHECK(d);
    *out = MAX_MIGS;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *out) {
    ENTER();
    CHECK(d);
    if (!is_gpu(d) || index >= MAX_MIGS) LEAVE(INVALID_ARGUMENT);
    if (index >= (unsigned)d->nmigs) LEAVE(NOT_FOUND);
    *out = d->migs[index];
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t d, nvmlDevice_t *out) {
    ENTER();
    if (!is_mig(d)) LEAVE(INVALID_ARGUMENT);
    *out = d->parent;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *out) {
    ENTER();
    CHECK(d);
    if (!is_mig(d)) LEAVE(NOT_SUPPORTED);
    *out = d->gi;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *out) {
    ENTER();
    CHECK(d);
    if (!is_mig(d)) LEAVE(NOT_SUPPORTED);
    *out = d->ci;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t d, nvmlDeviceAttributes_t *out) {
    ENTER();
    CHECK(d);
    if (!is_mig(d)) LEAVE(NOT_SUPPORTED);
    memset(out, 0, sizeof *out);
    out->gpuInstanceSliceCount = d->gi_slices;
    out->computeInstanceSliceCount = d->ci_slices;
    out->multiprocessorCount = 14 * d->ci_slices;
    out->memorySizeMB = d->memory_mib;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t d, nvmlGpuFabricInfo_t *out) {
    ENTER();
    if (!fabric_v1) LEAVE(FUNCTION_NOT_FOUND);
    CHECK(d);
    if (!is_gpu(d) || !d->has_fabric) LEAVE(NOT_SUPPORTED);
    *out = d->fabric;
    LEAVE(OK);
}

/* The versioned form: v2, or v3 (which adds healthSummary). */
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t d, nvmlGpuFabricInfoV_t *out) {
    ENTER();
    CHECK(d);
    unsigned int version = out->version;
    if (version != FABRIC_INFO_V2 && version != FABRIC_INFO_V3) LEAVE(ARGUMENT_VERSION_MISMATCH);
    if (!is_gpu(d) || !d->has_fabric) LEAVE(NOT_SUPPORTED);
    memcpy(out->clusterUuid, d->fabric.clusterUuid, sizeof out->clusterUuid);
    out->status = d->fabric.status;
    out->cliqueId = d->fabric.cliqueId;
    out->state = d->fabric.state;
    out->healthMask = 0;
    if (version == FABRIC_INFO_V3) out->healthSummary = 0;
    LEAVE(OK);
}

/* Every GPU instance profile p has id p here (enough for nvdp's "+me"-style name suffixes). */
nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t d, unsigned int profile,
                                                  nvmlGpuInstanceProfileInfo_v2_t *out) {
    ENTER();
    CHECK(d);
    if (out->version != PROFILE_INFO_V2) LEAVE(ARGUMENT_VERSION_MISMATCH);
    if (!is_gpu(d) || d->mig_enabled < 0) LEAVE(NOT_SUPPORTED);
    if (profile >= 18) LEAVE(INVALID_ARGUMENT);
    memset(out, 0, sizeof *out);
    out->version = PROFILE_INFO_V2;
    out->id = profile;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t d, unsigned int id, nvmlGpuInstance_t *out) {
    ENTER();
    CHECK(d);
    if (!is_gpu(d)) LEAVE(INVALID_ARGUMENT);
    for (int i = 0; i < d->nmigs; i++)
        if (d->migs[i]->gi == id) { *out = &d->migs[i]->instance; LEAVE(OK); }
    LEAVE(NOT_FOUND);
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *out) {
    ENTER();
    if (gi == NULL) LEAVE(INVALID_ARGUMENT);
    memset(out, 0, sizeof *out);
    out->device = gi->parent;
    out->id = gi->id;
    out->profileId = gi->profile;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int *out) {
    ENTER();
    CHECK(a);
    CHECK(b);
    if (!is_gpu(a) || !is_gpu(b)) LEAVE(NOT_SUPPORTED);
    int level = topo[a->index][b->index];
    *out = level ? level : (a->numa >= 0 && a->numa == b->numa ? 40 : 50);
    LEAVE(OK);
}

/* No NVLinks on this node. */
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, unsigned int *out) {
    (void)link; (void)out;
    ENTER();
    CHECK(d);
    LEAVE(NOT_SUPPORTED);
}
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t *out) {
    (void)d; (void)link; (void)out;
    return NOT_SUPPORTED;
}
nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, int index, int *out) {
    (void)a; (void)b; (void)index; (void)out;
    return NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t d, int *out) {
    ENTER();
    CHECK(d);
    *out = 0;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned *corr, unsigned *unc, unsigned *pending,
                                       unsigned *failure) {
    ENTER();
    CHECK(d);
    *corr = *unc = *pending = *failure = 0;
    LEAVE(OK);
}

/* ---- events ---------------------------------------------------------------------------------- */

static int valid_set(nvmlEventSet_t s) { return s >= &sets[0] && s < &sets[MAX_SETS] && s->used; }

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *out) {
    ENTER();
    for (int s = 0; s < MAX_SETS; s++)
        if (!sets[s].used) {
            memset(&sets[s], 0, sizeof sets[s]);
            sets[s].used = 1;
            *out = &sets[s];
            LEAVE(OK);
        }
    LEAVE(UNKNOWN);
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t s) {
    ENTER();
    if (!valid_set(s)) LEAVE(INVALID_ARGUMENT);
    s->used = 0;
    pthread_cond_broadcast(&queued);
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *out) {
    ENTER();
    CHECK(d);
    *out = SUPPORTED_EVENTS;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t s) {
    ENTER();
    CHECK(d);
    if (!is_gpu(d)) LEAVE(NOT_SUPPORTED);
    if (!valid_set(s)) LEAVE(INVALID_ARGUMENT);
    if (types & ~SUPPORTED_EVENTS) LEAVE(NOT_SUPPORTED);
    s->types[d->index] |= types;
    LEAVE(OK);
}

static long long ms_of(const struct timespec *t) { return t->tv_sec * 1000LL + t->tv_nsec / 1000000; }

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t s, nvmlEventData_t *out, unsigned int timeout_ms) {
    struct timespec now, until;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long long end = ms_of(&now) + timeout_ms;
    int commands = getenv("NVML_STANDIN_COMMANDS") != NULL;
    ENTER();
    for (;;) {
        if (!valid_set(s)) LEAVE(INVALID_ARGUMENT);
        if (s->count > 0) {
            *out = s->queue[s->head];
            s->head = (s->head + 1) % MAX_QUEUE;
            s->count--;
            LEAVE(OK);
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (ms_of(&now) >= end) LEAVE(TIMEOUT);
        long long wake = end;
        if (commands && ms_of(&now) + COMMANDS_CHECK_MS < wake) wake = ms_of(&now) + COMMANDS_CHECK_MS;
        until.tv_sec = (time_t)(wake / 1000);
        until.tv_nsec = (long)(wake % 1000) * 1000000L;
        pthread_cond_timedwait(&queued, &lock, &until); /* drops the mutex while it sleeps */
        if (!initialized) LEAVE(UNINITIALIZED);
        poll_commands();
    }
}
nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t s, nvmlEventData_t *out, unsigned int t) { return nvmlEventSetWait_v2(s, out, t); }
