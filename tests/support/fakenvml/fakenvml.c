/*
 * A fake libnvidia-ml.so.1 for tests: the NVML entry points pynvml calls for the sidecar, compiled against
 * NVIDIA's own nvml.h (PyPI nvidia-nvml-dev) so every signature is checked by the compiler.
 *
 * Driven by a scenario file named in FAKE_NVML_SCENARIO, re-read at every nvmlInit, one item a line:
 *
 *   driver 560.35.03
 *   init_error 9                                   nvmlInit answers this nvmlReturn_t (9: driver not loaded)
 *   gpu <uuid> [key=value ...]                     a physical GPU, enumerated in file order
 *   mig <parent-uuid> <uuid> [key=value ...]       a MIG device of an earlier GPU (which then has MIG on)
 *
 * Keys: name=<text> util=<pct>[,<pct>...] (cycled, one per utilisation read) mem_total=<bytes>
 * mem_used=<bytes> energy_mj=<start> energy_step_mj=<per read> procs=<pid>:<bytes>[,...]
 * unsupported=utilization,memory,energy,processes (those calls answer NVML_ERROR_NOT_SUPPORTED)
 * lost_after=<n> (after n memory reads every sampling call answers NVML_ERROR_GPU_IS_LOST, until the
 * next nvmlInit) lost_marker=<path> (lost while that file exists; handle lookups of a lost GPU answer
 * GPU_IS_LOST too, as the driver's do) proc_util=<pid>:<sm pct>[,...] (per-process SM utilisation samples,
 * nvmlDeviceGetProcessUtilization; MIG devices answer NOT_SUPPORTED there, as real ones do).
 *
 * Compiled with -DFAKE_NVML_OLD_DRIVER the library lacks nvmlDeviceGetComputeRunningProcesses_v3, like a
 * driver older than 510, so only the _v2 process list exists.
 *
 * When FAKE_NVML_TRACE names a file, every entry point appends its name to it, so a test can check
 * which real NVML calls pynvml made.
 */
#include <nvml.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_DEVICES 64
#define MAX_UTIL 32
#define MAX_PROCS 16

enum { F_UTIL = 1, F_MEMORY = 2, F_ENERGY = 4, F_PROCESSES = 8 };

struct nvmlDevice_st {
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    int parent; /* index of the parent GPU for a MIG device, -1 for a GPU */
    int mig_children;
    unsigned int util[MAX_UTIL];
    int util_count;
    unsigned long util_reads;
    unsigned long long mem_total, mem_used, energy, energy_step;
    unsigned int proc_pid[MAX_PROCS];
    unsigned long long proc_mem[MAX_PROCS];
    int proc_count;
    unsigned int util_pid[MAX_PROCS];
    unsigned long long util_sm[MAX_PROCS];
    int util_proc_count;
    unsigned long long util_stamp;
    unsigned int unsupported;
    long lost_after;
    unsigned long memory_reads;
    char lost_marker[512];
};

static struct nvmlDevice_st devices[MAX_DEVICES];
static int device_count;
static int initialized;
static char driver_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = "999.99.99-fake";

static void trace(const char *name) {
    const char *path = getenv("FAKE_NVML_TRACE");
    if (!path || !*path) return;
    FILE *out = fopen(path, "a");
    if (!out) return;
    fprintf(out, "%s\n", name);
    fclose(out);
}

static int find_uuid(const char *uuid) {
    for (int i = 0; i < device_count; i++)
        if (strcmp(devices[i].uuid, uuid) == 0) return i;
    return -1;
}

static void parse_list(const char *text, unsigned int *out, int *count, int max) {
    char copy[512];
    snprintf(copy, sizeof copy, "%s", text);
    *count = 0;
    for (char *save = NULL, *item = strtok_r(copy, ",", &save); item && *count < max;
         item = strtok_r(NULL, ",", &save))
        out[(*count)++] = (unsigned int)strtoul(item, NULL, 10);
}

