/*
 * A fake libnvidia-ml.so.1 for a simulated GPU host (see ../README.md).
 *
 * Compiled against NVIDIA's own nvml.h so every prototype is checked by the compiler. The GPUs and
 * their mutable state live in the INI file named by FAKE_NVML_CONFIG, re-read on every call under a
 * shared flock on "<config>.lock"; nvmlDeviceSetComputeMode rewrites it under an exclusive lock,
 * atomically (temp file + rename), so state set in one process is seen by the next and concurrent
 * setters lose nothing. Only the functions below are exported: anything else is absent, as on a
 * driver too old to have it, and nvidia-ml-py raises NVMLError_FunctionNotFound.
 */
#define _GNU_SOURCE
/* Declare the unversioned legacy entry points (nvmlInit, nvmlDeviceGetCount, ...) as themselves
 * instead of letting the header rename them to their _v2 successors, so both can be defined. */
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define FAKE_API __attribute__((visibility("default")))

#define MAX_GPUS 64
/* MIG devices per GPU: 7 compute slices on A100/H100/H200, so at most 7 compute instances of 1 slice
 * (more only with CIs sharing a GI; 8 slots is room for a config to say so). */
#define MAX_MIG 8
#define MIG_MAGIC 0x4d494744u /* "MIGD" */
#define MAX_FAULTS 128
#define MAX_CONFIG_BYTES (1024 * 1024)
#define FUNC_NAME_LEN 64
#define DEVICE_MAGIC 0x4e564d4cu /* "NVML" */
/* Framebuffer the driver keeps for itself, and what an idle GPU shows as used by clients. */
#define RESERVED_BYTES (512ull * 1024 * 1024)
#define IDLE_USED_BYTES (1ull * 1024 * 1024)

/* ------------------------------------------------------------------------------------------------ */
/* Exported functions: the fault-injection key names and the MPS locality-domain view need them.    */

enum scope { SCOPE_SYSTEM, SCOPE_DEVICE };

struct export_info {
    const char *name;
    enum scope scope;
    int mps_view_ok; /* still answers under NVML_MPS_DEVICE_ENUMERATION=1 (nvml.h lists it) */
};

static const struct export_info EXPORTS[] = {
    {"nvmlInit", SCOPE_SYSTEM, 1},
    {"nvmlInit_v2", SCOPE_SYSTEM, 1},
    {"nvmlInitWithFlags", SCOPE_SYSTEM, 1},
    {"nvmlShutdown", SCOPE_SYSTEM, 1},
    {"nvmlErrorString", SCOPE_SYSTEM, 1},
    {"nvmlSystemGetDriverVersion", SCOPE_SYSTEM, 0},
    {"nvmlSystemGetNVMLVersion", SCOPE_SYSTEM, 1},
    {"nvmlSystemGetCudaDriverVersion", SCOPE_SYSTEM, 0},
    {"nvmlSystemGetCudaDriverVersion_v2", SCOPE_SYSTEM, 0},
    {"nvmlDeviceGetCount", SCOPE_SYSTEM, 0},
    {"nvmlDeviceGetCount_v2", SCOPE_SYSTEM, 1},
    {"nvmlDeviceGetHandleByIndex", SCOPE_DEVICE, 0},
    {"nvmlDeviceGetHandleByIndex_v2", SCOPE_DEVICE, 1},
    {"nvmlDeviceGetHandleByUUID", SCOPE_DEVICE, 1},
    {"nvmlDeviceGetIndex", SCOPE_DEVICE, 1},
    {"nvmlDeviceGetUUID", SCOPE_DEVICE, 1},
    {"nvmlDeviceGetName", SCOPE_DEVICE, 1},
    {"nvmlDeviceGetMemoryInfo", SCOPE_DEVICE, 1},
    {"nvmlDeviceGetMemoryInfo_v2", SCOPE_DEVICE, 1},
    {"nvmlDeviceGetCudaComputeCapability", SCOPE_DEVICE, 1},
    {"nvmlDeviceGetPciInfo_v3", SCOPE_DEVICE, 1},
    {"nvmlDeviceGetComputeMode", SCOPE_DEVICE, 0},
    {"nvmlDeviceSetComputeMode", SCOPE_DEVICE, 0},
    {"nvmlDeviceGetMigMode", SCOPE_DEVICE, 0},
    {"nvmlDeviceGetPersistenceMode", SCOPE_DEVICE, 0},
    {"nvmlDeviceGetMaxMigDeviceCount", SCOPE_DEVICE, 0},
    {"nvmlDeviceGetMigDeviceHandleByIndex", SCOPE_DEVICE, 0},
    {"nvmlDeviceGetDeviceHandleFromMigDeviceHandle", SCOPE_DEVICE, 0},
    {"nvmlDeviceIsMigDeviceHandle", SCOPE_DEVICE, 0},
    {"nvmlDeviceGetGpuInstanceId", SCOPE_DEVICE, 0},
    {"nvmlDeviceGetComputeInstanceId", SCOPE_DEVICE, 0},
    {"nvmlDeviceGetAttributes_v2", SCOPE_DEVICE, 0},
};
#define N_EXPORTS (sizeof(EXPORTS) / sizeof(EXPORTS[0]))

static const struct export_info *export_by_name(const char *name)
{
    for (size_t i = 0; i < N_EXPORTS; i++)
        if (strcmp(EXPORTS[i].name, name) == 0)
            return &EXPORTS[i];
    return NULL;
}

/* The function a fault key names, without its version: "nvmlInit_v2", "nvmlInitWithFlags" and
 * "nvmlInit" are one family (pynvml's nvmlInit() calls nvmlInitWithFlags), as are
 * nvmlDeviceGetCount/_v2, nvmlDeviceGetMemoryInfo/_v2, ... A fault applies to the whole family. */
static void family_of(const char *name, char *out, size_t n)
{
    snprintf(out, n, "%s", name);
    size_t len = strlen(out);
    size_t i = len;
    while (i > 0 && isdigit((unsigned char)out[i - 1]))
        i--;
    if (i < len && i >= 2 && out[i - 1] == 'v' && out[i - 2] == '_')
        out[i - 2] = '\0';
    if (strcasecmp(out, "nvmlInitWithFlags") == 0)
        snprintf(out, n, "nvmlInit");
}

static const struct export_info *export_by_family(const char *name)
{
    char want[FUNC_NAME_LEN], have[FUNC_NAME_LEN];
    family_of(name, want, sizeof(want));
    for (size_t i = 0; i < N_EXPORTS; i++) {
        family_of(EXPORTS[i].name, have, sizeof(have));
        if (strcasecmp(want, have) == 0)
            return &EXPORTS[i];
    }
    return NULL;
}

/* ------------------------------------------------------------------------------------------------ */
/* The configuration                                                                                */

/* One MIG device (a compute instance in its GPU instance), section [gpu<N>.mig<M>]. */
struct mig {
    int present;
    char profile[32];
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    unsigned int gi_id, ci_id;
    unsigned long long memory_total_mib;
    unsigned int sm_count;
    unsigned int gi_slices, ci_slices;
    unsigned int seen;
};

struct gpu {
    int present;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    unsigned long long memory_total_mib;
    int cc_major, cc_minor;
    nvmlComputeMode_t compute_mode;
    int mig_supported;
    unsigned int mig_current, mig_pending;
    int mig_pending_set;
    unsigned int max_mig; /* nvmlDeviceGetMaxMigDeviceCount while MIG is enabled */
    unsigned int mig_count;
    struct mig migs[MAX_MIG];
    nvmlEnableState_t persistence;
    char pci_bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    unsigned int pci_domain, pci_bus, pci_device, pci_function;
    unsigned int pci_device_id;
    unsigned int seen; /* bit per key, to refuse duplicates and find missing required keys */
    /* where the section is in the text, so SetComputeMode can rewrite only its own line */
    size_t header_end;
    size_t mode_line_start, mode_line_end;
    int has_mode_line;
};

struct fault {
    char func[FUNC_NAME_LEN];
    int gpu; /* -1: [system] */
    nvmlReturn_t code;
};

struct config {
    char driver_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    int cuda_driver_version;
    int require_root;
    unsigned int system_seen;
    int have_system;
    unsigned int gpu_count;
    struct gpu gpus[MAX_GPUS];
    unsigned int n_faults;
    struct fault faults[MAX_FAULTS];
};