/* `<pid>:<value>[,...]` into two arrays of MAX_PROCS; answers how many pairs were read. */
static int parse_pairs(const char *text, unsigned int *pids, unsigned long long *values) {
    char copy[512];
    snprintf(copy, sizeof copy, "%s", text);
    int count = 0;
    for (char *save = NULL, *item = strtok_r(copy, ",", &save); item && count < MAX_PROCS;
         item = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(item, ':');
        pids[count] = (unsigned int)strtoul(item, NULL, 10);
        values[count] = colon ? strtoull(colon + 1, NULL, 10) : 0;
        count++;
    }
    return count;
}

static void apply_option(struct nvmlDevice_st *d, const char *key, const char *value) {
    if (!strcmp(key, "name")) snprintf(d->name, sizeof d->name, "%s", value);
    else if (!strcmp(key, "util")) parse_list(value, d->util, &d->util_count, MAX_UTIL);
    else if (!strcmp(key, "mem_total")) d->mem_total = strtoull(value, NULL, 10);
    else if (!strcmp(key, "mem_used")) d->mem_used = strtoull(value, NULL, 10);
    else if (!strcmp(key, "energy_mj")) d->energy = strtoull(value, NULL, 10);
    else if (!strcmp(key, "energy_step_mj")) d->energy_step = strtoull(value, NULL, 10);
    else if (!strcmp(key, "lost_after")) d->lost_after = strtol(value, NULL, 10);
    else if (!strcmp(key, "lost_marker")) snprintf(d->lost_marker, sizeof d->lost_marker, "%s", value);
    else if (!strcmp(key, "unsupported")) {
        if (strstr(value, "utilization")) d->unsupported |= F_UTIL;
        if (strstr(value, "memory")) d->unsupported |= F_MEMORY;
        if (strstr(value, "energy")) d->unsupported |= F_ENERGY;
        if (strstr(value, "processes")) d->unsupported |= F_PROCESSES;
    } else if (!strcmp(key, "proc_util")) {
        d->util_proc_count = parse_pairs(value, d->util_pid, d->util_sm);
    } else if (!strcmp(key, "procs")) {
        d->proc_count = parse_pairs(value, d->proc_pid, d->proc_mem);
    }
}

static struct nvmlDevice_st *add_device(const char *uuid, int parent) {
    if (device_count >= MAX_DEVICES) return NULL;
    struct nvmlDevice_st *d = &devices[device_count++];
    memset(d, 0, sizeof *d);
    snprintf(d->uuid, sizeof d->uuid, "%s", uuid);
    snprintf(d->name, sizeof d->name, "%s", parent < 0 ? "NVIDIA Fake GPU" : "NVIDIA Fake MIG 1g.10gb");
    d->parent = parent;
    d->lost_after = -1;
    if (parent >= 0) devices[parent].mig_children++;
    return d;
}

/* Answers NVML_SUCCESS or the init error the scenario asks for. */
static nvmlReturn_t load_scenario(void) {
    device_count = 0;
    const char *path = getenv("FAKE_NVML_SCENARIO");
    if (!path || !*path) return NVML_SUCCESS;
    FILE *in = fopen(path, "r");
    if (!in) return NVML_ERROR_UNKNOWN;
    nvmlReturn_t result = NVML_SUCCESS;
    char line[2048];
    while (fgets(line, sizeof line, in)) {
        char *save = NULL;
        char *kind = strtok_r(line, " \t\r\n", &save);
        if (!kind || kind[0] == '#') continue;
        if (!strcmp(kind, "driver")) {
            char *version = strtok_r(NULL, " \t\r\n", &save);
            if (version) snprintf(driver_version, sizeof driver_version, "%s", version);
            continue;
        }
        if (!strcmp(kind, "init_error")) {
            char *code = strtok_r(NULL, " \t\r\n", &save);
            if (code) result = (nvmlReturn_t)strtol(code, NULL, 10);
            continue;
        }
        int parent = -1;
        if (!strcmp(kind, "mig")) {
            char *parent_uuid = strtok_r(NULL, " \t\r\n", &save);
            parent = parent_uuid ? find_uuid(parent_uuid) : -1;
            if (parent < 0) continue;
        } else if (strcmp(kind, "gpu") != 0) {
            continue;
        }
        char *uuid = strtok_r(NULL, " \t\r\n", &save);
        struct nvmlDevice_st *d = uuid ? add_device(uuid, parent) : NULL;
        if (!d) continue;
        for (char *option = strtok_r(NULL, " \t\r\n", &save); option; option = strtok_r(NULL, " \t\r\n", &save)) {
            char *equals = strchr(option, '=');
            if (!equals) continue;
            *equals = '\0';
            apply_option(d, option, equals + 1);
        }
    }
    fclose(in);
    return result;
}

static int valid(nvmlDevice_t device) {
    return device >= devices && device < devices + device_count;
}

static int is_lost(nvmlDevice_t d) {
    if (d->lost_after >= 0 && d->memory_reads >= (unsigned long)d->lost_after) return 1;
    return d->lost_marker[0] && access(d->lost_marker, F_OK) == 0;
}

/* The common checks of a sampling call: initialised, a real handle, not lost, the figure supported. */
static nvmlReturn_t check(nvmlDevice_t device, unsigned int figure) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!valid(device)) return NVML_ERROR_INVALID_ARGUMENT;
    if (is_lost(device)) return NVML_ERROR_GPU_IS_LOST;
    if (device->unsupported & figure) return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    trace("nvmlInitWithFlags");
    nvmlReturn_t result = load_scenario();
    initialized = result == NVML_SUCCESS;
    return result;
}

nvmlReturn_t nvmlInit_v2(void) {
    trace("nvmlInit_v2");
    return nvmlInitWithFlags(0);
}

nvmlReturn_t nvmlShutdown(void) {
    trace("nvmlShutdown");
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    initialized = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    trace("nvmlSystemGetDriverVersion");
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!version || length < strlen(driver_version) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(version, length, "%s", driver_version);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    trace("nvmlDeviceGetCount_v2");
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    unsigned int gpus = 0;
    for (int i = 0; i < device_count; i++)
        if (devices[i].parent < 0) gpus++;
    *count = gpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    trace("nvmlDeviceGetHandleByIndex_v2");
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    unsigned int seen = 0;
    for (int i = 0; i < device_count; i++) {
        if (devices[i].parent >= 0) continue;
        if (seen++ == index) {
            if (is_lost(&devices[i])) return NVML_ERROR_GPU_IS_LOST;
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    trace("nvmlDeviceGetHandleByUUID");
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    int index = uuid ? find_uuid(uuid) : -1;
    if (index < 0) return NVML_ERROR_NOT_FOUND;
    if (is_lost(&devices[index])) return NVML_ERROR_GPU_IS_LOST;
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    trace("nvmlDeviceGetUUID");
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!valid(device)) return NVML_ERROR_INVALID_ARGUMENT;
    if (length < strlen(device->uuid) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(uuid, length, "%s", device->uuid);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    trace("nvmlDeviceGetName");
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!valid(device)) return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(name, length, "%s", device->name);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    trace("nvmlDeviceGetUtilizationRates");
    nvmlReturn_t result = check(device, F_UTIL);
    if (result != NVML_SUCCESS) return result;
    unsigned int value = device->util_count ? device->util[device->util_reads % device->util_count] : 0;
    device->util_reads++;
    utilization->gpu = value;
    utilization->memory = value / 2;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    trace("nvmlDeviceGetMemoryInfo");
    nvmlReturn_t result = check(device, F_MEMORY);
    if (result != NVML_SUCCESS) return result;
    device->memory_reads++;
    memory->total = device->mem_total;
    memory->used = device->mem_used;
    memory->free = device->mem_total - device->mem_used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    trace("nvmlDeviceGetMemoryInfo_v2");
    nvmlReturn_t result = check(device, F_MEMORY);
    if (result != NVML_SUCCESS) return result;
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    device->memory_reads++;
    memory->total = device->mem_total;
    memory->reserved = 0;
    memory->used = device->mem_used;
    memory->free = device->mem_total - device->mem_used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy) {
    trace("nvmlDeviceGetTotalEnergyConsumption");
    nvmlReturn_t result = check(device, F_ENERGY);
    if (result != NVML_SUCCESS) return result;
    *energy = device->energy;
    device->energy += device->energy_step;
    return NVML_SUCCESS;
}

/* One process list for both versions: _v3 (drivers 510+) and _v2 share the nvmlProcessInfo_v2_t layout. */
static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos) {
    nvmlReturn_t result = check(device, F_PROCESSES);
    if (result != NVML_SUCCESS) return result;
    unsigned int wanted = (unsigned int)device->proc_count;
    if (!infos || *infoCount < wanted) {
        *infoCount = wanted;
        return wanted ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    for (unsigned int i = 0; i < wanted; i++) {
        infos[i].pid = device->proc_pid[i];
        infos[i].usedGpuMemory = device->proc_mem[i];
        infos[i].gpuInstanceId = device->parent >= 0 ? 1 : 0xFFFFFFFFu;
        infos[i].computeInstanceId = device->parent >= 0 ? 0 : 0xFFFFFFFFu;
    }
    *infoCount = wanted;
    return NVML_SUCCESS;
}

#ifndef FAKE_NVML_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos) {
    trace("nvmlDeviceGetComputeRunningProcesses_v3");
    return running_processes(device, infoCount, infos);
}
#endif

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v2_t *infos) {
    trace("nvmlDeviceGetComputeRunningProcesses_v2");
    return running_processes(device, infoCount, infos);
}