enum gpu_key {
    K_NAME = 1u << 0,
    K_UUID = 1u << 1,
    K_MEMORY = 1u << 2,
    K_CC = 1u << 3,
    K_COMPUTE_MODE = 1u << 4,
    K_MIG_MODE = 1u << 5,
    K_MIG_PENDING = 1u << 6,
    K_PERSISTENCE = 1u << 7,
    K_PCI_BUS_ID = 1u << 8,
    K_PCI_DEVICE_ID = 1u << 9,
    K_MAX_MIG = 1u << 10,
};

enum mig_key {
    M_PROFILE = 1u << 0,
    M_UUID = 1u << 1,
    M_GI = 1u << 2,
    M_CI = 1u << 3,
    M_MEMORY = 1u << 4,
    M_SMS = 1u << 5,
    M_GI_SLICES = 1u << 6,
    M_CI_SLICES = 1u << 7,
};
#define MIG_REQUIRED (M_PROFILE | M_UUID | M_GI | M_MEMORY | M_SMS)
#define GPU_REQUIRED (K_NAME | K_UUID | K_MEMORY | K_CC)

enum system_key {
    S_DRIVER = 1u << 0,
    S_CUDA = 1u << 1,
    S_ROOT = 1u << 2,
};
#define SYSTEM_REQUIRED (S_DRIVER | S_CUDA)

static void debug(const char *path, unsigned int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* FAKE_NVML_DEBUG=1 says why a config was refused; a real driver has nothing to say there. */
static void debug(const char *path, unsigned int line, const char *fmt, ...)
{
    const char *on = getenv("FAKE_NVML_DEBUG");
    if (on == NULL || *on == '\0' || strcmp(on, "0") == 0)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (line > 0)
        fprintf(stderr, "fake-nvml: %s:%u: %s\n", path ? path : "(unset)", line, msg);
    else
        fprintf(stderr, "fake-nvml: %s: %s\n", path ? path : "(unset)", msg);
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *end = s + strlen(s);
    while (end > s && isspace((unsigned char)end[-1]))
        *--end = '\0';
    return s;
}

static int parse_bool(const char *v, int *out)
{
    static const char *yes[] = {"true", "yes", "on", "1"};
    static const char *no[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0) {
            *out = 1;
            return 0;
        }
        if (strcasecmp(v, no[i]) == 0) {
            *out = 0;
            return 0;
        }
    }
    return -1;
}

/* "enabled"/"disabled", or any boolean spelling */
static int parse_enabled(const char *v, int *out)
{
    if (strcasecmp(v, "enabled") == 0) {
        *out = 1;
        return 0;
    }
    if (strcasecmp(v, "disabled") == 0) {
        *out = 0;
        return 0;
    }
    return parse_bool(v, out);
}

static int parse_ull(const char *v, int base, unsigned long long max, unsigned long long *out)
{
    if (*v == '\0' || *v == '-' || *v == '+')
        return -1;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, base);
    if (errno != 0 || *end != '\0' || x > max)
        return -1;
    *out = x;
    return 0;
}

static int copy_string(char *dst, size_t n, const char *v)
{
    if (*v == '\0' || strlen(v) >= n)
        return -1;
    snprintf(dst, n, "%s", v);
    return 0;
}

static const struct {
    const char *name;
    nvmlReturn_t code;
} RETURN_NAMES[] = {
    {"NVML_SUCCESS", NVML_SUCCESS},
    {"NVML_ERROR_UNINITIALIZED", NVML_ERROR_UNINITIALIZED},
    {"NVML_ERROR_INVALID_ARGUMENT", NVML_ERROR_INVALID_ARGUMENT},
    {"NVML_ERROR_NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED},
    {"NVML_ERROR_NO_PERMISSION", NVML_ERROR_NO_PERMISSION},
    {"NVML_ERROR_ALREADY_INITIALIZED", NVML_ERROR_ALREADY_INITIALIZED},
    {"NVML_ERROR_NOT_FOUND", NVML_ERROR_NOT_FOUND},
    {"NVML_ERROR_INSUFFICIENT_SIZE", NVML_ERROR_INSUFFICIENT_SIZE},
    {"NVML_ERROR_INSUFFICIENT_POWER", NVML_ERROR_INSUFFICIENT_POWER},
    {"NVML_ERROR_DRIVER_NOT_LOADED", NVML_ERROR_DRIVER_NOT_LOADED},
    {"NVML_ERROR_TIMEOUT", NVML_ERROR_TIMEOUT},
    {"NVML_ERROR_IRQ_ISSUE", NVML_ERROR_IRQ_ISSUE},
    {"NVML_ERROR_LIBRARY_NOT_FOUND", NVML_ERROR_LIBRARY_NOT_FOUND},
    {"NVML_ERROR_FUNCTION_NOT_FOUND", NVML_ERROR_FUNCTION_NOT_FOUND},
    {"NVML_ERROR_CORRUPTED_INFOROM", NVML_ERROR_CORRUPTED_INFOROM},
    {"NVML_ERROR_GPU_IS_LOST", NVML_ERROR_GPU_IS_LOST},
    {"NVML_ERROR_RESET_REQUIRED", NVML_ERROR_RESET_REQUIRED},
    {"NVML_ERROR_OPERATING_SYSTEM", NVML_ERROR_OPERATING_SYSTEM},
    {"NVML_ERROR_LIB_RM_VERSION_MISMATCH", NVML_ERROR_LIB_RM_VERSION_MISMATCH},
    {"NVML_ERROR_IN_USE", NVML_ERROR_IN_USE},
    {"NVML_ERROR_MEMORY", NVML_ERROR_MEMORY},
    {"NVML_ERROR_NO_DATA", NVML_ERROR_NO_DATA},
    {"NVML_ERROR_VGPU_ECC_NOT_SUPPORTED", NVML_ERROR_VGPU_ECC_NOT_SUPPORTED},
    {"NVML_ERROR_INSUFFICIENT_RESOURCES", NVML_ERROR_INSUFFICIENT_RESOURCES},
    {"NVML_ERROR_FREQ_NOT_SUPPORTED", NVML_ERROR_FREQ_NOT_SUPPORTED},
    {"NVML_ERROR_ARGUMENT_VERSION_MISMATCH", NVML_ERROR_ARGUMENT_VERSION_MISMATCH},
    {"NVML_ERROR_DEPRECATED", NVML_ERROR_DEPRECATED},
    {"NVML_ERROR_NOT_READY", NVML_ERROR_NOT_READY},
    {"NVML_ERROR_GPU_NOT_FOUND", NVML_ERROR_GPU_NOT_FOUND},
    {"NVML_ERROR_INVALID_STATE", NVML_ERROR_INVALID_STATE},
    {"NVML_ERROR_RESET_TYPE_NOT_SUPPORTED", NVML_ERROR_RESET_TYPE_NOT_SUPPORTED},
    {"NVML_ERROR_UNKNOWN", NVML_ERROR_UNKNOWN},
};

/* A fault code: a number, or an nvmlReturn_t name (NVML_ERROR_GPU_IS_LOST). */
static int parse_return_code(const char *v, nvmlReturn_t *out)
{
    unsigned long long x;
    if (parse_ull(v, 10, INT_MAX, &x) == 0) {
        *out = (nvmlReturn_t)x;
        return 0;
    }
    for (size_t i = 0; i < sizeof(RETURN_NAMES) / sizeof(RETURN_NAMES[0]); i++) {
        if (strcasecmp(v, RETURN_NAMES[i].name) == 0) {
            *out = RETURN_NAMES[i].code;
            return 0;
        }
    }
    return -1;
}

static const char *const COMPUTE_MODE_NAMES[] = {
    [NVML_COMPUTEMODE_DEFAULT] = "default",
    [NVML_COMPUTEMODE_EXCLUSIVE_THREAD] = "exclusive_thread",
    [NVML_COMPUTEMODE_PROHIBITED] = "prohibited",
    [NVML_COMPUTEMODE_EXCLUSIVE_PROCESS] = "exclusive_process",
};

static int parse_compute_mode(const char *v, nvmlComputeMode_t *out)
{
    static const nvmlComputeMode_t allowed[] = {
        NVML_COMPUTEMODE_DEFAULT, NVML_COMPUTEMODE_EXCLUSIVE_PROCESS, NVML_COMPUTEMODE_PROHIBITED};
    for (size_t i = 0; i < sizeof(allowed) / sizeof(allowed[0]); i++) {
        if (strcasecmp(v, COMPUTE_MODE_NAMES[allowed[i]]) == 0) {
            *out = allowed[i];
            return 0;
        }
    }
    return -1;
}

/* "00000000:18:00.0" (NVML's form) or the legacy "0000:18:00.0". */
static int parse_pci_bus_id(const char *v, struct gpu *g)
{
    unsigned int domain, bus, device, function;
    int used = 0;
    if (sscanf(v, "%x:%x:%x.%x%n", &domain, &bus, &device, &function, &used) != 4 || v[used] != '\0')
        return -1;
    if (bus > 0xff || device > 31 || function > 7)
        return -1;
    g->pci_domain = domain;
    g->pci_bus = bus;
    g->pci_device = device;
    g->pci_function = function;
    return 0;
}

static int gpu_section_index(const char *section, unsigned int *index)
{
    unsigned long long x;
    const char *digits = section + 3;
    if (strncmp(section, "gpu", 3) != 0)
        return -1;
    /* no sign, no leading zeros: one spelling per GPU */
    if (!isdigit((unsigned char)digits[0]) || (digits[0] == '0' && digits[1] != '\0'))
        return -1;
    if (parse_ull(digits, 10, MAX_GPUS - 1, &x) != 0)
        return -1;
    *index = (unsigned int)x;
    return 0;
}

static int parse_system_key(struct config *cfg, const char *key, const char *value)
{
    unsigned int bit;
    int rc;
    unsigned long long x;
    if (strcmp(key, "driver_version") == 0) {
        bit = S_DRIVER;
        rc = copy_string(cfg->driver_version, sizeof(cfg->driver_version), value);
    } else if (strcmp(key, "cuda_driver_version") == 0) {
        bit = S_CUDA;
        rc = parse_ull(value, 10, INT_MAX, &x);
        if (rc == 0 && x < 1000)
            rc = -1; /* 12060 means CUDA 12.6 */
        cfg->cuda_driver_version = (int)x;
    } else if (strcmp(key, "require_root") == 0) {
        bit = S_ROOT;
        rc = parse_bool(value, &cfg->require_root);
    } else {
        return -2;
    }
    if (cfg->system_seen & bit)
        return -3;
    cfg->system_seen |= bit;
    return rc;
}

static int parse_gpu_key(struct gpu *g, const char *key, const char *value)
{
    unsigned int bit;
    int rc = 0;
    unsigned long long x = 0;
    if (strcmp(key, "name") == 0) {
        bit = K_NAME;
        rc = copy_string(g->name, sizeof(g->name), value);
    } else if (strcmp(key, "uuid") == 0) {
        bit = K_UUID;
        rc = copy_string(g->uuid, NVML_DEVICE_UUID_BUFFER_SIZE, value);
        if (rc == 0 && strncmp(value, "GPU-", 4) != 0)
            rc = -1;
    } else if (strcmp(key, "memory_total_mib") == 0) {
        bit = K_MEMORY;
        rc = parse_ull(value, 10, 1ull << 30, &x);
        if (rc == 0 && x * 1048576ull <= RESERVED_BYTES + IDLE_USED_BYTES)
            rc = -1;
        g->memory_total_mib = x;
    } else if (strcmp(key, "compute_capability") == 0) {
        bit = K_CC;
        int used = 0;
        if (sscanf(value, "%d.%d%n", &g->cc_major, &g->cc_minor, &used) != 2 || value[used] != '\0' ||
            g->cc_major < 1 || g->cc_minor < 0 || !isdigit((unsigned char)value[0]))
            rc = -1;
    } else if (strcmp(key, "compute_mode") == 0) {
        bit = K_COMPUTE_MODE;
        rc = parse_compute_mode(value, &g->compute_mode);
    } else if (strcmp(key, "mig_mode") == 0) {
        bit = K_MIG_MODE;
        if (strcasecmp(value, "unsupported") == 0) {
            g->mig_supported = 0;
        } else {
            int on = 0;
            rc = parse_enabled(value, &on);
            g->mig_supported = 1;
            g->mig_current = on ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
        }
    } else if (strcmp(key, "mig_pending") == 0) {
        bit = K_MIG_PENDING;
        int on = 0;
        rc = parse_enabled(value, &on);
        g->mig_pending = on ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
        g->mig_pending_set = 1;
    } else if (strcmp(key, "persistence_mode") == 0) {
        bit = K_PERSISTENCE;
        int on = 0;
        rc = parse_enabled(value, &on);
        g->persistence = on ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    } else if (strcmp(key, "pci_bus_id") == 0) {
        bit = K_PCI_BUS_ID;
        rc = parse_pci_bus_id(value, g);
    } else if (strcmp(key, "max_mig_devices") == 0) {
        bit = K_MAX_MIG;
        rc = parse_ull(value, 10, MAX_MIG, &x);
        if (rc == 0 && x == 0)
            rc = -1;
        g->max_mig = (unsigned int)x;
    } else if (strcmp(key, "pci_device_id") == 0) {
        bit = K_PCI_DEVICE_ID;
        rc = parse_ull(value, 16, 0xffffffffull, &x);
        g->pci_device_id = (unsigned int)x;
    } else {
        return -2;
    }
    if (g->seen & bit)
        return -3;
    g->seen |= bit;
    return rc;
}

/* "[<c>c.]<g>g.<mem>gb": the slice counts a profile name gives (1c.3g.40gb: CI 1, GI 3). */
static int profile_slices(const char *profile, unsigned int *gi, unsigned int *ci)
{
    unsigned int a = 0, b = 0;
    int used = 0;
    if (sscanf(profile, "%uc.%ug.%*[0-9]gb%n", &a, &b, &used) == 2 && profile[used] == '\0' && a >= 1 && b >= a) {
        *ci = a;
        *gi = b;
        return 0;
    }
    used = 0;
    if (sscanf(profile, "%ug.%*[0-9]gb%n", &b, &used) == 1 && profile[used] == '\0' && b >= 1) {
        *ci = b;
        *gi = b;
        return 0;
    }
    return -1;
}

static int parse_mig_key(struct mig *m, const char *key, const char *value)
{
    unsigned int bit;
    int rc = 0;
    unsigned long long x = 0;
    if (strcmp(key, "profile") == 0) {
        bit = M_PROFILE;
        unsigned int gi, ci;
        rc = copy_string(m->profile, sizeof(m->profile), value);
        if (rc == 0 && profile_slices(value, &gi, &ci) != 0)
            rc = -1;
    } else if (strcmp(key, "uuid") == 0) {
        bit = M_UUID;
        rc = copy_string(m->uuid, NVML_DEVICE_UUID_BUFFER_SIZE, value);
        if (rc == 0 && strncmp(value, "MIG-", 4) != 0)
            rc = -1;
    } else if (strcmp(key, "gpu_instance_id") == 0) {
        bit = M_GI;
        rc = parse_ull(value, 10, 255, &x);
        m->gi_id = (unsigned int)x;
    } else if (strcmp(key, "compute_instance_id") == 0) {
        bit = M_CI;
        rc = parse_ull(value, 10, 255, &x);
        m->ci_id = (unsigned int)x;
    } else if (strcmp(key, "memory_total_mib") == 0) {
        bit = M_MEMORY;
        rc = parse_ull(value, 10, 1ull << 30, &x);
        if (rc == 0 && x * 1048576ull <= RESERVED_BYTES + IDLE_USED_BYTES)
            rc = -1;
        m->memory_total_mib = x;
    } else if (strcmp(key, "multiprocessor_count") == 0) {
        bit = M_SMS;
        rc = parse_ull(value, 10, 1024, &x);
        if (rc == 0 && x == 0)
            rc = -1;
        m->sm_count = (unsigned int)x;
    } else if (strcmp(key, "gpu_instance_slices") == 0) {
        bit = M_GI_SLICES;
        rc = parse_ull(value, 10, 8, &x);
        if (rc == 0 && x == 0)
            rc = -1;
        m->gi_slices = (unsigned int)x;
    } else if (strcmp(key, "compute_instance_slices") == 0) {
        bit = M_CI_SLICES;
        rc = parse_ull(value, 10, 8, &x);
        if (rc == 0 && x == 0)
            rc = -1;
        m->ci_slices = (unsigned int)x;
    } else {
        return -2;
    }
    if (m->seen & bit)
        return -3;
    m->seen |= bit;
    return rc;
}

/* "gpu<N>.mig<M>": a MIG device section. */
static int mig_section_index(const char *section, unsigned int *gpu, unsigned int *mig)
{
    char head[16];
    const char *dot = strchr(section, '.');
    if (dot == NULL || (size_t)(dot - section) >= sizeof(head) || strncmp(dot + 1, "mig", 3) != 0)
        return -1;
    memcpy(head, section, (size_t)(dot - section));
    head[dot - section] = '\0';
    if (gpu_section_index(head, gpu) != 0)
        return -1;
    const char *digits = dot + 4;
    unsigned long long x;
    if (!isdigit((unsigned char)digits[0]) || (digits[0] == '0' && digits[1] != '\0'))
        return -1;
    if (parse_ull(digits, 10, MAX_MIG - 1, &x) != 0)
        return -1;
    *mig = (unsigned int)x;
    return 0;
}

static int add_fault(struct config *cfg, int gpu, const char *func, const char *value)
{
    const struct export_info *e = export_by_family(func);
    if (e == NULL || strcmp(e->name, "nvmlErrorString") == 0)
        return -4; /* nothing exported by that name can fail */
    if (gpu >= 0 && e->scope != SCOPE_DEVICE)
        return -5;
    for (unsigned int i = 0; i < cfg->n_faults; i++) {
        char a[FUNC_NAME_LEN], b[FUNC_NAME_LEN];
        family_of(cfg->faults[i].func, a, sizeof(a));
        family_of(func, b, sizeof(b));
        if (cfg->faults[i].gpu == gpu && strcasecmp(a, b) == 0)
            return -3;
    }
    if (cfg->n_faults >= MAX_FAULTS || strlen(func) >= FUNC_NAME_LEN)
        return -1;
    struct fault *f = &cfg->faults[cfg->n_faults];
    if (parse_return_code(value, &f->code) != 0)
        return -1;
    snprintf(f->func, sizeof(f->func), "%s", func);
    f->gpu = gpu;
    cfg->n_faults++;
    return 0;
}

/* A GPU's MIG sections: contiguous from mig0, only on a GPU whose MIG mode is enabled, each complete,
 * UUIDs unique on the host, one (GI, CI) pair each. Fills the slice counts the profile implies. */
static int validate_migs(struct config *cfg, unsigned int i, const char *path)
{
    struct gpu *g = &cfg->gpus[i];
    g->mig_count = 0;
    while (g->mig_count < MAX_MIG && g->migs[g->mig_count].present)
        g->mig_count++;
    for (unsigned int k = g->mig_count; k < MAX_MIG; k++) {
        if (g->migs[k].present) {
            debug(path, 0, "[gpu%u.mig%u] present but [gpu%u.mig%u] missing: MIG sections must be contiguous from 0", i, k, i,
                  g->mig_count);
            return -1;
        }
    }
    if (g->mig_count == 0)
        return 0;
    if (!g->present || !g->mig_supported || g->mig_current != NVML_DEVICE_MIG_ENABLE) {
        debug(path, 0, "[gpu%u] has MIG devices but its mig_mode is not enabled", i);
        return -1;
    }
    if (g->mig_count > g->max_mig) {
        debug(path, 0, "[gpu%u] has %u MIG devices, more than max_mig_devices = %u", i, g->mig_count, g->max_mig);
        return -1;
    }
    for (unsigned int k = 0; k < g->mig_count; k++) {
        struct mig *m = &g->migs[k];
        if ((m->seen & MIG_REQUIRED) != MIG_REQUIRED) {
            debug(path, 0, "[gpu%u.mig%u] needs profile, uuid, gpu_instance_id, memory_total_mib and multiprocessor_count", i, k);
            return -1;
        }
        unsigned int gi_slices, ci_slices;
        profile_slices(m->profile, &gi_slices, &ci_slices);
        if (!(m->seen & M_GI_SLICES))
            m->gi_slices = gi_slices;
        if (!(m->seen & M_CI_SLICES))
            m->ci_slices = ci_slices;
        if (m->memory_total_mib > g->memory_total_mib) {
            debug(path, 0, "[gpu%u.mig%u] has more memory than its GPU", i, k);
            return -1;
        }
        for (unsigned int j = 0; j < k; j++) {
            if (g->migs[j].gi_id == m->gi_id && g->migs[j].ci_id == m->ci_id) {
                debug(path, 0, "[gpu%u.mig%u] and [gpu%u.mig%u] are both GPU instance %u, compute instance %u", i, j, i, k,
                      m->gi_id, m->ci_id);
                return -1;
            }
        }
        for (unsigned int o = 0; o <= i; o++) {
            if (strcmp(cfg->gpus[o].uuid, m->uuid) == 0)
                goto dup;
            for (unsigned int j = 0; j < (o == i ? k : cfg->gpus[o].mig_count); j++)
                if (strcmp(cfg->gpus[o].migs[j].uuid, m->uuid) == 0)
                    goto dup;
        }
        continue;
    dup:
        debug(path, 0, "[gpu%u.mig%u]: uuid %s is used twice", i, k, m->uuid);
        return -1;
    }
    return 0;
}

/* Parses the INI text (NUL-terminated, modified in place: pass a copy). 0 on success. */
static int parse_config(char *text, const char *path, struct config *cfg)
{
    enum { SEC_NONE, SEC_SYSTEM, SEC_GPU, SEC_MIG, SEC_OTHER } sec = SEC_NONE;
    struct gpu *g = NULL;
    struct mig *m = NULL;
    int gpu_index = -1;
    unsigned int lineno = 0;
    char *p = text;

    memset(cfg, 0, sizeof(*cfg));
    while (*p != '\0') {
        char *line = p;
        size_t line_start = (size_t)(line - text);
        char *nl = strchr(p, '\n');
        if (nl != NULL) {
            *nl = '\0';
            p = nl + 1;
        } else {
            p += strlen(p);
        }
        size_t line_end = (size_t)(p - text);
        lineno++;
        char *s = trim(line);
        if (*s == '\0' || *s == ';' || *s == '#')
            continue;
        if (*s == '[') {
            char *close = strchr(s, ']');
            if (close == NULL || close[1] != '\0') {
                debug(path, lineno, "malformed section header");
                return -1;
            }
            *close = '\0';
            char *name = trim(s + 1);
            unsigned int idx, mig_idx;
            if (strcmp(name, "system") == 0) {
                if (cfg->have_system) {
                    debug(path, lineno, "duplicate section [system]");
                    return -1;
                }
                cfg->have_system = 1;
                sec = SEC_SYSTEM;
            } else if (gpu_section_index(name, &idx) == 0) {
                if (cfg->gpus[idx].present) {
                    debug(path, lineno, "duplicate section [%s]", name);
                    return -1;
                }
                g = &cfg->gpus[idx];
                g->present = 1;
                g->header_end = line_end;
                gpu_index = (int)idx;
                sec = SEC_GPU;
            } else if (mig_section_index(name, &idx, &mig_idx) == 0) {
                if (cfg->gpus[idx].migs[mig_idx].present) {
                    debug(path, lineno, "duplicate section [%s]", name);
                    return -1;
                }
                m = &cfg->gpus[idx].migs[mig_idx];
                m->present = 1;
                gpu_index = (int)idx;
                sec = SEC_MIG;
            } else if (strncasecmp(name, "gpu", 3) == 0) {
                debug(path, lineno, "[%s]: GPU sections are [gpu0] .. [gpu%d], MIG devices [gpuN.mig0] .. [gpuN.mig%d]",
                      name, MAX_GPUS - 1, MAX_MIG - 1);
                return -1;
            } else {
                sec = SEC_OTHER; /* room for other tools sharing the file */
            }
            continue;
        }
        if (sec == SEC_OTHER)
            continue; /* another tool's section: its syntax is its own business */
        char *eq = strchr(s, '=');
        if (eq == NULL) {
            debug(path, lineno, "expected 'key = value'");
            return -1;
        }
        *eq = '\0';
        char *key = trim(s);
        char *value = trim(eq + 1);
        int rc;
        if (sec == SEC_NONE) {
            debug(path, lineno, "'%s' outside any section", key);
            return -1;
        }
        if (strncmp(key, "fail.", 5) == 0 && sec == SEC_MIG) {
            rc = -2; /* faults are per GPU: a MIG device fails with its GPU */
        } else if (strncmp(key, "fail.", 5) == 0) {
            rc = add_fault(cfg, sec == SEC_GPU ? gpu_index : -1, key + 5, value);
        } else if (sec == SEC_SYSTEM) {
            rc = parse_system_key(cfg, key, value);
        } else if (sec == SEC_MIG) {
            rc = parse_mig_key(m, key, value);
        } else {
            rc = parse_gpu_key(g, key, value);
            if (rc == 0 && strcmp(key, "compute_mode") == 0) {
                g->has_mode_line = 1;
                g->mode_line_start = line_start;
                g->mode_line_end = line_end;
            }
        }
        switch (rc) {
        case 0:
            break;
        case -2:
            debug(path, lineno, "unknown key '%s'", key);
            return -1;
        case -3:
            debug(path, lineno, "duplicate key '%s'", key);
            return -1;
        case -4:
            debug(path, lineno, "'%s': no exported function to fail", key);
            return -1;
        case -5:
            debug(path, lineno, "'%s' is not a per-GPU function: put it in [system]", key);
            return -1;
        default:
            debug(path, lineno, "bad value '%s' for '%s'", value, key);
            return -1;
        }
    }

    if (!cfg->have_system) {
        debug(path, 0, "no [system] section");
        return -1;
    }
    if ((cfg->system_seen & SYSTEM_REQUIRED) != SYSTEM_REQUIRED) {
        debug(path, 0, "[system] needs driver_version and cuda_driver_version");
        return -1;
    }
    cfg->gpu_count = 0;
    while (cfg->gpu_count < MAX_GPUS && cfg->gpus[cfg->gpu_count].present)
        cfg->gpu_count++;
    for (unsigned int i = cfg->gpu_count; i < MAX_GPUS; i++) {
        if (cfg->gpus[i].migs[0].present && !cfg->gpus[i].present) {
            debug(path, 0, "[gpu%u.mig0] without [gpu%u]", i, i);
            return -1;
        }
        if (cfg->gpus[i].present) {
            debug(path, 0, "[gpu%u] present but [gpu%u] missing: GPU sections must be contiguous from 0",
                  i, cfg->gpu_count);
            return -1;
        }
    }
    for (unsigned int i = 0; i < cfg->gpu_count; i++) {
        struct gpu *gi = &cfg->gpus[i];
        if ((gi->seen & GPU_REQUIRED) != GPU_REQUIRED) {
            debug(path, 0, "[gpu%u] needs name, uuid, memory_total_mib and compute_capability", i);
            return -1;
        }
        for (unsigned int j = 0; j < i; j++) {
            if (strcmp(cfg->gpus[j].uuid, gi->uuid) == 0) {
                debug(path, 0, "[gpu%u] and [gpu%u] share uuid %s", j, i, gi->uuid);
                return -1;
            }
        }
        if (!(gi->seen & K_MIG_MODE))
            gi->mig_supported = 1, gi->mig_current = NVML_DEVICE_MIG_DISABLE;
        if (!gi->mig_pending_set)
            gi->mig_pending = gi->mig_current;
        if (!(gi->seen & K_MAX_MIG))
            gi->max_mig = 7;
        if (validate_migs(cfg, i, path) != 0)
            return -1;
        if (!(gi->seen & K_PCI_BUS_ID))
            gi->pci_bus = i + 1;
        snprintf(gi->pci_bus_id, sizeof(gi->pci_bus_id), "%08X:%02X:%02X.%X", gi->pci_domain, gi->pci_bus,
                 gi->pci_device, gi->pci_function);
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* Reading and writing the file                                                                     */

struct loaded {
    char path[PATH_MAX]; /* the config, symlinks resolved so every process locks the same file */
    char *text;          /* as read, unmodified */
    size_t len;
    struct config cfg;
    int lock_fd;
};

static void loaded_free(struct loaded *l)
{
    if (l == NULL)
        return;
    free(l->text);
    if (l->lock_fd >= 0)
        close(l->lock_fd); /* drops the flock */
    free(l);
}

static int open_lock(const char *path)
{
    char lock_path[PATH_MAX + 8];
    snprintf(lock_path, sizeof(lock_path), "%s.lock", path);
    int fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        fd = open(lock_path, O_RDONLY | O_CLOEXEC); /* another user's lock file: flock works read-only */
    return fd;
}

static char *read_all(int fd, size_t *len)
{
    size_t cap = 8192, n = 0;
    char *buf = malloc(cap);
    if (buf == NULL)
        return NULL;
    for (;;) {
        if (n + 1 >= cap) {
            if (cap >= MAX_CONFIG_BYTES) {
                free(buf);
                return NULL;
            }
            cap *= 2;
            char *nb = realloc(buf, cap);
            if (nb == NULL) {
                free(buf);
                return NULL;
            }
            buf = nb;
        }
        ssize_t r = read(fd, buf + n, cap - n - 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            free(buf);
            return NULL;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    if (memchr(buf, '\0', n) != NULL) { /* binary garbage */
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/*
 * Reads and parses the config under a lock (LOCK_SH or LOCK_EX), which stays held until
 * loaded_free(). NULL when the config is unset, unreadable or invalid.
 */
static struct loaded *load_config(int lock_op)
{
    const char *env = getenv("FAKE_NVML_CONFIG");
    if (env == NULL || *env == '\0') {
        debug(NULL, 0, "FAKE_NVML_CONFIG is not set: no driver");
        return NULL;
    }
    struct loaded *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return NULL;
    l->lock_fd = -1;
    if (realpath(env, l->path) == NULL) {
        debug(env, 0, "%s", strerror(errno));
        loaded_free(l);
        return NULL;
    }
    /* No lock file and no right to create one (a directory this caller cannot write): a reader
     * still sees a whole file, since writers rename, and a writer fails later, at its temp file. */
    l->lock_fd = open_lock(l->path);
    while (l->lock_fd >= 0 && flock(l->lock_fd, lock_op) != 0) {
        if (errno != EINTR) {
            loaded_free(l);
            return NULL;
        }
    }
    int fd = open(l->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        debug(l->path, 0, "%s", strerror(errno));
        loaded_free(l);
        return NULL;
    }
    l->text = read_all(fd, &l->len);
    close(fd);
    if (l->text == NULL) {
        debug(l->path, 0, "unreadable, too large or binary");
        loaded_free(l);
        return NULL;
    }
    char *scratch = strdup(l->text);
    if (scratch == NULL) {
        loaded_free(l);
        return NULL;
    }
    int rc = parse_config(scratch, l->path, &l->cfg);
    free(scratch);
    if (rc != 0) {
        loaded_free(l);
        return NULL;
    }
    return l;
}

static nvmlReturn_t errno_to_nvml(int err)
{
    return (err == EACCES || err == EPERM || err == EROFS) ? NVML_ERROR_NO_PERMISSION : NVML_ERROR_UNKNOWN;
}

static int write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t w = write(fd, buf, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -1;
        buf += w;
        len -= (size_t)w;
    }
    return 0;
}

/* Rewrites one GPU's compute_mode line (or adds it); the caller holds the exclusive lock. */
static nvmlReturn_t store_compute_mode(struct loaded *l, unsigned int index, nvmlComputeMode_t mode)
{
    const struct gpu *g = &l->cfg.gpus[index];
    size_t cut_start = g->has_mode_line ? g->mode_line_start : g->header_end;
    size_t cut_end = g->has_mode_line ? g->mode_line_end : g->header_end;
    char line[64];
    int n = snprintf(line, sizeof(line), "compute_mode = %s\n", COMPUTE_MODE_NAMES[mode]);
    /* a header on the file's last line, with no newline after it */
    int need_nl = cut_start > 0 && l->text[cut_start - 1] != '\n';

    char dir_tmpl[PATH_MAX + 16];
    snprintf(dir_tmpl, sizeof(dir_tmpl), "%s.XXXXXX", l->path);
    int fd = mkostemp(dir_tmpl, O_CLOEXEC);
    if (fd < 0)
        return errno_to_nvml(errno);
    struct stat st;
    if (stat(l->path, &st) == 0) {
        if (fchmod(fd, st.st_mode & 07777) != 0) {
            /* keep the mode 0600 mkostemp gave: still readable by this user */
        }
        if (geteuid() == 0 && fchown(fd, st.st_uid, st.st_gid) != 0) {
            /* owner unchanged is only cosmetic */
        }
    }
    int err = 0;
    if (write_all(fd, l->text, cut_start) != 0 || (need_nl && write_all(fd, "\n", 1) != 0) ||
        write_all(fd, line, (size_t)n) != 0 || write_all(fd, l->text + cut_end, l->len - cut_end) != 0)
        err = errno;
    if (close(fd) != 0 && err == 0)
        err = errno;
    if (err == 0 && rename(dir_tmpl, l->path) != 0)
        err = errno;
    if (err != 0) {
        unlink(dir_tmpl);
        return errno_to_nvml(err);
    }
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------ */
/* Library state, call log, faults                                                                  */

static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned int init_refcount;
static int mps_view; /* NVML_MPS_DEVICE_ENUMERATION=1 at the first nvmlInit */

struct nvmlDevice_st {
    unsigned int magic;
    unsigned int index;
};
static struct nvmlDevice_st device_table[MAX_GPUS];
/* MIG device handles: slot [gpu][mig]; index holds gpu * MAX_MIG + mig. */
static struct nvmlDevice_st mig_table[MAX_GPUS * MAX_MIG];

static void log_call(const char *func)
{
    const char *path = getenv("FAKE_NVML_CALL_LOG");
    if (path == NULL || *path == '\0')
        return;
    int saved = errno;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
    if (fd >= 0) {
        char line[FUNC_NAME_LEN + 32];
        int n = snprintf(line, sizeof(line), "%ld %s\n", (long)getpid(), func);
        /* one write() per line: O_APPEND keeps lines from concurrent processes whole */
        if (write(fd, line, (size_t)n) != n) {
            /* the log is best effort */
        }
        close(fd);
    }
    errno = saved;
}

static int initialized(void)
{
    pthread_mutex_lock(&state_lock);
    int r = init_refcount > 0;
    pthread_mutex_unlock(&state_lock);
    return r;
}

static int in_mps_view(void)
{
    pthread_mutex_lock(&state_lock);
    int r = mps_view;
    pthread_mutex_unlock(&state_lock);
    return r;
}

/* The injected code for func on this GPU (gpu < 0: system-wide only), or NVML_SUCCESS. */
static nvmlReturn_t injected(const struct config *cfg, const char *func, int gpu)
{
    char want[FUNC_NAME_LEN], have[FUNC_NAME_LEN];
    nvmlReturn_t system = NVML_SUCCESS;
    family_of(func, want, sizeof(want));
    for (unsigned int i = 0; i < cfg->n_faults; i++) {
        family_of(cfg->faults[i].func, have, sizeof(have));
        if (strcasecmp(want, have) != 0)
            continue;
        if (cfg->faults[i].gpu >= 0 && cfg->faults[i].gpu == gpu)
            return cfg->faults[i].code; /* the GPU's own fault wins over [system]'s */
        if (cfg->faults[i].gpu < 0)
            system = cfg->faults[i].code;
    }
    return system;
}

/* Common entry for functions that touch no GPU. On success *out holds the config, shared-locked. */
static nvmlReturn_t enter_system(const char *func, struct loaded **out)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    struct loaded *l = load_config(LOCK_SH);
    if (l == NULL)
        return NVML_ERROR_UNKNOWN; /* the config vanished after init: the driver went away */
    nvmlReturn_t rc = injected(&l->cfg, func, -1);
    if (rc == NVML_SUCCESS && in_mps_view() && !export_by_name(func)->mps_view_ok)
        rc = NVML_ERROR_NOT_SUPPORTED;
    if (rc != NVML_SUCCESS) {
        loaded_free(l);
        return rc;
    }
    *out = l;
    return NVML_SUCCESS;
}

/* After the GPU is known: its faults, then the MPS view. */
static nvmlReturn_t check_gpu(const char *func, const struct loaded *l, unsigned int index)
{
    nvmlReturn_t rc = injected(&l->cfg, func, (int)index);
    if (rc == NVML_SUCCESS && in_mps_view() && !export_by_name(func)->mps_view_ok)
        rc = NVML_ERROR_NOT_SUPPORTED;
    return rc;
}

/* A MIG device handle's GPU and MIG index; -1 when it is not one of the MIG slots. */
static int mig_handle(nvmlDevice_t device, unsigned int *gpu, unsigned int *mig)
{
    uintptr_t base = (uintptr_t)mig_table, p = (uintptr_t)device;
    if (device == NULL || p < base || p >= base + sizeof(mig_table) || (p - base) % sizeof(mig_table[0]) != 0 ||
        device->magic != MIG_MAGIC)
        return -1;
    *gpu = device->index / MAX_MIG;
    *mig = device->index % MAX_MIG;
    return 0;
}

static int handle_index(nvmlDevice_t device, unsigned int *index)
{
    uintptr_t base = (uintptr_t)device_table, p = (uintptr_t)device;
    if (device == NULL || p < base || p >= base + sizeof(device_table) ||
        (p - base) % sizeof(device_table[0]) != 0 || device->magic != DEVICE_MAGIC)
        return -1;
    *index = device->index;
    return 0;
}

/* Handles are fixed slots, filled once at load, so a handle outlives any re-read of the config. */
__attribute__((constructor)) static void fill_device_table(void)
{
    for (unsigned int i = 0; i < MAX_GPUS; i++) {
        device_table[i].magic = DEVICE_MAGIC;
        device_table[i].index = i;
    }
    for (unsigned int i = 0; i < MAX_GPUS * MAX_MIG; i++) {
        mig_table[i].magic = MIG_MAGIC;
        mig_table[i].index = i;
    }
}

static nvmlDevice_t mig_handle_for(unsigned int gpu, unsigned int mig)
{
    return &mig_table[gpu * MAX_MIG + mig];
}

static nvmlDevice_t handle_for(unsigned int index)
{
    return &device_table[index];
}

/* Common entry for per-device functions that take a GPU or a MIG device handle: *mig is -1 for a GPU.
 * A MIG handle whose device no longer exists (the instance was destroyed; the config was rewritten) is
 * invalid, as nvml.h says of a destroyed compute instance's handle. Faults are the parent GPU's. */
static nvmlReturn_t enter_any(const char *func, nvmlDevice_t device, int lock_op, struct loaded **out, unsigned int *index,
                              int *mig)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    unsigned int m = 0;
    *mig = -1;
    if (mig_handle(device, index, &m) == 0)
        *mig = (int)m;
    else if (handle_index(device, index) != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct loaded *l = load_config(lock_op);
    if (l == NULL)
        return NVML_ERROR_UNKNOWN;
    nvmlReturn_t rc = *index < l->cfg.gpu_count ? check_gpu(func, l, *index) : NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS && *mig >= 0 &&
        (l->cfg.gpus[*index].mig_current != NVML_DEVICE_MIG_ENABLE || (unsigned int)*mig >= l->cfg.gpus[*index].mig_count))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc != NVML_SUCCESS) {
        loaded_free(l);
        return rc;
    }
    *out = l;
    return NVML_SUCCESS;
}

/* Common entry for per-GPU functions. lock_op: LOCK_SH to read, LOCK_EX to modify. A MIG device handle is
 * answered NVML_ERROR_NOT_SUPPORTED: compute mode, MIG mode and persistence are the GPU's [I]. */
static nvmlReturn_t enter_device(const char *func, nvmlDevice_t device, int lock_op, struct loaded **out,
                                 unsigned int *index)
{
    int mig;
    nvmlReturn_t rc = enter_any(func, device, lock_op, out, index, &mig);
    if (rc == NVML_SUCCESS && mig >= 0) {
        loaded_free(*out);
        return NVML_ERROR_NOT_SUPPORTED;
    }
    return rc;
}

static nvmlReturn_t put_string(const char *value, char *buf, unsigned int length)
{
    if (buf == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------ */
/* Initialization                                                                                   */

static nvmlReturn_t do_init(const char *func, unsigned int flags)
{
    struct loaded *l = load_config(LOCK_SH);
    if (l == NULL)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    nvmlReturn_t rc = injected(&l->cfg, func, -1);
    loaded_free(l);
    if (rc != NVML_SUCCESS)
        return rc;

    pthread_mutex_lock(&state_lock);
    if (init_refcount == 0) {
        const char *v = getenv("NVML_MPS_DEVICE_ENUMERATION");
        mps_view = v != NULL && strcmp(v, "1") == 0;
    }
    if (mps_view && (flags & NVML_INIT_FLAG_NO_ATTACH)) {
        rc = NVML_ERROR_NOT_SUPPORTED; /* nvml.h: NO_ATTACH is not supported in the MPS view */
        if (init_refcount == 0)
            mps_view = 0;
    } else {
        init_refcount++;
    }
    pthread_mutex_unlock(&state_lock);
    return rc;
}

FAKE_API nvmlReturn_t nvmlInit(void)
{
    log_call(__func__);
    return do_init(__func__, 0);
}

FAKE_API nvmlReturn_t nvmlInit_v2(void)
{
    log_call(__func__);
    return do_init(__func__, 0);
}

FAKE_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    log_call(__func__);
    return do_init(__func__, flags);
}

FAKE_API nvmlReturn_t nvmlShutdown(void)
{
    log_call(__func__);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    struct loaded *l = load_config(LOCK_SH);
    if (l != NULL) {
        nvmlReturn_t rc = injected(&l->cfg, __func__, -1);
        loaded_free(l);
        if (rc != NVML_SUCCESS)
            return rc;
    }
    pthread_mutex_lock(&state_lock);
    nvmlReturn_t rc = NVML_SUCCESS;
    if (init_refcount == 0)
        rc = NVML_ERROR_UNINITIALIZED; /* another thread shut down meanwhile */
    else if (--init_refcount == 0)
        mps_view = 0;
    pthread_mutex_unlock(&state_lock);
    return rc;
}

FAKE_API const char *nvmlErrorString(nvmlReturn_t result)
{
    log_call(__func__);
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED:
        return "The requested vgpu operation is not available on target device, becasue ECC is enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Ran out of critical resources, other than memory";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "The provided version is invalid/unsupported";
    case NVML_ERROR_DEPRECATED: return "The requested functionality has been deprecated";
    case NVML_ERROR_NOT_READY: return "The system is not ready for the request";
    case NVML_ERROR_GPU_NOT_FOUND: return "No GPUs were found";
    case NVML_ERROR_INVALID_STATE: return "Resource not in correct state to perform requested operation";
    case NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: return "Reset not supported for given device/parameters";
    default: return "Unknown Error";
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* System queries                                                                                   */

FAKE_API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    log_call(__func__);
    struct loaded *l;
    nvmlReturn_t rc = enter_system(__func__, &l);
    if (rc != NVML_SUCCESS)
        return rc;
    rc = put_string(l->cfg.driver_version, version, length);
    loaded_free(l);
    return rc;
}

FAKE_API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    log_call(__func__);
    struct loaded *l;
    nvmlReturn_t rc = enter_system(__func__, &l);
    if (rc != NVML_SUCCESS)
        return rc;
    /* NVML reports "<CUDA major>.<driver version>", e.g. 12.560.35.03 */
    char buf[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE + 16];
    snprintf(buf, sizeof(buf), "%d.%s", l->cfg.cuda_driver_version / 1000, l->cfg.driver_version);
    rc = put_string(buf, version, length);
    loaded_free(l);
    return rc;
}

static nvmlReturn_t cuda_driver_version(const char *func, int *out)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct loaded *l;
    nvmlReturn_t rc = enter_system(func, &l);
    if (rc != NVML_SUCCESS)
        return rc;
    *out = l->cfg.cuda_driver_version;
    loaded_free(l);
    return NVML_SUCCESS;
}

FAKE_API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    log_call(__func__);
    return cuda_driver_version(__func__, cudaDriverVersion);
}

FAKE_API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    log_call(__func__);
    return cuda_driver_version(__func__, cudaDriverVersion);
}

/* ------------------------------------------------------------------------------------------------ */
/* Enumeration                                                                                      */

static nvmlReturn_t device_count(const char *func, unsigned int *out)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct loaded *l;
    nvmlReturn_t rc = enter_system(func, &l);
    if (rc != NVML_SUCCESS)
        return rc;
    *out = l->cfg.gpu_count;
    loaded_free(l);
    return NVML_SUCCESS;
}