/* Per-process SM utilisation: one fresh sample per process per call, stamped after lastSeenTimeStamp. */
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp) {
    trace("nvmlDeviceGetProcessUtilization");
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || !processSamplesCount) return NVML_ERROR_INVALID_ARGUMENT;
    if (is_lost(device)) return NVML_ERROR_GPU_IS_LOST;
    if (device->parent >= 0 || device->mig_children || (device->unsupported & F_UTIL))
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned int wanted = (unsigned int)device->util_proc_count;
    if (!wanted) return NVML_ERROR_NOT_FOUND;
    if (!utilization || *processSamplesCount < wanted) {
        *processSamplesCount = wanted;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    device->util_stamp = (lastSeenTimeStamp > device->util_stamp ? lastSeenTimeStamp : device->util_stamp) + 1000;
    for (unsigned int i = 0; i < wanted; i++) {
        utilization[i].pid = device->util_pid[i];
        utilization[i].timeStamp = device->util_stamp;
        utilization[i].smUtil = (unsigned int)device->util_sm[i];
        utilization[i].memUtil = (unsigned int)device->util_sm[i] / 2;
        utilization[i].encUtil = 0;
        utilization[i].decUtil = 0;
    }
    *processSamplesCount = wanted;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    trace("nvmlDeviceGetMigMode");
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || device->parent >= 0) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int mode = device->mig_children ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    *currentMode = mode;
    *pendingMode = mode;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    trace("nvmlDeviceGetMaxMigDeviceCount");
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || device->parent >= 0) return NVML_ERROR_INVALID_ARGUMENT;
    *count = device->mig_children ? 7 : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice) {
    trace("nvmlDeviceGetMigDeviceHandleByIndex");
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || device->parent >= 0) return NVML_ERROR_INVALID_ARGUMENT;
    int parent = (int)(device - devices);
    unsigned int seen = 0;
    for (int i = 0; i < device_count; i++) {
        if (devices[i].parent != parent) continue;
        if (seen++ == index) {
            *migDevice = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    trace("nvmlDeviceIsMigDeviceHandle");
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!valid(device)) return NVML_ERROR_INVALID_ARGUMENT;
    *isMigDevice = device->parent >= 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device) {
    trace("nvmlDeviceGetDeviceHandleFromMigDeviceHandle");
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!valid(migDevice) || migDevice->parent < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[migDevice->parent];
    return NVML_SUCCESS;
}