FAKE_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    log_call(__func__);
    return device_count(__func__, deviceCount);
}

FAKE_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    log_call(__func__);
    return device_count(__func__, deviceCount);
}

static nvmlReturn_t handle_by_index(const char *func, unsigned int index, nvmlDevice_t *device)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct loaded *l = load_config(LOCK_SH);
    if (l == NULL)
        return NVML_ERROR_UNKNOWN;
    nvmlReturn_t rc = index < l->cfg.gpu_count ? check_gpu(func, l, index) : NVML_ERROR_INVALID_ARGUMENT;
    loaded_free(l);
    if (rc == NVML_SUCCESS)
        *device = handle_for(index);
    return rc;
}

FAKE_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    log_call(__func__);
    return handle_by_index(__func__, index, device);
}

FAKE_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    log_call(__func__);
    return handle_by_index(__func__, index, device);
}

FAKE_API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    log_call(__func__);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (uuid == NULL || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct loaded *l = load_config(LOCK_SH);
    if (l == NULL)
        return NVML_ERROR_UNKNOWN;
    nvmlReturn_t rc = NVML_ERROR_NOT_FOUND;
    unsigned int index = 0;
    int mig = -1;
    for (unsigned int i = 0; i < l->cfg.gpu_count && rc == NVML_ERROR_NOT_FOUND; i++) {
        if (strcmp(l->cfg.gpus[i].uuid, uuid) == 0) {
            index = i;
            rc = check_gpu(__func__, l, i);
            break;
        }
        /* nvml.h: "The UUID of the target GPU or MIG instance" */
        for (unsigned int k = 0; k < l->cfg.gpus[i].mig_count; k++) {
            if (strcmp(l->cfg.gpus[i].migs[k].uuid, uuid) == 0) {
                index = i;
                mig = (int)k;
                rc = check_gpu(__func__, l, i);
                break;
            }
        }
    }
    if (rc == NVML_ERROR_NOT_FOUND) {
        /* a system-wide fault still applies when nothing matched */
        nvmlReturn_t injected_rc = injected(&l->cfg, __func__, -1);
        if (injected_rc != NVML_SUCCESS)
            rc = injected_rc;
    }
    loaded_free(l);
    if (rc == NVML_SUCCESS)
        *device = mig >= 0 ? mig_handle_for(index, (unsigned int)mig) : handle_for(index);
    return rc;
}

FAKE_API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    log_call(__func__);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (index == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct loaded *l;
    unsigned int i;
    int mig;
    nvmlReturn_t rc = enter_any(__func__, device, LOCK_SH, &l, &i, &mig);
    if (rc != NVML_SUCCESS)
        return rc;
    /* nvml.h: a MIG device handle's index is the one nvmlDeviceGetMigDeviceHandleByIndex takes */
    *index = mig >= 0 ? (unsigned int)mig : i;
    loaded_free(l);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------ */
/* Device queries                                                                                   */

FAKE_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    log_call(__func__);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (uuid == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct loaded *l;
    unsigned int i;
    int mig;
    nvmlReturn_t rc = enter_any(__func__, device, LOCK_SH, &l, &i, &mig);
    if (rc != NVML_SUCCESS)
        return rc;
    rc = put_string(mig >= 0 ? l->cfg.gpus[i].migs[mig].uuid : l->cfg.gpus[i].uuid, uuid, length);
    loaded_free(l);
    return rc;
}

FAKE_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    log_call(__func__);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (name == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct loaded *l;
    unsigned int i;
    int mig;
    nvmlReturn_t rc = enter_any(__func__, device, LOCK_SH, &l, &i, &mig);
    if (rc != NVML_SUCCESS)
        return rc;
    if (mig >= 0) {
        /* "NVIDIA A100-SXM4-80GB MIG 1g.10gb": the GPU's name and the profile, as nvidia-smi -L prints it [I] */
        char buf[NVML_DEVICE_NAME_V2_BUFFER_SIZE + 48];
        snprintf(buf, sizeof(buf), "%s MIG %s", l->cfg.gpus[i].name, l->cfg.gpus[i].migs[mig].profile);
        rc = put_string(buf, name, length);
    } else {
        rc = put_string(l->cfg.gpus[i].name, name, length);
    }
    loaded_free(l);
    return rc;
}

FAKE_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    log_call(__func__);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct loaded *l;
    unsigned int i;
    int mig;
    nvmlReturn_t rc = enter_any(__func__, device, LOCK_SH, &l, &i, &mig);
    if (rc != NVML_SUCCESS)
        return rc;
    /* v1 counts the driver's reserved framebuffer as used; a MIG device reports its own memory */
    memory->total = (mig >= 0 ? l->cfg.gpus[i].migs[mig].memory_total_mib : l->cfg.gpus[i].memory_total_mib) * 1048576ull;
    memory->used = RESERVED_BYTES + IDLE_USED_BYTES;
    memory->free = memory->total - memory->used;
    loaded_free(l);
    return NVML_SUCCESS;
}

FAKE_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    log_call(__func__);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct loaded *l;
    unsigned int i;
    int mig;
    nvmlReturn_t rc = enter_any(__func__, device, LOCK_SH, &l, &i, &mig);
    if (rc != NVML_SUCCESS)
        return rc;
    if (memory->version != nvmlMemory_v2) {
        loaded_free(l);
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    /* v2 reports the reserved framebuffer on its own line */
    memory->total = (mig >= 0 ? l->cfg.gpus[i].migs[mig].memory_total_mib : l->cfg.gpus[i].memory_total_mib) * 1048576ull;
    memory->reserved = RESERVED_BYTES;
    memory->used = IDLE_USED_BYTES;
    memory->free = memory->total - memory->reserved - memory->used;
    loaded_free(l);
    return NVML_SUCCESS;
}

FAKE_API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    log_call(__func__);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (major == NULL || minor == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct loaded *l;
    unsigned int i;
    int mig;
    nvmlReturn_t rc = enter_any(__func__, device, LOCK_SH, &l, &i, &mig); /* a MIG device: its GPU's [I] */
    if (rc != NVML_SUCCESS)
        return rc;
    *major = l->cfg.gpus[i].cc_major;
    *minor = l->cfg.gpus[i].cc_minor;
    loaded_free(l);
    return NVML_SUCCESS;
}

FAKE_API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    log_call(__func__);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (pci == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct loaded *l;
    unsigned int i;
    int mig;
    nvmlReturn_t rc = enter_any(__func__, device, LOCK_SH, &l, &i, &mig); /* a MIG device: its GPU's [I] */
    if (rc != NVML_SUCCESS)
        return rc;
    const struct gpu *g = &l->cfg.gpus[i];
    memset(pci, 0, sizeof(*pci));
    snprintf(pci->busId, sizeof(pci->busId), "%s", g->pci_bus_id);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.%X", g->pci_domain & 0xffff,
             g->pci_bus, g->pci_device, g->pci_function);
    pci->domain = g->pci_domain;
    pci->bus = g->pci_bus;
    pci->device = g->pci_device;
    pci->pciDeviceId = g->pci_device_id;
    loaded_free(l);
    return NVML_SUCCESS;
}

FAKE_API nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    log_call(__func__);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (mode == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct loaded *l;
    unsigned int i;
    nvmlReturn_t rc = enter_device(__func__, device, LOCK_SH, &l, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    *mode = l->cfg.gpus[i].persistence;
    loaded_free(l);
    return NVML_SUCCESS;
}

FAKE_API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    log_call(__func__);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (currentMode == NULL || pendingMode == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct loaded *l;
    unsigned int i;
    nvmlReturn_t rc = enter_device(__func__, device, LOCK_SH, &l, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    const struct gpu *g = &l->cfg.gpus[i];
    if (!g->mig_supported) {
        rc = NVML_ERROR_NOT_SUPPORTED;
    } else {
        *currentMode = g->mig_current;
        *pendingMode = g->mig_pending;
    }
    loaded_free(l);
    return rc;
}

/* ------------------------------------------------------------------------------------------------ */
/* Compute mode                                                                                     */

FAKE_API nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode)
{
    log_call(__func__);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (mode == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct loaded *l;
    unsigned int i;
    nvmlReturn_t rc = enter_device(__func__, device, LOCK_SH, &l, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    *mode = l->cfg.gpus[i].compute_mode;
    loaded_free(l);
    return NVML_SUCCESS;
}

FAKE_API nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t device, nvmlComputeMode_t mode)
{
    log_call(__func__);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    unsigned int probe, probe_mig;
    if ((handle_index(device, &probe) != 0 && mig_handle(device, &probe, &probe_mig) != 0) ||
        (unsigned int)mode >= NVML_COMPUTEMODE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct loaded *l;
    unsigned int i;
    /* read, decide and write under one exclusive lock, so concurrent setters lose nothing */
    nvmlReturn_t rc = enter_device(__func__, device, LOCK_EX, &l, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    const struct gpu *g = &l->cfg.gpus[i];
    if (mode == NVML_COMPUTEMODE_EXCLUSIVE_THREAD)
        rc = NVML_ERROR_NOT_SUPPORTED; /* deprecated; current drivers refuse it */
    else if (l->cfg.require_root && geteuid() != 0)
        rc = NVML_ERROR_NO_PERMISSION;
    else if (g->mig_supported && g->mig_current == NVML_DEVICE_MIG_ENABLE)
        rc = NVML_ERROR_NOT_SUPPORTED; /* compute modes do not apply to a GPU split into MIG instances */
    else if (g->compute_mode != mode)
        rc = store_compute_mode(l, i, mode);
    loaded_free(l);
    return rc;
}

/* ------------------------------------------------------------------------------------------------ */
/* MIG devices: [gpu<N>.mig<M>] sections                                                            */

FAKE_API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    log_call(__func__);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct loaded *l;
    unsigned int i;
    nvmlReturn_t rc = enter_device(__func__, device, LOCK_SH, &l, &i);
    if (rc == NVML_ERROR_NOT_SUPPORTED)
        return NVML_ERROR_INVALID_ARGUMENT; /* nvml.h lists no NOT_SUPPORTED: a MIG handle is not a parent */
    if (rc != NVML_SUCCESS)
        return rc;
    const struct gpu *g = &l->cfg.gpus[i];
    /* nvml.h: "Returns zero if MIG is not supported or enabled" */
    *count = g->mig_supported && g->mig_current == NVML_DEVICE_MIG_ENABLE ? g->max_mig : 0;
    loaded_free(l);
    return NVML_SUCCESS;
}

FAKE_API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice)
{
    log_call(__func__);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (migDevice == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct loaded *l;
    unsigned int i;
    nvmlReturn_t rc = enter_device(__func__, device, LOCK_SH, &l, &i);
    if (rc == NVML_ERROR_NOT_SUPPORTED)
        return NVML_ERROR_INVALID_ARGUMENT; /* a MIG handle has no MIG devices under it */
    if (rc != NVML_SUCCESS)
        return rc;
    const struct gpu *g = &l->cfg.gpus[i];
    if (!g->mig_supported || g->mig_current != NVML_DEVICE_MIG_ENABLE)
        rc = NVML_ERROR_NOT_SUPPORTED; /* [I]: MIG disabled or not supported */
    else if (index >= g->max_mig)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (index >= g->mig_count)
        rc = NVML_ERROR_NOT_FOUND; /* nvml.h: "no valid MIG device was found at index" */
    else
        *migDevice = mig_handle_for(i, index);
    loaded_free(l);
    return rc;
}

FAKE_API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    log_call(__func__);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct loaded *l;
    unsigned int i;
    int mig;
    nvmlReturn_t rc = enter_any(__func__, migDevice, LOCK_SH, &l, &i, &mig);
    if (rc != NVML_SUCCESS)
        return rc;
    loaded_free(l);
    if (mig < 0)
        return NVML_ERROR_INVALID_ARGUMENT; /* not a MIG device handle [I] */
    *device = handle_for(i);
    return NVML_SUCCESS;
}

FAKE_API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    log_call(__func__);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (isMigDevice == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct loaded *l;
    unsigned int i;
    int mig;
    nvmlReturn_t rc = enter_any(__func__, device, LOCK_SH, &l, &i, &mig);
    if (rc != NVML_SUCCESS)
        return rc;
    loaded_free(l);
    *isMigDevice = mig >= 0;
    return NVML_SUCCESS;
}

static nvmlReturn_t instance_id(const char *func, nvmlDevice_t device, unsigned int *id, int compute)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (id == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct loaded *l;
    unsigned int i;
    int mig;
    nvmlReturn_t rc = enter_any(func, device, LOCK_SH, &l, &i, &mig);
    if (rc != NVML_SUCCESS)
        return rc;
    if (mig < 0) {
        rc = NVML_ERROR_NOT_SUPPORTED; /* a GPU handle has no instance [I] */
    } else {
        const struct mig *m = &l->cfg.gpus[i].migs[mig];
        *id = compute ? m->ci_id : m->gi_id;
    }
    loaded_free(l);
    return rc;
}

FAKE_API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    log_call(__func__);
    return instance_id(__func__, device, id, 0);
}

FAKE_API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    log_call(__func__);
    return instance_id(__func__, device, id, 1);
}

FAKE_API nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    log_call(__func__);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (attributes == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct loaded *l;
    unsigned int i;
    int mig;
    nvmlReturn_t rc = enter_any(__func__, device, LOCK_SH, &l, &i, &mig);
    if (rc != NVML_SUCCESS)
        return rc;
    if (mig < 0) {
        rc = NVML_ERROR_NOT_SUPPORTED; /* nvml.h: "This API currently only supports MIG device handles" */
    } else {
        const struct mig *m = &l->cfg.gpus[i].migs[mig];
        memset(attributes, 0, sizeof(*attributes));
        attributes->multiprocessorCount = m->sm_count;
        attributes->gpuInstanceSliceCount = m->gi_slices;
        attributes->computeInstanceSliceCount = m->ci_slices;
        attributes->memorySizeMB = m->memory_total_mib;
    }
    loaded_free(l);
    return rc;
}
